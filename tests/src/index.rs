//! A KV index subscribed to simulator engines, as the agent wires it.

use std::{sync::Arc, time::Duration};

use warmpath_agent::kv_index::{
    IndexConfig, KvIndex, SourceId, SourceInfo,
    subscriber::{self, SourceConfig},
};

use crate::sim::Fleet;

/// Subscribes a new source of `index` to engine `i` of `fleet` (events + replay when enabled).
pub async fn subscribe(
    index: &Arc<KvIndex>,
    fleet: &Fleet,
    i: usize,
) -> (SourceId, tokio::task::JoinHandle<()>) {
    let publisher = fleet.engines[i].publisher.as_ref().expect("events enabled");
    let cfg = SourceConfig {
        pod: format!("sim-{i}"),
        rank: None,
        endpoint: publisher.events_endpoint.clone(),
        bind: false,
        replay: publisher.replay_endpoint.clone(),
        topic: String::new(),
    };
    let id = index.add_source(SourceInfo {
        pod: cfg.pod.clone(),
        rank: None,
    });
    let task = subscriber::spawn(index.clone(), id, cfg)
        .await
        .expect("subscribe");
    (id, task)
}

/// A fresh index with the simulator's block size.
pub fn index() -> Arc<KvIndex> {
    Arc::new(KvIndex::new(IndexConfig::default()))
}

/// Engine hashes (int form) the index holds on GPU for a source, sorted.
pub fn indexed_gpu(index: &KvIndex, id: SourceId) -> Vec<u64> {
    let mut v: Vec<u64> = index
        .source_keys(id)
        .into_iter()
        .filter(|(_, _, tiers)| tiers & warmpath_agent::kv_index::Tier::Gpu.bit() != 0)
        .map(|(h, _, _)| h)
        .collect();
    v.sort_unstable();
    v
}

/// The engine's own cached GPU blocks (int form), sorted.
pub async fn engine_gpu(client: &reqwest::Client, base: &str) -> Vec<u64> {
    let v: serde_json::Value = client
        .get(format!("{base}/sim/cache"))
        .send()
        .await
        .expect("cache")
        .json()
        .await
        .expect("json");
    let mut out: Vec<u64> = v["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .map(|b| b["hash_int"].as_u64().expect("u64"))
        .collect();
    out.sort_unstable();
    out
}

/// Waits until the index's view of source `id` equals engine `base`'s cache; on timeout,
/// panics with the difference and the index's status.
pub async fn converge(
    index: &KvIndex,
    id: SourceId,
    client: &reqwest::Client,
    base: &str,
    timeout: Duration,
) -> Vec<u64> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let engine = engine_gpu(client, base).await;
        let indexed = indexed_gpu(index, id);
        if indexed == engine {
            return engine;
        }
        if std::time::Instant::now() > deadline {
            let missing = engine.iter().filter(|h| !indexed.contains(h)).count();
            let extra = indexed.iter().filter(|h| !engine.contains(h)).count();
            panic!(
                "index != engine cache: {missing} missing, {extra} extra; status {:?}",
                index.status()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
