//! `cargo xtask`: the project's build, test and demo entry points.
//!
//! Every command checks (and where it can, installs) its own prerequisites, so the two README
//! commands work on a fresh machine.

mod ebpf;
mod fuzz;
mod layers;
mod pgo;
mod setup;
mod shell;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "warmpath build, test and demo tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install prerequisites only (LLVM 22, rust-src for nightly, bpf-linker, Python test clients).
    Setup,
    /// Build the eBPF programs (release, BTF) into target/bpfel-unknown-none/release/.
    BuildEbpf,
    /// Build the workspace with the eBPF object embedded.
    Build {
        /// Optimised build.
        #[arg(long)]
        release: bool,
        /// With --release: a profile-guided build of the `warmpath` binary, trained on the
        /// data path, at target/pgo/warmpath (about three release builds' time).
        #[arg(long, requires = "release")]
        pgo: bool,
    },
    /// The README test command: fmt check, clippy, unit, integration and BPF tests, and a
    /// short run of every fuzz target.
    Test,
    /// Check the module structure: no cycles between sibling modules, the HTTP/1.1 layer
    /// importing nothing of the agent outside itself.
    Layers,
    /// Run the demo.
    Demo,
    /// Fuzz every target in fuzz/ (cargo-fuzz, nightly) for `--minutes` in all, or one target.
    Fuzz {
        /// Minutes of fuzzing in all, split evenly over the targets run.
        #[arg(long)]
        minutes: f64,
        /// Only this target (see fuzz/Cargo.toml).
        #[arg(long)]
        target: Option<String>,
    },
    /// Retrain the built-in tokenizer into tokenizer/assets/default-tokenizer/ (deterministic).
    GenTokenizer,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Setup => setup::all(),
        Task::BuildEbpf => ebpf::build().map(|path| println!("{}", path.display())),
        Task::Build { pgo: true, .. } => pgo::build().map(drop),
        Task::Build { release, .. } => build(release),
        Task::Test => test(),
        Task::Layers => layers::check(),
        Task::Demo => demo(),
        Task::Fuzz { minutes, target } => fuzz::run(minutes, target.as_deref()),
        Task::GenTokenizer => shell::run(&mut shell::cargo([
            "run",
            "--release",
            "--package",
            "warmpath-tokenizer",
            "--bin",
            "warmpath-train-tokenizer",
            "--",
            "tokenizer/assets/default-tokenizer",
        ])),
    }
}

fn build(release: bool) -> Result<()> {
    let object = ebpf::build()?;
    let mut cmd = shell::cargo(["build", "--workspace", "--exclude", "warmpath-ebpf"]);
    if release {
        cmd.arg("--release");
    }
    shell::run(cmd.env(ebpf::OBJECT_ENV, &object))
}

fn test() -> Result<()> {
    setup::all()?;
    let object = ebpf::build()?;
    shell::run(&mut shell::cargo(["fmt", "--all", "--", "--check"]))?;
    layers::check()?;
    // Licenses, bans and sources (deny.toml); advisories need GitHub (docs/security.md).
    shell::run(&mut shell::cargo([
        "deny", "check", "licenses", "bans", "sources",
    ]))?;
    shell::run(
        shell::cargo(["clippy", "--all-targets", "--", "-D", "warnings"])
            .env(ebpf::OBJECT_ENV, &object),
    )?;
    shell::run(shell::cargo(["test"]).env(ebpf::OBJECT_ENV, &object))?;
    python_suites(&object)?;
    node_suite()?;
    fuzz::smoke()
}

/// `cargo build` of the `warmpath` binary (release or debug) with the BPF `object` embedded;
/// callers add their own flags.
fn build_warmpath(release: bool, object: &std::path::Path) -> std::process::Command {
    let mut args = vec!["build"];
    if release {
        args.push("--release");
    }
    args.extend(["--package", "warmpath", "--bin", "warmpath"]);
    let mut cmd = shell::cargo(args);
    cmd.env(ebpf::OBJECT_ENV, object);
    cmd
}

/// The suites that drive warmpath with real third-party Python clients (openai, msgspec,
/// pyzmq) against the `warmpath` binary.
fn python_suites(object: &std::path::Path) -> Result<()> {
    shell::run(&mut build_warmpath(false, object))?;
    let bin = shell::target_dir().join("debug").join("warmpath");
    shell::run(
        std::process::Command::new("python3")
            .args([
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "tests/python",
            ])
            .env("WARMPATH_BIN", bin)
            .current_dir(shell::workspace_root()),
    )
}

/// The suite that drives the proxy with the official `openai` Node client (Node's own
/// fetch), against the debug binary `python_suites` built.
fn node_suite() -> Result<()> {
    let bin = shell::target_dir().join("debug").join("warmpath");
    shell::run(
        std::process::Command::new("node")
            .arg("--test")
            .env("WARMPATH_BIN", bin)
            .current_dir(shell::workspace_root().join(setup::NODE_SUITE)),
    )
}

/// The README's demo: a simulator fleet under KV pressure, warmpath agents in front of it,
/// the same shared-prefix workload through each policy, one table.
fn demo() -> Result<()> {
    let object = ebpf::build()?;
    shell::run(&mut build_warmpath(true, &object))?;
    let bin = shell::target_dir().join("release").join("warmpath");
    // compare.json, compare.{svg,png} and logs/ (every agent's and peer router's output: the
    // terminal shows only progress and the table).
    let out = shell::target_dir().join("demo");
    shell::run(
        std::process::Command::new(bin)
            .args(["bench", "compare", "--out"])
            .arg(&out),
    )
}
