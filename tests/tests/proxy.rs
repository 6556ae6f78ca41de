//! The routing proxy in front of a simulator fleet: prefix affinity, spreading, retries,
//! errors and cancellation.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use serde_json::json;
use warmpath_e2e::{
    agent::proxy,
    sim::{Fleet, TemplateDir, get_json, metric, stream_completion, wait_for},
};

const WAIT: Duration = Duration::from_secs(20);

fn shared_prompt(group: u32, question: u32) -> String {
    let system: String = (0..60)
        .map(|i| format!("rule {} of group {group} says be careful. ", i))
        .collect();
    format!("{system} Question number {question}: what now?")
}

async fn complete(client: &reqwest::Client, base: &str, prompt: &str) -> (String, u64) {
    let (pod, v) = warmpath_e2e::agent::complete(client, base, json!(prompt)).await;
    (
        pod,
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

async fn fleet(n: u16) -> Fleet {
    Fleet::tiny(n, &["--kv-replay-port", "0"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefixes_follow_their_cache_and_cold_ones_spread() {
    let fleet = fleet(3).await;
    let routing = proxy(&fleet, &[]).await;
    let base = format!("http://{}", routing.listen);
    let client = reqwest::Client::new();
    // Three groups, first request of each is cold.
    let mut homes = Vec::new();
    for g in 0..3 {
        homes.push(complete(&client, &base, &shared_prompt(g, 0)).await.0);
    }
    let distinct: std::collections::HashSet<_> = homes.iter().collect();
    assert_eq!(distinct.len(), 3, "cold prefixes spread: {homes:?}");
    // Every later request of a group lands where its prefix is cached, and hits the cache.
    for q in 1..4 {
        for g in 0..3 {
            let (pod, cached) = complete(&client, &base, &shared_prompt(g, q)).await;
            assert_eq!(pod, homes[g as usize], "group {g} question {q}");
            assert!(cached > 0, "group {g} question {q} cached {cached}");
        }
    }
    let status = get_json(&client, &format!("http://{}/status", routing.admin)).await;
    assert_eq!(status["pods"].as_array().unwrap().len(), 3);
    // Each engine's own /metrics is scraped into the decision inputs.
    let admin = format!("http://{}/status", routing.admin);
    wait_for("engine load scraped", WAIT, || {
        let (client, admin) = (client.clone(), admin.clone());
        async move {
            let s: serde_json::Value = client.get(admin).send().await.ok()?.json().await.ok()?;
            s["pods"]
                .as_array()?
                .iter()
                .all(|p| p["load"]["engine"]["waiting"].is_u64())
                .then_some(())
        }
    })
    .await;
    assert!(
        status["pods"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["index"]["confirmed"].as_u64().unwrap() > 0),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_is_retried_before_the_first_byte() {
    // No KV events here: --kv-events is per endpoint, and the dead one has none.
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dead_url = format!("http://{dead}");
    let routing = proxy(
        &fleet,
        &["--endpoint", &dead_url, "--policy", "round-robin"],
    )
    .await;
    let base = format!("http://{}", routing.listen);
    let client = reqwest::Client::new();
    for i in 0..4 {
        let (pod, _) = complete(&client, &base, &format!("hello {i}")).await;
        assert_eq!(pod, fleet.engines[0].http.to_string());
    }
    let status = get_json(&client, &format!("http://{}/status", routing.admin)).await;
    assert!(
        status["pods"][1]["load"]["failures"].as_u64().unwrap() >= 1,
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_endpoint_fails_the_client_gets_the_last_failure() {
    let dead: Vec<String> = (0..2)
        .map(|_| {
            let addr = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            format!("http://{addr}")
        })
        .collect();
    let routing = proxy(
        &Fleet {
            engines: Vec::new(),
        },
        &["--endpoint", &dead[0], "--endpoint", &dead[1]],
    )
    .await;
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", routing.listen))
        .json(&json!({"model": "sim-llama", "prompt": "hello", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: serde_json::Value = r.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert_eq!(v["error"]["type"], "BadGatewayError", "{v}");
    // The answer names the endpoint tried last; both were tried.
    assert!(
        dead.iter()
            .any(|d| message.starts_with(&format!("{} failed: connect", &d["http://".len()..]))),
        "{v}"
    );
    let client = reqwest::Client::new();
    let status = get_json(&client, &format!("http://{}/status", routing.admin)).await;
    for pod in 0..2 {
        assert!(
            status["pods"][pod]["load"]["failures"].as_u64().unwrap() >= 1,
            "{status}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors() {
    let fleet = fleet(1).await;
    let routing = proxy(&fleet, &[]).await;
    let base = format!("http://{}", routing.listen);
    let client = reqwest::Client::new();
    let post = |body: Vec<u8>| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let r = client
                .post(format!("{base}/v1/completions"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let (s, v) = post(b"{nope".to_vec()).await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (400, Some("BadRequestError"))
    );
    let (s, v) = post(
        json!({"model": "other", "prompt": "x"})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["message"].as_str()),
        (404, Some("The model `other` does not exist."))
    );
    let (s, _) = post(vec![b' '; 17 * 1024 * 1024]).await;
    assert_eq!(s, 413);
    let models = get_json(&client, &format!("{base}/v1/models")).await;
    assert_eq!(models["object"], "list");
    let card = &models["data"][0];
    assert_eq!(
        (&card["id"], &card["object"]),
        (&json!("sim-llama"), &json!("model"))
    );
    // `created` (unix seconds) is required by typed clients (async-openai's `Model`).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let created = card["created"].as_u64().expect("created is unix seconds");
    assert!(created.abs_diff(now) < 600, "{created} vs {now}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_cancels_the_upstream_request() {
    use futures::StreamExt;
    let fleet = Fleet::start(&["--port", "0", "--profile", "llama-3.1-8b-h100"]).await;
    let routing = proxy(&fleet, &[]).await;
    let client = reqwest::Client::new();
    let body = json!({"prompt": "tell me a long story", "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let resp = client
        .post(format!("http://{}/v1/completions", routing.listen))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(stream);
    let sim = fleet.url(0);
    wait_for("engine sees the abort", WAIT, || {
        let (client, sim) = (client.clone(), sim.clone());
        async move { (metric(&client, &sim, "vllm:request_aborted_total").await == 1.0).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_request_body_is_forwarded_intact() {
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let routing = proxy(&fleet, &[]).await;
    let client = reqwest::Client::new();
    // A streamed (chunked) request body: the proxy must not forward the client's framing.
    let chunks: Vec<Result<&'static [u8], std::io::Error>> = vec![
        Ok(br#"{"prompt": "hello "#),
        Ok(br#"there", "max_tokens": 2}"#),
    ];
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let r = client
        .post(format!("http://{}/v1/completions", routing.listen))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_prefix_spills_over_once_its_pod_is_busier_than_recomputing() {
    // Real-time 8B timing: prefill takes long enough for a queue to form.
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--replicas",
        "2",
        "--profile",
        "llama-3.1-8b-h100",
        "--kv-events-port",
        "0",
        "--kv-replay-port",
        "0",
    ])
    .await;
    let routing = proxy(&fleet, &[]).await;
    let base = format!("http://{}", routing.listen);
    let client = reqwest::Client::new();
    let system = shared_prompt(7, 0);
    // Each request adds a long question: ~20 uncached blocks of prefill on top of the prefix.
    let question = |q: u32| {
        format!(
            "{system} {}",
            (0..60)
                .map(|i| format!("detail {i} of question {q} matters. "))
                .collect::<String>()
        )
    };
    let (home, _) = complete(&client, &base, &question(0)).await;
    let burst: Vec<_> = (1..=40)
        .map(|q| {
            let (client, base, prompt) = (client.clone(), base.clone(), question(q));
            tokio::spawn(async move { complete(&client, &base, &prompt).await.0 })
        })
        .collect();
    let mut pods = Vec::new();
    for t in burst {
        pods.push(t.await.unwrap());
    }
    let at_home = pods.iter().filter(|p| **p == home).count();
    // Affinity keeps a share on the pod holding the prefix, but once its queued prefill work
    // exceeds the cost of recomputing the prefix elsewhere, requests go to the other pod.
    assert!(at_home >= 8, "only {at_home} of 40 stayed with the prefix");
    assert!(at_home <= 32, "{at_home} of 40 piled onto the prefix's pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_requests_are_served_where_their_adapter_is_and_follow_its_cache() {
    // Engine 0 serves the `sql` adapter, engine 1 only the base model.
    let with_lora = Fleet::tiny(1, &["--kv-replay-port", "0", "--lora-modules", "sql"]).await;
    let plain = fleet(1).await;
    let mut fleet = with_lora;
    fleet.engines.extend(plain.engines);
    let routing = proxy(&fleet, &[]).await;
    let base = format!("http://{}", routing.listen);
    let client = reqwest::Client::new();
    // The proxy learns the adapters from the engines' /v1/models and lists them.
    let models_url = format!("{base}/v1/models");
    wait_for("adapters listed", WAIT, || {
        let (client, url) = (client.clone(), models_url.clone());
        async move {
            let v: serde_json::Value = client.get(url).send().await.ok()?.json().await.ok()?;
            v["data"]
                .as_array()?
                .iter()
                .any(|m| m["id"] == "sql" && m["parent"] == "sim-llama")
                .then_some(())
        }
    })
    .await;
    let sql_pod = fleet.engines[0].http.to_string();
    let prompt = shared_prompt(7, 0);
    let mut cached = Vec::new();
    for _ in 0..3 {
        let r = client
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "sql", "prompt": prompt, "max_tokens": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["x-warmpath-pod"],
            sql_pod.as_str(),
            "only engine 0 serves sql"
        );
        let prefix: usize = r.headers()["x-warmpath-prefix-blocks"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let v: serde_json::Value = r.json().await.unwrap();
        cached.push((
            prefix,
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        ));
    }
    assert!(cached[2].0 > 0 && cached[2].1 > 0, "{cached:?}");
    // Adapter keys agree with the engine's: its events confirm the speculative entries.
    let admin = format!("http://{}/status", routing.admin);
    wait_for("engine 0's events confirm adapter keys", WAIT, || {
        let (client, admin) = (client.clone(), admin.clone());
        async move {
            let s: serde_json::Value = client.get(admin).send().await.ok()?.json().await.ok()?;
            (s["pods"][0]["index"]["confirmed"].as_u64()? > 0).then_some(())
        }
    })
    .await;
    // An adapter nobody serves is a 404 with vLLM's message.
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "nosuch", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cookie_keeps_a_conversation_on_one_pod() {
    let fleet = fleet(3).await;
    let routing = proxy(&fleet, &["--policy", "session", "--session-cookie", "sid"]).await;
    let base = format!("http://{}", routing.listen);
    let client = reqwest::Client::new();
    let mut homes = std::collections::HashMap::new();
    for turn in 0..4 {
        for user in 0..6 {
            let r = client
                .post(format!("{base}/v1/completions"))
                .header("cookie", format!("theme=dark; sid=user-{user}"))
                .json(&json!({"model": "sim-llama", "prompt": format!("turn {turn} of user {user}"), "max_tokens": 1}))
                .send()
                .await
                .unwrap();
            let pod = r.headers()["x-warmpath-pod"].to_str().unwrap().to_string();
            assert_eq!(
                homes.entry(user).or_insert_with(|| pod.clone()),
                &pod,
                "user {user} turn {turn}"
            );
        }
    }
    let distinct: std::collections::HashSet<_> = homes.values().collect();
    assert!(distinct.len() >= 2, "sessions spread: {homes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_that_is_not_up_yet_does_not_hold_the_agent() {
    // The engine's events port, with nothing listening there yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let events = format!("tcp://127.0.0.1:{port}");
    let http = Fleet::start(&["--port", "0", "--profile", "tiny"]).await;
    let routing = tokio::time::timeout(
        WAIT,
        warmpath_e2e::agent::proxy(
            &Fleet {
                engines: Vec::new(),
            },
            &["--endpoint", &http.url(0), "--kv-events", &events],
        ),
    )
    .await
    .expect("the agent starts without its publisher");
    let base = format!("http://{}", routing.listen);
    let client = reqwest::Client::new();
    // Served meanwhile, without prefix information for that pod.
    let (_, _) = complete(&client, &base, &shared_prompt(1, 0)).await;
    let status = get_json(&client, &format!("http://{}/status", routing.admin)).await;
    assert_eq!(status["pods"][0]["prefix_weight"], 0, "{status}");
    // Once a publisher appears on that port, events flow into the index.
    let publisher = Fleet::start(&[
        "--port",
        "0",
        "--profile",
        "tiny",
        "--kv-events-port",
        &port.to_string(),
    ])
    .await;
    let admin = format!("http://{}/status", routing.admin);
    let url = publisher.url(0);
    let round = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    wait_for("events from the late publisher", WAIT, || {
        let (client, admin, url, round) =
            (client.clone(), admin.clone(), url.clone(), round.clone());
        async move {
            // Traffic straight to the publishing engine makes it emit BlockStored events; a
            // new prompt each time, so events keep coming until the subscription is up
            // (events published before it are lost, as with any ZeroMQ subscriber).
            let n = round.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let _ = client
                .post(format!("{url}/v1/completions"))
                .json(&json!({"prompt": shared_prompt(100 + n, 0), "max_tokens": 1}))
                .send()
                .await;
            let s: serde_json::Value = client.get(admin).send().await.ok()?.json().await.ok()?;
            (s["pods"][0]["index"]["blocks_stored"].as_u64()? > 0).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_upstreams_carry_every_request_and_stream() {
    let fleet = fleet(2).await;
    let routing = proxy(&fleet, &["--upstream-protocol", "h2"]).await;
    let base = format!("http://{}", routing.listen);
    let client = reqwest::Client::new();
    let status = get_json(&client, &format!("http://{}/status", routing.admin)).await;
    assert_eq!(status["pools"][0]["upstream"], "h2", "{status}");
    // Concurrent requests, streaming and not, all multiplexed to the engines over h2c.
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        let (client, base) = (client.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                let s = stream_completion(
                    &client,
                    &base,
                    json!({"model": "sim-llama", "prompt": shared_prompt(i, i), "max_tokens": 4, "stream": true}),
                )
                .await;
                assert_eq!(s.finish_reason.as_deref(), Some("length"));
                assert!(s.usage.is_none(), "the client did not ask for usage");
            } else {
                complete(&client, &base, &shared_prompt(i, i)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Completions went over HTTP/2 only (the agent's metrics scrapes stay on HTTP/1.1).
    let mut h2 = 0;
    for i in 0..2 {
        let v = get_json(&client, &format!("{}/sim/http", fleet.url(i))).await;
        h2 += v["http2"].as_u64().unwrap();
    }
    assert_eq!(h2, 8, "every completion reached an engine over h2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_clients_are_served_streaming_and_not() {
    let fleet = fleet(1).await;
    let routing = proxy(&fleet, &[]).await;
    let base = format!("http://{}", routing.listen);
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "sim-llama", "prompt": "over h2c", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let s = stream_completion(
        &client,
        &base,
        json!({"model": "sim-llama", "prompt": "streamed over h2c", "max_tokens": 3, "stream": true}),
    )
    .await;
    assert_eq!(s.finish_reason.as_deref(), Some("length"));
    assert!(s.usage.is_none(), "the client did not ask for usage");
}

/// Writes `wire` on a fresh connection and reads until the proxy closes it (or `until` shows
/// up in what was read).
async fn raw(addr: &str, wire: &[u8], until: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(wire).await.unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 8192];
    loop {
        let n = tokio::time::timeout(WAIT, s.read(&mut b))
            .await
            .expect("the proxy answers")
            .unwrap_or(0);
        got.extend_from_slice(&b[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if n == 0 || until.is_some_and(|u| text.matches(u).count() > 0) {
            return text;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http1_server_answers_odd_and_malformed_requests_clearly() {
    let fleet = fleet(1).await;
    let routing = proxy(&fleet, &[]).await;
    let addr = routing.listen.to_string();
    let body = r#"{"model": "sim-llama", "prompt": "hi", "max_tokens": 1}"#;
    let post = |extra: &str, body: &str| {
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    // Malformed heads: 400 with an OpenAI error body, then the connection closes.
    for wire in [
        "GARBAGE\r\n\r\n".to_string(),
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: x\r\n\r\n".to_string(),
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ),
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n".to_string(),
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
            .to_string(),
    ] {
        let got = raw(&addr, wire.as_bytes(), None).await;
        assert!(got.starts_with("HTTP/1.1 400 "), "{wire:?} -> {got}");
        assert!(got.contains("connection: close"), "{got}");
        assert!(got.contains(r#""type":"BadRequestError""#), "{got}");
    }
    // Too many header fields: 431.
    let many: String = (0..120).map(|i| format!("x-h{i}: v\r\n")).collect();
    let got = raw(&addr, post(&many, body).as_bytes(), None).await;
    assert!(got.starts_with("HTTP/1.1 431 "), "{got}");
    // A declared body over the limit is refused before it is read.
    let got = raw(
        &addr,
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 999999999\r\n\r\n",
        None,
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 413 "), "{got}");
    assert!(got.contains("connection: close"), "{got}");
    // Pipelined requests are answered in order on one connection (an `Expect:
    // 100-continue` whose body is already there needs no interim answer); the last asks to
    // close.
    let wire = format!(
        "{}{}{}",
        post("", body),
        post("expect: 100-continue\r\n", body),
        post("connection: close\r\n", body)
    );
    let got = raw(&addr, wire.as_bytes(), None).await;
    assert_eq!(got.matches("HTTP/1.1 200 OK").count(), 3, "{got}");
    assert_eq!(got.matches("\"completion_tokens\":1").count(), 3, "{got}");
    assert!(got.contains("connection: close"), "{got}");
    // HTTP/1.0 without keep-alive: one answer, delimited by its length, then close.
    let got = raw(
        &addr,
        format!(
            "POST /v1/completions HTTP/1.0\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
        None,
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
    assert!(got.contains("content-length: "), "{got}");
    // A streamed answer to an HTTP/1.1 client is chunked and ends with the last chunk.
    let stream_body = r#"{"model": "sim-llama", "prompt": "hi", "max_tokens": 2, "stream": true}"#;
    let got = raw(&addr, post("", stream_body).as_bytes(), Some("0\r\n\r\n")).await;
    assert!(got.contains("transfer-encoding: chunked"), "{got}");
    assert!(got.contains("data: [DONE]"), "{got}");
    assert!(got.ends_with("\r\n0\r\n\r\n"), "{got}");
    // A chunked request body (with an extension and a trailer) arrives whole.
    let chunked = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5;ext=1\r\n{}\r\n{:x}\r\n{}\r\n0\r\nx-trailer: t\r\n\r\n",
        &body[..5],
        body.len() - 5,
        &body[5..]
    );
    let got = raw(&addr, chunked.as_bytes(), None).await;
    assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
    assert!(got.contains("\"completion_tokens\":1"), "{got}");
    // HEAD passes through without a body.
    let got = raw(
        &addr,
        b"HEAD /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        None,
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
    assert!(got.ends_with("\r\n\r\n"), "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_prefix_keys_are_counted_by_reason_in_status() {
    // Mistral Nemo's template raises on two user turns in a row: the engine answers 400, the
    // agent routes the request without keys and says why in /status.
    let dir = TemplateDir::new(
        "mistral-nemo-unkeyed",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        json!({"bos_token": "<s>", "eos_token": "</s>"}),
    );
    let fleet = Fleet::tiny(2, &["--tokenizer", &dir.path()]).await;
    let local = proxy(&fleet, &["--tokenizer", &dir.path()]).await;
    let engine = proxy(&fleet, &["--tokens", "engine"]).await;
    let client = reqwest::Client::new();
    let chat = |routing: &warmpath_agent::agent::Routing, messages: serde_json::Value| {
        let r = client
            .post(format!("http://{}/v1/chat/completions", routing.listen))
            .json(&json!({"model": "sim-llama", "messages": messages, "max_tokens": 2}))
            .send();
        async move { r.await.unwrap().status().as_u16() }
    };
    let twice = json!([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]);
    let fine = json!([{"role": "user", "content": "one"}]);
    for routing in [&local, &engine] {
        assert_eq!(chat(routing, fine.clone()).await, 200);
        assert_eq!(chat(routing, twice.clone()).await, 400);
        assert_eq!(chat(routing, twice.clone()).await, 400);
    }
    let pool = |routing: &warmpath_agent::agent::Routing| {
        let url = format!("http://{}/status", routing.admin);
        let client = client.clone();
        async move { get_json(&client, &url).await["pools"][0].clone() }
    };
    let local = pool(&local).await;
    assert_eq!(local["unkeyed"], json!({"template": 2}), "{local}");
    assert_eq!(
        local["unkeyed_first_error"]["template"],
        "chat template: After the optional system message, conversation roles must alternate \
         user/assistant/user/assistant/..."
    );
    // The engine token source: the engine's /tokenize refuses the same prompt.
    let engine = pool(&engine).await;
    assert_eq!(engine["unkeyed"], json!({"engine_tokenize": 2}), "{engine}");
    let first = engine["unkeyed_first_error"]["engine_tokenize"]
        .as_str()
        .unwrap();
    assert!(
        first.ends_with("/tokenize answered 400 Bad Request"),
        "{first}"
    );
}
