//! `warmpath bench matrix --workloads mooncake:FILE` as a user runs it: a request trace in
//! the Mooncake format replayed on a fleet, every row answering each line; a bad line named.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use warmpath_e2e::bench_cli::{matrix_argv, read, run};

/// The whole run, start-up of the debug agents included, on a loaded 2-core machine.
const RUN_WITHIN: Duration = Duration::from_secs(240);

fn bench(argv: &[String]) -> std::process::Output {
    run(env!("CARGO_BIN_EXE_warmpath-roles"), argv, RUN_WITHIN)
}

#[test]
fn matrix_replays_a_mooncake_trace() {
    let out = std::env::temp_dir().join(format!(
        "warmpath-bench-matrix-trace-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    // Four requests in Mooncake's format: the second and fourth extend the first's two
    // blocks, the third shares nothing; two arrive at one instant.
    let trace = out.join("trace.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 40, \"hash_ids\": [1, 2, 3]}\n\
         {\"timestamp\": 1000, \"input_length\": 1500, \"output_length\": 80, \"hash_ids\": [1, 2, 4]}\n\
         {\"timestamp\": 1000, \"input_length\": 300, \"output_length\": 8, \"hash_ids\": [5]}\n\
         {\"timestamp\": 2500, \"input_length\": 2000, \"output_length\": 1, \"hash_ids\": [1, 2, 6, 7]}\n",
    )
    .unwrap();
    let workload = format!("mooncake:{}", trace.display());
    let results = out.join("results");
    let output = bench(&matrix_argv(
        &results,
        &workload,
        "1.0",
        &["--trace-block-tokens", "32"],
    ));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    for row in ["RoundRobin", "LeastLoaded", "Precise", "Precise (1 agent)"] {
        let line = format!("| {workload} | 1x | ");
        let found = stdout
            .lines()
            .find(|l| l.starts_with(&line) && l.contains(&format!(" | {row} | ")))
            .unwrap_or_else(|| panic!("{row}: {stdout}"));
        assert!(found.contains(&format!(" | {row} | 4/4 | ")), "{found}");
    }
    // Prompts as the blocks shrink them: 1100 tokens of 512-token blocks at 32 a block are
    // 32 + 32 + ceil(76 x 32 / 512) = 69 tokens, 1500: 94, 300: 19, 2000: 125 (the built-in
    // tokenizer counts within a few tokens of that, BOS included); answers alike, at least
    // one: 3, 5, 1, 1.
    let json: serde_json::Value =
        serde_json::from_str(&read(&results.join("matrix.json"))).unwrap();
    let rows = json["cells"][0]["rows"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["status"] == "ok"), "{rows:?}");
    let lines: Vec<serde_json::Value> = read(&results.join("requests.jsonl"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l["row"] == "RoundRobin")
        .collect();
    let mut sizes: Vec<(u64, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["prompt_tokens"].as_u64().unwrap(),
                l["output_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes.len(), 4, "{sizes:?}");
    let want = [(19, 1), (69, 3), (94, 5), (125, 1)];
    for ((got, out), (tokens, answer)) in sizes.iter().zip(want) {
        assert!(got.abs_diff(tokens) <= 6 && *out == answer, "{sizes:?}");
    }
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_trace_line_whose_ids_do_not_cover_its_prompt_is_named_before_anything_runs() {
    let out = std::env::temp_dir().join(format!(
        "warmpath-bench-matrix-bad-trace-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let trace = out.join("trace.jsonl");
    let workload = format!("mooncake:{}", trace.display());
    let results = out.join("results");
    // Two ids for 1100 tokens of 512-token blocks (three needed).
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 40, \"hash_ids\": [1, 2]}\n",
    )
    .unwrap();
    let output = bench(&matrix_argv(&results, &workload, "1.0", &[]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("request 1 (in time order): 2 ids for 1100 prompt tokens"),
        "{stderr}"
    );
    assert!(!results.exists(), "nothing ran");
    std::fs::remove_dir_all(&out).unwrap();
}
