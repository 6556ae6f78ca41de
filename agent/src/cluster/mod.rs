//! The cluster (docs/cluster.md): agents sharing one index without a central router. Each
//! agent subscribes to the pods on its own node and owns them; the others learn those pods'
//! state from it.
//!
//! facts (the typed gossip values) -> membership (chitchat: publish ours, view theirs, diff)
//! -> remote (owners of the pods we route to, and their health, in the `KvIndex`); auth (the
//! shared key: sealed datagrams, the gRPC token). [`ClusterNode`] runs them for one agent
//! over any chitchat transport: sealed UDP in production, channels in tests.

pub mod auth;
pub mod facts;
pub mod membership;
pub mod remote;

use std::{sync::Arc, time::Duration};

use chitchat::transport::Transport;
use parking_lot::Mutex;

use crate::kv_index::{KvIndex, SourceId};
use facts::{AgentFact, Fact, PodFact, PodHealth};
use membership::{Membership, MembershipConfig, View, diff};
use remote::RemotePods;

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
    pub agent: AgentFact,
    pub publish_every: Duration,
    /// How long a dead owner's pods stay unsure before their ownership is forgotten.
    pub remote_grace: Duration,
}

/// One agent's membership in the cluster: publishing its pods, following its peers'.
pub struct ClusterNode {
    membership: Arc<Membership>,
    remote: Arc<Mutex<RemotePods>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("membership", &self.membership)
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

// === impl ClusterNode ===

impl ClusterNode {
    /// Joins the cluster: `local` pods are published as this agent's, `remote` ones (id and
    /// their remote source in `index`) follow their owners.
    pub async fn start(
        settings: NodeSettings,
        index: Arc<KvIndex>,
        local: Vec<LocalPod>,
        remote: Vec<(String, SourceId)>,
        transport: &dyn Transport,
    ) -> Result<Self, membership::StartError> {
        for pod in &local {
            index.enable_journal(pod.source, settings.membership.incarnation << 16);
        }
        let facts = own_facts(&index, &settings.agent, &local);
        let membership =
            Arc::new(Membership::start(&settings.membership, &facts, transport).await?);
        let remote = Arc::new(Mutex::new(RemotePods::new(
            index.clone(),
            remote,
            settings.remote_grace,
        )));
        let follow = tokio::spawn(follow(
            membership.clone(),
            remote.clone(),
            settings.remote_grace,
        ));
        let publish = tokio::spawn(publish(
            membership.clone(),
            index,
            settings.agent,
            local,
            settings.publish_every,
        ));
        Ok(Self {
            membership,
            remote,
            tasks: vec![follow, publish],
        })
    }

    pub fn node_id(&self) -> &str {
        self.membership.node_id()
    }

    /// The live peers now.
    pub async fn view(&self) -> View {
        self.membership.view().await
    }

    /// The owner of a remote pod, when one claims it and is alive.
    pub fn owner(&self, pod: &str) -> Option<String> {
        self.remote.lock().owner(pod).map(str::to_string)
    }

    /// Stops gossiping (peers declare this agent dead when their detectors say so).
    pub fn shutdown(self) {
        drop(self);
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

/// Applies every membership change to the remote pods, and forgets dead owners after the
/// grace period.
async fn follow(membership: Arc<Membership>, remote: Arc<Mutex<RemotePods>>, grace: Duration) {
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
                    remote.lock().apply(&changes, now());
                }
                seen = view;
            }
            _ = sweep.tick() => {
                remote.lock().sweep(now());
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
mod tests;
