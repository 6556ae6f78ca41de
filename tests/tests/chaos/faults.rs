//! Faulty event streams, slow and stalled peers, malformed input at every interface.

use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use warmpath_e2e::{
    agent::{in_front_of, proxy, urls},
    index::{engine_gpu, indexed_gpu},
    raw_http::{FakeEngine, Scripted, agent_for},
    sim::{Fleet, get_json, wait_for},
};
use zeromq::{Socket, SocketSend};

use super::{WAIT, completion, open_stream, scrape, served_by, spawn_agent, spawn_sim};

async fn post(
    client: &reqwest::Client,
    url: &str,
    body: Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = client.post(url).json(&body).send().await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.json().await.unwrap_or(Value::Null))
}

/// A prompt of several blocks, distinct per `i`.
fn prompt(i: usize) -> String {
    (0..40)
        .map(|w| format!("fact {w} of topic {i}. "))
        .collect()
}

/// The status of one short completion of `prompt(i)` through the agent at `base`.
async fn complete(client: &reqwest::Client, base: &str, i: usize) -> u16 {
    let url = format!("{base}/v1/completions");
    post(client, &url, completion(&prompt(i), 2, false)).await.0
}

/// The first pod's index status as `/status` shows it.
async fn pod_index(client: &reqwest::Client, admin: &str) -> Value {
    get_json(client, &format!("{admin}/status")).await["pods"][0]["index"].clone()
}

