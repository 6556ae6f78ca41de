//! Declarative policy end to end (docs/policy.md): an agent with `--policy-dir` in front of
//! simulator engines. Cache isolation by tenant (the engines' own `cached_tokens`), and hot
//! reload under continuous load from the bench generator: policies swapped 100 times, valid
//! and invalid alternately, no failed request, each valid version in effect within a second,
//! each invalid one rejected while the last good version serves.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use clap::Parser;
use serde_json::json;
use warmpath_bench::BenchCommand;
use warmpath_e2e::{
    agent::{start, urls},
    sim::{Fleet, get_json, wait_for},
};

/// A temporary policy directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("warmpath-policy-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    /// Writes `file` atomically (a temporary name, then rename), as tools do.
    fn write(&self, file: &str, text: &str) {
        let tmp = self.0.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.0.join(file)).unwrap();
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn client_from(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

const TENANTS: &str = r#"
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: iso-a}
spec:
  identity: {cidrs: [127.0.0.2/32]}
  cacheIsolation: isolated
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: iso-b}
spec:
  identity: {cidrs: [127.0.0.3/32]}
  cacheIsolation: isolated
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: shared-c}
spec:
  identity: {cidrs: [127.0.0.4/32]}
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: shared-d}
spec:
  identity: {cidrs: [127.0.0.5/32]}
"#;

/// The engine's `cached_tokens` for one completion of `prompt` sent from `source`.
async fn cached_tokens(base: &str, source: &str, prompt: &str) -> u64 {
    let resp = client_from(source)
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "sim-llama", "prompt": prompt, "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("usage with cached_tokens: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_tenants_never_share_cached_prefixes_and_shared_ones_do() {
    // One engine: every request lands on the same prefix cache.
    let fleet = Fleet::tiny(1, &[]).await;
    let dir = Dir::new("isolation");
    dir.write("tenants.yaml", TENANTS);
    let routing = start([
        "--endpoint".to_string(),
        fleet.url(0),
        "--kv-events".into(),
        fleet.events(0),
        "--policy-dir".into(),
        dir.path().display().to_string(),
    ])
    .await;
    let (base, _) = urls(&routing);
    let prompt =
        "The quarterly report covers revenue, costs and the outlook for next year. ".repeat(12);
    // Isolated: a tenant hits its own cache...
    assert_eq!(cached_tokens(&base, "127.0.0.2", &prompt).await, 0);
    let again = cached_tokens(&base, "127.0.0.2", &prompt).await;
    assert!(again > 0, "iso-a's second request hits its own prefix");
    // ...and never another's: the same prompt from iso-b is computed from scratch.
    assert_eq!(cached_tokens(&base, "127.0.0.3", &prompt).await, 0);
    // Nor does a shared tenant see the isolated tenants' blocks.
    assert_eq!(cached_tokens(&base, "127.0.0.4", &prompt).await, 0);
    // Shared: the second tenant hits what the first computed.
    let other = format!("{prompt} A different document entirely.");
    let other = other.replace("quarterly", "annual");
    assert_eq!(cached_tokens(&base, "127.0.0.4", &other).await, 0);
    let hit = cached_tokens(&base, "127.0.0.5", &other).await;
    assert!(hit > 0, "shared-d hits shared-c's prefix");
    // A client's own salt subdivides its tenant's cache instead of escaping it.
    let salted = client_from("127.0.0.2")
        .post(format!("{base}/v1/completions"))
        .json(
            &json!({"model": "sim-llama", "prompt": prompt, "max_tokens": 1, "cache_salt": "mine"}),
        )
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = salted.json().await.unwrap();
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{v}"
    );
}

/// Version `n` of the policy under reload: valid for even `n` (weights that change with
/// `n`), invalid for odd `n` (a scorer that does not exist).
fn version(n: usize) -> String {
    let weight = if n.is_multiple_of(2) {
        format!("queue: {}", 1 + n)
    } else {
        format!("warp-drive: {n}")
    };
    format!(
        r#"apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {{name: swapped, namespace: ml}}
spec:
  targetRef: {{pool: {{name: default}}}}
  action:
    explain: true
    weights: {{{weight}}}
"#
    )
}

