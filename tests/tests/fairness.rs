//! Priority and weight across agents end to end (docs/policy.md, "Across agents"): two agent
//! processes over UDP gossip in front of one simulator engine that runs 8 sequences at once,
//! each agent with `--cluster-max-concurrent 8`. Tenant `first` sends through agent 0 and
//! `second` through agent 1, 6 closed-loop clients each: 12 asking for 8 slots. Measured by
//! what the clients received: the requests each tenant completed over a window once the
//! agents' gates are engaged.
//!
//! - priority 10 against 0: `first` is held to its demand (6), `second` gets the 2 left;
//! - equal priority, weights 3 and 1: 6 and 2 again (8 x 3/4 and 8 x 1/4).
//!
//! Each engine sequence takes about as long (one batch), so completions follow the slots:
//! `first` completes 6 of every 8, 75 %. Without the gate each agent admits all 6 and the
//! engine serves both first come first served: 50 %.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{
    net::IpAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::json;
use warmpath_e2e::{
    agent_process::AgentProcess,
    scratch::{Dir, cluster_agent_args, free_tcp_port, free_udp_port},
    sim::{Fleet, metrics_text, wait_for},
};

#[test]
#[ignore = "entry point of the agent child process (agent_process.rs)"]
fn agent_process() {
    warmpath_e2e::agent_process::child_main();
}

/// The pool's cluster-wide concurrency, and the engine's sequences at once.
const CAPACITY: usize = 8;
/// Closed-loop clients per tenant.
const LOOPS: usize = 6;
/// Output tokens per request: about 70 ms of engine time at 8 sequences (tiny profile).
const MAX_TOKENS: u64 = 64;
/// The measured window, once the gates are engaged.
const WINDOW: Duration = Duration::from_secs(8);
/// `first`'s expected part of the completions, and the tolerance around it.
const EXPECTED: f64 = 0.75;
const TOLERANCE: f64 = 0.08;
/// Attempts per client loop at most, and the longest any load runs.
const MAX_ATTEMPTS: usize = 2_000;
const HARD_STOP: Duration = Duration::from_secs(90);

const FIRST: &str = "127.0.0.2";
const SECOND: &str = "127.0.0.3";

fn tenants(first: &str, second: &str) -> String {
    format!(
        r#"apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {{name: first}}
spec:
  identity: {{cidrs: [{FIRST}/32]}}
  {first}
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {{name: second}}
spec:
  identity: {{cidrs: [{SECOND}/32]}}
  {second}
"#
    )
}

/// Agent `k` in front of the one engine, gossiping every 100 ms.
fn agent_args(
    fleet: &Fleet,
    k: usize,
    ports: &[(u16, u16)],
    key: &Path,
    policy: &Path,
) -> Vec<String> {
    let mut args = cluster_agent_args("e2e-fairness", k, ports, key, policy);
    args.extend(["--queue-timeout-ms".into(), "20000".into()]);
    args.extend(["--cluster-max-concurrent".into(), CAPACITY.to_string()]);
    args.extend(["--endpoint".into(), fleet.url(0)]);
    args
}

/// A closed-loop client from `source`: a request as soon as the last one ended, until
/// `stop` is set, [`HARD_STOP`] has passed or [`MAX_ATTEMPTS`] were made; the instants its
/// requests completed. Any status but 200 fails the test.
async fn closed_loop(source: &'static str, url: String, stop: Arc<AtomicBool>) -> Vec<Instant> {
    let client = reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let hard_stop = Instant::now() + HARD_STOP;
    let mut done = Vec::new();
    for i in 0..MAX_ATTEMPTS {
        if stop.load(Ordering::Relaxed) || Instant::now() >= hard_stop {
            break;
        }
        let body = json!({"model": "sim-llama", "prompt": format!("{source} request {i}: tell me a story"), "max_tokens": MAX_TOKENS, "ignore_eos": true});
        let resp = client.post(&url).json(&body).send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        assert_eq!(status, 200, "{source}: request {i}: {text}");
        done.push(Instant::now());
    }
    done
}

