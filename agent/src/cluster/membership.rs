//! Who is in the cluster and what they say about themselves: one chitchat node per agent
//! publishing this agent's [`Fact`]s, and the live peers' facts as a [`View`], with changes
//! between two views as a pure [`diff`].
//!
//! chitchat's phi-accrual failure detector decides liveness; a peer it declares dead leaves
//! the view (and shows up in the diff as [`Change::Left`]) at once. A restarted agent is a
//! new chitchat member (a new generation id, its incarnation); while its old self is not yet
//! declared dead both are live, and the view keeps the newest.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use chitchat::{
    ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, NodeState, spawn_chitchat,
    transport::Transport,
};
use tokio::sync::watch;

use super::facts::{AgentFact, Fact, LoadFact, PodFact, UsageFact};
use crate::contention::Contention;
use crate::kv_index::Watermark;

/// Gossip rounds in production: 500 ms, so that a change reaches 64 agents within 2 s
/// (1.23-1.41 s for the slowest of five, `warmpath bench cluster`) for 8.5 KB/s of gossip
/// per node with every pod busy; a stopped agent is noticed after about 12-15 rounds
/// (6-7.5 s).
pub const DEFAULT_GOSSIP_INTERVAL: Duration = Duration::from_millis(500);
/// The longest gossip round the configuration accepts: a minute, so a stopped agent is
/// still noticed within a quarter of an hour, and the detector's multiples of it stay far
/// from overflow.
pub const MAX_GOSSIP_INTERVAL: Duration = Duration::from_secs(60);
/// How long chitchat remembers a dead member before forgetting it (a returning member
/// within it is recognised as the same one).
pub const DEFAULT_DEAD_GRACE: Duration = Duration::from_secs(3_600);

/// One agent's gossip settings.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    pub cluster_id: String,
    pub node_id: String,
    /// Unique per start of this agent (chitchat's generation id).
    pub incarnation: u64,
    pub listen: SocketAddr,
    /// The address peers gossip to (the listen address unless behind a NAT or 0.0.0.0).
    pub advertise: SocketAddr,
    /// `host:port` of members to join through (DNS names are re-resolved).
    pub seeds: Vec<String>,
    pub gossip_interval: Duration,
    pub dead_grace: Duration,
}

/// Why membership could not start.
#[derive(Debug, thiserror::Error)]
#[error("gossip on {listen}: {message}")]
pub struct StartError {
    pub listen: SocketAddr,
    pub message: String,
}

/// This agent's chitchat node.
pub struct Membership {
    handle: ChitchatHandle,
    node_id: String,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("id", self.handle.chitchat_id())
            .finish_non_exhaustive()
    }
}

// === impl Membership ===

impl Membership {
    /// Joins the cluster over `transport` (sealed UDP in production, channels in tests),
    /// publishing `facts` from the start.
    pub async fn start(
        config: &MembershipConfig,
        facts: &[Fact],
        transport: &dyn Transport,
    ) -> Result<Self, StartError> {
        let err = |message: String| StartError {
            listen: config.listen,
            message,
        };
        let initial = facts
            .iter()
            .map(|f| Ok((f.key(), f.value()?)))
            .collect::<Result<Vec<_>, super::facts::FactError>>()
            .map_err(|e| err(e.to_string()))?;
        let chitchat_config = ChitchatConfig {
            chitchat_id: ChitchatId::new(
                config.node_id.as_str(),
                config.incarnation,
                config.advertise,
            ),
            cluster_id: config.cluster_id.clone(),
            gossip_interval: config.gossip_interval,
            listen_addr: config.listen,
            seed_nodes: config.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                // The prior of the heartbeat interval: a peer heard from every round.
                // Saturating: a round too long for these never panics (the configuration
                // refuses one over `MAX_GOSSIP_INTERVAL`).
                initial_interval: config.gossip_interval.saturating_mul(2),
                max_interval: config.gossip_interval.saturating_mul(10),
                dead_node_grace_period: config.dead_grace,
                ..Default::default()
            },
            marked_for_deletion_grace_period: config.dead_grace,
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: chitchat::ProtocolVersion::V1,
        };
        let handle = spawn_chitchat(chitchat_config, initial, transport)
            .await
            .map_err(|e| err(format!("{e:#}")))?;
        Ok(Self {
            handle,
            node_id: config.node_id.clone(),
        })
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Sets this agent's facts (changed values travel with the next gossip round).
    pub async fn publish(&self, facts: &[Fact]) -> Result<(), super::facts::FactError> {
        let values = facts
            .iter()
            .map(|f| Ok((f.key(), f.value()?)))
            .collect::<Result<Vec<_>, super::facts::FactError>>()?;
        let chitchat = self.handle.chitchat();
        let mut chitchat = chitchat.lock().await;
        let node = chitchat.self_node_state();
        for (k, v) in values {
            if node.get(&k) != Some(v.as_str()) {
                node.set(k, v);
            }
        }
        Ok(())
    }

    /// Withdraws facts (a pod no longer local).
    pub async fn retract(&self, keys: &[String]) {
        let chitchat = self.handle.chitchat();
        let mut chitchat = chitchat.lock().await;
        let node = chitchat.self_node_state();
        for k in keys {
            if node.contains_key(k) {
                node.delete(k);
            }
        }
    }

    /// Live members' states; changes whenever one's facts or the live set change.
    pub async fn watch(&self) -> watch::Receiver<BTreeMap<ChitchatId, NodeState>> {
        self.handle.chitchat().lock().await.live_nodes_watcher()
    }

    /// The live peers now.
    pub async fn view(&self) -> View {
        let live = self.watch().await.borrow().clone();
        View::from_live(&live, &self.node_id)
    }

