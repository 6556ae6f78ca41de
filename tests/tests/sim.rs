//! The engine simulator, end to end over HTTP: prefix caching, KV pressure, errors, determinism.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use serde_json::json;
use warmpath_e2e::sim::{Fleet, TemplateDir, get_json, metric, stream_completion, wait_for};

const WAIT: Duration = Duration::from_secs(20);

/// `n` token ids derived from `seed` (all inside the built-in vocabulary).
fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 100 + (seed.wrapping_mul(7919) + i * 31) % 5000)
        .collect()
}

fn prompt(shared: &[u32], unique_seed: u32, unique: usize) -> Vec<u32> {
    let mut p = shared.to_vec();
    p.extend(tokens(unique_seed, unique));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefix_is_served_from_cache_and_ttft_drops_with_the_uncached_part() {
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--profile",
        "llama-3.1-8b-h100",
        "--time-scale",
        "0.5",
    ])
    .await;
    let client = reqwest::Client::new();
    let base = fleet.url(0);
    let shared = tokens(1, 4096);
    let body = |p: Vec<u32>| {
        json!({"model": "sim-llama", "prompt": p, "max_tokens": 4, "stream": true,
                                     "stream_options": {"include_usage": true}, "ignore_eos": true})
    };
    let cold = stream_completion(&client, &base, body(prompt(&shared, 2, 100))).await;
    let warm = stream_completion(&client, &base, body(prompt(&shared, 3, 100))).await;
    assert_eq!(
        cold.usage.as_ref().unwrap()["prompt_tokens_details"]["cached_tokens"],
        0
    );
    assert_eq!(
        warm.usage.as_ref().unwrap()["prompt_tokens_details"]["cached_tokens"],
        4096,
        "all 256 shared full blocks"
    );
    assert_eq!(warm.usage.as_ref().unwrap()["completion_tokens"], 4);
    // Cold prefills 4196 tokens, warm 100: modelled ~0.21 s vs ~0.006 s (x0.5 wall).
    assert!(
        warm.ttft * 4 < cold.ttft,
        "warm {:?} vs cold {:?}",
        warm.ttft,
        cold.ttft
    );
    let hits = metric(&client, &base, "vllm:prefix_cache_hits_total").await;
    let queries = metric(&client, &base, "vllm:prefix_cache_queries_total").await;
    assert_eq!((hits, queries), (4096.0, 2.0 * 4196.0));
}

