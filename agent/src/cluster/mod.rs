//! The cluster (docs/cluster.md): agents sharing one index without a central router. Each
//! agent subscribes to the pods on its own node and owns them; the others learn those pods'
//! state from it.
//!
//! facts (the typed gossip values) -> membership (chitchat: publish ours, view theirs, diff)
//! -> remote (owners of the pods we route to, and their health, in the `KvIndex`); usage
//! (tenants' demand for cluster-wide quotas, [`spawn_usage_exchange`]; their contention for
//! the cluster-wide concurrency, [`spawn_contention_exchange`]); auth (the shared key:
//! sealed datagrams, the gRPC token). [`ClusterNode`] runs them for one agent
//! over any chitchat transport: sealed UDP in production, channels in tests; its pods
//! (local and remote) change at run time with [`ClusterNode::set_pods`] (pods). watermarks
//! paces how often a pod's watermark fact changes; lag records how far behind the owners
//! this agent's copies and placements are ([`ClusterNode::lags`]); scale runs many agents
//! in one process for `warmpath bench cluster`.

pub mod auth;
pub mod contention;
pub mod facts;
pub mod join;
pub mod lag;
mod loads;
pub mod membership;
mod order;
mod pods;
pub mod remote;
mod report;
pub mod scale;
pub mod sync;
pub mod usage;
mod watermarks;

pub use contention::spawn_contention_exchange;
pub use loads::{LOAD_ROUNDS, LoadSource, load_fact, spawn_load_publisher};
pub use order::spawn_order_watch;
pub use pods::{PodsChanged, Refused};
pub use report::Report;
pub use usage::spawn_usage_exchange;

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{Arc, atomic::AtomicU64},
    time::Duration,
};

use chitchat::transport::Transport;
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, watch};

use crate::kv_index::{AgentLoad, KvIndex, LoadSink, PlacementSink, RouterKey, SourceId};
use auth::{AuthCounters, ClusterKey};
use facts::AgentFact;
use lag::Lags;
use membership::{Membership, MembershipConfig, View};
use remote::RemotePods;
use sync::{
    PLACEMENT_QUEUE,
    client::{Upstream, replicate_changing},
    proto::{Placement, PodLoad},
    server::SyncServer,
};

/// How often an agent refreshes its own facts (pod health, watermarks): changes are
/// coalesced to at most one value per key per period.
pub const DEFAULT_PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// One pod this agent subscribes to and owns.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    grpc: SocketAddr,
    incarnation: u64,
    /// The pods it replicates (a change reopens the stream with the new set).
    pods: watch::Sender<sync::client::PodSet>,
    placements: mpsc::Sender<Placement>,
    loads: mpsc::Sender<PodLoad>,
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
    shared: Arc<Shared>,
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
    /// Stops every task the node started, including the replication streams: those are
    /// owned by [`Shared`], which a [`Report`] (in `/status` and meter callbacks for the
    /// process's life) keeps alive, so they are ended here rather than with it.
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        // Aborted, `follow` no longer reconciles: nothing restarts a stream after this.
        self.shared.clients.lock().clear();
        self.membership.stop();
    }
}

/// Tokio's clock as a std instant (the index's), so paused-clock tests move both.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Everything the background tasks share. Locks are never held across an await; when
/// nested, `local` before `remote` and `clients` before `remote`.
struct Shared {
    index: Arc<KvIndex>,
    remote: Mutex<RemotePods>,
    clients: Clients,
    server: Arc<SyncServer>,
    /// This agent's pods now ([`ClusterNode::set_pods`]).
    local: Mutex<Vec<LocalPod>>,
    token: Option<String>,
    /// This agent's incarnation, and how many journals it started: each local pod's
    /// journal gets an incarnation of its own ([`pods`]).
    incarnation: u64,
    journals: AtomicU64,
    /// Wakes the publisher when the local pods changed.
    republish: Notify,
    /// What the transport and IndexSync refused (shown by [`Report`]).
    counters: Arc<AuthCounters>,
    /// How far behind the owners this agent's copies and placements are.
    lags: Arc<Lags>,
}

// === impl ClusterNode ===