// === KV events: dropped, duplicated and reordered batches ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_duplicated_and_reordered_batches_converge_through_replay() {
    let fleet = Fleet::tiny(
        1,
        &[
            "--kv-replay-port",
            "0",
            "--fault-drop-event-batch-every",
            "7",
            "--fault-duplicate-event-batch-every",
            "3",
            "--fault-reorder-event-batch-every",
            "5",
        ],
    )
    .await;
    let routing = proxy(&fleet, &[]).await;
    let ((base, admin), sim) = (urls(&routing), fleet.url(0));
    let client = reqwest::Client::new();
    let id = routing.proxy.index.status()[0].0;
    let mut sent = 0;
    for _ in 0..20 {
        assert_eq!(complete(&client, &base, sent).await, 200);
        sent += 1;
    }
    // Each request is a few batches; one held back or dropped at the very end is found by
    // the next batch or the subscriber's quiet-period catch-up. Bounded: a few more requests
    // at most.
    let mut converged = false;
    for _ in 0..10 {
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < deadline {
            if indexed_gpu(&routing.proxy.index, id) == engine_gpu(&client, &sim).await {
                converged = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if converged {
            break;
        }
        assert_eq!(complete(&client, &base, sent).await, 200);
        sent += 1;
    }
    let status = pod_index(&client, &admin).await;
    assert!(converged, "index != engine cache; /status: {status}");
    assert_eq!(status["state"], "healthy", "{status}");
    assert!(status["gaps"].as_u64().unwrap() > 0, "{status}");
    assert!(
        status["restarts"].as_u64().unwrap() > 0,
        "duplicates and late batches look like restarts: {status}"
    );
    assert!(status["replayed"].as_u64().unwrap() > 0, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replay_a_faulty_event_stream_marks_the_pod_unsure_and_status_says_so() {
    let fleet = Fleet::tiny(1, &["--fault-duplicate-event-batch-every", "3"]).await;
    let routing = proxy(&fleet, &[]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    for i in 0..6 {
        assert_eq!(
            complete(&client, &base, i).await,
            200,
            "requests are served whatever the index's state"
        );
    }
    let status = wait_for("the pod marked unsure", WAIT, || async {
        let s = pod_index(&client, &admin).await;
        (s["state"] == "unsure").then_some(s)
    })
    .await;
    assert!(
        status["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{status}"
    );
    let pods = get_json(&client, &format!("{admin}/status")).await["pods"].clone();
    assert_eq!(
        pods[0]["prefix_weight"], 0,
        "an unsure pod gets no prefix score"
    );
}

// === KV events: garbage on the ZeroMQ socket ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_event_socket_is_counted_and_routing_carries_on() {
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let mut publisher = zeromq::PubSocket::new();
    let bound = publisher
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap()
        .to_string();
    let routing = in_front_of(&[fleet.url(0)], &["--kv-events", &bound]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    let frames = |parts: Vec<Bytes>| zeromq::ZmqMessage::try_from(parts).unwrap();
    let seq = |n: u64| Bytes::copy_from_slice(&n.to_be_bytes());
    let garbage: Vec<Vec<Bytes>> = vec![
        // Not msgpack at all.
        vec![
            Bytes::new(),
            seq(0),
            Bytes::from_static(b"\xc1\xc1garbage\xff"),
        ],
        // msgpack, wrong shape: an int, a map, a truncated array.
        vec![Bytes::new(), seq(1), Bytes::from_static(b"\x2a")],
        vec![Bytes::new(), seq(2), Bytes::from_static(b"\x81\xa1a\x01")],
        vec![Bytes::new(), seq(3), Bytes::from_static(b"\x93\xcb\x00")],
        // An envelope whose event list holds nonsense.
        vec![
            Bytes::new(),
            seq(4),
            Bytes::from_static(b"\x93\x00\x91\xa5hello\xc0"),
        ],
        // Frames that are not [topic, seq, payload].
        vec![Bytes::from_static(b"only one frame")],
        vec![
            Bytes::new(),
            Bytes::from_static(b"\x01\x02\x03"),
            Bytes::from_static(b"\x90"),
        ],
    ];
    // PUB drops messages until the subscription arrives: send until they are counted.
    let malformed = || async {
        scrape(
            &client,
            &admin,
            "warmpath_index_dropped_total",
            &["reason=\"malformed\""],
        )
        .await
    };
    let mut rounds = 0;
    while malformed().await < garbage.len() as f64 {
        assert!(
            rounds < 200,
            "garbage never counted; /status: {}",
            pod_index(&client, &admin).await
        );
        for g in &garbage {
            publisher.send(frames(g.clone())).await.unwrap();
        }
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = pod_index(&client, &admin).await;
    assert_eq!(status["state"], "unsure", "{status}");
    assert_eq!(status["entries"], 0, "nothing entered the index: {status}");
    // The agent still routes.
    let (s, _, v) = post(
        &client,
        &format!("{base}/v1/completions"),
        completion("still here", 2, false),
    )
    .await;
    assert_eq!(s, 200, "{v}");
}

// === slow and stalled clients and engines ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_head_or_body_is_cut_off_at_the_read_timeout() {
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let routing = proxy(&fleet, &["--read-timeout-ms", "300"]).await;
    let addr = routing.listen;
    let stalled = |wire: &'static [u8]| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // The agent's read timeout runs from the first byte it reads, which can come before
        // this task resumes from its write: so the clock starts before the connect (started
        // after the write, it read 298.6 ms once in CI).
        let start = std::time::Instant::now();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(wire).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(WAIT, s.read_to_end(&mut out))
            .await
            .expect("the agent closes")
            .unwrap();
        (start.elapsed(), String::from_utf8_lossy(&out).into_owned())
    };
    // A head that never ends.
    let (took, answer) = stalled(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le").await;
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // A body that stops arriving.
    let (took, answer) = stalled(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"ha",
    )
    .await;
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("\"code\":408"),
        "an OpenAI error body: {answer}"
    );
    let client = reqwest::Client::new();
    let (s, _, _) = post(
        &client,
        &format!("http://{addr}/v1/completions"),
        completion("fine", 2, false),
    )
    .await;
    assert_eq!(s, 200);
}

/// Resident memory of process `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_gets_backpressure_not_buffering() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Engine and agent in their own processes: the agent's memory is measured alone.
    let sim = spawn_sim(&[
        "--port",
        "0",
        "--profile",
        "tiny",
        "--time-scale",
        "0.01",
        "--block-size",
        "128",
    ]);
    let engine = format!("http://{}", sim.http);
    let (agent, listen) = spawn_agent(&engine);
    let listen: std::net::SocketAddr = listen.parse().unwrap();
    let client = reqwest::Client::new();
    const TOKENS: u64 = 30_000;
    const WARM: u64 = 2_000;
    // Warm up the agent's allocations (connections, buffers) with one full stream.
    let warm = open_stream(&client, &format!("http://{listen}"), "warm up", WARM as u32).await;
    assert_eq!(warm.finish().await.last().unwrap(), "[DONE]");
    let before = rss_kib(agent.pid());
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut socket = socket.connect(listen).await.unwrap();
    let body = completion("a very long story", TOKENS as u32, true).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    wait_for(
        "the engine generated every token",
        Duration::from_secs(120),
        || async {
            (scrape(&client, &engine, "vllm:generation_tokens_total", &[]).await
                >= (TOKENS + WARM) as f64)
                .then_some(())
        },
    )
    .await;
    let grown = rss_kib(agent.pid()).saturating_sub(before);
    // Now read it all: every event arrives.
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, socket.read_to_end(&mut raw))
        .await
        .expect("the stream ends")
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let events = text.matches("data: {").count() as u64;
    assert!(text.contains("data: [DONE]"));
    assert!(events > TOKENS, "{events} events");
    println!(
        "RSS grew {grown} KiB while {} KiB waited for a client that did not read",
        raw.len() >> 10
    );
    assert!(
        grown * 1024 < raw.len() as u64 / 4,
        "RSS grew {grown} KiB of {} KiB produced",
        raw.len() >> 10
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_stalls_mid_stream_is_given_up_at_the_idle_timeout() {
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--profile",
        "tiny",
        "--fault-stall-after-tokens",
        "5",
    ])
    .await;
    let routing = proxy(&fleet, &["--upstream-idle-timeout-ms", "400"]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    let start = std::time::Instant::now();
    let events = open_stream(&client, &base, "a story that stops", 100)
        .await
        .finish()
        .await;
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], 504, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("idle timeout")
    );
    assert_eq!(
        events.iter().filter(|e| e.contains("\"text\"")).count(),
        5,
        "the tokens before the stall"
    );
    assert_eq!(
        counter(&client, &admin, "warmpath_upstream_idle_timeouts_total").await,
        1.0
    );
    // Recorded as the engine's failure, not as a client that went away.
    wait_outcomes(
        &client,
        &admin,
        "upstream_error",
        1.0,
        "the stream recorded",
    )
    .await;
    assert_eq!(outcomes(&client, &admin, "cancelled").await, 0.0);
    assert_eq!(outcomes(&client, &admin, "ok").await, 0.0);
    // The agent dropped the engine's request: its slots are free.
    wait_for("in-flight released", WAIT, || async {
        (routing.proxy.pools[0].pool.endpoints()[0].in_flight() == 0
            && routing.proxy.admission.active() == 0)
            .then_some(())
    })
    .await;
}

/// `warmpath_requests_total` for one outcome.
async fn outcomes(client: &reqwest::Client, admin: &str, outcome: &str) -> f64 {
    let label = format!("outcome=\"{outcome}\"");
    scrape(client, admin, "warmpath_requests_total", &[&label]).await
}

/// Waits, as `what`, until `n` requests are counted with `outcome` (the record follows the
/// response).
async fn wait_outcomes(client: &reqwest::Client, admin: &str, outcome: &str, n: f64, what: &str) {
    wait_for(what, WAIT, || async {
        (outcomes(client, admin, outcome).await == n).then_some(())
    })
    .await;
}

/// A counter without labels, scraped from the agent's `/metrics`.
async fn counter(client: &reqwest::Client, admin: &str, name: &str) -> f64 {
    scrape(client, admin, name, &[]).await
}

/// An engine that accepts the connection, reads the request and never sends a byte back.
async fn silent_engine() -> FakeEngine {
    FakeEngine::start(Scripted {
        bytes: Vec::new(),
        close: false,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_never_answers_gets_a_504_at_the_head_timeout() {
    const HEAD_MS: u64 = 400;
    let silent = silent_engine().await;
    let routing = agent_for(&silent, &["--upstream-head-timeout-ms", "400"]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    for stream in [false, true] {
        let start = std::time::Instant::now();
        let (status, _, v) = post(
            &client,
            &format!("{base}/v1/completions"),
            completion("never answered", 4, stream),
        )
        .await;
        let took = start.elapsed();
        println!("stream {stream}: {status} after {took:?}");
        assert_eq!(status, 504, "stream {stream}: {v}");
        assert!(took >= Duration::from_millis(HEAD_MS), "{took:?}");
        // Given up at the timeout, not at some later one (the 2 s connect timeout, the 30 s
        // of WAIT): well under a second past it even on a loaded machine.
        assert!(took < Duration::from_millis(HEAD_MS + 1500), "{took:?}");
        assert_eq!(v["error"]["code"], 504, "{v}");
        assert_eq!(v["error"]["type"], "GatewayTimeoutError", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("upstream head timeout") && message.contains("400 ms"),
            "{message}"
        );
    }
    // Each request reached the engine once (no other endpoint to retry on).
    assert_eq!(silent.take_seen().len(), 2);
    assert_eq!(
        counter(&client, &admin, "warmpath_upstream_head_timeouts_total").await,
        2.0
    );
    wait_outcomes(&client, &admin, "upstream_error", 2.0, "both recorded").await;
    assert_eq!(routing.proxy.pools[0].pool.endpoints()[0].in_flight(), 0);
    assert_eq!(routing.proxy.admission.active(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_timeout_is_retried_on_another_pod_before_the_first_byte() {
    let silent = silent_engine().await;
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let endpoints = [format!("http://{}", silent.addr), fleet.url(0)];
    let routing = in_front_of(
        &endpoints,
        &[
            "--upstream-head-timeout-ms",
            "300",
            "--policy",
            "round-robin",
        ],
    )
    .await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    let sim = fleet.engines[0].http.to_string();
    for i in 0..4 {
        let (status, pod) = served_by(&client, &base, &format!("retried {i}")).await;
        assert_eq!(status, 200);
        assert_eq!(pod, sim);
    }
    // Round robin sent some of them to the silent engine first; each of those timed out and
    // was answered by the simulator.
    let silent_saw = silent.take_seen().len();
    assert!(silent_saw >= 1, "round robin never tried the silent engine");
    assert_eq!(
        counter(&client, &admin, "warmpath_upstream_head_timeouts_total").await,
        silent_saw as f64
    );
    wait_outcomes(&client, &admin, "ok", 4.0, "all recorded").await;
    assert_eq!(outcomes(&client, &admin, "upstream_error").await, 0.0);
}

// === malformed input: HTTP (application level), config, admin ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_clear_errors_and_counters_and_routing_stays_correct() {
    let fleet = Fleet::tiny(2, &["--kv-replay-port", "0"]).await;
    let routing = proxy(&fleet, &[]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    let deep = format!(
        "{{\"prompt\": {}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    // (path, body, status). The agent answers each itself, except the last: a prompt nested
    // too deep to be a prompt is not the router's to judge (it routes without prefix
    // information, as for any prompt it cannot tokenize) and the engine refuses it.
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("/v1/completions", b"{nope".to_vec(), 400),
        ("/v1/completions", b"".to_vec(), 400),
        ("/v1/completions", b"\x00\xff\xfe garbage".to_vec(), 400),
        ("/v1/completions", b"[1, 2]".to_vec(), 400),
        ("/v1/completions", b"\"a string\"".to_vec(), 400),
        (
            "/v1/completions",
            br#"{"model": 3, "prompt": "x"}"#.to_vec(),
            400,
        ),
        (
            "/v1/completions",
            br#"{"model": ["a"], "prompt": "x"}"#.to_vec(),
            400,
        ),
        (
            "/v1/completions",
            b"{\"prompt\": \"\xff\xfe\"}".to_vec(),
            400,
        ),
        ("/v1/chat/completions", b"{\"messages\": [".to_vec(), 400),
        (
            "/v1/chat/completions",
            b"{\"messages\": [{\"role\": 1}], \"model\": {}}".to_vec(),
            400,
        ),
        (
            "/v1/completions",
            br#"{"model": "no-such-model", "prompt": "x"}"#.to_vec(),
            404,
        ),
        ("/v1/completions", deep.into_bytes(), 400),
    ];
    let by_agent = cases.len() - 1;
    for (n, (path, body, want)) in cases.iter().enumerate() {
        let r = client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or_else(|e| {
            panic!(
                "{path} {}: not JSON: {e}",
                String::from_utf8_lossy(&body[..body.len().min(40)])
            )
        });
        let what = String::from_utf8_lossy(&body[..body.len().min(40)]).into_owned();
        assert_eq!(status, *want, "{what}: {v}");
        assert_eq!(v["error"]["code"], *want, "{what}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        let reached = scrape(&client, &admin, "warmpath_endpoint_requests_total", &[]).await;
        let want_reached = if n < by_agent { 0.0 } else { 1.0 };
        assert_eq!(reached, want_reached, "{what}: engine requests ({v})");
    }
    wait_for("every refusal counted", WAIT, || async {
        let n = scrape(
            &client,
            &admin,
            "warmpath_requests_total",
            &["outcome=\"client_error\""],
        )
        .await;
        (n == cases.len() as f64).then_some(())
    })
    .await;
    // Routing is intact: a shared prefix still follows its cache.
    let shared: String = (0..60)
        .map(|i| format!("rule {i} says be careful. "))
        .collect();
    let (s, first, _) = post(
        &client,
        &format!("{base}/v1/completions"),
        completion(&format!("{shared} Q1"), 2, false),
    )
    .await;
    assert_eq!(s, 200);
    let pod = first["x-warmpath-pod"].clone();
    let again = wait_for("the prefix indexed and followed", WAIT, || {
        let (client, base, shared) = (client.clone(), base.clone(), shared.clone());
        async move {
            let (s, h, _) = post(
                &client,
                &format!("{base}/v1/completions"),
                completion(&format!("{shared} Q2"), 2, false),
            )
            .await;
            assert_eq!(s, 200);
            let blocks: u64 = h["x-warmpath-prefix-blocks"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            (blocks > 0).then_some(h)
        }
    })
    .await;
    assert_eq!(again["x-warmpath-pod"], pod);
}

#[tokio::test]
async fn admin_unknown_paths_and_methods_get_clear_errors() {
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let routing = proxy(&fleet, &[]).await;
    let admin = format!("http://{}", routing.admin);
    let client = reqwest::Client::new();
    for (method, path) in [
        (reqwest::Method::GET, "/nope"),
        (reqwest::Method::POST, "/status"),
        (reqwest::Method::DELETE, "/metrics"),
        (reqwest::Method::GET, "/status/../../etc/passwd"),
        (reqwest::Method::PUT, "/"),
    ] {
        let r = client
            .request(method.clone(), format!("{admin}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method} {path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], 404, "{method} {path}: {v}");
    }
    let status = get_json(&client, &format!("{admin}/status")).await;
    assert_eq!(status["model"], "sim-llama");
    assert_eq!(
        counter(&client, &admin, "warmpath_admin_unknown_requests_total").await,
        5.0
    );
}

#[test]
fn bad_configuration_is_refused_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("warmpath-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base =
        "version: 1\npools:\n- name: p\n  model: m\n  endpoints:\n  - url: http://127.0.0.1:1\n";
    for (text, field) in [
        ("version: [\n", "f.yaml"),
        ("\u{0}\u{1}binary", "f.yaml"),
        (
            &*format!("{base}proxy: {{maxConcurrent: lots}}\n"),
            "proxy.maxConcurrent",
        ),
        (
            &*format!("{base}proxy: {{maxPromptBytes: 0}}\n"),
            "proxy.maxPromptBytes",
        ),
        (
            &*format!("{base}proxy: {{queueTimeoutMs: -5}}\n"),
            "proxy.queueTimeoutMs",
        ),
        (
            &*format!("{base}proxy: {{readTimeoutMs: 0}}\n"),
            "proxy.readTimeoutMs",
        ),
        (
            &*format!("{base}proxy: {{maxConcurent: 3}}\n"),
            "maxConcurent",
        ),
        (
            &*base.replace("http://127.0.0.1:1", "ftp://x"),
            "pools[0].endpoints[0].url",
        ),
    ] {
        let path = dir.join("f.yaml");
        std::fs::write(&path, text).unwrap();
        let err = warmpath_agent::config::load(&path).unwrap_err().to_string();
        assert!(err.contains(field), "{text:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    use clap::Parser;
    for (flags, field) in [
        (&["--max-prompt-bytes", "0"][..], "--max-prompt-bytes"),
        (
            &["--max-prompt-bytes", "9", "--max-body-bytes", "8"],
            "--max-prompt-bytes",
        ),
        (&["--queue-timeout-ms", "0"], "--queue-timeout-ms"),
    ] {
        let mut args = vec!["agent", "--endpoint", "http://127.0.0.1:1"];
        args.extend_from_slice(flags);
        let err = warmpath_agent::args::AgentArgs::try_parse_from(args)
            .unwrap()
            .config()
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{flags:?}: {err}");
    }
    assert!(
        warmpath_agent::args::AgentArgs::try_parse_from(["agent", "--max-concurrent", "-1"])
            .is_err()
    );
}
