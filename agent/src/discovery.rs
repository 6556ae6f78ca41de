//! Pool membership that changes at run time: what a watcher (Kubernetes, [`crate::k8s`])
//! found for each configured pool, applied to the running pools — endpoints added, made
//! routable, drained and removed, their KV event subscriptions started and stopped.
//!
//! Watchers publish the whole desired state (level-triggered: a missed notification loses
//! nothing, the next one carries everything) on a [`tokio::sync::watch`] channel.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use tokio::{sync::watch, task::JoinHandle};

use crate::{
    cluster::{ClusterNode, LocalPod},
    kv_index::{
        KvIndex, SourceId, SourceInfo,
        subscriber::{self, SourceConfig},
    },
    pool::{Endpoint, EndpointParts, Pool},
    proxy::Proxy,
};

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

/// The cluster this agent is in, and the pods of its configuration (which stay in the
/// cluster's sets beside the discovered ones).
#[derive(Debug, Clone)]
pub struct ClusterPods {
    pub node: Arc<ClusterNode>,
    /// Configured pods this agent subscribes to.
    pub local: Vec<LocalPod>,
    /// Configured pods other agents own: `(id, remote source)`.
    pub remote: Vec<(String, SourceId)>,
    /// Pools (by name) whose other nodes' pods are not replicated (`cluster.replicate`):
    /// they get no remote source, and are routed by load alone.
    pub unreplicated: HashSet<String>,
}

/// Applies each desired state the watcher publishes to the proxy's pools until `desired`
/// closes. Alone (no `cluster`) the agent subscribes to every endpoint's KV events; in a
/// cluster, to its own node's, and replicates the others' from the agents that own them.
/// The returned receiver counts the desired states applied so far (the agent waits for the
/// first before it serves).
pub fn spawn(
    proxy: Arc<Proxy>,
    mut desired: watch::Receiver<Desired>,
    cluster: Option<ClusterPods>,
) -> (JoinHandle<()>, watch::Receiver<u64>) {
    let (applied_tx, applied) = watch::channel(0u64);
    let task = tokio::spawn(async move {
        let mut sync = MemberSync::new(proxy, cluster);
        loop {
            let now = desired.borrow_and_update().clone();
            sync.apply(&now).await;
            applied_tx.send_modify(|n| *n += 1);
            if desired.changed().await.is_err() {
                return;
            }
        }
    });
    (task, applied)
}

/// An endpoint's identity across desired states.
type Key = (String, Option<u32>);

/// The running side of membership: which endpoint each spec became, and its subscription.
#[derive(Debug)]
pub struct MemberSync {
    proxy: Arc<Proxy>,
    cluster: Option<ClusterPods>,
    /// Per pool: spec -> (endpoint, its KV subscription task).
    members: HashMap<String, HashMap<Key, Member>>,
    /// Pools the watcher named that the configuration has not (reported once).
    unknown: HashSet<String>,
}

#[derive(Debug)]
struct Member {
    spec: EndpointSpec,
    endpoint: Arc<Endpoint>,
    subscription: Option<JoinHandle<()>>,
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(task) = self.subscription.take() {
            task.abort();
        }
    }
}

/// What one [`MemberSync::apply`] changed, for logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub added: usize,
    pub removed: usize,
    /// Kept endpoints whose routable verdict changed.
    pub changed: usize,
}

impl MemberSync {
    pub fn new(proxy: Arc<Proxy>, cluster: Option<ClusterPods>) -> Self {
        Self {
            proxy,
            cluster,
            members: HashMap::new(),
            unknown: Default::default(),
        }
    }

    fn index(&self) -> &Arc<KvIndex> {
        &self.proxy.index
    }

