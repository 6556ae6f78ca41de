//! Gossip at 16 and 64 agents in one process, on tokio's paused clock with the production
//! 1 s interval: time to converge, time for one change to reach everyone, and bytes per
//! node per second, idle and with every pod's watermark moving. Run with
//! `cargo test -p warmpath-agent --lib cluster::scale -- --ignored --nocapture`; the figures
//! are in docs/cluster.md. (Ignored by default: it measures, it does not check behaviour
//! the other tests do not.)

use std::{sync::Arc, time::Duration};

use chitchat::transport::ChannelTransport;

use super::{
    ClusterNode, LocalPod, NodeSettings,
    facts::PodHealth,
    membership::{DEFAULT_GOSSIP_INTERVAL, MembershipConfig, View},
    remote::DEFAULT_REMOTE_GRACE,
};
use crate::kv_index::{
    IndexConfig, KvIndex, SourceId, SourceInfo, Tier,
    wire::{Batch, EngineHash, Event, Stored},
};

const PODS: usize = 8;

struct Agent {
    node: ClusterNode,
    index: Arc<KvIndex>,
    pods: Vec<SourceId>,
}

async fn start(n: usize, transport: &ChannelTransport) -> Vec<Agent> {
    let mut agents = Vec::new();
    for i in 0..n {
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let pods: Vec<SourceId> = (0..PODS)
            .map(|p| {
                index.add_source(SourceInfo {
                    pod: format!("10.0.{i}.{p}:8000"),
                    rank: None,
                })
            })
            .collect();
        let local = pods
            .iter()
            .enumerate()
            .map(|(p, s)| LocalPod {
                id: format!("10.0.{i}.{p}:8000"),
                model: "meta-llama/Llama-3.1-8B-Instruct".into(),
                source: *s,
            })
            .collect();
        let listen = ([127, 0, 0, 1], 30_000 + i as u16).into();
        let settings = NodeSettings {
            membership: MembershipConfig {
                cluster_id: "scale".into(),
                node_id: format!("node-{i:04}"),
                incarnation: 1_764_000_000_000,
                listen,
                advertise: listen,
                seeds: vec!["127.0.0.1:30000".into()],
                gossip_interval: DEFAULT_GOSSIP_INTERVAL,
                dead_grace: Duration::from_secs(3_600),
            },
            grpc_listen: ([127, 0, 0, 1], 0).into(),
            grpc_advertise: None,
            proxy: None,
            key: None,
            counters: Arc::default(),
            publish_every: super::DEFAULT_PUBLISH_EVERY,
            remote_grace: DEFAULT_REMOTE_GRACE,
        };
        let node = ClusterNode::start(settings, index.clone(), local, Vec::new(), transport)
            .await
            .expect("starts");
        agents.push(Agent { node, index, pods });
    }
    agents
}

async fn views(agents: &[Agent]) -> Vec<View> {
    let mut v = Vec::new();
    for a in agents {
        v.push(a.node.view().await);
    }
    v
}

/// Polls (virtual time) until `done` holds for every agent's view; the time it took.
async fn until(agents: &[Agent], done: impl Fn(&View) -> bool) -> Duration {
    let start = tokio::time::Instant::now();
    loop {
        if views(agents).await.iter().all(&done) {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(120), "no convergence");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One stored block on every pod of every agent (each pod's watermark moves by one).
fn churn(agents: &[Agent], round: u64) {
    for a in agents {
        for s in &a.pods {
            let batch = Batch {
                ts: 0.0,
                events: vec![Event::Stored(Stored {
                    hashes: vec![EngineHash(round)],
                    parent: None,
                    token_ids: (0..16).map(|t| t + round as u32).collect(),
                    block_size: 16,
                    lora_name: None,
                    tier: Tier::Gpu,
                    extra_keys: Vec::new(),
                    reusable: true,
                })],
                dp_rank: None,
            };
            a.index.apply(*s, &batch, round);
        }
    }
}

async fn measure(n: usize) {
    let transport = ChannelTransport::with_mtu(65_507);
    let agents = start(n, &transport).await;
    let peers = n - 1;
    let took = until(&agents, |v| {
        v.peers.len() == peers && v.peers.values().all(|p| p.pods.len() == PODS)
    })
    .await;
    println!("{n} agents x {PODS} pods: converged {took:?} after start");

    let secs = 20;
    let before = transport.statistics();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let after = transport.statistics();
    let idle = (after.num_bytes_total - before.num_bytes_total) as f64 / (n as f64 * secs as f64);
    let msgs =
        (after.num_messages_total - before.num_messages_total) as f64 / (n * secs as usize) as f64;
    println!(
        "{n} agents: idle gossip {:.1} KB/s per node sent ({msgs:.1} messages/s)",
        idle / 1e3
    );

    // One change: agent 0's first pod turns unsure; how long until every agent knows.
    agents[0].index.mark_unsure(
        agents[0].pods[0],
        "scale test".into(),
        tokio::time::Instant::now().into_std(),
    );
    let pod0 = "10.0.0.0:8000";
    let took = until(&agents[1..], |v| {
        v.peers
            .get("node-0000")
            .and_then(|p| p.pods.get(pod0))
            .is_some_and(|p| p.fact.health == PodHealth::Unsure)
    })
    .await;
    println!("{n} agents: one pod's health change known to all {peers} others in {took:?}");

    let before = transport.statistics();
    let rounds = secs * 10;
    for r in 0..rounds {
        churn(&agents, 1_000 + r);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = transport.statistics();
    let busy = (after.num_bytes_total - before.num_bytes_total) as f64 / (n as f64 * secs as f64);
    println!(
        "{n} agents: gossip with every pod's watermark moving every 100 ms: {:.1} KB/s per node sent",
        busy / 1e3
    );
}

#[tokio::test(start_paused = true)]
#[ignore = "a measurement: run with --ignored --nocapture (docs/cluster.md)"]
async fn gossip_at_16_and_64_agents() {
    measure(16).await;
    measure(64).await;
}
