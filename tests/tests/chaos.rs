//! Chaos, faults and overload: the agent in front of simulators that are killed, stall, send
//! faulty event streams, or get more traffic than the agent's configured capacity; malformed
//! input at every interface. Each test ends by checking the agent still routes correctly.
//! docs/reliability.md lists which fault each test covers.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{
    process::Command,
    time::{Duration, Instant},
};

use clap::Parser;
use serde_json::{Value, json};
use warmpath_agent::{agent::start_routing, args::AgentArgs};
use warmpath_e2e::{
    agent::{in_front_of, proxy, urls},
    process::OwnedChild,
    sim::{Fleet, metrics_text, wait_for},
};

const WAIT: Duration = Duration::from_secs(30);
/// The environment variable that makes this binary a simulator child process.
const CHILD_FLAGS: &str = "WARMPATH_CHAOS_SIM_FLAGS";

/// Not a test of its own: the entry point of the simulator processes the tests start and
/// kill (this test binary run again with `CHILD_FLAGS` set).
#[test]
#[ignore = "entry point of the simulator child processes"]
fn sim_child() {
    let Ok(flags) = std::env::var(CHILD_FLAGS) else {
        return;
    };
    let flags: Vec<String> = serde_json::from_str(&flags).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let fleet = Fleet::start(&flags).await;
        println!("{}", warmpath_sim::cli::ready_line(&fleet.engines));
        std::future::pending::<()>().await;
    });
}

/// The environment variable that makes this binary an agent child process.
const AGENT_FLAGS: &str = "WARMPATH_CHAOS_AGENT_FLAGS";

/// Not a test of its own: the entry point of agent processes (whose memory is measured
/// alone).
#[test]
#[ignore = "entry point of the agent child processes"]
fn agent_child() {
    let Ok(flags) = std::env::var(AGENT_FLAGS) else {
        return;
    };
    let flags: Vec<String> = serde_json::from_str(&flags).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let routing = start_routing(&AgentArgs::try_parse_from(flags).unwrap())
            .await
            .unwrap();
        println!(
            "{}",
            json!({"ready": true, "listen": routing.listen.to_string()})
        );
        std::future::pending::<()>().await;
    });
}

/// This test binary run again as `entry`, with `flags` in `env`; returns the child and its
/// ready line.
fn spawn_child(entry: &str, env: &str, flags: &[&str]) -> (OwnedChild, Value) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", entry, "--nocapture"])
        .env(env, serde_json::to_string(flags).unwrap());
    let child = OwnedChild::spawn(cmd).unwrap();
    // libtest prints its own lines first; the ready line is JSON.
    for _ in 0..20 {
        let line = child
            .next_line(WAIT)
            .expect("the child printed its ready line");
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && v["ready"] == true
        {
            return (child, v);
        }
    }
    panic!("no ready line from {entry}");
}

/// An agent in its own process in front of `engine` (killed on drop); its proxy address.
fn spawn_agent(engine: &str) -> (OwnedChild, String) {
    let flags = [
        "agent",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--explain",
        "--endpoint",
        engine,
    ];
    let (child, ready) = spawn_child("agent_child", AGENT_FLAGS, &flags);
    (child, ready["listen"].as_str().unwrap().to_string())
}

/// A simulator in its own process (killed on drop).
struct SimProcess {
    child: OwnedChild,
    http: String,
}

fn spawn_sim(flags: &[&str]) -> SimProcess {
    let (child, ready) = spawn_child("sim_child", CHILD_FLAGS, flags);
    let http = ready["engines"][0]["http"].as_str().unwrap().to_string();
    SimProcess { child, http }
}

/// The sum of a Prometheus family's samples whose labels contain every one of `labels`.
async fn scrape(client: &reqwest::Client, base: &str, name: &str, labels: &[&str]) -> f64 {
    let text = metrics_text(client, base).await;
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn completion(prompt: &str, max_tokens: u32, stream: bool) -> Value {
    json!({"model": "sim-llama", "prompt": prompt, "max_tokens": max_tokens,
        "ignore_eos": true, "stream": stream})
}

/// One short, non-streamed completion of `prompt` through the agent at `base`, read to its
/// end: the status and the pod that served it (`x-warmpath-pod`; empty when absent).
async fn served_by(client: &reqwest::Client, base: &str, prompt: &str) -> (u16, String) {
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&completion(prompt, 2, false))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let pod = r
        .headers()
        .get("x-warmpath-pod")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    r.bytes().await.unwrap();
    (status, pod)
}

/// A stream that has started (its first bytes read), to be read on later.
struct Open {
    resp: reqwest::Response,
    pod: String,
    seen: Vec<u8>,
}

