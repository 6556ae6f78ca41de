//! `warmpath bench` interrupted: SIGTERM sent to the bench alone (as `kill` sends it) stops
//! every process it started, and it says why.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use warmpath_e2e::{
    bench_cli::{spawn, tiny_compare},
    process::ProcessGroup,
};

/// Start-up of two debug agents on a loaded 2-core machine.
const RUN_WITHIN: Duration = Duration::from_secs(240);

/// Interrupted (SIGTERM to the bench alone, as `kill` sends it), the bench stops every
/// process it started and says why: none of its agents or engines outlives it.
#[test]
fn an_interrupted_bench_stops_every_process_it_started() {
    let out =
        std::env::temp_dir().join(format!("warmpath-bench-interrupted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // Long enough to be interrupted mid-row: modelled time 20x slower than the wall clock,
    // 20 rounds of 64 output tokens a request.
    let argv = tiny_compare(
        &out,
        &[
            ("--policies", "round-robin"),
            ("--central", "off"),
            ("--rounds", "20"),
            ("--output-tokens", "64"),
            ("--time-scale", "20"),
            ("--max-seconds", "120"),
        ],
    );
    let child = spawn(env!("CARGO_BIN_EXE_warmpath-roles"), &argv);
    let bench = i32::try_from(child.id()).unwrap();
    // Whatever happens, nothing of the group survives the test.
    let _group = ProcessGroup(Some(bench));
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    // Its agents serving requests: the row is under way.
    let log = out.join("logs").join("agent-round-robin-1.log");
    until("the second agent serves", RUN_WITHIN, || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("routing proxy ready"))
    });
    let started = descendants(bench);
    assert!(
        started.len() >= 2,
        "the bench's processes (engines, agents): {started:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(bench),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let output = finished
        .recv_timeout(Duration::from_secs(30))
        .expect("the bench exited after SIGTERM")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("interrupted by SIGTERM: stopped every process the benchmark started"),
        "{stderr}"
    );
    for pid in started {
        until(
            &format!("process {pid} ended"),
            Duration::from_secs(10),
            || !alive(pid),
        );
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// Waits (bounded) until `done` holds, polling every 50 ms.
fn until(what: &str, within: Duration, done: impl Fn() -> bool) {
    let end = std::time::Instant::now() + within;
    while !done() {
        assert!(
            std::time::Instant::now() < end,
            "{what}: not within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every live descendant of `pid`, from `/proc`.
fn descendants(pid: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|p| Some((p, stat(p)?.1)))
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (child, _) in parents.iter().filter(|(_, pp)| *pp == parent) {
            out.push(*child);
            frontier.push(*child);
        }
    }
    out.retain(|p| alive(*p));
    out
}

/// A process's state letter and parent, from `/proc/PID/stat` (`None`: gone).
fn stat(pid: i32) -> Option<(char, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which may hold spaces, in parentheses.
    let rest = &text[text.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Whether `pid` runs (a zombie has ended: only its parent has yet to reap it).
fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}