    /// Stops gossiping (peers notice through their failure detectors).
    pub fn stop(&self) {
        if let Err(e) = self.handle.initiate_shutdown() {
            tracing::debug!(error = %e, "gossip already stopped");
        }
    }
}

/// What a live peer says about one of its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPod {
    pub fact: PodFact,
    pub watermark: Option<Watermark>,
    pub load: Option<LoadFact>,
}

/// A live peer and its facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub node_id: String,
    pub incarnation: u64,
    pub gossip: SocketAddr,
    pub agent: Option<AgentFact>,
    pub pods: BTreeMap<String, PeerPod>,
    pub usage: BTreeMap<String, UsageFact>,
    /// Its tenants' contention for the cluster-wide concurrency (`fair:` facts).
    pub contention: BTreeMap<String, Contention>,
    /// Its contention exchange's round counter (`fair`); `None` before its first round.
    pub contention_round: Option<u64>,
    /// Values that did not parse (a newer or broken peer); ignored.
    pub malformed: usize,
}

impl Peer {
    fn from_state(id: &ChitchatId, state: &NodeState) -> Self {
        let mut peer = Self {
            node_id: id.node_id.to_string(),
            incarnation: id.generation_id,
            gossip: id.gossip_advertise_addr,
            agent: None,
            pods: BTreeMap::new(),
            usage: BTreeMap::new(),
            contention: BTreeMap::new(),
            contention_round: None,
            malformed: 0,
        };
        let mut watermarks = BTreeMap::new();
        let mut loads = BTreeMap::new();
        for (key, value) in state.key_values() {
            match Fact::parse(key, value) {
                Ok(Fact::Agent(a)) => peer.agent = Some(a),
                Ok(Fact::Pod { pod, fact }) => {
                    peer.pods.insert(
                        pod,
                        PeerPod {
                            fact,
                            watermark: None,
                            load: None,
                        },
                    );
                }
                Ok(Fact::Watermark { pod, at }) => {
                    watermarks.insert(pod, at);
                }
                Ok(Fact::Load { pod, load }) => {
                    loads.insert(pod, load);
                }
                Ok(Fact::Usage { tenant, usage }) => {
                    peer.usage.insert(tenant, usage);
                }
                Ok(Fact::Contention { tenant, contention }) => {
                    peer.contention.insert(tenant, contention);
                }
                Ok(Fact::ContentionRound(round)) => peer.contention_round = Some(round),
                Err(_) => peer.malformed += 1,
            }
        }
        for (pod, p) in &mut peer.pods {
            p.watermark = watermarks.get(pod).copied();
            p.load = loads.get(pod).copied();
        }
        peer
    }
}

/// The live peers (this agent excluded), by node id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    pub peers: BTreeMap<String, Peer>,
}

impl View {
    /// The view from chitchat's live members; of two live incarnations of one node, the
    /// newest.
    pub fn from_live(live: &BTreeMap<ChitchatId, NodeState>, self_node: &str) -> Self {
        let mut peers: BTreeMap<String, Peer> = BTreeMap::new();
        for (id, state) in live {
            if &*id.node_id == self_node {
                continue;
            }
            if peers
                .get(&*id.node_id)
                .is_some_and(|p| p.incarnation >= id.generation_id)
            {
                continue;
            }
            peers.insert(id.node_id.to_string(), Peer::from_state(id, state));
        }
        Self { peers }
    }
}

/// How one peer differs between two views.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Not in the old view.
    Joined(Peer),
    /// In both, with other facts or another incarnation (the new peer).
    Changed(Peer),
    /// Not in the new view (declared dead, or left): the last known peer.
    Left(Peer),
}

/// The changes from `old` to `new`, in node id order.
pub fn diff(old: &View, new: &View) -> Vec<Change> {
    let mut changes = Vec::new();
    for (id, peer) in &new.peers {
        match old.peers.get(id) {
            None => changes.push(Change::Joined(peer.clone())),
            Some(before) if before != peer => changes.push(Change::Changed(peer.clone())),
            Some(_) => {}
        }
    }
    for (id, peer) in &old.peers {
        if !new.peers.contains_key(id) {
            changes.push(Change::Left(peer.clone()));
        }
    }
    changes
}

#[cfg(test)]
impl Peer {
    /// A peer without facts, for tests.
    pub fn bare(id: &str, incarnation: u64) -> Self {
        Self {
            node_id: id.into(),
            incarnation,
            gossip: ([127, 0, 0, 1], 1).into(),
            agent: None,
            pods: BTreeMap::new(),
            usage: BTreeMap::new(),
            contention: BTreeMap::new(),
            contention_round: None,
            malformed: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str, incarnation: u64) -> Peer {
        Peer::bare(id, incarnation)
    }

    fn view(peers: &[Peer]) -> View {
        View {
            peers: peers
                .iter()
                .map(|p| (p.node_id.clone(), p.clone()))
                .collect(),
        }
    }

    #[test]
    fn the_diff_names_who_joined_changed_and_left() {
        let a = peer("a", 1);
        let b2 = peer("b", 2);
        let c = peer("c", 1);
        let old = view(&[a.clone(), peer("b", 1)]);
        let new = view(&[a.clone(), b2.clone(), c.clone()]);
        assert_eq!(
            diff(&old, &new),
            vec![Change::Changed(b2), Change::Joined(c.clone())]
        );
        assert_eq!(diff(&new, &new), Vec::new());
        assert_eq!(
            diff(&new, &view(&[c])),
            vec![Change::Left(a), Change::Left(peer("b", 2))]
        );
    }
}