/// `x-warmpath-policy` of one probe request.
async fn policy_header(client: &reqwest::Client, base: &str) -> String {
    let resp = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "sim-llama", "prompt": "probe", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.headers()
        .get("x-warmpath-policy")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[derive(Debug, Parser)]
struct Bench {
    #[command(subcommand)]
    command: BenchCommand,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_swapped_under_load_drop_no_request_and_take_effect_within_a_second() {
    let fleet = Fleet::tiny(2, &[]).await;
    let dir = Dir::new("reload");
    dir.write("policy.yaml", &version(0));
    let mut flags = vec!["--policy-dir".to_string(), dir.path().display().to_string()];
    for i in 0..2 {
        flags.extend([
            "--endpoint".into(),
            fleet.url(i),
            "--kv-events".into(),
            fleet.events(i),
        ]);
    }
    let routing = start(flags).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    assert_eq!(policy_header(&client, &base).await, "ml/swapped@1");

    // Continuous load: the bench generator, closed loop, run after run until the swaps are
    // done (each run bounded in requests, the whole in runs), every report kept.
    let out = Dir::new("reload-bench");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (base, out, done) = (base.clone(), out.path().to_path_buf(), done.clone());
        tokio::spawn(async move {
            let mut reports = Vec::new();
            for run in 0..500 {
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let json = out.join(format!("run-{run}.json"));
                let argv = [
                    "bench",
                    "run",
                    "--target",
                    &base,
                    "--workload",
                    "multi-turn",
                    "--sessions",
                    "6",
                    "--turns",
                    "6",
                    "--system-tokens",
                    "200",
                    "--question-tokens",
                    "20",
                    "--output-tokens",
                    "4",
                    "--think-seconds",
                    "0.002",
                    "--concurrency",
                    "4",
                    "--seed",
                    &run.to_string(),
                    "--json",
                    &json.display().to_string(),
                ];
                let Bench {
                    command: BenchCommand::Run(args),
                } = Bench::try_parse_from(argv).unwrap()
                else {
                    unreachable!()
                };
                warmpath_bench::run::run(*args).await.unwrap();
                let v: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
                reports.push(v["report"]["overall"].clone());
            }
            reports
        })
    };

    // Every version read is a generation (version n is generation n + 1), valid or not.
    let mut slowest = Duration::ZERO;
    for n in 1..=100 {
        dir.write("policy.yaml", &version(n));
        let started = Instant::now();
        let generation = n as i64 + 1;
        if n.is_multiple_of(2) {
            let want = format!("ml/swapped@{generation}");
            loop {
                if policy_header(&client, &base).await == want {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "version {n} never took effect"
                );
                tokio::task::yield_now().await;
            }
            slowest = slowest.max(started.elapsed());
        } else {
            // Rejected: the agent says so, and the last good version keeps serving.
            loop {
                let status = get_json(&client, &format!("{admin}/status")).await;
                let obj = &status["policies"]["objects"][0];
                if obj["serving"] == format!("last good (generation {})", generation - 1)
                    && obj["observed_generation"].as_i64() == Some(generation)
                {
                    let accepted = &obj["conditions"][0];
                    assert_eq!(accepted["status"], "False", "{obj}");
                    assert!(
                        accepted["message"].as_str().unwrap().contains("warp-drive"),
                        "{obj}"
                    );
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "version {n} was never reported: {}",
                    status["policies"]
                );
                tokio::task::yield_now().await;
            }
            assert_eq!(
                policy_header(&client, &base).await,
                format!("ml/swapped@{}", generation - 1)
            );
        }
    }
    eprintln!("slowest reload to take effect: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(1),
        "a valid version took {slowest:?} to take effect"
    );
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let reports = load.await.unwrap();
    let requests: u64 = reports
        .iter()
        .map(|r| r["requests"].as_u64().unwrap())
        .sum();
    let errors: u64 = reports.iter().map(|r| r["errors"].as_u64().unwrap()).sum();
    assert!(
        reports.len() >= 2 && requests >= 72,
        "the load ran throughout ({} runs, {requests} requests)",
        reports.len()
    );
    assert_eq!(
        errors, 0,
        "no request failed during 100 reloads: {reports:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_sends_its_share_to_the_other_pool_with_that_pools_model() {
    let a = Fleet::start(&["--port", "0", "--profile", "tiny", "--model", "sim-a"]).await;
    let b = Fleet::start(&["--port", "0", "--profile", "tiny", "--model", "sim-b"]).await;
    let dir = Dir::new("split");
    dir.write(
        "split.yaml",
        r#"apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: half-to-b, namespace: ml}
spec:
  targetRef: {pool: {name: a}}
  action:
    explain: true
    split:
    - {pool: a, weight: 1}
    - {pool: b, weight: 1}
"#,
    );
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "version: 1\nlisten: 127.0.0.1:0\nadmin: 127.0.0.1:0\npolicyDir: {}\npools:\n- {{name: a, model: sim-a, endpoints: [{{url: '{}'}}]}}\n- {{name: b, model: sim-b, endpoints: [{{url: '{}'}}]}}\n",
            dir.path().display(),
            a.url(0),
            b.url(0)
        ),
    )
    .unwrap();
    let args = <warmpath_agent::args::AgentArgs as clap::Parser>::try_parse_from([
        "agent".to_string(),
        "--config".into(),
        config.display().to_string(),
    ])
    .unwrap();
    let routing = warmpath_agent::agent::start_routing(&args).await.unwrap();
    let (base, _) = urls(&routing);
    let client = reqwest::Client::new();
    let b_pod = b.engines[0].http.to_string();
    let mut to_b = 0;
    for _ in 0..8 {
        let resp = client
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "sim-a", "prompt": "hello there", "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        // The engines of pool b serve only sim-b: a 200 from them means the model was
        // rewritten.
        assert_eq!(resp.status(), 200);
        let pod = resp.headers()["x-warmpath-pod"]
            .to_str()
            .unwrap()
            .to_string();
        let policy = resp.headers()["x-warmpath-policy"]
            .to_str()
            .unwrap()
            .to_string();
        let v: serde_json::Value = resp.json().await.unwrap();
        if pod == b_pod {
            to_b += 1;
            assert_eq!(v["model"], "sim-b", "{v}");
            // Split by half-to-b, then decided by pool b's configuration.
            assert_eq!(policy, "ml/half-to-b@1 > pool/b");
        } else {
            assert_eq!(v["model"], "sim-a", "{v}");
            assert_eq!(policy, "ml/half-to-b@1");
        }
    }
    assert_eq!(to_b, 4, "weights 1:1, exactly per cycle of 2");
}

