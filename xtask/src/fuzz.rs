//! Fuzzing with cargo-fuzz (libFuzzer, nightly, AddressSanitizer): `cargo xtask fuzz` runs
//! every target in `fuzz/` (or one) for a time budget, and `cargo xtask test` runs each
//! target briefly ([`smoke`]) so a crash fails CI.
//!
//! The committed seeds (`fuzz/corpus/<target>/`) are read, never written: inputs the fuzzer
//! finds go to `<target dir>/fuzz/corpus/<target>/` (kept between runs), crashes to
//! `<target dir>/fuzz/artifacts/<target>/`. Builds go to `<target dir>/fuzz/` too (not into
//! the host build's directory: other flags, another toolchain). Debug assertions are on, so an
//! integer overflow is a finding.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{setup, shell};

/// Every fuzz target, as named in `fuzz/Cargo.toml`.
pub const TARGETS: [&str; 12] = [
    "http_server",
    "http_framing",
    "http_client",
    "kv_wire",
    "zmq_frames",
    "openai_request",
    "sse_tap",
    "config_yaml",
    "cluster_facts",
    "cluster_datagram",
    "cluster_sync",
    "metrics_page",
];

/// The CI run: each target over its seeds and then this many generated inputs (or for
/// [`SMOKE_SECONDS`], whichever comes first), with a fixed seed.
const SMOKE_RUNS: &str = "2000";
const SMOKE_SECONDS: &str = "8";
/// No single input may take longer (the loopback targets fail their own input after 20 s).
const INPUT_TIMEOUT_S: &str = "30";

/// What one run of one target reported.
#[derive(Debug, Default)]
struct Report {
    target: &'static str,
    executions: u64,
    seconds: f64,
    /// libFuzzer's `cov:` (covered edges) and `ft:` (features) at the end.
    cov: u64,
    ft: u64,
    corpus: u64,
}

/// `cargo xtask fuzz --minutes N [--target T]`: `minutes` of fuzzing in all, split evenly
/// over the targets run.
pub fn run(minutes: f64, target: Option<&str>) -> Result<()> {
    let targets: Vec<&'static str> = match target {
        Some(t) => vec![
            TARGETS
                .into_iter()
                .find(|k| *k == t)
                .with_context(|| format!("no fuzz target {t}; targets: {}", TARGETS.join(", ")))?,
        ],
        None => TARGETS.to_vec(),
    };
    if !(minutes > 0.0 && minutes.is_finite()) {
        bail!("--minutes must be a positive number of minutes, not {minutes}");
    }
    let seconds = ((minutes * 60.0) / targets.len() as f64).ceil().max(1.0) as u64;
    build()?;
    let mut reports = Vec::new();
    for t in targets {
        let work = fuzz_dir().join("corpus").join(t);
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        reports.push(fuzz_target(
            t,
            &work,
            &[format!("-max_total_time={seconds}")],
        )?);
    }
    print_table(&reports);
    Ok(())
}

/// The CI run of every target: a fresh working corpus each time, a fixed seed; a crash, a
/// failed property or a hang fails it.
pub fn smoke() -> Result<()> {
    build()?;
    let mut reports = Vec::new();
    for t in TARGETS {
        let work = fuzz_dir().join("smoke").join(t);
        if work.exists() {
            std::fs::remove_dir_all(&work)
                .with_context(|| format!("emptying {}", work.display()))?;
        }
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        reports.push(fuzz_target(
            t,
            &work,
            &[
                format!("-runs={SMOKE_RUNS}"),
                format!("-max_total_time={SMOKE_SECONDS}"),
                "-seed=1".into(),
            ],
        )?);
    }
    print_table(&reports);
    Ok(())
}

/// Builds every target once (sanitizer, coverage, debug assertions).
fn build() -> Result<()> {
    setup::cargo_fuzz()?;
    shell::run(
        cargo_fuzz(["build", "--debug-assertions"])
            .arg("--target-dir")
            .arg(fuzz_dir()),
    )
}

/// Runs one target over `work` (written) and its committed seeds (read), with `args` for
/// libFuzzer; its output is passed through and its final statistics read.
fn fuzz_target(target: &'static str, work: &Path, args: &[String]) -> Result<Report> {
    let seeds = shell::workspace_root()
        .join("fuzz")
        .join("corpus")
        .join(target);
    let artifacts = fuzz_dir().join("artifacts").join(target);
    std::fs::create_dir_all(&artifacts)
        .with_context(|| format!("creating {}", artifacts.display()))?;
    // The binary `build` made, run directly: `cargo fuzz run` would check the build again
    // for every target.
    let mut cmd = Command::new(binary(target));
    cmd.arg(work)
        .arg(&seeds)
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        .arg("-print_final_stats=1")
        .args(args)
        .stderr(Stdio::piped());
    eprintln!("+ fuzz {target}: {}", args.join(" "));
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start {}", binary(target).display()))?;
    let mut report = Report {
        target,
        ..Report::default()
    };
    let stderr = child.stderr.take().expect("stderr was piped just above");
    for line in BufReader::new(stderr).lines() {
        let line = line.context("reading libFuzzer's output")?;
        eprintln!("{line}");
        read_stats(&line, &mut report);
    }
    let status = child.wait().context("waiting for cargo fuzz")?;
    report.seconds = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!(
            "fuzz target {target} failed ({status}): the input is in {} (reproduce: {} <file>)",
            artifacts.display(),
            binary(target).display()
        );
    }
    Ok(report)
}

/// Picks libFuzzer's counters out of one line of its output.
fn read_stats(line: &str, report: &mut Report) {
    if let Some(n) = line.strip_prefix("stat::number_of_executed_units: ") {
        report.executions = n.trim().parse().unwrap_or(report.executions);
        return;
    }
    // Status lines: `#1234\tNEW    cov: 567 ft: 890 corp: 12/3456b ...`.
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        let value = || {
            words
                .clone()
                .next()
                .and_then(|v| v.split('/').next()?.parse().ok())
        };
        match w {
            "cov:" => report.cov = value().unwrap_or(report.cov),
            "ft:" => report.ft = value().unwrap_or(report.ft),
            "corp:" => report.corpus = value().unwrap_or(report.corpus),
            _ => {}
        }
    }
}

fn print_table(reports: &[Report]) {
    println!("| target | executions | seconds | cov | ft | corpus |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in reports {
        println!(
            "| {} | {} | {:.0} | {} | {} | {} |",
            r.target, r.executions, r.seconds, r.cov, r.ft, r.corpus
        );
    }
}

/// A target's binary as `cargo fuzz build` leaves it (built for the host triple).
fn binary(target: &str) -> PathBuf {
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    fuzz_dir().join(triple).join("release").join(target)
}

/// Where fuzz builds, working corpora and artifacts go.
fn fuzz_dir() -> PathBuf {
    shell::target_dir().join("fuzz")
}

/// `cargo fuzz <args>` on the nightly toolchain, from the workspace root.
fn cargo_fuzz<const N: usize>(args: [&str; N]) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "fuzz"])
        .args(args)
        // The stable toolchain that runs xtask must not leak into the nightly build.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .current_dir(shell::workspace_root());
    cmd
}
