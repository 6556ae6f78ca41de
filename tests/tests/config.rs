//! The agent started from a configuration file: several pools behind one listener, each with
//! its own token source, routed by the model a request names.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use serde_json::json;
use warmpath_e2e::sim::{Fleet, get_json, wait_for};

const WAIT: Duration = Duration::from_secs(20);

async fn fleet(model: &str, n: &str) -> Fleet {
    Fleet::start(&[
        "--port",
        "0",
        "--replicas",
        n,
        "--profile",
        "tiny",
        "--model",
        model,
        "--kv-events-port",
        "0",
        "--kv-replay-port",
        "0",
    ])
    .await
}

fn endpoints(fleet: &Fleet) -> String {
    fleet
        .engines
        .iter()
        .map(|e| {
            let p = e.publisher.as_ref().unwrap();
            format!(
                "      - url: http://{}\n        kvEvents: {}\n        kvReplay: {}\n",
                e.http,
                p.events_endpoint,
                p.replay_endpoint.as_deref().unwrap()
            )
        })
        .collect()
}

fn system(group: u32) -> String {
    (0..50)
        .map(|i| format!("clause {i} of contract {group} applies. "))
        .collect()
}

/// Posts a completion; returns (pod, prefix blocks).
async fn complete(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    prompt: &str,
) -> (String, usize) {
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": model, "prompt": prompt, "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{model}");
    let h = |k: &str| r.headers()[k].to_str().unwrap().to_string();
    // The agent passes the engine's own headers on: the simulator that answered names
    // itself, and it is the pod the agent says it chose.
    assert_eq!(h("x-sim-engine"), h("x-warmpath-pod"), "{model}");
    (
        h("x-warmpath-pod"),
        h("x-warmpath-prefix-blocks").parse().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_from_a_file_route_by_model_with_their_own_token_sources() {
    let (local, engine, approx) = (
        fleet("model-local", "2").await,
        fleet("model-engine", "2").await,
        fleet("model-approx", "2").await,
    );
    let yaml = format!(
        "version: 1\nlisten: [127.0.0.1:0, 127.0.0.1:0]\nadmin: 127.0.0.1:0\nproxy: {{explain: true}}\npools:\n\
         \x20 - name: local\n    model: model-local\n    endpoints:\n{}\
         \x20 - name: engine\n    model: model-engine\n    tokens: {{source: engine}}\n    policy: {{preset: precise, weights: {{kvUsage: 0.25}}}}\n    endpoints:\n{}\
         \x20 - name: approx\n    model: model-approx\n    tokens: {{source: approximate}}\n    policy: {{preset: approximate}}\n    endpoints:\n{}",
        endpoints(&local),
        endpoints(&engine),
        endpoints(&approx),
    );
    let dir = std::env::temp_dir().join(format!("warmpath-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let config = warmpath_agent::config::load(&path).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    std::fs::remove_dir_all(&dir).unwrap();
    let routing = warmpath_agent::agent::start(&config).await.unwrap();
    assert_eq!(routing.listens.len(), 2);
    let client = reqwest::Client::new();
    let pods = |f: &Fleet| {
        f.engines
            .iter()
            .map(|e| e.http.to_string())
            .collect::<Vec<_>>()
    };
    for (model, fleet) in [
        ("model-local", &local),
        ("model-engine", &engine),
        ("model-approx", &approx),
    ] {
        // Either listener serves every pool.
        for listen in &routing.listens {
            let base = format!("http://{listen}");
            let mut home = None;
            for q in 0..4 {
                let (pod, prefix) = complete(
                    &client,
                    &base,
                    model,
                    &format!("{} question {q}", system(1)),
                )
                .await;
                assert!(pods(fleet).contains(&pod), "{model} went to {pod}");
                // The prefix follows its first pod, whatever the token source.
                assert_eq!(home.get_or_insert(pod.clone()), &pod, "{model} q{q}");
                if q > 0 {
                    assert!(prefix > 0, "{model} q{q}: no prefix");
                }
            }
        }
    }
    // The engine-tokenized pool's keys agree with its events (speculation confirmed).
    let admin = format!("http://{}/status", routing.admin);
    wait_for("engine-tokenized keys confirmed by events", WAIT, || {
        let (client, admin) = (client.clone(), admin.clone());
        async move {
            let s: serde_json::Value = client.get(admin).send().await.ok()?.json().await.ok()?;
            s["pods"]
                .as_array()?
                .iter()
                .filter(|p| p["pool"] == "engine")
                .any(|p| p["index"]["confirmed"].as_u64().unwrap_or(0) > 0)
                .then_some(())
        }
    })
    .await;
    let status = get_json(&client, &admin).await;
    let pools = status["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 3);
    assert_eq!(pools[1]["weights"]["kvUsage"], 0.25);
    assert_eq!(pools[2]["policy"], "Approximate");
    let models = get_json(&client, &format!("http://{}/v1/models", routing.listen)).await;
    assert_eq!(models["data"].as_array().unwrap().len(), 3);
    let r = client
        .post(format!("http://{}/v1/completions", routing.listen))
        .json(&json!({"model": "model-missing", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