/// Hit rate of a cyclic workload over `groups` prefixes of `prefix` tokens, 3 rounds.
async fn cyclic_hit_rate(
    num_gpu_blocks: usize,
    cpu_blocks: usize,
    groups: u32,
    prefix: usize,
) -> (f64, usize, usize) {
    let blocks = num_gpu_blocks.to_string();
    let cpu = cpu_blocks.to_string();
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--profile",
        "tiny",
        "--time-scale",
        "0.2",
        "--num-gpu-blocks",
        &blocks,
        "--cpu-offload-blocks",
        &cpu,
        "--max-model-len",
        "1024",
    ])
    .await;
    let client = reqwest::Client::new();
    let base = fleet.url(0);
    for round in 0..3u32 {
        for g in 0..groups {
            let p = prompt(&tokens(1000 + g, prefix), round * 100 + g, 16);
            let body =
                json!({"model": "sim-llama", "prompt": p, "max_tokens": 2, "ignore_eos": true});
            let r = client
                .post(format!("{base}/v1/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    }
    let hits = metric(&client, &base, "vllm:prefix_cache_hits_total").await;
    let queries = metric(&client, &base, "vllm:prefix_cache_queries_total").await;
    let cache = get_json(&client, &format!("{base}/sim/cache")).await;
    let len = |k: &str| cache[k].as_array().unwrap().len();
    (hits / queries, len("blocks"), len("cpu_blocks"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_pressure_evicts_and_the_hit_rate_falls_as_lru_predicts() {
    // 4 groups x 512-token prefixes = 128 blocks of working set (+ unique tails).
    // Roomy cache: rounds 2 and 3 hit every prefix: 2/3 x 512/528 = 0.646.
    let (roomy, _, _) = cyclic_hit_rate(1024, 0, 4, 512).await;
    assert!(
        (roomy - 2.0 / 3.0 * 512.0 / 528.0).abs() < 0.01,
        "roomy hit rate {roomy:.3}"
    );
    // 64 blocks hold two prefixes: cycling over four under LRU evicts each before its reuse.
    let (tight, cached, _) = cyclic_hit_rate(64, 0, 4, 512).await;
    assert!(tight < 0.05, "tight hit rate {tight:.3}");
    assert!(cached <= 64);
    // The same GPU cache with a CPU tier big enough for the rest: prefixes come back from CPU.
    let (tiered, gpu, cpu) = cyclic_hit_rate(64, 256, 4, 512).await;
    assert!(tiered > 0.6, "tiered hit rate {tiered:.3}");
    assert!(gpu <= 64 && cpu > 0 && cpu <= 256, "gpu {gpu} cpu {cpu}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_use_vllm_bodies_and_status_codes() {
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--profile",
        "tiny",
        "--max-model-len",
        "256",
        "--num-gpu-blocks",
        "64",
    ])
    .await;
    let client = reqwest::Client::new();
    let base = fleet.url(0);
    let post = |path: &'static str, body: String| {
        let client = client.clone();
        let url = format!("{base}{path}");
        async move {
            let r = client
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (s, v) = post(
        "/v1/completions",
        json!({"model": "nope", "prompt": "hi"}).to_string(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["type"].as_str(), v["error"]["code"].as_u64()),
        (404, Some("NotFoundError"), Some(404))
    );
    assert_eq!(v["error"]["message"], "The model `nope` does not exist.");
    let (s, v) = post("/v1/completions", "{not json".into()).await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (400, Some("BadRequestError"))
    );
    let (s, v) = post(
        "/v1/completions",
        json!({"prompt": tokens(1, 300)}).to_string(),
    )
    .await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 256"),
        "{v}"
    );
    let (s, _) = post(
        "/v1/completions",
        json!({"prompt": "hi", "n": 2}).to_string(),
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = post(
        "/v1/chat/completions",
        json!({"model": "sim-llama"}).to_string(),
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = post("/v1/completions", json!({"prompt": [999_999]}).to_string()).await;
    assert_eq!(s, 400);
    let r = client.get(format!("{base}/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_503_and_crash_turns_health_red() {
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--profile",
        "tiny",
        "--max-waiting",
        "0",
        "--fault-crash-after",
        "1",
    ])
    .await;
    let client = reqwest::Client::new();
    let base = fleet.url(0);
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500, "second request crashes the engine");
    wait_for("health 503", WAIT, || {
        let client = client.clone();
        let url = format!("{base}/health");
        async move { (client.get(url).send().await.ok()?.status() == 503).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_seed_same_output_and_stop_strings_cut() {
    let a = Fleet::start(&["--port", "0", "--profile", "tiny", "--seed", "7"]).await;
    let b = Fleet::start(&["--port", "0", "--profile", "tiny", "--seed", "7"]).await;
    let client = reqwest::Client::new();
    let body = json!({"prompt": "The quick brown fox", "max_tokens": 12, "ignore_eos": true, "stream": true});
    let ra = stream_completion(&client, &a.url(0), body.clone()).await;
    let rb = stream_completion(&client, &b.url(0), body).await;
    assert_eq!(ra.text, rb.text);
    assert_eq!(ra.chunks, 13, "12 tokens and the final chunk");
    let words: Vec<&str> = ra.text.split_whitespace().collect();
    let stop = words[3];
    let body = json!({"prompt": "The quick brown fox", "max_tokens": 12, "ignore_eos": true, "stream": true, "stop": [stop]});
    let stopped = stream_completion(&client, &a.url(0), body).await;
    assert_eq!(stopped.finish_reason.as_deref(), Some("stop"));
    assert!(
        !stopped.text.contains(stop),
        "{:?} still contains {stop:?}",
        stopped.text
    );
    assert!(ra.text.starts_with(&stopped.text));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_runs_independent_engines() {
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--replicas",
        "3",
        "--profile",
        "tiny",
        "--kv-events-port",
        "0",
    ])
    .await;
    assert_eq!(fleet.engines.len(), 3);
    let client = reqwest::Client::new();
    let p = tokens(5, 64);
    for _ in 0..2 {
        let r = client
            .post(format!("{}/v1/completions", fleet.url(0)))
            .json(&json!({"prompt": p, "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(
        metric(&client, &fleet.url(0), "vllm:prefix_cache_hits_total").await,
        48.0
    );
    assert_eq!(
        metric(&client, &fleet.url(1), "vllm:prefix_cache_queries_total").await,
        0.0
    );
    let endpoints: std::collections::HashSet<_> = (0..3).map(|i| fleet.events(i)).collect();
    assert_eq!(endpoints.len(), 3, "each engine publishes on its own port");
    // Every answer names the engine that gave it (x-sim-engine: its HTTP address), streamed,
    // whole or refused, so a client behind any router can tell which engine served it.
    for i in 0..3 {
        let expected = fleet.engines[i].http.to_string();
        let stream = json!({"prompt": p, "max_tokens": 1, "stream": true});
        let refused = json!({"prompt": p, "max_tokens": -1});
        let whole = json!({"prompt": p, "max_tokens": 1});
        for (body, status) in [(whole, 200), (stream, 200), (refused, 400)] {
            let r = client
                .post(format!("{}/v1/completions", fleet.url(i)))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), status, "engine {i}, {body}");
            let named = r.headers().get("x-sim-engine").map(|v| v.to_str().unwrap());
            assert_eq!(named, Some(expected.as_str()), "engine {i}, {body}");
        }
        let health = client.get(format!("{}/health", fleet.url(i))).send();
        let health = health.await.unwrap();
        assert_eq!(health.headers()["x-sim-engine"], expected.as_str());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_stops_mid_way_and_a_disconnect_aborts_it() {
    use futures::StreamExt;
    // A real-time 8B profile: 2,000 tokens take ~12 s, so the engine is still generating
    // when the client gives up (the abort is then visible in its metrics).
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--profile",
        "llama-3.1-8b-h100",
        "--fault-stall-after-tokens",
        "3",
    ])
    .await;
    let client = reqwest::Client::new();
    let base = fleet.url(0);
    let body =
        json!({"prompt": "stall here", "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let resp = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    while text.matches("\"text\":\"").count() < 3 {
        let bytes = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        text.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    // Nothing more arrives: no fourth token, no [DONE].
    let more = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
    assert!(more.is_err(), "stream should stall, got {more:?}");
    assert!(!text.contains("[DONE]"));
    drop(stream);
    wait_for("abort counted", WAIT, || {
        let (client, base) = (client.clone(), base.clone());
        async move { (metric(&client, &base, "vllm:request_aborted_total").await == 1.0).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_chat_templates_render_or_refuse_as_vllm_does() {
    // Llama 3.2 calls strftime_now("%d %b %Y"): the simulator answered 400 (`unknown
    // function: strftime_now`) before it rendered templates as transformers does.
    let dir = TemplateDir::new(
        "llama-3.2",
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        json!({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    );
    let path = dir.0.display().to_string();
    let fleet = Fleet::start(&["--port", "0", "--profile", "tiny", "--tokenizer", &path]).await;
    let messages = json!([{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What day is it?"}]);
    // The prompt vLLM would tokenize: today's date in it (read before and after the request,
    // in case it ran over midnight).
    let tok = warmpath_tokenizer::Tokenizer::from_dir(&dir.0).unwrap();
    let chat = warmpath_tokenizer::Chat::from_json(
        warmpath_tokenizer::ChatJson {
            messages: &messages.to_string(),
            ..Default::default()
        },
        true,
    )
    .unwrap();
    let count = || {
        tok.encode(&tok.render_chat(&chat).unwrap(), false)
            .unwrap()
            .len()
    };
    let before = count();
    let client = reqwest::Client::new();
    let post = |body: serde_json::Value| {
        let r = client
            .post(format!("{}/v1/chat/completions", fleet.url(0)))
            .json(&body)
            .send();
        async move {
            let r = r.await.unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let (status, v) = post(json!({"messages": messages, "max_tokens": 2})).await;
    assert_eq!(status, 200, "{v}");
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(
        prompt_tokens == before || prompt_tokens == count(),
        "{prompt_tokens} prompt tokens, the local render has {before}"
    );
    // A template's raise_exception is 400 with its message, as vLLM answers.
    let call = |id: &str| {
        json!({"id": id, "type": "function",
        "function": {"name": "f", "arguments": "{}"}})
    };
    let (status, v) = post(json!({"messages": [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call("a"), call("b")]}],
        "tools": [{"type": "function", "function": {"name": "f"}}]}))
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(
        (v["error"]["type"].as_str(), v["error"]["message"].as_str()),
        (
            Some("BadRequestError"),
            Some("This model only supports single tool-calls at once!")
        )
    );
}
