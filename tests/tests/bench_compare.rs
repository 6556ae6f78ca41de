//! `warmpath bench compare` as a user runs it, a process of its own: the terminal gets
//! progress and the table, never a log line; every agent it starts logs into its own file
//! under `--out`; the multi-agent precise row runs on cluster mode beside a central agent;
//! the intercepted row's clients run in pod network namespaces and cgroups (root).
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{path::Path, time::Duration};

use warmpath_e2e::{
    bench_cli::{matrix_argv, read, run, tiny_compare},
    gate,
};

/// The whole run, start-up of four debug agents included, on a loaded 2-core machine.
const RUN_WITHIN: Duration = Duration::from_secs(240);

#[test]
fn compare_shows_progress_and_the_table_and_logs_every_agent_to_a_file() {
    let rows = ["RoundRobin", "Precise", "Precise (1 agent)"];
    let out = std::env::temp_dir().join(format!("warmpath-bench-compare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // 2 groups x 2 users x 1 round = 4 requests per policy, through 2 agents each (the
    // central row: one), the precise agents a cluster (the default).
    let argv = tiny_compare(&out, &[("--policies", "round-robin,precise")]);
    let output = bench(&argv);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );

    // The table, every row with every request answered.
    assert!(
        stdout.contains("| policy | requests | errors | TTFT p50 (s) |"),
        "{stdout}"
    );
    for policy in rows {
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
    // The cluster row against the central one, each figure with its verdict.
    assert!(
        stdout.contains(
            "2 agents (cluster) against one:\n  Precise vs Precise (1 agent): prefix hits "
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("(PASS: target at most 2 points lower)")
            || stdout.contains("(MISS: target at most 2 points lower)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  Precise vs Precise (1 agent): p90 TTFT ")
            && (stdout.contains("(PASS: target at most 1.10x)")
                || stdout.contains("(MISS: target at most 1.10x)")),
        "{stdout}"
    );
    // Progress on stderr, as plain lines (not a terminal): each phase and its end, and the
    // cluster formed before the precise row's requests.
    let phases: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| format!("[{}/3] {r}", i + 1))
        .collect();
    for phase in &phases {
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

    assert!(
        stderr.contains("  cluster: 2 agents converged "),
        "{stderr}"
    );

    // Each agent logged its start into its own file.
    for (role, count) in [
        ("agent-round-robin", 2),
        ("agent-precise", 2),
        ("agent-precise-central", 1),
    ] {
        for n in 0..count {
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
    assert!(!logs.join("agent-precise-central-1.log").exists());
    assert!(logs.join("bench.log").is_file());
    let json: serde_json::Value = serde_json::from_str(&read(&out.join("compare.json"))).unwrap();
    let names: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names, rows, "{json}");
    // Users are pinned to agents: 4 users, 2 agents (the central row: all through one).
    let per_agent: Vec<&serde_json::Value> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["requests_per_agent"])
        .collect();
    assert_eq!(
        per_agent,
        [
            &serde_json::json!([2, 2]),
            &serde_json::json!([2, 2]),
            &serde_json::json!([4])
        ],
        "{json}"
    );
    check_cluster(&json[1]["cluster"], &logs);
    // Only the cluster row has cluster agents.
    assert!(
        json[0].get("cluster").is_none() && json[2].get("cluster").is_none(),
        "{json}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// Issue #20's test 6: the intercepted row's clients are processes in pod network namespaces
/// and cgroups of the row's own, dialling the Service VIP, and each node's agent accepted
/// their connections from interception — from the pod's address (which exists only on the
/// row's pod network) and the pod's cgroup id (its log) —, every request answered; the row
/// leaves no namespace, cgroup or pin directory behind.
#[test]
fn compare_intercepted_row_runs_its_clients_in_pod_namespaces() {
    let test = "compare_intercepted_row_runs_its_clients_in_pod_namespaces";
    if !gate::bpf_available(test) {
        return;
    }
    let rows = ["Precise", "Precise (eBPF intercept)"];
    let out = std::env::temp_dir().join(format!(
        "warmpath-bench-compare-ebpf-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    // 2 groups x 2 users x 2 rounds = 8 requests per row, through 2 agents (two nodes).
    let argv = [
        "bench",
        "compare",
        "--out",
        &out.display().to_string(),
        "--policies",
        "precise",
        "--central",
        "off",
        "--agents",
        "2",
        "--replicas",
        "2",
        "--peers",
        "none",
        "--ebpf",
        "on",
        "--groups",
        "2",
        "--users",
        "2",
        "--rounds",
        "2",
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
    let output = bench(&argv);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    for policy in rows {
        assert!(
            stdout.contains(&format!("\n| {policy} | 8 | 0 | ")),
            "{policy}: {stdout}"
        );
    }
    assert!(
        stderr.contains("  eBPF: clients in 2 pod namespaces; "),
        "{stderr}"
    );
    let logs = out.join("logs");
    let json: serde_json::Value = serde_json::from_str(&read(&out.join("compare.json"))).unwrap();
    let row = &json[1];
    assert_eq!(row["policy"], rows[1], "{json}");
    // On cluster mode like the Precise row, users pinned to nodes.
    assert_eq!(row["cluster"].as_array().map(Vec::len), Some(2), "{row}");
    assert_eq!(
        row["requests_per_agent"],
        serde_json::json!([4, 4]),
        "{row}"
    );
    let intercept = &row["intercept"];
    assert_eq!(intercept["vip"], "10.96.0.10:8000", "{intercept}");
    assert_eq!(intercept["node_address"], "10.232.0.1", "{intercept}");
    let pods = intercept["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 2, "{intercept}");
    for (k, pod) in pods.iter().enumerate() {
        let address = format!("10.232.0.{}", k + 2);
        assert_eq!(pod["address"], address, "{pod}");
        assert_eq!(pod["requests"], 4, "{pod}");
        assert_eq!(pod["intercepted_other"], 0, "{pod}");
        let id = pod["cgroup_id"].as_u64().unwrap();
        let cgroup = pod["cgroup"].as_str().unwrap();
        assert!(cgroup.ends_with(&format!("/pod{k}")), "{pod}");
        // The agent's own word: it attached to this pod's cgroup, and every connection it
        // accepted from interception came from this pod's address and cgroup, to the VIP.
        let path = logs.join(format!("agent-precise-ebpf-{k}.log"));
        let text = read(&path);
        assert!(
            text.lines()
                .any(|l| l.contains("interception attached") && l.contains(cgroup)),
            "{}:\n{text}",
            path.display()
        );
        let accepted: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("intercepted connection"))
            .collect();
        assert!(!accepted.is_empty(), "{}:\n{text}", path.display());
        assert_eq!(pod["intercepted"], accepted.len(), "{pod}");
        let (peer, cgroup_id) = (format!("peer={address}:"), format!("cgroup_id={id}"));
        for line in &accepted {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert!(
                words.iter().any(|w| w.starts_with(&peer))
                    && words.contains(&"vip=10.96.0.10:8000")
                    && words.contains(&cgroup_id.as_str()),
                "{line}"
            );
        }
        assert!(
            logs.join(format!("client-precise-ebpf-{k}.log")).is_file(),
            "{k}"
        );
    }
    assert_left_nothing(intercept);
    std::fs::remove_dir_all(&out).unwrap();
}

/// The row's namespaces, cgroups and pin directories are gone.
fn assert_left_nothing(intercept: &serde_json::Value) {
    let listed = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    let mut names = vec![intercept["node_netns"].as_str().unwrap()];
    names.extend(
        intercept["pods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["netns"].as_str().unwrap()),
    );
    for name in names {
        assert!(
            !listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(name)),
            "{name} left:\n{listed}"
        );
    }
    let mut dirs = vec![intercept["cgroup"].as_str().unwrap()];
    dirs.extend(
        intercept["pin_dirs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap()),
    );
    for dir in dirs {
        assert!(!Path::new(dir).exists(), "{dir} left");
    }
}

/// The cluster row's two agents as their `/status` showed them when the run started: each
/// subscribed to one of the two engines itself (a different one), and replicated the other
/// from the agent subscribed to it; each agent's log says it joined with one local and one
/// remote pod.
fn check_cluster(cluster: &serde_json::Value, logs: &Path) {
    let agents = cluster.as_array().unwrap_or_else(|| panic!("{cluster}"));
    assert_eq!(agents.len(), 2, "{cluster}");
    let subscribed: Vec<String> = agents
        .iter()
        .map(|a| {
            let s = a["subscribed"].as_array().unwrap_or_else(|| panic!("{a}"));
            assert_eq!(s.len(), 1, "{cluster}");
            s[0].as_str().unwrap().to_string()
        })
        .collect();
    assert_ne!(subscribed[0], subscribed[1], "{cluster}");
    for (n, a) in agents.iter().enumerate() {
        let other = 1 - n;
        assert_eq!(a["node"], format!("node-{n}"), "{cluster}");
        assert_eq!(
            a["replicated"],
            serde_json::json!({ subscribed[other].clone(): format!("node-{other}") }),
            "{cluster}"
        );
        let path = logs.join(format!("agent-precise-{n}.log"));
        let text = read(&path);
        let joined = text
            .lines()
            .find(|l| l.contains("joined the cluster"))
            .unwrap_or_else(|| panic!("{}:\n{text}", path.display()));
        assert!(
            joined.contains(&format!("node=node-{n} "))
                && joined.contains("local=1")
                && joined.contains("remote=1"),
            "{joined}"
        );
    }
}

/// Runs `warmpath-roles <argv>` as a user does ([`run`]), within [`RUN_WITHIN`].
fn bench(argv: &[String]) -> std::process::Output {
    run(env!("CARGO_BIN_EXE_warmpath-roles"), argv, RUN_WITHIN)
}

#[test]
fn matrix_runs_every_cell_and_row_and_writes_one_table() {
    let rows = ["RoundRobin", "LeastLoaded", "Precise", "Precise (1 agent)"];
    let out = std::env::temp_dir().join(format!("warmpath-bench-matrix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // Two workloads x two loads, four requests a cell (chat: 2 sessions of 3 turns would be
    // a multiple of the 2 engines, so 3 sessions, 9 requests); no peers.
    let output = bench(&matrix_argv(&out, "rag:1.0:64,chat", "0.5,1.0", &[]));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(
        stdout.starts_with("bench matrix: 2 workloads x 2 loads = 4 cells, 4 rows each (4 run)"),
        "{stdout}"
    );
    assert!(stdout.contains("min\n"), "the estimate: {stdout}");
    assert!(
        stdout.contains("| workload | load | req/s | row | answered/sent | TTFT p50 (ms) | TTFT p90 (ms) | TTFT p99 (ms) | output tok/s | prefix hit % | available % | captured % | delivered % | pred. error p50 (ms) | preempted |"),
        "{stdout}"
    );
    for (workload, sent) in [("rag:1:64", 4), ("chat", 9)] {
        for load in ["0.5x", "1x"] {
            for row in rows {
                let line = format!("| {workload} | {load} | ");
                let found = stdout
                    .lines()
                    .find(|l| l.starts_with(&line) && l.contains(&format!(" | {row} | ")))
                    .unwrap_or_else(|| panic!("{workload} {load} {row}: {stdout}"));
                assert!(
                    found.contains(&format!(" | {row} | {sent}/{sent} | ")),
                    "{found}"
                );
                // 15 columns, every one filled (receipts: the agents sent their headers), the
                // last a count of preemptions.
                let cols: Vec<&str> = found.trim_matches('|').split(" | ").collect();
                assert_eq!(cols.len(), 15, "{found}");
                assert!(cols[..13].iter().all(|c| c.trim() != "-"), "{found}");
                assert!(cols[14].trim().parse::<u64>().is_ok(), "{found}");
            }
        }
    }
    // No peer ran: the peer targets against the stand-in, said so.
    assert!(
        stdout.contains("Precise: p50 <= 1.05x best non-warmpath row (stand-in: no peer ran): "),
        "{stdout}"
    );
    assert!(
        stdout.contains(" PASS, ")
            && stdout.contains(" MISS (")
            && stdout.contains(" of them below the cell's floor: out of any router's reach; ")
            && stdout.contains(
                " beyond every row measured: the fewest cold answers and the fastest answers of any row, combined, do not meet them; "
            )
            && stdout.contains(
                " with the limit inside their 95 % interval: another draw of the cell could pass them)\n"
            ),
        "{stdout}"
    );
    // Each cell's floor: its line in the table, TTFT only.
    for workload in ["rag:1:64", "chat"] {
        for load in ["0.5x", "1x"] {
            let line = format!("| {workload} | {load} | ");
            let floor = stdout
                .lines()
                .find(|l| l.starts_with(&line) && l.contains(" | Floor (any router) | - | "))
                .unwrap_or_else(|| panic!("{workload} {load} floor: {stdout}"));
            let cols: Vec<&str> = floor.trim_matches('|').split(" | ").collect();
            assert_eq!(cols.len(), 15, "{floor}");
        }
    }
    for name in ["matrix.md", "matrix.json"] {
        let line = format!("results: {}", out.join(name).display());
        assert!(stdout.contains(&line), "{line}: {stdout}");
    }
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !text.lines().any(|l| l.contains(" INFO ")),
            "{name}: {text}"
        );
    }
    let md = read(&out.join("matrix.md"));
    assert!(stdout.contains(&md), "matrix.md is the printed report");

    let json: serde_json::Value = serde_json::from_str(&read(&out.join("matrix.json"))).unwrap();
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4, "{json}");
    for cell in cells {
        let sent = cell["requests"].as_u64().unwrap();
        assert!(cell["blocks_per_engine"].as_u64().unwrap() >= 2, "{cell}");
        let names: Vec<&str> = cell["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, rows, "{cell}");
        // The floor is above zero, and no row's TTFT quantile is under it: a real run only
        // adds to a lone prefill of each request's new tokens.
        let floor = |q: &str| {
            cell["floor"][q]
                .as_f64()
                .unwrap_or_else(|| panic!("{q}: {cell}"))
        };
        assert!(floor("ttft_p50") > 0.0, "{cell}");
        for r in cell["rows"].as_array().unwrap() {
            for q in ["ttft_p50", "ttft_p90", "ttft_p99"] {
                let measured = r["result"][q].as_f64().unwrap();
                assert!(measured >= floor(q), "{q} below the floor: {r} / {cell}");
            }
        }
        for r in cell["rows"].as_array().unwrap() {
            let x = &r["result"];
            let n = |k: &str| x[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
            assert_eq!(r["status"], "ok", "{r}");
            assert_eq!((n("requests"), n("errors")), (sent as f64, 0.0), "{r}");
            assert!((0.0..=1.0).contains(&n("prefix_hit_ratio")), "{r}");
            assert!(0.0 < n("ttft_p50") && n("ttft_p50") <= n("ttft_p90"), "{r}");
            assert!(
                n("ttft_p90") <= n("ttft_p99") && n("output_tokens_per_s") > 0.0,
                "{r}"
            );
            // Receipts: captured never exceeds available; delivered at most the prompts.
            assert!(n("captured_tokens") <= n("available_tokens"), "{r}");
            assert!(n("delivered_tokens") <= n("prompt_tokens"), "{r}");
        }
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// A matrix row's `tail` in `matrix.json`: every one of its `answered` in one class, at
/// least one in the slowest tenth, and none a miss without receipt (a warmpath row sends
/// its receipts).
fn assert_tail_counts_every_answer(r: &serde_json::Value, answered: u64) {
    let class = |c: &str, k: &str| {
        r["tail"][c][k]
            .as_u64()
            .unwrap_or_else(|| panic!("{c}: {r}"))
    };
    let classes = ["hit", "lost_waiting", "not_taken", "held_nowhere", "miss"];
    let sum = |k: &str| classes.iter().map(|c| class(c, k)).sum::<u64>();
    assert_eq!(sum("all"), answered, "{r}");
    assert!((1..=answered).contains(&sum("slowest")), "{r}");
    assert_eq!(class("miss", "all"), 0, "{r}");
    assert!(
        class("router_hold", "slowest") <= class("router_hold", "all"),
        "{r}"
    );
}

#[test]
fn matrix_repeats_pool_each_rows_runs() {
    let out = std::env::temp_dir().join(format!(
        "warmpath-bench-matrix-repeats-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    // One cell of four requests, run on seeds 7 and 8: every row answers 2 x 4.
    let output = bench(&matrix_argv(&out, "rag:1.0:64", "1.0", &["--repeats", "2"]));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(
            "seeds 7-8, 4 requests per cell x 2 runs (each row's figures pool its runs' answers)"
        ),
        "{stdout}"
    );
    for row in ["RoundRobin", "LeastLoaded", "Precise", "Precise (1 agent)"] {
        let found = stdout
            .lines()
            .find(|l| l.starts_with("| rag:1:64 | 1x | ") && l.contains(&format!(" | {row} | ")))
            .unwrap_or_else(|| panic!("{row}: {stdout}"));
        assert!(found.contains(&format!(" | {row} | 8/8 | ")), "{found}");
    }
    let json: serde_json::Value = serde_json::from_str(&read(&out.join("matrix.json"))).unwrap();
    assert_eq!(json["settings"]["repeats"], 2, "{json}");
    let cell = &json["cells"][0];
    assert_eq!(cell["requests"], 8, "{cell}");
    for r in cell["rows"].as_array().unwrap() {
        assert_eq!(r["result"]["requests"], 8, "{r}");
        let agents: u64 = r["result"]["requests_per_agent"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(agents, 8, "{r}");
        assert_tail_counts_every_answer(r, 8);
    }
    assert!(
        stdout.contains("| workload | load | row | slowest | hit | lost waiting | not taken | held nowhere | miss (no receipt) | router hold |"),
        "{stdout}"
    );
    // requests.jsonl: each row's four answers of each run, under that run's seed, with the
    // cached tokens the engine reported; the table's answered count is these lines'.
    let lines: Vec<serde_json::Value> = read(&out.join("requests.jsonl"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert_eq!(lines.len(), 4 * 2 * 4, "{lines:?}");
    for row in ["RoundRobin", "LeastLoaded", "Precise", "Precise (1 agent)"] {
        for (run, seed) in [(0, 7), (1, 8)] {
            let of_run: Vec<_> = lines
                .iter()
                .filter(|l| l["row"] == row && l["run"] == run)
                .collect();
            assert_eq!(of_run.len(), 4, "{row} run {run}: {lines:?}");
            // RAG: every request is a user (a chain) of its own, numbered in plan order.
            let mut sessions: Vec<u64> = of_run
                .iter()
                .map(|l| l["session"].as_u64().unwrap_or_else(|| panic!("{l}")))
                .collect();
            sessions.sort_unstable();
            assert_eq!(sessions, [0, 1, 2, 3], "{row} run {run}: {of_run:?}");
            // Sent at: wall seconds from the run's start, in the order they were sent.
            let sent: Vec<f64> = of_run
                .iter()
                .map(|l| l["start"].as_f64().unwrap())
                .collect();
            assert!(
                sent.windows(2).all(|w| w[0] <= w[1]) && sent[0] >= 0.0 && sent[3] > 0.0,
                "{row} run {run}: {sent:?}"
            );
            for l in of_run {
                assert_eq!(l["workload"], "rag:1:64", "{l}");
                assert_eq!(l["load"], 1.0, "{l}");
                assert_eq!(l["seed"], seed, "{l}");
                assert_eq!(l["ok"], true, "{l}");
                assert!(l["ttft"].as_f64().unwrap() > 0.0, "{l}");
                let (prompt, cached) = (l["prompt_tokens"].as_u64(), l["cached_tokens"].as_u64());
                assert!(
                    prompt.unwrap() > 0 && cached.unwrap() <= prompt.unwrap(),
                    "{l}"
                );
                // The engine the agent chose, from its explain header: a simulator on loopback.
                let pod: std::net::SocketAddr = l["pod"].as_str().unwrap().parse().unwrap();
                assert!(pod.ip().is_loopback(), "{l}");
            }
        }
    }
    // Each row's figures per run beside the pooled ones: a run's TTFT quantiles lie within
    // that run's answers (requests.jsonl, wall seconds; the table's are over the time scale).
    for r in cell["rows"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap();
        let runs = r["runs"].as_array().unwrap_or_else(|| panic!("{r}"));
        assert_eq!(runs.len(), 2, "{r}");
        for (run, figures) in runs.iter().enumerate() {
            let ttfts: Vec<f64> = lines
                .iter()
                .filter(|l| l["row"] == name && l["run"] == run)
                .map(|l| l["ttft"].as_f64().unwrap() / 0.05)
                .collect();
            let (lo, hi) = ttfts
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), t| (lo.min(*t), hi.max(*t)));
            for q in ["ttft_p50", "ttft_p90", "ttft_p99"] {
                let v = figures[q].as_f64().unwrap();
                assert!(
                    v >= lo * 0.999 && v <= hi * 1.001,
                    "{name} run {run} {q} {v} outside {ttfts:?}"
                );
            }
            assert!(
                figures["output_tokens_per_s"].as_f64().unwrap() > 0.0,
                "{r}"
            );
        }
    }
    // Every verdict says how it fared in each run.
    let verdicts = json["targets"][0]["verdicts"].as_array().unwrap();
    assert!(verdicts.len() >= 8, "two rows judged: {verdicts:?}");
    for v in verdicts {
        assert_eq!(v["by_run"].as_array().map(Vec::len), Some(2), "{v}");
        assert!(v["detail"].as_str().unwrap().contains("; by run "), "{v}");
    }
    // Every TTFT verdict carries a 95 % interval of its ratio, within what the answers allow
    // (the row's slowest answer over the references' fastest, and its fastest over their
    // slowest), and is `within_noise` exactly when its limit lies inside the interval and
    // within reach; throughput has none.
    let answers_of = |rows: &[&str]| -> (f64, f64) {
        lines
            .iter()
            .filter(|l| rows.iter().any(|r| l["row"] == *r))
            .map(|l| l["ttft"].as_f64().unwrap())
            .fold((f64::MAX, 0.0f64), |(lo, hi), t| (lo.min(t), hi.max(t)))
    };
    let (refs_lo, refs_hi) = answers_of(&["RoundRobin", "LeastLoaded"]);
    for v in verdicts {
        let target = v["target"].as_str().unwrap();
        if target.starts_with("throughput") {
            assert!(v.get("interval_95").is_none(), "{v}");
            continue;
        }
        let (me_lo, me_hi) = answers_of(&[v["row"].as_str().unwrap()]);
        let interval = v["interval_95"].as_array().unwrap_or_else(|| panic!("{v}"));
        let (lo, hi) = (interval[0].as_f64().unwrap(), interval[1].as_f64().unwrap());
        assert!(
            me_lo / refs_hi * 0.999 <= lo && lo <= hi && hi <= me_hi / refs_lo * 1.001,
            "{v}"
        );
        let limit: f64 = target
            .split("<= ")
            .nth(1)
            .and_then(|t| t.split('x').next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{target}"));
        // Every request was answered; a target below the floor is decided on any draw.
        let inside = lo <= limit && limit <= hi && v["out_of_reach"] == false;
        assert_eq!(v["within_noise"], inside, "{v}");
        assert!(
            v["detail"].as_str().unwrap().contains("; 95 % interval "),
            "{v}"
        );
    }
    // The four agents' p90 in each run against that run's best of round-robin and
    // least-loaded (no peer ran: the stand-in).
    let runs_of = |name: &str| -> Vec<f64> {
        let row = cell["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {cell}"));
        row["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["ttft_p90"].as_f64().unwrap())
            .collect()
    };
    let (me, rr, ll) = (
        runs_of("Precise"),
        runs_of("RoundRobin"),
        runs_of("LeastLoaded"),
    );
    let p90 = verdicts
        .iter()
        .find(|v| {
            v["row"] == "Precise"
                && v["target"] == "p90 <= 1.05x best non-warmpath row (stand-in: no peer ran)"
        })
        .unwrap_or_else(|| panic!("{verdicts:?}"));
    for run in 0..2 {
        let want = me[run] / rr[run].min(ll[run]);
        let got = p90["by_run"][run].as_f64().unwrap();
        assert!((got - want).abs() < 1e-9, "run {run}: {got} vs {want}");
    }
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn matrix_floor_only_prints_each_cells_floor_and_runs_nothing() {
    let out = std::env::temp_dir().join(format!(
        "warmpath-bench-matrix-floor-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let output = bench(&matrix_argv(
        &out,
        "rag:1.0:64,no-sharing",
        "0.5,1.0",
        &["--floor-only"],
    ));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.starts_with(
            "| workload | load | req/s | requests | floor p50 (ms) | floor p90 (ms) | floor p99 (ms) |"
        ),
        "{stdout}"
    );
    for cell in [
        "| rag:1:64 | 0.5x | ",
        "| rag:1:64 | 1x | ",
        "| no-sharing | 0.5x | ",
        "| no-sharing | 1x | ",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(cell))
            .unwrap_or_else(|| panic!("{cell}: {stdout}"));
        let cols: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        assert_eq!(cols.len(), 7, "{line}");
        assert_eq!(cols[3].trim(), "4", "four requests a cell: {line}");
        let ms: Vec<f64> = cols[4..]
            .iter()
            .map(|c| c.trim().parse().unwrap())
            .collect();
        assert!(ms[0] > 0.0 && ms[0] <= ms[1] && ms[1] <= ms[2], "{line}");
    }
    assert!(!out.exists(), "--floor-only writes nothing");
}
