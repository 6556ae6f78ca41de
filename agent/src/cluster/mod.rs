//! The cluster (docs/cluster.md): agents sharing one index without a central router. Each
//! agent subscribes to the pods on its own node and owns them; the others learn those pods'
//! state from it.
//!
//! facts (the typed gossip values) -> membership (chitchat: publish ours, view theirs, diff)
//! -> remote (owners of the pods we route to, and their health, in the `KvIndex`); usage
//! (tenants' demand for cluster-wide quotas, [`spawn_usage_exchange`]); auth (the shared key:
//! sealed datagrams, the gRPC token). [`ClusterNode`] runs them for one agent
//! over any chitchat transport: sealed UDP in production, channels in tests.

pub mod auth;
pub mod facts;
pub mod join;
pub mod membership;
pub mod remote;
pub mod sync;
pub mod usage;

pub use usage::spawn_usage_exchange;

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};

use chitchat::transport::Transport;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::kv_index::{KvIndex, PlacementSink, RouterKey, SourceId};
use auth::{AuthCounters, ClusterKey};
use facts::{AgentFact, Fact, PodFact, PodHealth};
use membership::{Membership, MembershipConfig, View, diff};
use remote::RemotePods;
use sync::{
    PLACEMENT_QUEUE,
    client::{Upstream, replicate},
    proto::Placement,
    server::SyncServer,
};

/// How often an agent refreshes its own facts (pod health, watermarks): changes are
/// coalesced to at most one value per key per period.
pub const DEFAULT_PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// One pod this agent subscribes to and owns.
#[derive(Debug, Clone)]
pub struct LocalPod {
    /// The pod's id: its `host:port`, as every agent's pools name it.
    pub id: String,
    pub model: String,
    /// Its KV events source in this agent's index (journaled for replicas).
    pub source: SourceId,
}