async fn open_stream(client: &reqwest::Client, base: &str, prompt: &str, tokens: u32) -> Open {
    let mut resp = client
        .post(format!("{base}/v1/completions"))
        .json(&completion(prompt, tokens, true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let pod = resp.headers()["x-warmpath-pod"]
        .to_str()
        .unwrap()
        .to_string();
    let first = resp.chunk().await.unwrap().expect("a first chunk");
    Open {
        resp,
        pod,
        seen: first.to_vec(),
    }
}

impl Open {
    /// Reads the stream to its end; returns its SSE data payloads.
    async fn finish(mut self) -> Vec<String> {
        while let Some(c) = self.resp.chunk().await.unwrap() {
            self.seen.extend_from_slice(&c);
        }
        String::from_utf8(self.seen)
            .unwrap()
            .split("\n\n")
            .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

/// Completed requests by the engine's own count.
async fn engine_done(client: &reqwest::Client, base: &str) -> f64 {
    scrape(client, base, "vllm:request_success_total", &[]).await
}

// === overload ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_capacity_and_queue_get_prompt_429s_before_any_engine_work() {
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let routing = proxy(
        &fleet,
        &[
            "--max-concurrent",
            "2",
            "--max-queued",
            "1",
            "--queue-timeout-ms",
            "300",
        ],
    )
    .await;
    let ((base, admin), sim) = (urls(&routing), fleet.url(0));
    let client = reqwest::Client::new();
    // Two long streams hold both slots.
    let a = open_stream(&client, &base, "the first long story", 1500).await;
    let b = open_stream(&client, &base, "the second long story", 1500).await;
    assert_eq!(routing.proxy.admission.active(), 2);
    // A burst of six: one waits in the queue (and times out), five find it full.
    let burst: Vec<_> = (0..6)
        .map(|i| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let start = Instant::now();
                let r = client
                    .post(format!("{base}/v1/completions"))
                    .json(&completion(&format!("burst {i}"), 4, false))
                    .send()
                    .await
                    .unwrap();
                let retry = r.headers().get("retry-after").cloned();
                (
                    r.status(),
                    retry,
                    r.json::<Value>().await.unwrap(),
                    start.elapsed(),
                )
            })
        })
        .collect();
    let mut waited = 0;
    for t in burst {
        let (status, retry, body, took) = t.await.unwrap();
        assert_eq!(status, 429, "{body}");
        assert_eq!(retry.unwrap(), "1", "the 300 ms queue timeout, rounded up");
        assert_eq!(body["error"]["type"], "RateLimitError");
        assert_eq!(body["error"]["code"], 429);
        let message = body["error"]["message"].as_str().unwrap();
        if message.contains("queue timeout") {
            waited += 1;
            assert!(took >= Duration::from_millis(300), "{took:?}");
        } else {
            assert!(message.contains("at capacity"), "{message}");
        }
    }
    assert_eq!(waited, 1, "exactly one request fit in the queue");
    let refused = |reason: &'static str| {
        let (client, admin) = (client.clone(), admin.clone());
        async move {
            scrape(
                &client,
                &admin,
                "warmpath_admission_refused_total",
                &[&format!("reason=\"{reason}\"")],
            )
            .await
        }
    };
    assert_eq!(refused("queue_full").await, 5.0);
    assert_eq!(refused("queue_timeout").await, 1.0);
    // The admitted streams complete, whole.
    for s in [a, b] {
        let events = s.finish().await;
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let chunks = events.iter().filter(|e| e.contains("\"text\"")).count();
        assert_eq!(
            chunks, 1501,
            "every token of an admitted stream, then the finish chunk"
        );
    }
    // No refused request reached the engine: it served exactly the two streams.
    wait_for("the engine's count", WAIT, || async {
        (engine_done(&client, &sim).await == 2.0).then_some(())
    })
    .await;
    assert_eq!(
        scrape(&client, &admin, "warmpath_endpoint_requests_total", &[]).await,
        2.0
    );
    assert_eq!(routing.proxy.admission.active(), 0);
    // Capacity is back: a request is served.
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&completion("after the burst", 2, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_are_admitted_in_turn_as_slots_free() {
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let routing = proxy(
        &fleet,
        &[
            "--max-concurrent",
            "1",
            "--max-queued",
            "4",
            "--queue-timeout-ms",
            "20000",
        ],
    )
    .await;
    let (base, sim) = (format!("http://{}", routing.listen), fleet.url(0));
    let client = reqwest::Client::new();
    let holder = open_stream(&client, &base, "the slot holder", 200).await;
    let queued: Vec<_> = (0..3)
        .map(|i| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let r = client
                    .post(format!("{base}/v1/completions"))
                    .json(&completion(&format!("queued {i}"), 4, false))
                    .send()
                    .await
                    .unwrap();
                r.status()
            })
        })
        .collect();
    wait_for("three requests waiting", WAIT, || async {
        (routing.proxy.admission.waiting() == 3).then_some(())
    })
    .await;
    // Nothing queued has reached the engine while the slot is held.
    assert_eq!(engine_done(&client, &sim).await, 0.0);
    assert_eq!(holder.finish().await.last().unwrap(), "[DONE]");
    for q in queued {
        assert_eq!(q.await.unwrap(), 200);
    }
    assert_eq!(engine_done(&client, &sim).await, 4.0);
    let admin = format!("http://{}", routing.admin);
    assert_eq!(
        scrape(&client, &admin, "warmpath_admission_queued_total", &[]).await,
        3.0
    );
    assert_eq!(
        scrape(&client, &admin, "warmpath_admission_refused_total", &[]).await,
        0.0
    );
}

