//! The KV index against the simulator's real event stream: after a workload the index's view
//! of each engine equals the engine's cached blocks — in both wire eras, with int and bytes
//! hashes, through dropped batches (replay), unrecoverable losses and engine restarts.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use serde_json::json;
use warmpath_e2e::{
    index::{converge, engine_gpu, index, indexed_gpu, subscribe},
    sim::{Fleet, wait_for},
};

const WAIT: Duration = Duration::from_secs(20);

/// Requests over 6 prefix groups on a cache of 64 blocks: stores, hits and evictions.
async fn workload(client: &reqwest::Client, base: &str, rounds: u32) {
    for round in 0..rounds {
        for g in 0..6u32 {
            let mut prompt: Vec<u32> = (0..160).map(|i| 100 + (g * 977 + i * 13) % 5000).collect();
            prompt.extend((0..20).map(|i| 200 + (round * 31 + g * 7 + i) % 4000));
            let body = json!({"prompt": prompt, "max_tokens": 3, "ignore_eos": true});
            let r = client
                .post(format!("{base}/v1/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    }
}

async fn sim(extra: &[&str]) -> Fleet {
    let mut flags = vec![
        "--port",
        "0",
        "--profile",
        "tiny",
        "--num-gpu-blocks",
        "64",
        "--max-model-len",
        "512",
        "--kv-events-port",
        "0",
        "--kv-replay-port",
        "0",
    ];
    flags.extend_from_slice(extra);
    Fleet::start(&flags).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_equals_engine_cache_in_every_wire_format() {
    let client = reqwest::Client::new();
    for (format, bytes) in [
        ("map", false),
        ("map", true),
        ("array", false),
        ("array", true),
    ] {
        let mut extra = vec!["--kv-events-format", format];
        if bytes {
            extra.push("--kv-events-hash-bytes");
        }
        let fleet = sim(&extra).await;
        let index = index();
        let (id, _task) = subscribe(&index, &fleet, 0).await;
        workload(&client, &fleet.url(0), 3).await;
        let cached = converge(&index, id, &client, &fleet.url(0), WAIT).await;
        assert!(!cached.is_empty());
        let (_, status) = &index.status()[0];
        assert_eq!(status.state, "healthy", "{format}/{bytes}: {status:?}");
        assert!(
            status.blocks_removed > 0,
            "the small cache evicted: {status:?}"
        );
        assert_eq!(status.malformed, 0);
        for engine in fleet.engines {
            engine.shutdown();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_batches_are_replayed_to_equality() {
    let client = reqwest::Client::new();
    let fleet = sim(&["--fault-drop-event-batch-every", "3"]).await;
    let index = index();
    let (id, _task) = subscribe(&index, &fleet, 0).await;
    workload(&client, &fleet.url(0), 3).await;
    converge(&index, id, &client, &fleet.url(0), WAIT).await;
    let (_, status) = &index.status()[0];
    assert!(status.gaps > 0 && status.replayed > 0, "{status:?}");
    assert_eq!(
        (status.state, status.unrecoverable_gaps),
        ("healthy", 0),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losses_without_replay_mark_the_source_unsure() {
    let client = reqwest::Client::new();
    let fleet = Fleet::start(&[
        "--port",
        "0",
        "--profile",
        "tiny",
        "--num-gpu-blocks",
        "64",
        "--max-model-len",
        "512",
        "--kv-events-port",
        "0",
        "--fault-drop-event-batch-every",
        "2",
    ])
    .await;
    let index = index();
    let (id, _task) = subscribe(&index, &fleet, 0).await;
    workload(&client, &fleet.url(0), 2).await;
    let status = wait_for("unsure", WAIT, || async {
        index
            .status()
            .into_iter()
            .map(|(_, s)| s)
            .find(|s| s.state == "unsure")
    })
    .await;
    assert!(
        status
            .reason
            .as_deref()
            .unwrap()
            .contains("no replay endpoint"),
        "{status:?}"
    );
    assert!(!index.trusted(id));
}

/// Three free loopback ports, from below the kernel's ephemeral range.
fn free_ports() -> [String; 3] {
    [(); 3].map(|()| warmpath_e2e::scratch::free_tcp_port().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_restart_drops_old_entries_and_the_subscriber_reconnects() {
    let client = reqwest::Client::new();
    let [http, events, replay] = free_ports();
    let flags = [
        "--port",
        &http,
        "--profile",
        "tiny",
        "--num-gpu-blocks",
        "64",
        "--max-model-len",
        "512",
        "--kv-events-port",
        &events,
        "--kv-replay-port",
        &replay,
        "--seed",
        "1",
    ];
    let fleet = Fleet::start(&flags).await;
    let index = index();
    let (id, _task) = subscribe(&index, &fleet, 0).await;
    workload(&client, &fleet.url(0), 2).await;
    let before = converge(&index, id, &client, &fleet.url(0), WAIT).await;
    assert!(!before.is_empty());
    for engine in fleet.engines {
        engine.shutdown();
    }

    // The same pod comes back: new process, empty cache, sequence numbers from 0.
    let fleet = wait_for("restart on the same ports", WAIT, || async {
        // A new process: a different seed, so its block hashes differ from the old ones.
        let mut flags = flags;
        flags[flags.len() - 1] = "2";
        Fleet::try_start(&flags).await.ok()
    })
    .await;
    let base = fleet.url(0);
    // Keep sending until the reconnected subscriber sees the new process.
    wait_for("restart observed", WAIT, || {
        let (client, base, index) = (client.clone(), base.clone(), index.clone());
        async move {
            workload(&client, &base, 1).await;
            index
                .status()
                .into_iter()
                .find(|(_, s)| s.restarts + s.reconnects >= 1)
                .map(|_| ())
        }
    })
    .await;
    let after = converge(&index, id, &client, &base, WAIT).await;
    let indexed = indexed_gpu(&index, id);
    assert_eq!(indexed, after);
    assert_eq!(engine_gpu(&client, &base).await, after);
    assert!(
        before.iter().all(|h| !after.contains(h)),
        "no entry of the old process survives"
    );
}