/// What one agent's cluster node needs.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    pub membership: MembershipConfig,
    /// Where the IndexSync server listens (port 0: any).
    pub grpc_listen: SocketAddr,
    /// The address peers stream from (default: the bound address).
    pub grpc_advertise: Option<SocketAddr>,
    /// This agent's first proxy listener, published for diagnostics.
    pub proxy: Option<SocketAddr>,
    /// The shared key: the token IndexSync streams present and require (`None`: loopback
    /// only, nothing checked).
    pub key: Option<Arc<ClusterKey>>,
    pub counters: Arc<AuthCounters>,
    pub publish_every: Duration,
    /// How long a dead owner's pods stay unsure before their ownership is forgotten.
    pub remote_grace: Duration,
}

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Membership(#[from] membership::StartError),
    #[error("IndexSync listener {addr}: {source}")]
    Grpc {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A running replication stream from one peer.
#[derive(Debug)]
struct Client {
    upstream: Upstream,
    incarnation: u64,
    placements: mpsc::Sender<Placement>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Clients = Arc<Mutex<HashMap<String, Client>>>;

/// One agent's membership in the cluster: publishing its pods, following its peers',
/// serving its pods' index state and replicating theirs.
pub struct ClusterNode {
    membership: Arc<Membership>,
    remote: Arc<Mutex<RemotePods>>,
    grpc: SocketAddr,
    gossip_interval: Duration,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("membership", &self.membership)
            .field("grpc", &self.grpc)
            .finish_non_exhaustive()
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.membership.stop();
    }
}

/// Tokio's clock as a std instant (the index's), so paused-clock tests move both.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Everything the background tasks share.
struct Shared {
    index: Arc<KvIndex>,
    remote: Arc<Mutex<RemotePods>>,
    clients: Clients,
    server: Arc<SyncServer>,
    local: Vec<LocalPod>,
    token: Option<String>,
}

// === impl ClusterNode ===

impl ClusterNode {
    /// Joins the cluster: `local` pods are published and served as this agent's, `remote`
    /// ones (id and their remote source in `index`) are replicated from their owners.
    pub async fn start(
        settings: NodeSettings,
        index: Arc<KvIndex>,
        local: Vec<LocalPod>,
        remote: Vec<(String, SourceId)>,
        transport: &dyn Transport,
    ) -> Result<Self, StartError> {
        let grpc_err = |source| StartError::Grpc {
            addr: settings.grpc_listen,
            source,
        };
        let listener = tokio::net::TcpListener::bind(settings.grpc_listen)
            .await
            .map_err(grpc_err)?;
        let bound = listener.local_addr().map_err(grpc_err)?;
        let agent = AgentFact {
            grpc: settings.grpc_advertise.unwrap_or(bound),
            proxy: settings.proxy,
        };
        for pod in &local {
            index.enable_journal(pod.source, settings.membership.incarnation << 16);
        }
        let known: HashMap<String, SourceId> = local
            .iter()
            .map(|p| (p.id.clone(), p.source))
            .chain(remote.iter().cloned())
            .collect();
        let server = Arc::new(SyncServer::new(
            index.clone(),
            local.iter().map(|p| (p.id.clone(), p.source)).collect(),
            known,
            settings.key.clone(),
            settings.counters.clone(),
        ));
        let facts = own_facts(&index, &agent, &local);
        let membership =
            Arc::new(Membership::start(&settings.membership, &facts, transport).await?);
        let remote = Arc::new(Mutex::new(RemotePods::new(
            index.clone(),
            remote,
            settings.remote_grace,
        )));
        let shared = Arc::new(Shared {
            index: index.clone(),
            remote: remote.clone(),
            clients: Clients::default(),
            server: server.clone(),
            local: local.clone(),
            token: settings.key.as_ref().map(|k| k.grpc_token().to_string()),
        });
        let (placed, placed_rx) = mpsc::channel(PLACEMENT_QUEUE);
        // One sink per index: a second node on the same index (tests only) shares none.
        index.set_placement_sink(PlacementSink::new(move |id, keys| {
            let _ = placed.try_send((id, keys.to_vec()));
        }));
        let tasks = vec![
            tokio::spawn(sync::server::serve(server, listener)),
            tokio::spawn(follow(
                membership.clone(),
                shared.clone(),
                settings.remote_grace,
            )),
            tokio::spawn(publish(
                membership.clone(),
                index,
                agent,
                local,
                settings.publish_every,
            )),
            tokio::spawn(dispatch_placements(shared, placed_rx)),
        ];
        Ok(Self {
            membership,
            remote,
            grpc: bound,
            gossip_interval: settings.membership.gossip_interval,
            tasks,
        })
    }

    pub fn node_id(&self) -> &str {
        self.membership.node_id()
    }

    /// The bound IndexSync address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// How often this node gossips (the round [`spawn_usage_exchange`] should use).
    pub fn gossip_interval(&self) -> Duration {
        self.gossip_interval
    }

    /// The live peers now.
    pub async fn view(&self) -> View {
        self.membership.view().await
    }

    /// The owner of a remote pod, when one claims it and is alive.
    pub fn owner(&self, pod: &str) -> Option<String> {
        self.remote.lock().owner(pod).map(str::to_string)
    }

    /// Stops gossiping and streaming (peers declare this agent dead when their detectors
    /// say so).
    pub fn shutdown(self) {
        drop(self);
    }
}

/// Starts, restarts or stops replication streams so that there is one per live owner of
/// pods this agent replicates, with that owner's current pods and address.
fn reconcile_clients(shared: &Shared, view: &View) {
    let owners = shared.remote.lock().by_owner();
    let mut clients = shared.clients.lock();
    let mut wanted: BTreeMap<String, (Upstream, u64)> = BTreeMap::new();
    for ((node, incarnation), pods) in owners {
        let Some(grpc) = view
            .peers
            .get(&node)
            .filter(|p| p.incarnation == incarnation)
            .and_then(|p| p.agent.map(|a| a.grpc))
        else {
            continue;
        };
        let upstream = Upstream {
            peer: node.clone(),
            grpc,
            pods,
        };
        wanted.insert(node, (upstream, incarnation));
    }
    clients.retain(|node, c| {
        wanted
            .get(node)
            .is_some_and(|(u, inc)| *u == c.upstream && *inc == c.incarnation)
    });
    for (node, (upstream, incarnation)) in wanted {
        if clients.contains_key(&node) {
            continue;
        }
        let (placements, rx) = mpsc::channel(PLACEMENT_QUEUE);
        let task = tokio::spawn(replicate(
            upstream.clone(),
            shared.index.clone(),
            shared.token.clone(),
            rx,
        ));
        clients.insert(
            node,
            Client {
                upstream,
                incarnation,
                placements,
                task,
            },
        );
    }
}

/// Sends this agent's placements where they belong: on a local pod to its subscribers, on
/// a remote pod to its owner (who relays them to the pod's other replicas).
async fn dispatch_placements(
    shared: Arc<Shared>,
    mut placed: mpsc::Receiver<(SourceId, Vec<RouterKey>)>,
) {
    let ttl = shared.index.config().speculative_ttl;
    let ttl_ms = u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX);
    while let Some((source, keys)) = placed.recv().await {
        if let Some(pod) = shared.local.iter().find(|p| p.source == source) {
            shared.server.placed_locally(&pod.id, &keys, ttl);
            continue;
        }
        let (pod, owner) = {
            let remote = shared.remote.lock();
            let Some(pod) = remote.pod_of(source) else {
                continue;
            };
            (pod.to_string(), remote.owner(pod).map(str::to_string))
        };
        let Some(owner) = owner else {
            continue;
        };
        if let Some(c) = shared.clients.lock().get(&owner) {
            let _ = c.placements.try_send(Placement {
                pod,
                keys: keys.iter().map(|k| k.0).collect(),
                ttl_ms,
            });
        }
    }
}

/// This agent's facts: where to reach it, its pods with their event health and watermarks.
fn own_facts(index: &KvIndex, agent: &AgentFact, local: &[LocalPod]) -> Vec<Fact> {
    let status = index.status();
    let mut facts = vec![Fact::Agent(*agent)];
    for pod in local {
        let health = match status
            .iter()
            .find(|(id, _)| *id == pod.source)
            .map(|(_, s)| s.state)
        {
            Some("healthy") => PodHealth::Healthy,
            Some("unsure") => PodHealth::Unsure,
            _ => PodHealth::Waiting,
        };
        facts.push(Fact::Pod {
            pod: pod.id.clone(),
            fact: PodFact {
                model: pod.model.clone(),
                addr: pod.id.clone(),
                health,
            },
        });
        if let Some(at) = index.watermark(pod.source) {
            facts.push(Fact::Watermark {
                pod: pod.id.clone(),
                at,
            });
        }
    }
    facts
}

/// Applies every membership change to the remote pods and the replication streams, and
/// forgets dead owners after the grace period.
async fn follow(membership: Arc<Membership>, shared: Arc<Shared>, grace: Duration) {
    let mut live = membership.watch().await;
    let mut seen = View::default();
    let mut sweep = tokio::time::interval((grace / 4).max(Duration::from_millis(10)));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = live.changed() => {
                if changed.is_err() {
                    return;
                }
                let view = View::from_live(&live.borrow_and_update(), membership.node_id());
                let changes = diff(&seen, &view);
                if !changes.is_empty() {
                    shared.remote.lock().apply(&changes, now());
                    reconcile_clients(&shared, &view);
                }
                seen = view;
            }
            _ = sweep.tick() => {
                if shared.remote.lock().sweep(now()) > 0 {
                    reconcile_clients(&shared, &seen);
                }
            }
        }
    }
}

/// Refreshes this agent's facts every `every`.
async fn publish(
    membership: Arc<Membership>,
    index: Arc<KvIndex>,
    agent: AgentFact,
    local: Vec<LocalPod>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = membership.publish(&own_facts(&index, &agent, &local)).await {
            tracing::warn!(error = %e, "cannot publish this agent's cluster facts");
        }
    }
}

#[cfg(test)]
mod scale;
#[cfg(test)]
mod tests;