/// `failureMode`: a precise policy that cannot score any pod (the engine publishes no KV
/// events, so no pod's index is trusted) answers 503 when it fails closed, and routes to a
/// ready pod once the same policy fails open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failclosed_policy_answers_503_when_no_pod_can_be_scored_and_failopen_routes() {
    let fleet = Fleet::tiny(1, &[]).await;
    let dir = Dir::new("failure");
    let policy = |mode: &str| {
        format!(
            "apiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {{name: strict, namespace: ml}}\nspec:\n  targetRef: {{pool: {{name: default}}}}\n  action: {{preset: precise, failureMode: {mode}}}\n"
        )
    };
    dir.write("strict.yaml", &policy("failClosed"));
    // No --kv-events: the pod has no trusted index.
    let routing = start([
        "--endpoint".to_string(),
        fleet.url(0),
        "--policy-dir".into(),
        dir.path().display().to_string(),
    ])
    .await;
    let (base, _) = urls(&routing);
    let ask = || {
        let base = base.clone();
        async move {
            let resp = reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(&json!({"model": "sim-llama", "prompt": "hello there", "max_tokens": 1}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, v) = ask().await;
    assert_eq!(status, 503, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("ml/strict") && message.contains("fails closed"),
        "{v}"
    );
    assert_eq!(v["error"]["code"], 503, "{v}");
    dir.write("strict.yaml", &policy("failOpen"));
    wait_for("the fail-open version", Duration::from_secs(5), || async {
        (ask().await.0 == 200).then_some(())
    })
    .await;
}