    /// Makes every pool named in `desired` hold exactly its specs.
    pub async fn apply(&mut self, desired: &Desired) -> Applied {
        let mut total = Applied::default();
        // Members gone: their sources are removed from the index once their subscriptions
        // have stopped and the cluster has let go.
        let mut dropped: Vec<Retired> = Vec::new();
        for (name, specs) in desired {
            let Some(runtime) = self.proxy.pools.iter().find(|p| &p.name == name) else {
                if self.unknown.insert(name.clone()) {
                    tracing::warn!(pool = %name, "membership for a pool the configuration does not have; ignored");
                }
                continue;
            };
            let pool = &runtime.pool;
            let mut old = self.members.remove(name).unwrap_or_default();
            let mut next: HashMap<Key, Member> = HashMap::new();
            let mut order: Vec<Key> = Vec::new();
            let mut applied = Applied::default();
            for spec in specs {
                let key = (spec.authority.clone(), spec.dp_rank);
                if next.contains_key(&key) {
                    continue;
                }
                let member = match old.remove(&key) {
                    // Same endpoint, same sources: kept (its counters and history with it).
                    Some(mut m) if same_sources(&m.spec, spec) => {
                        if m.spec.routable != spec.routable {
                            applied.changed += 1;
                            m.endpoint.set_wanted(spec.routable);
                        }
                        m.spec = spec.clone();
                        m
                    }
                    replaced => {
                        if let Some(m) = replaced {
                            dropped.push(forget(pool, m));
                        }
                        applied.added += 1;
                        self.start(name, pool, spec).await
                    }
                };
                order.push(key.clone());
                next.insert(key, member);
            }
            applied.removed = old.len();
            for (_, m) in old.drain() {
                tracing::info!(pool = %name, endpoint = %m.spec.authority, origin = %m.spec.origin, "endpoint left the pool");
                dropped.push(forget(pool, m));
            }
            // Kept endpoints first, in their old order; new ones after.
            let current = pool.endpoints();
            let mut endpoints: Vec<Arc<Endpoint>> = current
                .iter()
                .filter(|e| next.values().any(|m| Arc::ptr_eq(&m.endpoint, e)))
                .cloned()
                .collect();
            for key in &order {
                let e = &next[key].endpoint;
                if !endpoints.iter().any(|x| Arc::ptr_eq(x, e)) {
                    endpoints.push(e.clone());
                }
            }
            pool.set_endpoints(endpoints);
            if applied != Applied::default() {
                tracing::info!(pool = %name, endpoints = next.len(), added = applied.added, removed = applied.removed, changed = applied.changed, "pool membership changed");
            }
            total.added += applied.added;
            total.removed += applied.removed;
            total.changed += applied.changed;
            self.members.insert(name.clone(), next);
        }
        if let Some(c) = &self.cluster {
            let (local, remote) = self.cluster_sets(c);
            let changed = c.node.set_pods(local, remote);
            for refused in &changed.refused {
                tracing::warn!(%refused, "pod not shared with the cluster");
            }
        }
        for retired in dropped {
            if let Some(task) = retired.subscription {
                task.abort();
                // Awaited: an aborted task may still be applying a batch on another thread.
                let _ = task.await;
            }
            if let Some(source) = retired.source {
                self.index().remove_source(source);
            }
        }
        total
    }

    /// The cluster's pod sets: the configured ones, then every discovered member with a
    /// source (subscribed here: local; replicated: remote).
    fn cluster_sets(&self, c: &ClusterPods) -> (Vec<LocalPod>, Vec<(String, SourceId)>) {
        let (mut local, mut remote) = (c.local.clone(), c.remote.clone());
        let mut pools: Vec<_> = self.members.iter().collect();
        pools.sort_by(|a, b| a.0.cmp(b.0));
        for (pool, members) in pools {
            let model = self
                .proxy
                .pools
                .iter()
                .find(|p| &p.name == pool)
                .map(|p| p.pool.model.clone())
                .unwrap_or_default();
            // In a stable order: of two entries for one pod id (DP ranks) the cluster keeps
            // the first, the same one every time.
            let mut members: Vec<_> = members.iter().collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            for (_, m) in members {
                let Some(source) = m.endpoint.source else {
                    continue;
                };
                match m.subscription.is_some() {
                    true => local.push(LocalPod {
                        id: m.spec.authority.clone(),
                        model: model.clone(),
                        source,
                    }),
                    false => remote.push((m.spec.authority.clone(), source)),
                }
            }
        }
        (local, remote)
    }

