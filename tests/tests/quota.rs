//! Tenant quotas end to end (docs/policy.md, "Quotas and fairness"): a prompt-token quota
//! holds to within 5 % at one agent and within 10 % across four agent processes sharing it
//! over real UDP gossip, measured by the prompt tokens the simulator engines report as
//! served (`usage.prompt_tokens` of every 200), while clients offer several times the limit.
//! A tenant without a quota on the same agent is never refused.
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
    agent::{start, urls},
    agent_process::AgentProcess,
    scratch::{Dir, cluster_agent_args, free_tcp_port, free_udp_port},
    sim::{Fleet, metrics_text, wait_for},
};

#[test]
#[ignore = "entry point of the agent child process (agent_process.rs)"]
fn agent_process() {
    warmpath_e2e::agent_process::child_main();
}

/// The `limited` tenant's cluster-wide prompt-token quota, tokens per second.
const LIMIT: f64 = 2000.0;
/// Its `burstSeconds`: the bucket holds `LIMIT x BURST` tokens at most.
const BURST: f64 = 0.5;
/// Length of the measured window.
const WINDOW: Duration = Duration::from_secs(30);
/// Load after the window, so that demand does not drop at its end.
const TAIL: Duration = Duration::from_millis(500);
/// A refused client tries again after this (no Retry-After wait: demand stays above the
/// limit).
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// Attempts per client loop at most (at most about 50 a second over a 40 s run).
const MAX_ATTEMPTS: usize = 5_000;
/// Longest any load runs, whatever happens (the loops' hard stop).
const HARD_STOP: Duration = Duration::from_secs(120);

const LIMITED: &str = "127.0.0.2";
const FREE: &str = "127.0.0.3";

fn tenants() -> String {
    format!(
        r#"apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {{name: limited}}
spec:
  identity: {{cidrs: [{LIMITED}/32]}}
  quotas: {{promptTokens: {LIMIT}/s, burstSeconds: {BURST}}}
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {{name: free}}
spec:
  identity: {{cidrs: [{FREE}/32]}}
"#
    )
}

/// One request as its client saw it.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    sent: Instant,
    status: u16,
    /// The engine's `usage.prompt_tokens` (200s only).
    prompt_tokens: u64,
}

/// A prompt of about 200 tokens, different for every request.
fn prompt(loop_name: &str, i: usize) -> String {
    format!(
        "{loop_name} request {i}: {}",
        "the quarterly report covers revenue, costs and the outlook for next year. ".repeat(7)
    )
}

/// Checks a quota refusal: `Retry-After` of at least a second and the OpenAI error shape.
async fn check_refusal(resp: reqwest::Response, loop_name: &str) {
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        retry_after.is_some_and(|s| s >= 1),
        "{loop_name}: a 429 with Retry-After >= 1, got {:?}",
        resp.headers().get("retry-after")
    );
    let v: serde_json::Value = resp.json().await.unwrap();
    let e = &v["error"];
    let message = e["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`limited`") && message.contains("prompt tokens"),
        "{loop_name}: the refusal names the tenant and the quota: {v}"
    );
    assert_eq!(e["type"], "RateLimitError", "{v}");
    assert_eq!(e["code"], 429, "{v}");
}

