//! Priority and weight across agents end to end (docs/policy.md, "Across agents"): two agent
//! processes over UDP gossip in front of one simulator engine that runs 8 sequences at once,
//! each agent's one pool with `clusterMaxConcurrent: 8` (the pool's own, from a config file). Tenant `first` sends through agent 0 and
//! `second` through agent 1, closed-loop clients each, more than the 8 slots in all.
//! Measured by what the clients received: the requests each tenant completed over a window
//! once the agents' gates are engaged.
//!
//! - priority 10 against 0, 6 clients each: `first` is held to its demand (6), `second`
//!   gets the 2 left;
//! - equal priority, weights 3 and 1, 8 clients against 6 (both backlogged: 14 for 8): 6 and
//!   2 again (8 x 3/4 and 8 x 1/4), whatever the clients' turnaround;
//! - the control, the gate off (no `clusterMaxConcurrent`), 6 clients each: each agent
//!   admits all 6 and the engine serves both first come first served.
//!
//! Each engine sequence takes about as long (one batch), so completions follow the slots:
//! under the gate `first` completes 6 of every 8, 75 %. In the control every client waits
//! its turn in the engine's one queue, so each of the 12 completes as many as any other
//! within one (its request cut by the window's ends): the tenants' counts within 6 of each
//! other in ~890 completions, 50 % within 0.4 %; the tolerance allows 3 % for the engine's
//! scheduling.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{
    net::IpAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
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
/// Closed-loop clients per tenant (the weight case gives `first` [`MANY_LOOPS`]).
const LOOPS: usize = 6;
const MANY_LOOPS: usize = 8;
/// Output tokens per request: about 70 ms of engine time at 8 sequences (tiny profile).
const MAX_TOKENS: u64 = 64;
/// The measured window, once the gates are engaged.
const WINDOW: Duration = Duration::from_secs(8);
/// `first`'s expected part of the completions under the gate, and the tolerance around it.
const EXPECTED: f64 = 0.75;
const TOLERANCE: f64 = 0.08;
/// The same without the gate (the control).
const EXPECTED_OFF: f64 = 0.5;
const TOLERANCE_OFF: f64 = 0.03;
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

/// An agent's configuration: the pool `shared` (the same name at every agent: the gate's
/// facts are per tenant and pool) in front of the engine, with the pool's gate
/// (`capacity` slots cluster-wide) or without (0).
fn agent_config(fleet: &Fleet, capacity: usize) -> String {
    format!(
        "version: 1\nlisten: 127.0.0.1:0\nadmin: 127.0.0.1:0\nproxy: {{workers: 1, queueTimeoutMs: 20000}}\n\
         pools:\n- name: shared\n  model: sim-llama\n  clusterMaxConcurrent: {capacity}\n  \
         endpoints:\n  - url: {}\n",
        fleet.url(0)
    )
}

/// Agent `k` in front of the one engine, gossiping every 100 ms, from its configuration
/// file `config`.
fn agent_args(
    k: usize,
    ports: &[(u16, u16)],
    (key, policy): (&Path, &Path),
    config: &Path,
) -> Vec<String> {
    let mut args = cluster_agent_args("e2e-fairness", k, ports, key, policy);
    args.extend(["--config".into(), config.display().to_string()]);
    args
}

/// A closed-loop client from `source`: a request as soon as the last one ended, until
/// `stop` is set, [`HARD_STOP`] has passed or [`MAX_ATTEMPTS`] were made; the instants its
/// requests completed (each also counted in `done_count`). Any status but 200 fails the
/// test.
async fn closed_loop(
    source: &'static str,
    url: String,
    stop: Arc<AtomicBool>,
    done_count: Arc<AtomicUsize>,
) -> Vec<Instant> {
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
        done_count.fetch_add(1, Ordering::Relaxed);
    }
    done
}

