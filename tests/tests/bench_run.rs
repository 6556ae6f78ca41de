//! `warmpath bench run` end to end: a seeded multi-turn workload with a tenant mix, closed
//! loop, against the routing proxy in front of a simulator fleet; the JSON report and charts.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use clap::Parser;
use warmpath_bench::BenchCommand;
use warmpath_e2e::{agent::proxy, sim::Fleet};
use warmpath_sim::engine::timing::{Profile, StepWork};

/// `warmpath bench ...` as the binary parses it.
#[derive(Debug, Parser)]
struct Bench {
    #[command(subcommand)]
    command: BenchCommand,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_turn_run_reports_every_request_per_tenant() {
    let fleet = Fleet::tiny(2, &[]).await;
    let routing = proxy(&fleet, &["--trust-tenant-header-from", "127.0.0.1"]).await;
    let dir = std::env::temp_dir().join(format!("warmpath-bench-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("run.json");
    let stem = dir.join("run");
    let metrics: Vec<String> = (0..2)
        .map(|i| format!("{}/metrics", fleet.url(i)))
        .collect();
    let mut argv = vec![
        "bench".to_string(),
        "run".into(),
        "--target".into(),
        format!("http://{}", routing.listen),
        "--workload".into(),
        "multi-turn".into(),
        "--sessions".into(),
        "6".into(),
        "--turns".into(),
        "3".into(),
        "--system-tokens".into(),
        "300".into(),
        "--question-tokens".into(),
        "20".into(),
        "--output-tokens".into(),
        "8".into(),
        "--think-seconds".into(),
        "0.01".into(),
        "--concurrency".into(),
        "3".into(),
        "--tenants".into(),
        "a=2,b=1".into(),
        "--max-seconds".into(),
        "60".into(),
        "--json".into(),
        json.display().to_string(),
        "--chart".into(),
        stem.display().to_string(),
    ];
    for m in &metrics {
        argv.extend(["--engine-metrics".into(), m.clone()]);
    }
    let Bench {
        command: BenchCommand::Run(args),
    } = Bench::try_parse_from(argv).unwrap()
    else {
        unreachable!()
    };
    warmpath_bench::run::run(*args).await.unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let overall = &v["report"]["overall"];
    assert_eq!(overall["requests"], 18, "{overall}");
    assert_eq!(overall["errors"], 0);
    // Later turns re-send the conversation so far: the engines serve it from cache.
    assert!(
        overall["prefix_hit_ratio"].as_f64().unwrap() > 0.3,
        "{overall}"
    );
    assert!(v["report"]["engine_prefix_hit_ratio"].as_f64().unwrap() > 0.3);
    let tenants = v["report"]["tenants"].as_object().unwrap();
    assert_eq!(tenants.len(), 2);
    let per_tenant: u64 = tenants
        .values()
        .map(|t| t["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(per_tenant, 18);
    let samples = v["samples"].as_array().unwrap();
    assert!(samples.iter().all(|s| s["output_tokens"] == 8));
    // The proxy attributed the same requests to the same tenants (trusted header).
    let prom = reqwest::get(format!("http://{}/metrics", routing.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (t, s) in tenants {
        let line = prom
            .lines()
            .find(|l| {
                l.starts_with("warmpath_requests_total{")
                    && l.contains(&format!("tenant=\"{t}\""))
                    && l.contains("outcome=\"ok\"")
            })
            .unwrap_or_else(|| panic!("no series for tenant {t}: {prom}"));
        assert!(line.ends_with(&format!(" {}", s["requests"])), "{line}");
    }
    // Route receipts: every sample read the agent's explain headers, and the samples' sums
    // equal the agent's receipt counters (delivered: the engines' cached_tokens).
    let counter = |name: &str| -> u64 {
        prom.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let summed = |k: &str| samples.iter().map(|s| s[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(
        summed("available_tokens"),
        counter("warmpath_receipt_available_tokens_total")
    );
    assert_eq!(
        summed("captured_tokens"),
        counter("warmpath_receipt_captured_tokens_total")
    );
    assert_eq!(
        summed("cached_tokens"),
        counter("warmpath_receipt_delivered_tokens_total")
    );
    let receipts = &overall["receipts"];
    assert_eq!(receipts["requests"], 18, "{overall}");
    assert!(
        receipts["captured_pct"].as_f64().unwrap() > 0.0
            && receipts["available_pct"].as_f64() >= receipts["captured_pct"].as_f64(),
        "{overall}"
    );
    for ext in ["svg", "png"] {
        assert!(dir.join(format!("run-ttft-cdf.{ext}")).is_file());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--no-stream`: whole answers through the proxy, each request counted with its usage. Its
/// TTFT (the whole answer) is bounded by what the client cannot beat: from below by the
/// simulator's modelled time for generating the answer at the flags' profile and time scale,
/// from above by the run's wall time as the test measures it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streaming_run_counts_whole_answers() {
    const PROFILE: &str = "tiny";
    const TIME_SCALE: f64 = 20.0;
    const OUTPUT_TOKENS: u64 = 5;
    let time_scale = TIME_SCALE.to_string();
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--profile",
        PROFILE,
        "--time-scale",
        &time_scale,
    ])
    .await;
    let routing = proxy(&fleet, &[]).await;
    let json = std::env::temp_dir().join(format!(
        "warmpath-bench-run-whole-{}.json",
        std::process::id()
    ));
    let output_tokens = OUTPUT_TOKENS.to_string();
    let argv = [
        "bench",
        "run",
        "--no-stream",
        "--target",
        &format!("http://{}", routing.listen),
        "--groups",
        "2",
        "--users",
        "3",
        "--rounds",
        "2",
        "--system-tokens",
        "64",
        "--question-tokens",
        "8",
        "--output-tokens",
        &output_tokens,
        "--concurrency",
        "4",
        "--max-seconds",
        "60",
        "--json",
        &json.display().to_string(),
    ];
    let Bench {
        command: BenchCommand::Run(args),
    } = Bench::try_parse_from(argv).unwrap()
    else {
        unreachable!()
    };
    let started = std::time::Instant::now();
    warmpath_bench::run::run(*args).await.unwrap();
    let wall = started.elapsed().as_secs_f64();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    let overall = &v["report"]["overall"];
    assert_eq!(overall["requests"], 12, "{overall}");
    assert_eq!(overall["errors"], 0, "{overall}");
    // After the step that yields the first token, each further token takes one decode step
    // of at least the profile's one-sequence decode time; wall time is modelled time times
    // the scale, less the under-a-millisecond sleeps the engine batches. Half of that is the
    // floor: the engine's clock is absolute while it is busy, so time a stalled (loaded)
    // machine took from one request is made up in the steps of the next.
    let decode_step = Profile::by_name(PROFILE)
        .unwrap()
        .step_time(&StepWork {
            decode_seqs: 1,
            ..Default::default()
        })
        .as_secs_f64();
    let floor = 0.5 * ((OUTPUT_TOKENS - 1) as f64 * decode_step * TIME_SCALE - 0.001);
    for s in v["samples"].as_array().unwrap() {
        assert_eq!(s["output_tokens"], OUTPUT_TOKENS, "{s}");
        assert!(s["prompt_tokens"].as_u64().unwrap() >= 64, "{s}");
        let (ttft, e2e) = (s["ttft"].as_f64().unwrap(), s["e2e"].as_f64().unwrap());
        assert!(
            ttft >= floor,
            "TTFT {ttft} s under the modelled {floor} s: {s}"
        );
        assert!(ttft <= e2e && e2e <= wall, "e2e {e2e} s, run {wall} s: {s}");
    }
}

/// `warmpath bench compare` end to end on a small shared-prefix workload: two policies, each
/// in front of its own fresh fleet, through two agent processes; the JSON rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comparison_runs_every_policy_through_every_agent() {
    let dir = std::env::temp_dir().join(format!("warmpath-bench-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("compare.json");
    let argv = [
        "bench",
        "compare",
        "--groups",
        "3",
        "--users",
        "4",
        "--rounds",
        "2",
        "--system-tokens",
        "256",
        "--question-tokens",
        "16",
        "--output-tokens",
        "4",
        "--rate",
        "40",
        "--replicas",
        "2",
        "--num-gpu-blocks",
        "256",
        "--profile",
        "tiny",
        "--time-scale",
        "1",
        "--agents",
        "2",
        "--policies",
        "round-robin,precise",
        // The central precise row has its own test (bench_compare.rs).
        "--central",
        "off",
        "--peers",
        "none",
        "--ebpf",
        "off",
        "--max-seconds",
        "60",
        "--json",
        json.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ];
    // A process of its own, as a user runs it: compare starts its agents as `warmpath
    // agent` processes of the binary it runs in.
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-roles"))
        .args(argv)
        .kill_on_drop(true)
        .stdin(std::process::Stdio::null())
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(240), run)
        .await
        .expect("bench compare finished in time")
        .unwrap();
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["RoundRobin", "Precise"]);
    for r in &rows {
        assert_eq!(r["requests"], 24, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        // Users are pinned to agents: 12 users over 2 agents, 2 questions each.
        assert_eq!(r["requests_per_agent"], serde_json::json!([12, 12]), "{r}");
        let (p50, p90) = (
            r["ttft_p50"].as_f64().unwrap(),
            r["ttft_p90"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p50 <= p90, "{r}");
    }
    // Three groups of 16 shared blocks (of ~19 per prompt): even if each agent's first
    // request of each group were cold (6 of 24), precise serves the rest from cache.
    assert!(
        rows[1]["prefix_hit_ratio"].as_f64().unwrap() > 0.4,
        "{}",
        rows[1]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
