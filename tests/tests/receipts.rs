//! Route receipts end to end: for each request the prompt tokens available on some pod,
//! captured by the chosen pod and delivered by the engine (`cached_tokens`), in the explain
//! headers, the `/metrics` counters and `/status`, with exact values. Prompts are token ids,
//! so their length is known without a tokenizer; the tiny profile's blocks are 16 tokens,
//! and the simulator, like vLLM, never serves a prompt's last token from its cache.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{collections::HashMap, time::Duration};

use serde_json::json;
use warmpath_e2e::{
    agent::{proxy, urls},
    sim::{Fleet, get_json, metric, metrics_text, sample, wait_for},
};

const WAIT: Duration = Duration::from_secs(20);
/// The tiny profile's `--block-size` (the simulator's default), which the agent's pool uses.
const BLOCK: u64 = 16;

/// A prompt of `len` token ids, distinct per `seed` from its first token.
fn ids(seed: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| 100 + seed * 131 + i).collect()
}

/// One request as the client saw it.
#[derive(Debug, PartialEq)]
struct Seen {
    pod: String,
    available: u64,
    captured: u64,
    /// The engine's `usage.prompt_tokens_details.cached_tokens`.
    delivered: u64,
}

async fn complete(client: &reqwest::Client, base: &str, prompt: &[u32]) -> Seen {
    let body = json!({"model": "sim-llama", "prompt": prompt, "max_tokens": 2});
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let header = |name: &str| r.headers()[name].to_str().unwrap().to_string();
    let (pod, available, captured) = (
        header("x-warmpath-pod"),
        header("x-warmpath-available-tokens").parse().unwrap(),
        header("x-warmpath-captured-tokens").parse().unwrap(),
    );
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64(),
        Some(prompt.len() as u64)
    );
    Seen {
        pod,
        available,
        captured,
        delivered: v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    }
}

/// Tracks the blocks each engine has published, to wait until the agent's index holds them.
struct Indexed {
    client: reqwest::Client,
    status: String,
    /// Blocks stored per pod (authority) so far.
    expected: HashMap<String, u64>,
}

impl Indexed {
    /// After `pod` stored `blocks` more: waits until its index is healthy and has them.
    async fn wait(&mut self, pod: &str, blocks: u64) {
        let want = *self
            .expected
            .entry(pod.to_string())
            .and_modify(|b| *b += blocks)
            .or_insert(blocks);
        let (client, url) = (&self.client, &self.status);
        wait_for(
            &format!("{pod}'s {want} blocks indexed"),
            WAIT,
            || async move {
                let s = get_json(client, url).await;
                let p = s["pods"]
                    .as_array()?
                    .iter()
                    .find(|p| p["load"]["endpoint"] == pod)?
                    .clone();
                (p["index"]["state"] == "healthy" && p["index"]["blocks_stored"].as_u64()? >= want)
                    .then_some(())
            },
        )
        .await;
    }
}

