//! The cluster as an operator sees it: the `cluster` section of `/status` (`warmpath status`
//! prints it as CLUSTER) and `warmpath.cluster.*` on a meter (Prometheus and OTLP), read from
//! the node's state when asked (docs/cluster.md, "Seeing it"; docs/telemetry.md).
//!
//! A [`Report`] holds the node's shared state, not the node: it never keeps a stopped node's
//! tasks alive, and after a shutdown it shows the last state (no peers are followed any more).

use std::{net::SocketAddr, sync::Arc};

use opentelemetry::{KeyValue, metrics::Meter};
use serde_json::json;

use super::{ClusterNode, Shared, facts::LoadFact, pods::health_of};

/// The node's state for `/status` and metrics.
#[derive(Clone)]
pub struct Report {
    shared: Arc<Shared>,
    node_id: String,
    grpc: SocketAddr,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Report")
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

impl ClusterNode {
    /// What `/status` and the metrics show of this node (cheap to clone).
    pub fn report(&self) -> Report {
        Report {
            shared: self.shared.clone(),
            node_id: self.node_id().to_string(),
            grpc: self.grpc,
        }
    }
}

fn load_json(load: &LoadFact) -> serde_json::Value {
    json!({"running": load.running, "waiting": load.waiting,
        "kv_cache_usage": f64::from(load.kv_permille) / 1000.0})
}

// === impl Report ===

impl Report {
    /// The `cluster` section: this node, the counters of what was refused, the live peers,
    /// the health this agent publishes for its pods, and per remote pod its owner with the
    /// owner's word (health, watermark, load).
    pub fn status(&self) -> serde_json::Value {
        let counters = self.shared.counters.snapshot();
        let index = self.shared.index.status();
        let local: Vec<_> = self
            .shared
            .local
            .lock()
            .iter()
            .map(|p| {
                let state = index
                    .iter()
                    .find(|(id, _)| *id == p.source)
                    .map(|(_, s)| s.state);
                let watermark = self.shared.index.watermark(p.source);
                json!({"pod": p.id, "model": p.model, "health": health_of(state).as_str(),
                    "watermark": watermark.map(|w| format!("{}:{}", w.incarnation, w.sequence))})
            })
            .collect();
        let remote = self.shared.remote.lock();
        let view = remote.view();
        let malformed_facts: usize = view.peers.values().map(|p| p.malformed).sum();
        let peers: Vec<_> = view
            .peers
            .values()
            .map(|p| {
                json!({"node": p.node_id, "incarnation": p.incarnation,
                    "gossip": p.gossip.to_string(), "grpc": p.agent.map(|a| a.grpc.to_string()),
                    "pods": p.pods.len(), "malformed_facts": p.malformed})
            })
            .collect();
        let remote_pods: Vec<_> = remote
            .pods()
            .into_iter()
            .map(|(pod, _)| match remote.owner_says(&pod) {
                Some((owner, said)) => json!({"pod": pod, "owner": owner,
                    "owner_health": said.fact.health.as_str(),
                    "watermark": said.watermark.map(|w| format!("{}:{}", w.incarnation, w.sequence)),
                    "owner_load": said.load.as_ref().map(load_json)}),
                None => json!({"pod": pod, "owner": null, "owner_health": null,
                    "watermark": null, "owner_load": null}),
            })
            .collect();
        json!({"node": self.node_id, "grpc": self.grpc.to_string(),
            "counters": {"rejected_datagrams": counters.rejected_datagrams,
                "malformed_datagrams": counters.malformed_datagrams,
                "oversized_datagrams": counters.oversized_datagrams,
                "rejected_streams": counters.rejected_streams,
                "malformed_facts": malformed_facts},
            "peers": peers, "local_pods": local, "remote_pods": remote_pods})
    }

    /// Registers `warmpath.cluster.*` on `meter`: the refusal counters
    /// (`rejected_datagrams`, `malformed_datagrams`, `oversized_datagrams`,
    /// `rejected_streams`), `malformed_facts` by peer, `peers`, and the owners' load of the
    /// remote pods (`owner_running`, `owner_waiting`, `owner_kv_usage` by pod and owner).
    pub fn observe(&self, meter: &Meter) {
        type Pick = fn(&super::auth::CountersSnapshot) -> u64;
        let counters: [(&'static str, &'static str, &'static str, Pick); 4] = [
            (
                "warmpath.cluster.rejected_datagrams",
                "{datagram}",
                "Gossip datagrams dropped unopened: no header, a tag that does not verify, another cluster's",
                |c| c.rejected_datagrams,
            ),
            (
                "warmpath.cluster.malformed_datagrams",
                "{datagram}",
                "Gossip datagrams that verified but did not parse (a peer's bug)",
                |c| c.malformed_datagrams,
            ),
            (
                "warmpath.cluster.oversized_datagrams",
                "{message}",
                "Gossip messages too large for one datagram once sealed (not sent)",
                |c| c.oversized_datagrams,
            ),
            (
                "warmpath.cluster.rejected_streams",
                "{stream}",
                "IndexSync streams refused for a missing or wrong token",
                |c| c.rejected_streams,
            ),
        ];
        for (name, unit, description, pick) in counters {
            let shared = self.shared.clone();
            meter
                .u64_observable_counter(name)
                .with_unit(unit)
                .with_description(description)
                .with_callback(move |o| o.observe(pick(&shared.counters.snapshot()), &[]))
                .build();
        }
        let shared = self.shared.clone();
        meter
            .u64_observable_gauge("warmpath.cluster.malformed_facts")
            .with_unit("{fact}")
            .with_description(
                "A live peer's gossip values that did not parse (ignored, never applied)",
            )
            .with_callback(move |o| {
                for p in shared.remote.lock().view().peers.values() {
                    o.observe(
                        p.malformed as u64,
                        &[KeyValue::new("peer", p.node_id.clone())],
                    );
                }
            })
            .build();
        let shared = self.shared.clone();
        meter
            .u64_observable_gauge("warmpath.cluster.peers")
            .with_unit("{agent}")
            .with_description("Live peers (other agents) in this agent's view")
            .with_callback(move |o| o.observe(shared.remote.lock().view().peers.len() as u64, &[]))
            .build();
        type LoadPick = fn(&LoadFact) -> f64;
        let loads: [(&'static str, &'static str, &'static str, LoadPick); 3] = [
            (
                "warmpath.cluster.owner_running",
                "{request}",
                "Requests running on a remote pod, as its owner last scraped it",
                |l| f64::from(l.running),
            ),
            (
                "warmpath.cluster.owner_waiting",
                "{request}",
                "Requests waiting on a remote pod, as its owner last scraped it",
                |l| f64::from(l.waiting),
            ),
            (
                "warmpath.cluster.owner_kv_usage",
                "1",
                "KV cache usage (0..1) of a remote pod, as its owner last scraped it",
                |l| f64::from(l.kv_permille) / 1000.0,
            ),
        ];
        for (name, unit, description, pick) in loads {
            let shared = self.shared.clone();
            meter
                .f64_observable_gauge(name)
                .with_unit(unit)
                .with_description(description)
                .with_callback(move |o| {
                    let remote = shared.remote.lock();
                    for (pod, _) in remote.pods() {
                        if let Some((owner, said)) = remote.owner_says(&pod)
                            && let Some(load) = &said.load
                        {
                            o.observe(
                                pick(load),
                                &[
                                    KeyValue::new("pod", pod.clone()),
                                    KeyValue::new("owner", owner.to_string()),
                                ],
                            );
                        }
                    }
                })
                .build();
        }
    }
}