/// The value of `warmpath_admission_cluster_cap` for `tenant` at `agent`.
async fn cap(client: &reqwest::Client, agent: &AgentProcess, tenant: &str) -> Option<f64> {
    let text = metrics_text(client, &format!("http://{}", agent.admin)).await;
    let want = format!("tenant=\"{tenant}\"");
    text.lines()
        .find(|l| l.starts_with("warmpath_admission_cluster_cap{") && l.contains(&want))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Runs one contention: `first` through agent 0, `second` through agent 1; returns the
/// completions of each in the window.
async fn contend(name: &str, first: &str, second: &str) -> (usize, usize) {
    let seqs = CAPACITY.to_string();
    let fleet = Fleet::tiny(1, &["--max-num-seqs", &seqs]).await;
    let dir = Dir::new(&format!("fairness-{name}"));
    let policy = Dir::new(&format!("fairness-{name}-policy"));
    policy.write("tenants.yaml", &tenants(first, second));
    let key = dir.write("key", "e2e-fairness-cluster-key-of-at-least-32-bytes\n");
    let ports: Vec<(u16, u16)> = (0..2).map(|_| (free_udp_port(), free_tcp_port())).collect();
    let agents: Vec<AgentProcess> = (0..2)
        .map(|k| {
            let args = agent_args(&fleet, k, &ports, &key, policy.path());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            AgentProcess::start(&args, &[])
                .unwrap_or_else(|e| panic!("agent {k} did not start: {e:?}"))
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for (k, source) in [FIRST, SECOND].into_iter().enumerate() {
        for _ in 0..LOOPS {
            let url = format!("http://{}/v1/completions", agents[k].listen);
            loops.push((k, tokio::spawn(closed_loop(source, url, stop.clone()))));
        }
    }
    // Engaged: each agent's gate holds its tenant to its part (6 and 2).
    let client = reqwest::Client::new();
    let started = Instant::now();
    let caps = wait_for(
        &format!("{name}: both gates engaged at 6 and 2"),
        Duration::from_secs(30),
        || async {
            let caps = (
                cap(&client, &agents[0], "first").await,
                cap(&client, &agents[1], "second").await,
            );
            (caps == (Some(6.0), Some(2.0))).then_some(caps)
        },
    )
    .await;
    eprintln!("{name}: caps {caps:?} after {:?}", started.elapsed());
    let from = Instant::now() + Duration::from_millis(500);
    let to = from + WINDOW;
    tokio::time::sleep_until(to.into()).await;
    let end_caps = (
        cap(&client, &agents[0], "first").await,
        cap(&client, &agents[1], "second").await,
    );
    stop.store(true, Ordering::Relaxed);
    let mut counts = [0usize; 2];
    for (k, l) in loops {
        counts[k] += l
            .await
            .unwrap()
            .iter()
            .filter(|&&t| t >= from && t < to)
            .count();
    }
    eprintln!("{name}: caps at the end {end_caps:?}");
    drop(agents);
    (counts[0], counts[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_share_a_pools_concurrency_by_priority_then_weight() {
    for (name, first, second) in [
        ("priority", "priority: 10", "priority: 0"),
        ("weight", "weight: 3", "weight: 1"),
    ] {
        let (a, b) = contend(name, first, second).await;
        let share = a as f64 / (a + b) as f64;
        eprintln!(
            "{name}: `first` completed {a}, `second` {b} in {WINDOW:?}: `first` {:.1} % (expected {:.0} % +/- {:.0})",
            share * 100.0,
            EXPECTED * 100.0,
            TOLERANCE * 100.0
        );
        assert!(b > 0, "{name}: `second` kept at least its floor");
        assert!(
            (share - EXPECTED).abs() <= TOLERANCE,
            "{name}: `first` completed {a} of {} ({:.3}), expected {EXPECTED} +/- {TOLERANCE}",
            a + b,
            share
        );
    }
}