/// Waits until `n` requests have their receipts recorded (the record is written when the
/// response body is dropped, just after the client has read it), then returns the
/// counters: requests, available, captured, delivered, shortfall.
async fn counters(client: &reqwest::Client, admin: &str, n: u64) -> [u64; 5] {
    wait_for("receipts recorded", WAIT, || async move {
        let got = metric(client, admin, "warmpath_receipt_requests_total").await as u64;
        (got >= n).then_some(())
    })
    .await;
    let mut out = [0; 5];
    for (v, name) in out.iter_mut().zip([
        "warmpath_receipt_requests_total",
        "warmpath_receipt_available_tokens_total",
        "warmpath_receipt_captured_tokens_total",
        "warmpath_receipt_delivered_tokens_total",
        "warmpath_receipt_shortfall_requests_total",
    ]) {
        *v = metric(client, admin, name).await as u64;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_show_available_captured_and_delivered_exactly() {
    let fleet = Fleet::tiny(2, &["--kv-replay-port", "0"]).await;
    let routing = proxy(&fleet, &[]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    let mut indexed = Indexed {
        client: client.clone(),
        status: format!("{admin}/status"),
        expected: HashMap::new(),
    };
    // 100 tokens: six whole blocks (96 tokens) for the keys and for the engine's cache.
    let a = ids(1, 100);
    let cold = complete(&client, &base, &a).await;
    assert_eq!(
        (cold.available, cold.captured, cold.delivered),
        (0, 0, 0),
        "nothing is cached yet"
    );
    indexed.wait(&cold.pod, 100 / BLOCK).await;
    let warm = complete(&client, &base, &a).await;
    let six = 6 * BLOCK;
    assert_eq!(
        warm,
        Seen {
            pod: cold.pod.clone(),
            available: six,
            captured: six,
            delivered: six,
        }
    );
    // 96 tokens, exactly six blocks: the router holds all six, but the engine recomputes the
    // last token (vLLM does), so it serves five from cache: a shortfall of one block.
    let b = ids(2, 96);
    let cold_b = complete(&client, &base, &b).await;
    assert_eq!(
        (cold_b.available, cold_b.captured, cold_b.delivered),
        (0, 0, 0)
    );
    indexed.wait(&cold_b.pod, 96 / BLOCK).await;
    let warm_b = complete(&client, &base, &b).await;
    assert_eq!(
        warm_b,
        Seen {
            pod: cold_b.pod.clone(),
            available: six,
            captured: six,
            delivered: 5 * BLOCK,
        }
    );
    let seen = [&cold, &warm, &cold_b, &warm_b];
    let sum = |f: fn(&Seen) -> u64| seen.iter().map(|s| f(s)).sum::<u64>();
    let got = counters(&client, &admin, 4).await;
    assert_eq!(
        got,
        [4, 192, 192, 176, 1],
        "requests, available, captured, delivered, shortfall"
    );
    // The delivered counter is the engines' own cached_tokens, summed.
    assert_eq!(got[3], sum(|s| s.delivered));
    assert_eq!(
        metric(&client, &admin, "warmpath_cached_prompt_tokens_total").await as u64,
        got[3]
    );
    // /status: the tenant's live window, with both ratios.
    let status = get_json(&client, &format!("{admin}/status")).await;
    // The pool's prefix survival (docs/routing.md): the two answers that captured a
    // prefix. The 100-token prompt: 96 held, 96 delivered. The 96-token one: 96 held, but
    // the engine may serve at most the whole blocks before the last token (80), and did:
    // nothing was lost to eviction, so survival is exactly 1, from 2 observations (with
    // the 96 held counted as such it would be (0.996 x 96 + 80 + 4096) / (0.996 x 96 + 96
    // + 4096) = 0.9963).
    let pool = &status["pools"][0]["ttft_prediction"];
    assert_eq!(pool["survival_observations"].as_u64(), Some(2), "{status}");
    assert_eq!(pool["prefix_survival"].as_f64(), Some(1.0), "{status}");
    assert_eq!(
        metric(&client, &admin, "warmpath_prefix_survival").await,
        1.0
    );
    // By predicted wait: eight bands (under 25 ms, doubling to 1.6 s, then open), each 1
    // where nothing was lost (a band with no answers takes the pool's figure).
    let bands = pool["prefix_survival_by_wait"]
        .as_array()
        .unwrap_or_else(|| panic!("{status}"));
    let edges: Vec<_> = bands.iter().map(|b| b["below_ms"].as_f64()).collect();
    assert_eq!(
        edges,
        [25.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1600.0]
            .map(Some)
            .into_iter()
            .chain([None])
            .collect::<Vec<_>>()
    );
    assert!(
        bands.iter().all(|b| b["survival"].as_f64() == Some(1.0)),
        "{status}"
    );
    let captured: f64 = bands
        .iter()
        .filter_map(|b| b["captured_tokens"].as_f64())
        .sum();
    // 96 + 80 tokens captured; the first kept 255/256 at the second.
    assert!(
        (captured - (96.0 * 255.0 / 256.0 + 80.0)).abs() < 1e-9,
        "{status}"
    );
    assert_eq!(
        metric(&client, &admin, "warmpath_prefix_survival_by_wait").await,
        1.0
    );
    let r = &status["tenants"][0]["receipts"];
    let field = |k: &str| r[k].as_u64();
    assert_eq!(
        [
            "requests",
            "available_tokens",
            "captured_tokens",
            "delivered_tokens",
            "shortfall_requests"
        ]
        .map(field),
        [4, 192, 192, 176, 1].map(Some),
        "{status}"
    );
    // Ratios as floats (serde_json's parse is not always correctly rounded): within 1e-9.
    let near = |k: &str, want: f64| (r[k].as_f64().unwrap() - want).abs() < 1e-9;
    assert!(
        near("capture_pct", 100.0) && near("delivery_pct", 100.0 * 176.0 / 192.0),
        "{status}"
    );
    let table = warmpath_agent::status::render(&status);
    let row = table
        .lines()
        .skip_while(|l| !l.starts_with("ROUTE RECEIPTS"))
        .nth(2)
        .unwrap();
    assert_eq!(
        row.split_whitespace().skip(1).collect::<Vec<_>>(),
        ["4", "192", "192", "176", "100.0%", "91.7%", "1"],
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_without_the_prefix_captures_less_than_was_available() {
    // Round-robin ignores the index: the second request goes to the pod that does not hold
    // the prefix the first one left on the other.
    let fleet = Fleet::tiny(2, &["--kv-replay-port", "0"]).await;
    let routing = proxy(&fleet, &["--policy", "round-robin"]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    let mut indexed = Indexed {
        client: client.clone(),
        status: format!("{admin}/status"),
        expected: HashMap::new(),
    };
    let a = ids(3, 100);
    let six = 6 * BLOCK;
    let first = complete(&client, &base, &a).await;
    assert_eq!(
        (first.available, first.captured, first.delivered),
        (0, 0, 0)
    );
    indexed.wait(&first.pod, 100 / BLOCK).await;
    let other = complete(&client, &base, &a).await;
    assert_ne!(other.pod, first.pod, "round-robin takes turns");
    assert_eq!(
        (other.available, other.captured, other.delivered),
        (six, 0, 0),
        "available on the first pod, captured nowhere"
    );
    indexed.wait(&other.pod, 100 / BLOCK).await;
    let back = complete(&client, &base, &a).await;
    assert_eq!(back.pod, first.pod);
    assert_eq!(
        (back.available, back.captured, back.delivered),
        (six, six, six)
    );
    let got = counters(&client, &admin, 3).await;
    assert_eq!(got, [3, 2 * six, six, six, 0]);
    let status = get_json(&client, &format!("{admin}/status")).await;
    let r = &status["tenants"][0]["receipts"];
    assert_eq!(
        (r["capture_pct"].as_f64(), r["delivery_pct"].as_f64()),
        (Some(50.0), Some(100.0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_s_receipt_is_the_answering_pod_s() {
    // Round-robin over two engines and an endpoint nobody listens on (which holds nothing:
    // it has no index): once both engines hold the prefix, the request whose turn is the
    // dead one is retried on an engine, which holds the whole prefix.
    let fleet = Fleet::tiny(2, &["--kv-replay-port", "0"]).await;
    // Ports bound and released: nothing listens there (its events and replay sockets too,
    // given only because the flags go per endpoint).
    let free = || format!("127.0.0.1:{}", warmpath_e2e::scratch::free_tcp_port());
    let (dead, events, replay) = (
        format!("http://{}", free()),
        format!("tcp://{}", free()),
        format!("tcp://{}", free()),
    );
    let routing = proxy(
        &fleet,
        &[
            "--endpoint",
            &dead,
            "--kv-events",
            &events,
            "--kv-replay",
            &replay,
            "--policy",
            "round-robin",
        ],
    )
    .await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    let mut indexed = Indexed {
        client: client.clone(),
        status: format!("{admin}/status"),
        expected: HashMap::new(),
    };
    // (The counter is absent until the first retry; it is recorded with the request,
    // as its receipt is, so read it after `counters` has seen the receipt.)
    let retries = || async {
        sample(
            &metrics_text(&client, &admin).await,
            "warmpath_retries_total",
        )
        .unwrap_or(0.0) as u64
    };
    // Round-robin starts at a random endpoint (agents started together must not rotate in
    // step), and a retry takes the next turn: send the prompt until both engines have
    // answered it (a turn of the dead endpoint is retried on one of them). The first
    // answer found nothing anywhere.
    let a = ids(4, 100);
    let six = 6 * BLOCK;
    let mut sent = 0;
    let mut answered: Vec<String> = Vec::new();
    while answered.len() < 2 {
        assert!(
            sent < 4,
            "four requests and not both engines answered: {answered:?}"
        );
        let seen = complete(&client, &base, &a).await;
        sent += 1;
        if sent == 1 {
            assert_eq!((seen.available, seen.captured, seen.delivered), (0, 0, 0));
        }
        if !answered.contains(&seen.pod) {
            indexed.wait(&seen.pod, 100 / BLOCK).await;
            answered.push(seen.pod);
        }
    }
    let before = counters(&client, &admin, sent).await;
    let retried_before = retries().await;
    // Both hold the prefix now: every request finds it, and within three turns one meets
    // the dead endpoint and is retried; its receipt is the engine's that answered.
    let mut more = 0;
    loop {
        assert!(
            more < 3,
            "three turns of round-robin never met the dead endpoint"
        );
        let seen = complete(&client, &base, &a).await;
        more += 1;
        assert!(answered.contains(&seen.pod), "{seen:?}");
        assert_eq!(
            (seen.available, seen.captured, seen.delivered),
            (six, six, six),
            "captured by the engine that answered, not by a dead first pick"
        );
        counters(&client, &admin, sent + more).await;
        if retries().await > retried_before {
            break;
        }
    }
    assert_eq!(
        retries().await,
        retried_before + 1,
        "one retry in the last turn"
    );
    let got = counters(&client, &admin, sent + more).await;
    let added: Vec<u64> = got.iter().zip(before).map(|(g, b)| g - b).collect();
    let n = more;
    assert_eq!(added, [n, n * six, n * six, n * six, 0]);
}