    /// A new member: its KV source and subscription (when it publishes events and this
    /// agent is the one to subscribe), and its endpoint.
    async fn start(&self, name: &str, pool: &Pool, spec: &EndpointSpec) -> Member {
        let mut source = None;
        let mut subscription = None;
        let alone = self.cluster.is_none();
        let replicated = self
            .cluster
            .as_ref()
            .is_some_and(|c| !c.unreplicated.contains(name));
        if spec.kv_events.is_some() && replicated && !spec.local {
            // Another node's pod: its agent subscribes; this one replicates its index.
            source = Some(self.index().add_remote_source(SourceInfo {
                pod: spec.authority.clone(),
                rank: spec.dp_rank,
            }));
        }
        if let Some(events) = &spec.kv_events
            && (alone || spec.local)
        {
            let id = self.index().add_source(SourceInfo {
                pod: spec.authority.clone(),
                rank: spec.dp_rank,
            });
            let cfg = SourceConfig {
                pod: spec.authority.clone(),
                rank: spec.dp_rank,
                endpoint: events.clone(),
                bind: false,
                replay: spec.kv_replay.clone(),
                topic: spec.kv_topic.clone(),
            };
            match subscriber::spawn(self.index().clone(), id, cfg).await {
                Ok(task) => {
                    source = Some(id);
                    subscription = Some(task);
                }
                Err(err) => {
                    self.index().remove_source(id);
                    tracing::warn!(endpoint = %spec.authority, origin = %spec.origin, %err, "KV events unavailable; routing this endpoint without them");
                }
            }
        }
        tracing::info!(endpoint = %spec.authority, origin = %spec.origin, kv_events = ?spec.kv_events, subscribed = source.is_some(), routable = spec.routable, "endpoint joined the pool");
        let endpoint = pool.endpoint(EndpointParts {
            authority: spec.authority.clone(),
            metrics_url: Some(spec.metrics_url.clone()),
            source,
            origin: spec.origin.clone(),
            local: spec.local,
            dp_rank: spec.dp_rank,
            discovered: true,
            wanted: spec.routable,
        });
        Member {
            spec: spec.clone(),
            endpoint,
            subscription,
        }
    }
}

/// What a member that left still holds until its subscription has stopped.
#[derive(Debug)]
struct Retired {
    source: Option<SourceId>,
    subscription: Option<JoinHandle<()>>,
}

/// Drains a member and drops its routing history; returns its KV source and subscription,
/// for the caller to stop and remove (after the cluster has let go of it).
fn forget(pool: &Pool, mut m: Member) -> Retired {
    m.endpoint.set_wanted(false);
    pool.forget(&m.endpoint);
    Retired {
        source: m.endpoint.source,
        subscription: m.subscription.take(),
    }
}

