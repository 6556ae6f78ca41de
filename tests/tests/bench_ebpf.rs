//! `warmpath bench ebpf` as a user runs it (root), with tiny counts: the table has every
//! row with plausible, non-zero figures (connect4's in-kernel cost from the kernel's run-time
//! stats, with each program's exact run count; the sk_msg rows with messages redirected), and
//! the run leaves nothing behind (no network namespace of its tag, no pin directory, no
//! cgroup).
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{os::unix::process::CommandExt, path::Path, time::Duration};

use warmpath_e2e::{gate, process::ProcessGroup};

/// The whole run, start-up of four debug agents and five simulators included, on a loaded
/// 2-core machine.
const RUN_WITHIN: Duration = Duration::from_secs(300);
const ROUNDS: u64 = 2;
const CONNECTS: u64 = 50;
const REQUESTS: u64 = 2;
const CLIENTS: u64 = 2;
const HALF: u64 = 2;

fn num(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

#[test]
fn bench_ebpf_measures_every_row_and_leaves_nothing_behind() {
    if !gate::bpf_available("bench_ebpf_measures_every_row_and_leaves_nothing_behind") {
        return;
    }
    let tag = format!("wt{}", std::process::id() % 100_000);
    let out = std::env::temp_dir().join(format!("warmpath-bench-ebpf-{tag}"));
    let _ = std::fs::remove_dir_all(&out);
    let argv = [
        "bench",
        "ebpf",
        "--out",
        &out.display().to_string(),
        "--tag",
        &tag,
        "--connect-rounds",
        &ROUNDS.to_string(),
        "--rounds",
        &ROUNDS.to_string(),
        "--connects",
        &CONNECTS.to_string(),
        "--requests",
        &REQUESTS.to_string(),
        "--clients",
        &CLIENTS.to_string(),
        "--half",
        &HALF.to_string(),
        "--system-tokens",
        "256",
        "--num-gpu-blocks",
        "64",
        "--profile",
        "tiny",
        "--time-scale",
        "0.05",
        "--request-time-scale",
        "0.05",
    ]
    .map(String::from);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_warmpath-roles"))
        .args(&argv)
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut group = ProcessGroup(i32::try_from(child.id()).ok());
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    // On a timeout the panic drops `group`: the kill ends the waiting thread too.
    let output = finished
        .recv_timeout(RUN_WITHIN)
        .expect("bench ebpf finished in time")
        .unwrap();
    group.0 = None;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert_left_nothing(&tag);

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("ebpf.json")).unwrap()).unwrap();
    assert!(out.join("ebpf.md").is_file());
    // connect(): three variants; the iptables one measured whenever iptables is installed
    // (always under CI, whose image installs it).
    let connect = json["connect"].as_array().unwrap();
    let variants: Vec<&str> = connect
        .iter()
        .map(|r| r["variant"].as_str().unwrap())
        .collect();
    assert_eq!(
        variants,
        ["no interception", "iptables REDIRECT", "warmpath connect4"],
        "{json}"
    );
    let iptables = std::process::Command::new("iptables")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        assert!(iptables, "CI installs iptables (.ci/run)");
    }
    for row in connect {
        if row["variant"] == "iptables REDIRECT" && !iptables {
            assert_eq!(row["measured"], false, "{row}");
            assert_eq!(row["note"], "iptables not installed", "{row}");
            continue;
        }
        assert_eq!(row["measured"], true, "{row}");
        assert_eq!(row["connects"], ROUNDS * CONNECTS, "{row}");
        let (p50, p99) = (num(&row["p50_us"]), num(&row["p99_us"]));
        // A loopback connect takes microseconds to milliseconds, never nothing.
        assert!(p50 > 0.5 && p50 <= p99 && p99 < 1e6, "{row}");
        let rate = num(&row["connections_per_s"]["median"]);
        assert!(rate > 1.0 && rate < 1e7, "{row}");
    }
    assert_eq!(json["connect4_cost_us"]["rounds"], ROUNDS, "{json}");
    assert!(
        num(&json["connect4_cost_us"]["median"]).is_finite(),
        "{json}"
    );
    // In-kernel: the connect4 pair ran exactly once per connect of the stats pass, sock_ops
    // and the egress counter at least once (ESTABLISHED, the SYN); the sum is their time.
    let kernel = &json["connect4_kernel"];
    assert_eq!(kernel["missing"], "", "{kernel}");
    assert_eq!(kernel["connects"], ROUNDS * CONNECTS, "{kernel}");
    let program = |name: &str| {
        kernel["programs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["program"] == name)
            .unwrap_or_else(|| panic!("{name} in {kernel}"))
            .clone()
    };
    for name in ["connect4_proxy", "connect4"] {
        assert_eq!(program(name)["runs"], ROUNDS * CONNECTS, "{kernel}");
    }
    assert!(
        num(&program("sock_ops")["runs_per_connect"]) >= 1.0,
        "{kernel}"
    );
    assert_eq!(program("getpeername4")["runs"], 0, "{kernel}");
    let total = num(&kernel["ns_per_connect"]);
    let sum: f64 = kernel["programs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| num(&p["ns_per_connect"]))
        .sum();
    assert!(
        total > 0.0 && (total - sum).abs() < 1e-6 * total,
        "{kernel}"
    );

    // Requests: both kinds through each path, every request answered.
    let requests = json["requests"].as_array().unwrap();
    let mut seen = Vec::new();
    for row in requests {
        seen.push(format!(
            "{} {}",
            row["kind"].as_str().unwrap(),
            row["variant"].as_str().unwrap()
        ));
        assert_eq!(row["requests"], ROUNDS * REQUESTS, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
        let (p50, p99) = (
            num(&row["latency_ms"]["p50"]),
            num(&row["latency_ms"]["p99"]),
        );
        assert!(p50 > 0.0 && p50 <= p99 && p99 < 60_000.0, "{row}");
        if row["variant"] == "proxy mode + sk_msg" {
            // "sk_msg over both kinds: N messages redirected, ..."
            let note = row["note"].as_str().unwrap();
            let redirected: u64 = note
                .split_once(": ")
                .and_then(|(_, rest)| rest.split_once(' '))
                .and_then(|(n, _)| n.parse().ok())
                .unwrap_or_else(|| panic!("{note}"));
            assert!(redirected > 0, "{note}");
        }
    }
    assert_eq!(
        seen,
        [
            "non-streamed direct",
            "non-streamed proxy mode",
            "non-streamed proxy mode + sk_msg",
            "non-streamed steer",
            "SSE direct",
            "SSE proxy mode",
            "SSE proxy mode + sk_msg",
            "SSE steer"
        ]
    );

    // The agent's kill: both variants, every request after it answered.
    let failover = json["failover"].as_array().unwrap();
    let names: Vec<&str> = failover
        .iter()
        .map(|r| r["variant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["affinity fail-open", "plain VIP fallback"]);
    for row in failover {
        if !iptables {
            assert_eq!(row["requests"], 0, "{row}");
            continue;
        }
        assert_eq!(row["requests"], CLIENTS * HALF, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
        let p90 = num(&row["ttft_ms"]["p90"]);
        assert!(p90 > 0.0 && p90 < 60_000.0, "{row}");
    }

    // Every target judged, on the terminal too.
    let targets = json["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 6, "{json}");
    for t in targets {
        let name = t["name"].as_str().unwrap();
        let verdict = if t["met"] == true { "PASS" } else { "MISS" };
        assert!(
            stdout.contains(&format!("{verdict} {name}: ")),
            "{name}: {stdout}"
        );
    }
    assert!(
        stdout.contains("| connect() (us) | warmpath connect4 | "),
        "{stdout}"
    );
    std::fs::remove_dir_all(&out).unwrap();
    gate::announce(&format!(
        "bench ebpf (tiny counts): connect4 cost {:.2} us (difference of medians), {:.3} us in the kernel, {} targets judged",
        num(&json["connect4_cost_us"]["median"]),
        total / 1000.0,
        targets.len()
    ));
}

/// No netns named after the tag, no pin directory or cgroup of it.
fn assert_left_nothing(tag: &str) {
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&netns.stdout);
    assert!(
        !listed.lines().any(|l| l.starts_with(tag)),
        "namespaces left:\n{listed}"
    );
    let prefix = format!("warmpath-bench-{tag}");
    let cgroup_root = warmpath_agent::ebpf::cgroup2_root().unwrap();
    for dir in [Path::new(warmpath_agent::ebpf::DEFAULT_BPFFS), &cgroup_root] {
        let left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "left under {}: {left:?}", dir.display());
    }
}