// === request size bounds ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_mb_prompt_is_refused_before_tokenization() {
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let routing = proxy(&fleet, &[]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    let warmpath_agent::proxy::TokenSource::Local(tokenizer) = &routing.proxy.pools[0].tokens
    else {
        panic!("the default token source is the local tokenizer");
    };
    // A normal request is tokenized (the tokenizer caches segments of 256 bytes and more): the
    // probe works.
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&completion(
            &"a small prompt about rivers. ".repeat(12),
            2,
            false,
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let cached = tokenizer.cached_tokens();
    assert!(cached > 0);
    let text = |bytes: usize| -> String {
        (0..)
            .map(|i| format!("word{i} "))
            .flat_map(|w| w.into_bytes())
            .take(bytes)
            .map(char::from)
            .collect()
    };
    let post = |path: &'static str, body: Value| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let r = client
                .post(format!("{base}{path}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };
    // 10 MB: over the body limit (8 MiB), refused as it is read.
    let (status, body) = post("/v1/completions", completion(&text(10_000_000), 2, false)).await;
    assert_eq!(status, 413);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("body exceeds"),
        "{body}"
    );
    // 5 MB: within the body limit, over the prompt limit (4 MiB): refused after the parse,
    // before tokenization.
    let (status, body) = post("/v1/completions", completion(&text(5_000_000), 2, false)).await;
    assert_eq!(status, 413);
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_prompt_bytes"),
        "{body}"
    );
    let chat =
        json!({"model": "sim-llama", "messages": [{"role": "user", "content": text(5_000_000)}]});
    let (status, _) = post("/v1/chat/completions", chat).await;
    assert_eq!(status, 413);
    assert_eq!(
        tokenizer.cached_tokens(),
        cached,
        "nothing more was tokenized"
    );
    assert_eq!(
        scrape(
            &client,
            &admin,
            "warmpath_admission_refused_total",
            &["reason=\"prompt_too_large\""]
        )
        .await,
        2.0
    );
    assert_eq!(
        scrape(&client, &admin, "warmpath_endpoint_requests_total", &[]).await,
        1.0,
        "only the small request reached an engine"
    );
    let (status, _) = post("/v1/completions", completion("and again", 2, false)).await;
    assert_eq!(status, 200);
}

// === a pod killed mid-stream ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_killed_mid_stream_ends_only_its_stream_and_the_counters_say_so() {
    let sims = [
        spawn_sim(&["--port", "0", "--profile", "tiny"]),
        spawn_sim(&["--port", "0", "--profile", "tiny"]),
    ];
    let endpoints: Vec<String> = sims.iter().map(|s| format!("http://{}", s.http)).collect();
    let routing = in_front_of(&endpoints, &["--policy", "round-robin"]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    let a = open_stream(&client, &base, "the first long story", 3000).await;
    let b = open_stream(&client, &base, "the second long story", 3000).await;
    assert_ne!(
        a.pod, b.pod,
        "round-robin put the streams on different pods"
    );
    let survivor = b.pod.clone();
    let victim = sims.iter().find(|s| s.http == a.pod).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim.child.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let events = a.finish().await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], 502, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("failed mid-stream")
    );
    // The other stream completes in full.
    let events = b.finish().await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert_eq!(
        events.iter().filter(|e| e.contains("\"text\"")).count(),
        3001,
        "every token, then the finish chunk"
    );
    // The counters: one upstream error, one success.
    let requests = |outcome: &'static str| {
        let (client, admin) = (client.clone(), admin.clone());
        async move {
            scrape(
                &client,
                &admin,
                "warmpath_requests_total",
                &[&format!("outcome=\"{outcome}\"")],
            )
            .await
        }
    };
    wait_for("both streams recorded", WAIT, || async {
        (requests("ok").await + requests("upstream_error").await == 2.0).then_some(())
    })
    .await;
    assert_eq!(requests("upstream_error").await, 1.0);
    assert_eq!(requests("ok").await, 1.0);
    // New requests go to the survivor (the dead pod fails before the first byte: retried).
    for i in 0..3 {
        let (status, pod) = served_by(&client, &base, &format!("after {i}")).await;
        assert_eq!(status, 200);
        assert_eq!(pod, survivor);
    }
}

#[path = "chaos/faults.rs"]
mod faults;