/// Whether two specs of one endpoint use the same event and metrics sources (otherwise the
/// endpoint is rebuilt).
fn same_sources(a: &EndpointSpec, b: &EndpointSpec) -> bool {
    // Another pod at the same address (a reused IP) is another endpoint.
    a.origin == b.origin
        && a.metrics_url == b.metrics_url
        && a.kv_events == b.kv_events
        && a.kv_replay == b.kv_replay
        && a.kv_topic == b.kv_topic
        && a.local == b.local
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        kv_index::IndexConfig,
        proxy::TokenSource,
        routing::{Policy, SessionSource},
        telemetry::{Telemetry, TelemetryConfig},
    };

    fn proxy() -> Arc<Proxy> {
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let telemetry = Arc::new(Telemetry::new(&TelemetryConfig::default()).expect("telemetry"));
        let mut proxy = Proxy::new(index, telemetry, Default::default());
        let pool = Pool::new("m".into(), 16, Policy::Precise, Vec::new());
        proxy.add_pool(
            "p",
            pool,
            TokenSource::Approximate,
            SessionSource::default(),
        );
        Arc::new(proxy)
    }

    fn spec(authority: &str, routable: bool) -> EndpointSpec {
        EndpointSpec {
            authority: authority.into(),
            metrics_url: format!("http://{authority}/metrics"),
            kv_events: None,
            kv_replay: None,
            kv_topic: String::new(),
            dp_rank: None,
            local: true,
            routable,
            origin: format!("ns/{authority}"),
        }
    }

    fn desired(specs: Vec<EndpointSpec>) -> Desired {
        [("p".to_string(), specs)].into_iter().collect()
    }

    fn members(proxy: &Proxy) -> Vec<(String, &'static str)> {
        proxy.pools[0]
            .pool
            .endpoints()
            .iter()
            .map(|e| (e.authority.clone(), e.state()))
            .collect()
    }

    #[tokio::test]
    async fn endpoints_join_drain_and_leave_as_the_watcher_says() {
        let proxy = proxy();
        let mut sync = MemberSync::new(proxy.clone(), None);
        let a = spec("127.0.0.1:1", false);
        let b = spec("127.0.0.1:2", true);
        let applied = sync.apply(&desired(vec![a.clone(), b.clone()])).await;
        assert_eq!(
            applied,
            Applied {
                added: 2,
                removed: 0,
                changed: 0
            }
        );
        // Discovered: routable only once the metrics answered, and only when Ready.
        assert_eq!(
            members(&proxy),
            vec![
                ("127.0.0.1:1".to_string(), "unready"),
                ("127.0.0.1:2".to_string(), "pending")
            ]
        );
        let held_b = proxy.pools[0].pool.endpoints()[1].clone();
        held_b.set_engine_load(0, 0, 0.0);
        assert_eq!(held_b.state(), "serving");
        // `a` becomes Ready: the same endpoint, now wanted.
        let a_ready = spec("127.0.0.1:1", true);
        let applied = sync.apply(&desired(vec![a_ready, b.clone()])).await;
        assert_eq!(applied.changed, 1);
        assert_eq!(applied.added, 0);
        let e = proxy.pools[0].pool.endpoints()[0].clone();
        e.set_engine_load(0, 0, 0.0);
        assert!(e.routable());
        // `b` terminates: drained, then deleted; a request in flight keeps its endpoint.
        let guard = held_b.start(3, &[], 0);
        sync.apply(&desired(vec![
            spec("127.0.0.1:1", true),
            spec("127.0.0.1:2", false),
        ]))
        .await;
        assert!(!held_b.routable());
        let applied = sync.apply(&desired(vec![spec("127.0.0.1:1", true)])).await;
        assert_eq!(applied.removed, 1);
        assert_eq!(
            members(&proxy),
            vec![("127.0.0.1:1".to_string(), "serving")]
        );
        assert_eq!(
            held_b.in_flight(),
            1,
            "the request in flight still holds it"
        );
        drop(guard);
        assert_eq!(held_b.in_flight(), 0);
        // A pool that lost every pod has none; a pool the watcher does not name is kept.
        sync.apply(&desired(Vec::new())).await;
        assert!(members(&proxy).is_empty());
        sync.apply(&Desired::new()).await;
        assert!(members(&proxy).is_empty());
    }

    #[tokio::test]
    async fn a_changed_event_source_rebuilds_the_endpoint_and_its_subscription() {
        let proxy = proxy();
        let mut sync = MemberSync::new(proxy.clone(), None);
        let mut a = spec("127.0.0.1:1", true);
        a.kv_events = Some("tcp://127.0.0.1:1".into());
        sync.apply(&desired(vec![a.clone()])).await;
        let first = proxy.pools[0].pool.endpoints()[0].clone();
        let source = first.source.expect("subscribed (alone: every endpoint)");
        assert!(proxy.index.status().iter().any(|(id, _)| *id == source));
        a.kv_events = Some("tcp://127.0.0.1:2".into());
        let applied = sync.apply(&desired(vec![a])).await;
        assert_eq!((applied.added, applied.removed), (1, 0));
        let second = proxy.pools[0].pool.endpoints()[0].clone();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(!first.routable(), "the old endpoint is drained");
    }
}
