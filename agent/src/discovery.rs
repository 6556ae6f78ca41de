//! Pool membership that changes at run time: what a watcher (Kubernetes, [`crate::k8s`])
//! found for each configured pool, applied to the running pools — endpoints added, made
//! routable, drained and removed, their KV event subscriptions started and stopped.
//!
//! Watchers publish the whole desired state (level-triggered: a missed notification loses
//! nothing, the next one carries everything) on a [`tokio::sync::watch`] channel.

use std::collections::BTreeMap;

/// One endpoint a watcher found for a pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EndpointSpec {
    /// `host:port` of the engine's HTTP server (the pod IP and its target port). The
    /// endpoint's identity: a pod that changes address is a new endpoint.
    pub authority: String,
    /// Its Prometheus page (`http://ip:port/metrics`).
    pub metrics_url: String,
    /// Its ZeroMQ KV-event publisher (`tcp://ip:port`), when it publishes events.
    pub kv_events: Option<String>,
    /// Its replay (ROUTER) endpoint, when it has one.
    pub kv_replay: Option<String>,
    /// ZeroMQ topic filter (`""`: every topic).
    pub kv_topic: String,
    /// Data-parallel rank, for engines that publish one stream per rank.
    pub dp_rank: Option<u32>,
    /// On this agent's node (this agent subscribes to its events when it is in a cluster;
    /// alone, an agent subscribes to every endpoint's).
    pub local: bool,
    /// Whether new requests may go to it: Ready and not terminating. `false` drains it (no
    /// new requests; those in flight finish).
    pub routable: bool,
    /// Where it came from, for status and logs (`namespace/pod`).
    pub origin: String,
}

/// Every configured pool's endpoints, by pool name. A pool missing from the map keeps its
/// endpoints; a pool present with an empty list has none.
pub type Desired = BTreeMap<String, Vec<EndpointSpec>>;
