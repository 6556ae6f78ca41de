//! `warmpath bench compare` as a user runs it, a process of its own: the terminal gets
//! progress and the table, never a log line; every agent it starts logs into its own file
//! under `--out`.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{os::unix::process::CommandExt, path::Path, time::Duration};

/// The whole run, start-up of four debug agents included, on a loaded 2-core machine.
const RUN_WITHIN: Duration = Duration::from_secs(240);

/// Kills the bench's process group (the bench and the agents it started) unless disarmed:
/// a timed-out or panicking test leaves no process behind.
struct Group(Option<i32>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[test]
fn compare_shows_progress_and_the_table_and_logs_every_agent_to_a_file() {
    let out = std::env::temp_dir().join(format!("warmpath-bench-compare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // 2 groups x 2 users x 1 round = 4 requests per policy, through 2 agents each.
    let argv = [
        "bench",
        "compare",
        "--out",
        &out.display().to_string(),
        "--policies",
        "round-robin,precise",
        "--agents",
        "2",
        "--replicas",
        "2",
        "--peers",
        "none",
        "--ebpf",
        "off",
        "--groups",
        "2",
        "--users",
        "2",
        "--rounds",
        "1",
        "--system-tokens",
        "64",
        "--question-tokens",
        "8",
        "--output-tokens",
        "4",
        "--profile",
        "tiny",
        "--time-scale",
        "0.05",
        "--num-gpu-blocks",
        "64",
        "--max-seconds",
        "60",
    ]
    .map(String::from);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_warmpath-roles"))
        .args(&argv)
        // The default filter (info): what a user gets, and what must stay off the terminal.
        .env_remove("RUST_LOG")
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut group = Group(i32::try_from(child.id()).ok());
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    // On a timeout the panic drops `group`: the kill ends the waiting thread too.
    let output = finished
        .recv_timeout(RUN_WITHIN)
        .expect("bench compare finished in time")
        .unwrap();
    group.0 = None;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );

    // The table, both rows with every request answered.
    assert!(
        stdout.contains("| policy | requests | errors | TTFT p50 (s) |"),
        "{stdout}"
    );
    for policy in ["RoundRobin", "Precise"] {
        assert!(
            stdout.contains(&format!("\n| {policy} | 4 | 0 | ")),
            "{policy}: {stdout}"
        );
    }
    // Where everything went.
    let logs = out.join("logs");
    for line in [
        format!("results: {}", out.join("compare.json").display()),
        format!("chart: {}", out.join("compare.svg").display()),
        format!("chart: {}", out.join("compare.png").display()),
        format!("logs: {}", logs.display()),
    ] {
        assert!(stdout.contains(&line), "{line}: {stdout}");
    }
    // Progress on stderr, as plain lines (not a terminal): each phase and its end.
    for phase in ["[1/2] RoundRobin", "[2/2] Precise"] {
        assert!(
            stderr.contains(&format!("{phase}: 4 requests\n")),
            "{phase}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("{phase}: 4 requests, 0 errors, p90 TTFT ")),
            "{phase}: {stderr}"
        );
    }
    // No log line on the terminal, from the bench or from any agent.
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        for level in [" INFO ", " WARN ", " ERROR ", " DEBUG "] {
            assert!(
                !text.lines().any(|l| l.contains(level)),
                "{name} has a{level}line:\n{text}"
            );
        }
    }

    // Each agent logged its start into its own file.
    for role in ["agent-round-robin", "agent-precise"] {
        for n in 0..2 {
            let path = logs.join(format!("{role}-{n}.log"));
            let text = read(&path);
            assert!(
                text.contains("routing proxy ready"),
                "{}:\n{text}",
                path.display()
            );
            // As a file, not a terminal: no colour codes.
            assert!(!text.contains('\u{1b}'), "{}:\n{text}", path.display());
        }
    }
    assert!(!logs.join("agent-precise-2.log").exists());
    assert!(logs.join("bench.log").is_file());
    let json: serde_json::Value = serde_json::from_str(&read(&out.join("compare.json"))).unwrap();
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");
    std::fs::remove_dir_all(&out).unwrap();
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
