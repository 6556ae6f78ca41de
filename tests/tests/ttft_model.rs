//! The TTFT cost model end to end: every routed answer carries its prediction
//! (`x-warmpath-predicted-ttft-ms`), every stream is checked against it when it ends — the
//! `warmpath_ttft_prediction_error_seconds` histogram and `/status`'s median count exactly the
//! streams sent — and each pod's fit has learnt from exactly the streams it answered, while a
//! non-streamed answer (whose first byte is not its first token) is not fitted.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{collections::HashMap, time::Duration};

use serde_json::json;
use warmpath_e2e::{
    agent::{proxy, urls},
    sim::{Fleet, get_json, metric, wait_for},
};

const WAIT: Duration = Duration::from_secs(20);

/// Sends one completion of `len` distinct token ids; returns (pod, predicted ms).
async fn complete(client: &reqwest::Client, base: &str, seed: u32, stream: bool) -> (String, f64) {
    let prompt: Vec<u32> = (0..64).map(|i| 100 + seed * 131 + i).collect();
    let body = json!({"model": "sim-llama", "prompt": prompt, "max_tokens": 4, "stream": stream});
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    if r.status() != 200 {
        panic!("{}: {}", r.status(), r.text().await.unwrap());
    }
    let header = |name: &str| r.headers()[name].to_str().unwrap().to_string();
    let pod = header("x-warmpath-pod");
    let predicted: f64 = header("x-warmpath-predicted-ttft-ms").parse().unwrap();
    r.bytes().await.unwrap();
    (pod, predicted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_is_predicted_checked_and_fitted_to_its_pod() {
    let fleet = Fleet::tiny(2, &[]).await;
    let routing = proxy(&fleet, &[]).await;
    let (base, admin) = urls(&routing);
    let client = reqwest::Client::new();
    const STREAMS: u32 = 12;
    let mut per_pod: HashMap<String, u64> = HashMap::new();
    for seed in 0..STREAMS {
        let (pod, predicted) = complete(&client, &base, seed, true).await;
        // The prior before any answer: 20 ms fixed at least, and finite.
        assert!(predicted.is_finite() && predicted > 0.0, "{predicted}");
        *per_pod.entry(pod).or_default() += 1;
    }
    // One plain (non-streamed) answer: predicted, but not checked.
    let (_, predicted) = complete(&client, &base, 40, false).await;
    assert!(predicted > 0.0);
    let (c, admin_ref) = (&client, &admin);
    wait_for("every stream checked", WAIT, || async move {
        let n = metric(c, admin_ref, "warmpath_ttft_prediction_error_seconds_count").await;
        (n >= f64::from(STREAMS)).then_some(())
    })
    .await;
    let count = metric(
        &client,
        &admin,
        "warmpath_ttft_prediction_error_seconds_count",
    )
    .await;
    assert_eq!(count, f64::from(STREAMS), "streams only");
    let status = get_json(&client, &format!("{admin}/status")).await;
    let pool = &status["pools"][0]["ttft_prediction"];
    assert_eq!(pool["checked"].as_u64(), Some(u64::from(STREAMS)));
    assert!(pool["median_abs_error_ms"].as_f64().unwrap() >= 0.0);
    for p in status["pods"].as_array().unwrap() {
        let pod = p["load"]["endpoint"].as_str().unwrap();
        let want = per_pod.get(pod).copied().unwrap_or(0);
        assert_eq!(
            p["ttft_model"]["observations"].as_u64(),
            Some(want),
            "{pod}"
        );
        // 64-token prompts answered in milliseconds: the fitted rate is a rate, not NaN.
        assert!(p["ttft_model"]["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
    }
}
