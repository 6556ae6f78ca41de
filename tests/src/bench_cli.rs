//! `warmpath bench` as a user runs it, for the suites that run it as a process of its own.

use std::{os::unix::process::CommandExt, path::Path};

/// `bench compare` on a tiny fleet into `out`: 2 agents in front of 2 engines of the tiny
/// profile, no peers and no eBPF, 2 groups x 2 users x 1 round of short requests; each
/// `(flag, value)` of `changes` replaces that flag's value or is added.
pub fn tiny_compare(out: &Path, changes: &[(&str, &str)]) -> Vec<String> {
    let out = out.display().to_string();
    let mut argv: Vec<String> = ["bench", "compare", "--out", &out]
        .map(String::from)
        .to_vec();
    let mut flags: Vec<(&str, &str)> = vec![
        ("--agents", "2"),
        ("--replicas", "2"),
        ("--peers", "none"),
        ("--ebpf", "off"),
        ("--groups", "2"),
        ("--users", "2"),
        ("--rounds", "1"),
        ("--system-tokens", "64"),
        ("--question-tokens", "8"),
        ("--output-tokens", "4"),
        ("--profile", "tiny"),
        ("--time-scale", "0.05"),
        ("--num-gpu-blocks", "64"),
        ("--max-seconds", "60"),
    ];
    for (flag, value) in changes {
        match flags.iter_mut().find(|(f, _)| f == flag) {
            Some(slot) => slot.1 = value,
            None => flags.push((flag, value)),
        }
    }
    for (flag, value) in flags {
        argv.extend([flag.to_string(), value.to_string()]);
    }
    argv
}

/// `exe` (the suite's `warmpath-roles`) with `argv`, as its own process group, stdin closed, stdout and stderr piped, with the
/// default log filter (info: what a user gets, and what must stay off the terminal).
pub fn spawn(exe: &str, argv: &[String]) -> std::process::Child {
    std::process::Command::new(exe)
        .args(argv)
        .env_remove("RUST_LOG")
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {exe}: {e}"))
}

/// Runs `exe <argv>` as a user does (the default log filter, no terminal) in a process group
/// of its own, killed if it outlives `within` or the test panics.
pub fn run(exe: &str, argv: &[String], within: std::time::Duration) -> std::process::Output {
    let child = spawn(exe, argv);
    let mut group = crate::process::ProcessGroup(i32::try_from(child.id()).ok());
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    // On a timeout the panic drops `group`: the kill ends the waiting thread too.
    let output = finished
        .recv_timeout(within)
        .expect("the bench finished in time")
        .unwrap_or_else(|e| panic!("wait for {exe}: {e}"));
    group.0 = None;
    output
}

/// `bench matrix` of tiny requests (four a cell) on two engines and two agents, no peers.
pub fn matrix_argv(
    out: &std::path::Path,
    workloads: &str,
    loads: &str,
    extra: &[&str],
) -> Vec<String> {
    let out = out.display().to_string();
    let mut argv = vec![
        "bench",
        "matrix",
        "--quick",
        "--out",
        &out,
        "--workloads",
        workloads,
        "--loads",
        loads,
        "--requests",
        "4",
        "--replicas",
        "2",
        "--agents",
        "2",
        "--peers",
        "none",
        "--profile",
        "tiny",
        "--time-scale",
        "0.05",
        "--max-seconds",
        "60",
    ];
    argv.extend_from_slice(extra);
    argv.into_iter().map(String::from).collect()
}

/// The file at `path`, or a panic naming it.
pub fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