impl ClusterNode {
    /// Joins the cluster: `local` pods are published and served as this agent's, `remote`
    /// ones (id and their remote source in `index`) are replicated from their owners. The
    /// same as starting with none and calling [`ClusterNode::set_pods`] (the sets are
    /// checked the same way; refusals are logged).
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
        let lags = Arc::new(Lags::default());
        let server = Arc::new(SyncServer::new(
            index.clone(),
            HashMap::new(),
            HashMap::new(),
            settings.key.clone(),
            settings.counters.clone(),
            lags.clone(),
        ));
        let shared = Arc::new(Shared {
            index: index.clone(),
            remote: Mutex::new(RemotePods::new(
                index.clone(),
                Vec::new(),
                settings.remote_grace,
            )),
            clients: Clients::default(),
            server: server.clone(),
            local: Mutex::new(Vec::new()),
            token: settings.key.as_ref().map(|k| k.grpc_token().to_string()),
            incarnation: settings.membership.incarnation,
            journals: AtomicU64::new(0),
            republish: Notify::new(),
            counters: settings.counters.clone(),
            lags,
        });
        pods::log_refused(&shared.set_pods(local, remote));
        let facts = pods::own_facts(&index, &agent, &shared.local.lock());
        let membership =
            Arc::new(Membership::start(&settings.membership, &facts, transport).await?);
        let (placed, placed_rx) = mpsc::channel(PLACEMENT_QUEUE);
        // One sink per index: a second node on the same index (tests only) shares none.
        // Stamped as it is made (the sink is called by `KvIndex::speculate`), for the lag.
        index.set_placement_sink(PlacementSink::new(move |id, keys, _new| {
            let _ = placed.try_send((id, keys.to_vec(), lag::unix_micros()));
        }));
        let (loaded, loaded_rx) = mpsc::channel(PLACEMENT_QUEUE);
        index.set_load_sink(LoadSink::new(move |id, load| {
            let _ = loaded.try_send((id, load));
        }));
        let tasks = vec![
            tokio::spawn(dispatch_loads(
                shared.clone(),
                membership.node_id().to_string(),
                loaded_rx,
            )),
            tokio::spawn(sync::server::serve(server, listener)),
            tokio::spawn(follow(
                membership.clone(),
                shared.clone(),
                settings.remote_grace,
            )),
            tokio::spawn(pods::publish(
                membership.clone(),
                shared.clone(),
                agent,
                settings.publish_every,
            )),
            tokio::spawn(dispatch_placements(shared.clone(), placed_rx)),
        ];
        Ok(Self {
            membership,
            shared,
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

    /// The lag histograms of this agent's copies and of the placements it receives
    /// ([`Lags::observe`] exports them on a meter).
    pub fn lags(&self) -> &Arc<Lags> {
        &self.shared.lags
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
        self.shared.remote.lock().owner(pod).map(str::to_string)
    }

    /// This agent's pods now: the local set and the remote set (pod id order), as the
    /// last [`ClusterNode::set_pods`] (or `start`) left them after its checks. Every call
    /// replaces both sets, so a caller that changes only some pods (discovered ones next to
    /// configured ones) starts from these.
    pub fn pods(&self) -> (Vec<LocalPod>, Vec<(String, SourceId)>) {
        let local = self.shared.local.lock().clone();
        let remote = self.shared.remote.lock().pods();
        (local, remote)
    }

    /// Makes `local` and `remote` this agent's pods, the full sets each time (pods as in
    /// [`ClusterNode::start`]); callable at any time from any task, it returns at once
    /// (no await, no lock held beyond it). A new local pod is journaled, served and
    /// published in this agent's next facts; a local pod gone is retracted and no longer
    /// served; a new remote pod is replicated from whichever live peer claims it; a remote
    /// pod gone stops replicating and its copy is emptied. Nothing of a removed pod is kept
    /// here, but its source stays in the index: the caller removes it, **after** this call
    /// (source ids are reused; a stream still writing to a removed id could reach the pod
    /// that reuses it). See docs/cluster.md, "Pods that come and go".
    pub fn set_pods(&self, local: Vec<LocalPod>, remote: Vec<(String, SourceId)>) -> PodsChanged {
        self.shared.set_pods(local, remote)
    }

    /// Stops gossiping and streaming (peers declare this agent dead when their detectors
    /// say so).
    pub fn shutdown(self) {
        drop(self);
    }
}

/// The replication streams wanted: per live owner of pods this agent replicates, its
/// address, incarnation and those pods.
fn wanted_clients(remote: &RemotePods) -> BTreeMap<String, (Upstream, u64)> {
    let view: &View = remote.view();
    let mut wanted = BTreeMap::new();
    for ((node, incarnation), pods) in remote.by_owner() {
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
    wanted
}

/// Starts, restarts or stops replication streams so that there is one per live owner of
/// pods this agent replicates, with that owner's current pods and address. A kept owner
/// whose pods changed gets the new set on its running stream.
fn reconcile_clients(shared: &Shared) {
    let mut clients = shared.clients.lock();
    let wanted = wanted_clients(&shared.remote.lock());
    clients.retain(|node, c| {
        wanted
            .get(node)
            .is_some_and(|(u, inc)| u.grpc == c.grpc && *inc == c.incarnation)
    });
    for (node, (upstream, incarnation)) in wanted {
        if let Some(c) = clients.get(&node) {
            c.pods.send_if_modified(|pods| {
                let changed = *pods != upstream.pods;
                if changed {
                    pods.clone_from(&upstream.pods);
                }
                changed
            });
            continue;
        }
        let (placements, rx) = mpsc::channel(PLACEMENT_QUEUE);
        let (loads, loads_rx) = mpsc::channel(PLACEMENT_QUEUE);
        let (pods, pods_rx) = watch::channel(upstream.pods.clone());
        let grpc = upstream.grpc;
        let task = tokio::spawn(replicate_changing(
            upstream,
            pods_rx,
            shared.index.clone(),
            shared.token.clone(),
            (rx, loads_rx),
            shared.lags.clone(),
        ));
        clients.insert(
            node,
            Client {
                grpc,
                incarnation,
                pods,
                placements,
                loads,
                task,
            },
        );
    }
}

/// Where a message about the pod of a source goes.
enum Route {
    /// A local pod, by id: to its subscribers.
    Local(String),
    /// A remote pod, by id, and the node id of its owner: to the owner, who relays it.
    Remote(String, String),
}

/// Where messages about the pod of `source` go (`None`: no such pod, or no owner known).
fn route(shared: &Shared, source: SourceId) -> Option<Route> {
    let local = shared
        .local
        .lock()
        .iter()
        .find(|p| p.source == source)
        .map(|p| p.id.clone());
    if let Some(pod) = local {
        return Some(Route::Local(pod));
    }
    let remote = shared.remote.lock();
    let pod = remote.pod_of(source)?;
    let owner = remote.owner(pod)?.to_string();
    Some(Route::Remote(pod.to_string(), owner))
}

/// Sends this agent's placements where they belong: on a local pod to its subscribers, on
/// a remote pod to its owner (who relays them to the pod's other replicas).
async fn dispatch_placements(
    shared: Arc<Shared>,
    mut placed: mpsc::Receiver<(SourceId, Vec<RouterKey>, u64)>,
) {
    let ttl = shared.index.config().speculative_ttl;
    let ttl_ms = u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX);
    while let Some((source, keys, placed_unix_us)) = placed.recv().await {
        match route(&shared, source) {
            Some(Route::Local(pod)) => {
                shared
                    .server
                    .placed_locally(&pod, &keys, ttl, placed_unix_us);
            }
            Some(Route::Remote(pod, owner)) => {
                if let Some(c) = shared.clients.lock().get(&owner) {
                    let _ = c.placements.try_send(Placement {
                        pod,
                        keys: keys.iter().map(|k| k.0).collect(),
                        ttl_ms,
                        placed_unix_us,
                        relayed: false,
                    });
                }
            }
            None => {}
        }
    }
}

/// Sends this agent's loads where they belong, as placements go. A load that finds its
/// queue full is dropped: the proxy sends the next change, and refreshes a load that is not
/// zero ([`crate::pool::LOAD_REFRESH`]).
async fn dispatch_loads(
    shared: Arc<Shared>,
    agent: String,
    mut loaded: mpsc::Receiver<(SourceId, AgentLoad)>,
) {
    while let Some((source, load)) = loaded.recv().await {
        let msg = |pod| PodLoad {
            pod,
            agent: agent.clone(),
            in_flight: load.in_flight,
            queued_prefill_blocks: load.queued_prefill_blocks,
        };
        match route(&shared, source) {
            Some(Route::Local(pod)) => shared.server.loaded_locally(msg(pod)),
            Some(Route::Remote(pod, owner)) => {
                if let Some(c) = shared.clients.lock().get(&owner) {
                    let _ = c.loads.try_send(msg(pod));
                }
            }
            None => {}
        }
    }
}

/// Applies every membership change to the remote pods and the replication streams, and
/// forgets dead owners after the grace period.
async fn follow(membership: Arc<Membership>, shared: Arc<Shared>, grace: Duration) {
    let mut live = membership.watch().await;
    let mut sweep = tokio::time::interval((grace / 4).max(Duration::from_millis(10)));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = live.changed() => {
                if changed.is_err() {
                    return;
                }
                let view = View::from_live(&live.borrow_and_update(), membership.node_id());
                if shared.remote.lock().update(view, now()) {
                    reconcile_clients(&shared);
                }
            }
            _ = sweep.tick() => {
                if shared.remote.lock().sweep(now()) > 0 {
                    reconcile_clients(&shared);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
