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

/// Per remote pod its owner and the owner's word (all null while no live peer claims it).
fn remote_pods(remote: &super::remote::RemotePods) -> Vec<serde_json::Value> {
    remote
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
        .collect()
}

// === impl Report ===

impl Report {
    /// The `cluster` section: this node, the counters of what was refused, the live peers,
    /// the health this agent publishes for its pods, and per remote pod its owner with the
    /// owner's word (health, watermark, load).
    pub fn status(&self) -> serde_json::Value {
        let counters = self.shared.counters.snapshot();
        let local = self.local_pods();
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
        let remote_pods = remote_pods(&remote);
        json!({"node": self.node_id, "grpc": self.grpc.to_string(),
            "counters": {"rejected_datagrams": counters.rejected_datagrams,
                "malformed_datagrams": counters.malformed_datagrams,
                "oversized_datagrams": counters.oversized_datagrams,
                "rejected_streams": counters.rejected_streams,
                "malformed_facts": malformed_facts,
                "implausible_lags": self.shared.lags.implausible()},
            "peers": peers, "local_pods": local, "remote_pods": remote_pods})
    }

    /// This agent's pods with the health it publishes for each and its journal watermark.
    fn local_pods(&self) -> Vec<serde_json::Value> {
        let index = self.shared.index.status();
        self.shared
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
            .collect()
    }

    /// Registers `warmpath.cluster.*` on `meter`: the refusal counters
    /// (`rejected_datagrams`, `malformed_datagrams`, `oversized_datagrams`,
    /// `rejected_streams`), `implausible_lags`, `malformed_facts` by peer, `peers`, and the owners' load of the
    /// remote pods (`owner_running`, `owner_waiting`, `owner_kv_usage` by pod and owner).
    pub fn observe(&self, meter: &Meter) {
        self.observe_counters(meter);
        self.observe_peers(meter);
        self.observe_owner_loads(meter);
    }

    fn observe_counters(&self, meter: &Meter) {
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
            .u64_observable_counter("warmpath.cluster.implausible_lags")
            .with_unit("{lag}")
            .with_description(
                "Lags over an hour left out of the lag histograms (a sender's clock far behind ours)",
            )
            .with_callback(move |o| o.observe(shared.lags.implausible(), &[]))
            .build();
    }

    fn observe_peers(&self, meter: &Meter) {
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
    }

    fn observe_owner_loads(&self, meter: &Meter) {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use chitchat::transport::ChannelTransport;

    use super::*;
    use crate::{
        cluster::{
            LocalPod, NodeSettings, lag, membership::MembershipConfig, remote::DEFAULT_REMOTE_GRACE,
        },
        kv_index::{IndexConfig, KvIndex, SourceInfo},
        telemetry::{Telemetry, TelemetryConfig},
    };

    /// Agent `node_id`, gossiping over channels on `listen` (joining through `seeds`).
    fn settings(node_id: &str, listen: SocketAddr, seeds: Vec<String>) -> NodeSettings {
        let interval = std::time::Duration::from_millis(50);
        NodeSettings {
            membership: MembershipConfig {
                cluster_id: "test".into(),
                node_id: node_id.into(),
                incarnation: 1,
                listen,
                advertise: listen,
                seeds,
                gossip_interval: interval,
                dead_grace: std::time::Duration::from_secs(3_600),
            },
            grpc_listen: ([127, 0, 0, 1], 0).into(),
            grpc_advertise: None,
            proxy: None,
            key: None,
            counters: Arc::default(),
            publish_every: interval,
            remote_grace: DEFAULT_REMOTE_GRACE,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_counters_are_in_the_status_section_and_on_metrics() {
        let transport = ChannelTransport::with_mtu(65_507);
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let node = ClusterNode::start(
            settings("agent-0", ([127, 0, 0, 1], 16_000).into(), Vec::new()),
            index,
            Vec::new(),
            Vec::new(),
            &transport,
        )
        .await
        .expect("starts");
        let report = node.report();
        let counters = &report.shared.counters;
        counters.rejected_datagrams.fetch_add(3, Ordering::Relaxed);
        counters.oversized.fetch_add(1, Ordering::Relaxed);
        counters.rejected_streams.fetch_add(2, Ordering::Relaxed);
        // A placement stamped two hours before now (a peer's clock behind ours).
        let now_us = lag::unix_micros();
        report.shared.lags.record_at(
            now_us,
            lag::Stamp::Placement {
                placed_us: now_us - 7_200_000_000,
                relayed: false,
            },
        );
        let status = report.status();
        assert_eq!(
            status["counters"],
            json!({"rejected_datagrams": 3, "malformed_datagrams": 0,
                "oversized_datagrams": 1, "rejected_streams": 2, "malformed_facts": 0,
                "implausible_lags": 1})
        );
        assert_eq!(status["node"], "agent-0");
        assert_eq!(status["peers"], json!([]));
        let telemetry = Telemetry::new(&TelemetryConfig::default()).expect("telemetry");
        report.observe(telemetry.meter());
        let text = telemetry.prometheus();
        for line in [
            "warmpath_cluster_rejected_datagrams_total 3",
            "warmpath_cluster_malformed_datagrams_total 0",
            "warmpath_cluster_oversized_datagrams_total 1",
            "warmpath_cluster_rejected_streams_total 2",
            "warmpath_cluster_implausible_lags_total 1",
            "warmpath_cluster_peers 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }

    /// Waits (virtual time) until `cond` holds.
    async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let limit = std::time::Duration::from_secs(30);
        tokio::time::timeout(limit, async {
            while !cond() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_node_ends_its_replication_streams_though_its_report_is_held() {
        let transport = ChannelTransport::with_mtu(65_507);
        let info = |pod: &str| SourceInfo {
            pod: pod.into(),
            rank: None,
        };
        let pod = "127.0.0.1:20000";
        // agent-0 owns the pod; agent-1 replicates it over IndexSync.
        let owner_index = Arc::new(KvIndex::new(IndexConfig::default()));
        let local = LocalPod {
            id: pod.into(),
            model: "m".into(),
            source: owner_index.add_source(info(pod)),
        };
        let owner_addr: SocketAddr = ([127, 0, 0, 1], 16_100).into();
        let owner = ClusterNode::start(
            settings("agent-0", owner_addr, Vec::new()),
            owner_index,
            vec![local],
            Vec::new(),
            &transport,
        )
        .await
        .expect("the owner starts");
        let replica_index = Arc::new(KvIndex::new(IndexConfig::default()));
        let remote = vec![(pod.to_string(), replica_index.add_remote_source(info(pod)))];
        let replica = ClusterNode::start(
            settings(
                "agent-1",
                ([127, 0, 0, 1], 16_101).into(),
                vec![owner_addr.to_string()],
            ),
            replica_index,
            Vec::new(),
            remote,
            &transport,
        )
        .await
        .expect("the replica starts");
        let served = || owner.shared.server.streams();
        wait_for("the replica's stream reaches the owner", || served() == 1).await;

        // The agent keeps its node's report (in /status, in meter callbacks) for the
        // process's life: stopping the node still ends its stream.
        let report = replica.report();
        replica.shutdown();
        wait_for("the owner sees the stream close", || served() == 0).await;
        assert_eq!(
            report.status()["node"],
            "agent-1",
            "the report still answers"
        );
    }
}