/// The value of `warmpath_admission_cluster_cap` for `tenant` at `agent`, from the pool
/// `shared`'s stage.
async fn cap(client: &reqwest::Client, agent: &AgentProcess, tenant: &str) -> Option<f64> {
    let text = metrics_text(client, &format!("http://{}", agent.admin)).await;
    let want = format!("tenant=\"{tenant}\"");
    text.lines()
        .find(|l| {
            l.starts_with("warmpath_admission_cluster_cap{")
                && l.contains(&want)
                && l.contains("pool=\"shared\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// One contention: the tenants' classes, `first`'s clients (`second` has [`LOOPS`]), and the
/// gate's capacity (0: off).
struct Case {
    name: &'static str,
    first: &'static str,
    second: &'static str,
    first_loops: usize,
    capacity: usize,
}

/// Runs one contention: `first` through agent 0, `second` through agent 1; returns the
/// completions of each in the window, which opens once the gates hold their tenants to 6
/// and 2 (without the gate: once every client completed a request, on average).
async fn contend(case: &Case) -> (usize, usize) {
    let name = case.name;
    let seqs = CAPACITY.to_string();
    let fleet = Fleet::tiny(1, &["--max-num-seqs", &seqs]).await;
    let dir = Dir::new(&format!("fairness-{name}"));
    let policy = Dir::new(&format!("fairness-{name}-policy"));
    policy.write("tenants.yaml", &tenants(case.first, case.second));
    let key = dir.write("key", "e2e-fairness-cluster-key-of-at-least-32-bytes\n");
    let ports: Vec<(u16, u16)> = (0..2).map(|_| (free_udp_port(), free_tcp_port())).collect();
    let agents: Vec<AgentProcess> = (0..2)
        .map(|k| {
            let config = dir.write(
                &format!("agent-{k}.yaml"),
                &agent_config(&fleet, case.capacity),
            );
            let files = (key.as_path(), policy.path());
            let args = agent_args(k, &ports, files, &config);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            AgentProcess::start(&args, &[])
                .unwrap_or_else(|e| panic!("agent {k} did not start: {e:?}"))
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let completed: [Arc<AtomicUsize>; 2] = Default::default();
    let mut loops = Vec::new();
    let clients = [case.first_loops, LOOPS];
    for (k, source) in [FIRST, SECOND].into_iter().enumerate() {
        for _ in 0..clients[k] {
            let url = format!("http://{}/v1/completions", agents[k].listen);
            let client = closed_loop(source, url, stop.clone(), completed[k].clone());
            loops.push((k, tokio::spawn(client)));
        }
    }
    let client = reqwest::Client::new();
    let started = Instant::now();
    if case.capacity > 0 {
        // Engaged: each agent's gate holds its tenant to its part (6 and 2).
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
    } else {
        let warm = clients[0] + clients[1];
        wait_for(
            &format!("{name}: {warm} requests completed"),
            Duration::from_secs(30),
            || async {
                let n: usize = completed.iter().map(|c| c.load(Ordering::Relaxed)).sum();
                (n >= warm).then_some(())
            },
        )
        .await;
        eprintln!("{name}: warm after {:?}", started.elapsed());
    }
    let from = Instant::now() + Duration::from_millis(500);
    let to = from + WINDOW;
    // The measured window itself: a span of time, not a condition to wait for.
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
    let cases = [
        (
            Case {
                name: "priority",
                first: "priority: 10",
                second: "priority: 0",
                first_loops: LOOPS,
                capacity: CAPACITY,
            },
            EXPECTED,
            TOLERANCE,
        ),
        (
            Case {
                name: "weight",
                first: "weight: 3",
                second: "weight: 1",
                first_loops: MANY_LOOPS,
                capacity: CAPACITY,
            },
            EXPECTED,
            TOLERANCE,
        ),
        (
            Case {
                name: "gate-off",
                first: "priority: 10",
                second: "priority: 0",
                first_loops: LOOPS,
                capacity: 0,
            },
            EXPECTED_OFF,
            TOLERANCE_OFF,
        ),
    ];
    for (case, expected, tolerance) in cases {
        let name = case.name;
        let (a, b) = contend(&case).await;
        let share = a as f64 / (a + b) as f64;
        eprintln!(
            "{name}: `first` completed {a}, `second` {b} in {WINDOW:?}: `first` {:.1} % (expected {:.0} % +/- {:.0})",
            share * 100.0,
            expected * 100.0,
            tolerance * 100.0
        );
        assert!(b > 0, "{name}: `second` kept at least its floor");
        assert!(
            (share - expected).abs() <= tolerance,
            "{name}: `first` completed {a} of {} ({:.3}), expected {expected} +/- {tolerance}",
            a + b,
            share
        );
    }
}