/// A closed-loop client from `source`: a request as soon as the last one ended (after
/// `pause` for a 200, [`RETRY_PAUSE`] for a 429), until `stop` is set, [`HARD_STOP`] has
/// passed or [`MAX_ATTEMPTS`] were made. Any status but 200 and a quota 429 fails the test.
async fn closed_loop(
    source: &'static str,
    url: String,
    name: String,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> Vec<Attempt> {
    let client = reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let hard_stop = Instant::now() + HARD_STOP;
    let mut attempts = Vec::new();
    for i in 0..MAX_ATTEMPTS {
        if stop.load(Ordering::Relaxed) || Instant::now() >= hard_stop {
            break;
        }
        let body = json!({"model": "sim-llama", "prompt": prompt(&name, i), "max_tokens": 1});
        let sent = Instant::now();
        let resp = client
            .post(&url)
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{name}: request {i}: {e}"));
        let status = resp.status().as_u16();
        let mut prompt_tokens = 0;
        match status {
            200 => {
                let v: serde_json::Value = resp.json().await.unwrap();
                prompt_tokens = v["usage"]["prompt_tokens"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{name}: a 200 with usage: {v}"));
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            429 => {
                check_refusal(resp, &name).await;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            other => panic!("{name}: status {other}: {}", resp.text().await.unwrap()),
        }
        attempts.push(Attempt {
            sent,
            status,
            prompt_tokens,
        });
    }
    attempts
}

/// What the attempts sent in `[from, to)` got: (prompt tokens served, 200s, 429s).
fn served(attempts: &[Attempt], from: Instant, to: Instant) -> (u64, usize, usize) {
    let inside = attempts.iter().filter(|a| a.sent >= from && a.sent < to);
    inside.fold((0, 0, 0), |(tokens, ok, refused), a| match a.status {
        200 => (tokens + a.prompt_tokens, ok + 1, refused),
        _ => (tokens, ok, refused + 1),
    })
}

/// The value of the first series of `name` whose line contains every one of `labels`.
fn series(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .find(|l| {
            l.starts_with(name)
                && l[name.len()..].starts_with('{')
                && labels.iter().all(|want| l.contains(want))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

const LIMITED_PROMPT: [&str; 2] = ["tenant=\"limited\"", "dimension=\"prompt_tokens\""];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_holds_a_prompt_token_quota_within_5_percent_and_never_refuses_a_free_tenant() {
    let fleet = Fleet::tiny(2, &[]).await;
    let dir = Dir::new("quota-one");
    dir.write("tenants.yaml", &tenants());
    let mut flags = vec!["--policy-dir".to_string(), dir.path().display().to_string()];
    for i in 0..2 {
        flags.extend(["--endpoint".into(), fleet.url(i)]);
        flags.extend(["--kv-events".into(), fleet.events(i)]);
    }
    let routing = start(flags).await;
    let (base, admin) = urls(&routing);
    let url = format!("{base}/v1/completions");

    // `limited`: 8 loops, each retrying 20 ms after a refusal, offer about 8 x 40 x 200 =
    // 64,000 prompt tokens/s, 30 times the limit. `free`: 2 loops, 20 ms apart, a steady
    // few hundred requests over the run.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let limited: Vec<_> = (0..8)
        .map(|l| {
            let url = url.clone();
            tokio::spawn(closed_loop(
                LIMITED,
                url,
                format!("limited-{l}"),
                Duration::ZERO,
                stop.clone(),
            ))
        })
        .collect();
    let free: Vec<_> = (0..2)
        .map(|l| {
            let url = url.clone();
            tokio::spawn(closed_loop(
                FREE,
                url,
                format!("free-{l}"),
                Duration::from_millis(20),
                stop.clone(),
            ))
        })
        .collect();
    // Warm-up: the bucket starts full (LIMIT x BURST = 1,000 tokens) and the demand is 30
    // times the rate, so it is empty long before 2 s. From then on what is admitted over a
    // window T is the refill LIMIT x T plus the level at its start minus the level at its end,
    // each under one prompt (about 200 tokens; the admission charges whole blocks, the
    // engine's usage settles the rest): expected = LIMIT x T = 60,000 tokens, +/- 0.4 %.
    let from = started + Duration::from_secs(2);
    let to = from + WINDOW;
    tokio::time::sleep_until((to + TAIL).into()).await;
    stop.store(true, Ordering::Relaxed);
    let mut limited_attempts = Vec::new();
    for l in limited {
        limited_attempts.extend(l.await.unwrap());
    }
    let mut free_attempts = Vec::new();
    for l in free {
        free_attempts.extend(l.await.unwrap());
    }

    let (tokens, ok, refused) = served(&limited_attempts, from, to);
    let expected = LIMIT * WINDOW.as_secs_f64();
    let ratio = tokens as f64 / expected;
    eprintln!(
        "one agent: `limited` served {tokens} prompt tokens in {WINDOW:?} ({ok} requests, {refused} refused); expected {expected}; ratio {ratio:.4}"
    );
    assert!(
        refused > 4 * ok,
        "the demand was well above the limit ({ok} served, {refused} refused)"
    );
    assert!(
        (ratio - 1.0).abs() <= 0.05,
        "served {tokens} prompt tokens, expected {expected} +/- 5 % (ratio {ratio:.4})"
    );

    // `free` shares the agent and was never refused.
    let free_ok = free_attempts.iter().filter(|a| a.status == 200).count();
    eprintln!(
        "one agent: `free` sent {} requests, {free_ok} served",
        free_attempts.len()
    );
    assert_eq!(
        free_ok,
        free_attempts.len(),
        "every request of `free` succeeded"
    );
    assert!(free_ok >= 200, "`free` ran throughout ({free_ok} requests)");

    // The agent counted every refusal the clients saw, all on prompt tokens of `limited`.
    let text = metrics_text(&reqwest::Client::new(), &admin).await;
    let counted = series(&text, "warmpath_quota_refused_total", &LIMITED_PROMPT);
    let seen = limited_attempts.iter().filter(|a| a.status == 429).count();
    assert_eq!(counted, Some(seen as f64), "refusals counted by the agent");
    assert_eq!(
        series(&text, "warmpath_quota_refused_total", &["tenant=\"free\""]),
        None,
        "`free` has no quota state"
    );
}

const AGENTS: usize = 4;

/// Agent `k` of the cluster, in front of engine `k` only, gossiping every 100 ms.
fn agent_args(
    fleet: &Fleet,
    k: usize,
    ports: &[(u16, u16)],
    key: &Path,
    policy: &Path,
) -> Vec<String> {
    let mut args = cluster_agent_args("e2e-quota", k, ports, key, policy);
    args.extend(["--endpoint".into(), fleet.url(k)]);
    args.extend(["--kv-events".into(), fleet.events(k)]);
    args
}

/// Every agent's `warmpath_quota_local_limit` for `limited`'s prompt tokens (None for an
/// agent without it yet).
async fn local_limits(client: &reqwest::Client, agents: &[AgentProcess]) -> Vec<Option<f64>> {
    let mut out = Vec::new();
    for a in agents {
        let text = metrics_text(client, &format!("http://{}", a.admin)).await;
        out.push(series(&text, "warmpath_quota_local_limit", &LIMITED_PROMPT));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_agents_hold_a_cluster_wide_prompt_token_quota_within_10_percent() {
    let fleet = Fleet::tiny(AGENTS as u16, &[]).await;
    let dir = Dir::new("quota-cluster");
    let policy = Dir::new("quota-cluster-policy");
    policy.write("tenants.yaml", &tenants());
    let key = dir.write("key", "e2e-quota-cluster-key-of-at-least-32-bytes\n");
    let ports: Vec<(u16, u16)> = (0..AGENTS)
        .map(|_| (free_udp_port(), free_tcp_port()))
        .collect();
    let agents: Vec<AgentProcess> = (0..AGENTS)
        .map(|k| {
            let args = agent_args(&fleet, k, &ports, &key, policy.path());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            AgentProcess::start(&args, &[])
                .unwrap_or_else(|e| panic!("agent {k} did not start: {e:?}"))
        })
        .collect();

    // `limited`'s loops spread unevenly: 1, 2, 3 and 4 of 10 at agents 0-3 (10/20/30/40 %).
    let stop = Arc::new(AtomicBool::new(false));
    let load_started = Instant::now();
    let mut loops = Vec::new();
    for (k, agent) in agents.iter().enumerate() {
        for l in 0..=k {
            loops.push((
                k,
                tokio::spawn(closed_loop(
                    LIMITED,
                    format!("http://{}/v1/completions", agent.listen),
                    format!("limited-agent{k}-{l}"),
                    Duration::ZERO,
                    stop.clone(),
                )),
            ));
        }
    }

    // Warm-up: until every agent has heard the others' demand over the gossip, which the
    // shares show: each agent's share is below the whole limit and the four add up to it
    // (within 1 %; every agent is far above the water level, so each gets a quarter). Then
    // one more second, so that every bucket (a share x 0.5 s) has been emptied by the
    // demand. From then the expected total is the sum of the refills, LIMIT x T = 60,000
    // tokens over 30 s (each bucket's level at either end is under one prompt).
    let client = reqwest::Client::new();
    let warm = Instant::now();
    let shares = wait_for(
        "the four agents' shares of `limited` to add up to the limit",
        Duration::from_secs(30),
        || async {
            let shares = local_limits(&client, &agents).await;
            let all: Option<Vec<f64>> = shares.into_iter().collect();
            all.filter(|s| {
                let sum: f64 = s.iter().sum();
                s.iter().all(|&x| x < LIMIT) && (sum - LIMIT).abs() <= 0.01 * LIMIT
            })
        },
    )
    .await;
    eprintln!(
        "four agents: shares {shares:?} agreed {:?} after the load started",
        warm.elapsed()
    );
    let from = Instant::now() + Duration::from_secs(1);
    let to = from + WINDOW;
    tokio::time::sleep_until((to + TAIL).into()).await;
    stop.store(true, Ordering::Relaxed);
    let shares = local_limits(&client, &agents).await;

    let mut per_agent = [(0u64, 0usize, 0usize); AGENTS];
    let mut warm_up_tokens = 0;
    for (k, l) in loops {
        let attempts = l.await.unwrap();
        warm_up_tokens += served(&attempts, load_started, from).0;
        let (tokens, ok, refused) = served(&attempts, from, to);
        per_agent[k].0 += tokens;
        per_agent[k].1 += ok;
        per_agent[k].2 += refused;
    }
    let tokens: u64 = per_agent.iter().map(|a| a.0).sum();
    let expected = LIMIT * WINDOW.as_secs_f64();
    let ratio = tokens as f64 / expected;
    eprintln!(
        "four agents: warm-up {:?}, {warm_up_tokens} prompt tokens served in it",
        from - load_started
    );
    eprintln!(
        "four agents: `limited` served {tokens} prompt tokens in {WINDOW:?}; expected {expected}; ratio {ratio:.4}; per agent (tokens, served, refused) {per_agent:?}; shares at the end {shares:?}"
    );
    for (k, (_, ok, refused)) in per_agent.iter().enumerate() {
        assert!(
            *ok > 0 && refused > ok,
            "agent {k} served the tenant and refused more than it served ({ok}, {refused})"
        );
    }
    assert!(
        (ratio - 1.0).abs() <= 0.10,
        "served {tokens} prompt tokens across four agents, expected {expected} +/- 10 % (ratio {ratio:.4})"
    );
    drop(agents);
}

/// Tenants of the other three dimensions, each with a whole minute of burst so that the
/// refill during the test (a few seconds) stays small against the bucket.
const KINDS: &str = r#"apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: output}
spec:
  identity: {cidrs: [127.0.0.2/32]}
  quotas: {outputTokens: 120/min, burstSeconds: 60}
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: requests}
spec:
  identity: {cidrs: [127.0.0.3/32]}
  quotas: {requests: 2/min, burstSeconds: 60}
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: streams}
spec:
  identity: {cidrs: [127.0.0.4/32]}
  quotas: {concurrentStreams: 1}
"#;

/// One completion from `source`: (status, Retry-After, the body).
async fn complete(
    base: &str,
    source: &str,
    max_tokens: u64,
) -> (u16, Option<u64>, serde_json::Value) {
    let resp = reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "sim-llama", "prompt": "Tell me about the sea.", "max_tokens": max_tokens}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (status, retry_after, resp.json().await.unwrap())
}

/// The refusal message of a 429 body.
fn refusal(v: &serde_json::Value) -> &str {
    assert_eq!(v["error"]["type"], "RateLimitError", "{v}");
    v["error"]["message"].as_str().unwrap_or_default()
}

/// Output-token, request and stream quotas through the proxy, each judged by the rules of
/// docs/policy.md ("Quotas") from what the engine reported: output tokens are charged after
/// the answer from its `usage.completion_tokens` and refuse only once in debt, with
/// `Retry-After` the time the refill needs to repay it; a request quota refuses the request
/// its bucket cannot pay; a stream cap refuses while a stream is open and admits again once
/// it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_token_request_and_stream_quotas_refuse_as_documented() {
    // Real decode timing (~10 ms a token), so a long stream stays open while we look.
    let fleet = Fleet::start(&["--port", "0", "--profile", "llama-3.1-8b-h100"]).await;
    let dir = Dir::new("quota-kinds");
    dir.write("tenants.yaml", KINDS);
    let routing = start([
        "--endpoint".to_string(),
        format!("http://{}", fleet.engines[0].http),
        "--policy-dir".into(),
        dir.path().display().to_string(),
    ])
    .await;

    // outputTokens 120/min, burst 60 s: a bucket of 120 tokens refilled at 2 per second.
    let (base, admin) = urls(&routing);
    let answered = |n: f64| {
        let admin = admin.clone();
        async move {
            // Charged before the request is counted (proxy/record.rs): once the count shows
            // it, its output tokens are in the bucket.
            let text = metrics_text(&reqwest::Client::new(), &admin).await;
            let ok = ["tenant=\"output\"", "outcome=\"ok\""];
            (series(&text, "warmpath_requests_total", &ok) == Some(n)).then_some(())
        }
    };
    // The bucket is full until the first answer is charged, somewhere between the first
    // request's start and the moment its count shows: the refill before the refusal lies
    // between (third sent - first counted) and (third answered - first sent).
    let first_sent = Instant::now();
    let (s1, _, v1) = complete(&base, "127.0.0.2", 100).await;
    wait_for("the first answer settled", Duration::from_secs(10), || {
        answered(1.0)
    })
    .await;
    let first_counted = Instant::now();
    let (s2, _, v2) = complete(&base, "127.0.0.2", 100).await;
    assert_eq!((s1, s2), (200, 200), "{v1} {v2}");
    wait_for("the second answer settled", Duration::from_secs(10), || {
        answered(2.0)
    })
    .await;
    let generated: u64 = [&v1, &v2]
        .iter()
        .map(|v| v["usage"]["completion_tokens"].as_u64().unwrap())
        .sum();
    let third_sent = Instant::now();
    let (s3, retry, v3) = complete(&base, "127.0.0.2", 100).await;
    let refill = (
        (third_sent - first_counted).as_secs_f64(),
        first_sent.elapsed().as_secs_f64(),
    );
    assert_eq!(s3, 429, "{v3}");
    assert!(refusal(&v3).contains("`output`") && refusal(&v3).contains("output tokens"));
    // Debt = generated - 120 - 2 x refill; Retry-After = the seconds the refill needs to
    // repay it at 2 tokens/s, rounded up.
    let wait = |refilled: f64| ((generated as f64 - 120.0 - 2.0 * refilled) / 2.0).ceil();
    assert!(
        wait(refill.0) >= 1.0,
        "the two answers put the bucket in debt ({generated} tokens)"
    );
    let retry = retry.expect("Retry-After") as f64;
    assert!(
        (wait(refill.1).max(1.0)..=wait(refill.0)).contains(&retry),
        "Retry-After {retry} s; the debt needs {}-{} s",
        wait(refill.1),
        wait(refill.0)
    );

    // requests 2/min, burst 60 s: two requests, then the third waits for the refill (30 s
    // a request).
    let (a, _, _) = complete(&base, "127.0.0.3", 1).await;
    let (b, _, _) = complete(&base, "127.0.0.3", 1).await;
    let (c, retry, v) = complete(&base, "127.0.0.3", 1).await;
    assert_eq!((a, b, c), (200, 200, 429), "{v}");
    assert!(refusal(&v).contains("`requests`"), "{v}");
    let retry = retry.expect("Retry-After");
    assert!((28..=30).contains(&retry), "Retry-After {retry} s of 30");

    // concurrentStreams 1: a long stream is open (its headers arrived, its body not read).
    let client = reqwest::Client::builder()
        .local_address("127.0.0.4".parse::<IpAddr>().unwrap())
        .build()
        .unwrap();
    let open = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "sim-llama", "prompt": "A long story, please.", "max_tokens": 3000, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), 200);
    let (s, retry, v) = complete(&base, "127.0.0.4", 1).await;
    assert_eq!((s, retry), (429, Some(1)), "{v}");
    assert!(refusal(&v).contains("`streams`"), "{v}");
    // The client goes away: the stream ends at the agent, and the next request is admitted.
    drop(open);
    wait_for("the stream's slot freed", Duration::from_secs(10), || {
        let base = base.clone();
        async move { (complete(&base, "127.0.0.4", 1).await.0 == 200).then_some(()) }
    })
    .await;
}
