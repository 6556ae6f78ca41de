//! This agent's pods at run time (docs/cluster.md, "Pods that come and go"): the full local
//! and remote sets applied at once ([`ClusterNode::set_pods`](super::ClusterNode::set_pods)),
//! and the publisher that keeps this agent's facts in step with the local set.
//!
//! - A new local pod (or a new source for one) gets a journal of its own incarnation:
//!   `(agent incarnation + n) << 16` for the n-th journal this agent started, so a pod
//!   removed and added again is never mistaken for its old self by a replica (the low 16
//!   bits count the pod's own restarts, `KvIndex::mark_unsure` and the like). It is served
//!   by IndexSync at once and published within the publisher's next pass (woken at once).
//! - A local pod gone is no longer served (every producer looks its pods up again) and its
//!   facts (`pod:`, `wm:`, `load:`) are retracted; a peer seeing the retraction empties its
//!   copy and forgets the owner (`remote::RemotePods`).
//! - Remote pods: [`RemotePods::set_pods`](super::remote::RemotePods::set_pods), then the
//!   replication streams follow.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use super::{
    LocalPod, Shared,
    facts::{AgentFact, Fact, FactError, PodFact, PodHealth, check_id, pod_keys},
    membership::Membership,
    now, reconcile_clients,
};
use crate::kv_index::{KvIndex, SourceId};

/// What one `set_pods` changed, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodsChanged {
    pub local_added: usize,
    pub local_removed: usize,
    pub remote_added: usize,
    pub remote_removed: usize,
    /// Local pods left out (they are neither published nor served).
    pub refused: Vec<Refused>,
}

/// Why a local pod was left out of a `set_pods`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Its id or model would not make a fact (see `facts::check_id`).
    #[error("local pod left out of the cluster: {0}")]
    Invalid(FactError),
    /// Listed twice: the first is kept.
    #[error("local pod {pod:?} listed twice; the first one is kept")]
    Duplicate { pod: String },
}

/// Logs each refusal once per call.
pub(super) fn log_refused(changed: &PodsChanged) {
    for r in &changed.refused {
        tracing::warn!(error = %r, "cluster pods");
    }
}

// === impl Shared ===

impl Shared {
    /// See [`ClusterNode::set_pods`](super::ClusterNode::set_pods).
    pub(super) fn set_pods(
        &self,
        local: Vec<LocalPod>,
        remote: Vec<(String, SourceId)>,
    ) -> PodsChanged {
        let mut changed = PodsChanged::default();
        let local = checked(local, &mut changed.refused);
        let local_ids: HashSet<&str> = local.iter().map(|p| p.id.as_str()).collect();
        // A pod this agent owns is not replicated from anyone.
        let remote: Vec<(String, SourceId)> = remote
            .into_iter()
            .filter(|(pod, _)| !local_ids.contains(pod.as_str()))
            .collect();
        {
            let mut current = self.local.lock();
            let before: HashSet<(&str, SourceId)> =
                current.iter().map(|p| (p.id.as_str(), p.source)).collect();
            for pod in &local {
                if !before.contains(&(pod.id.as_str(), pod.source)) {
                    let n = self.journals.fetch_add(1, Ordering::Relaxed);
                    let incarnation = self.incarnation.wrapping_add(n) << 16;
                    self.index.enable_journal(pod.source, incarnation);
                    changed.local_added += 1;
                }
            }
            let after: HashSet<(&str, SourceId)> =
                local.iter().map(|p| (p.id.as_str(), p.source)).collect();
            changed.local_removed = before.difference(&after).count();
            let served: HashMap<String, SourceId> =
                local.iter().map(|p| (p.id.clone(), p.source)).collect();
            let mut known = served.clone();
            known.extend(remote.iter().cloned());
            self.server.set_pods(served, known);
            let set = self.remote.lock().set_pods(remote, now());
            changed.remote_added = set.added;
            changed.remote_removed = set.removed;
            *current = local;
        }
        self.republish.notify_one();
        reconcile_clients(self);
        changed
    }
}

/// The local pods fit for facts, the first of each id.
fn checked(local: Vec<LocalPod>, refused: &mut Vec<Refused>) -> Vec<LocalPod> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(local.len());
    for pod in local {
        if let Err(e) =
            check_id("pod id", &pod.id).and_then(|()| check_id("model name", &pod.model))
        {
            refused.push(Refused::Invalid(e));
            continue;
        }
        if !seen.insert(pod.id.clone()) {
            refused.push(Refused::Duplicate { pod: pod.id });
            continue;
        }
        out.push(pod);
    }
    out
}

/// This agent's facts: where to reach it, its pods with their event health and watermarks.
pub(super) fn own_facts(index: &KvIndex, agent: &AgentFact, local: &[LocalPod]) -> Vec<Fact> {
    let status = index.status();
    let mut facts = vec![Fact::Agent(*agent)];
    for pod in local {
        let health = health_of(
            status
                .iter()
                .find(|(id, _)| *id == pod.source)
                .map(|(_, s)| s.state),
        );
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

/// A local source's state in the index (`SourceStatus::state`) as the health its owner
/// publishes: `stalled` when the engine owes events and sends none (`KvIndex::sweep`), which
/// every replica then treats like `unsure`.
pub(super) fn health_of(state: Option<&str>) -> PodHealth {
    match state {
        Some("healthy") => PodHealth::Healthy,
        Some("unsure") => PodHealth::Unsure,
        Some("stalled") => PodHealth::Stalled,
        _ => PodHealth::Waiting,
    }
}

/// Refreshes this agent's facts every `every`, and at once when the local pods change:
/// facts of pods no longer local are retracted.
pub(super) async fn publish(
    membership: Arc<Membership>,
    shared: Arc<Shared>,
    agent: AgentFact,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // What `start` published.
    let mut published: BTreeSet<String> =
        shared.local.lock().iter().map(|p| p.id.clone()).collect();
    let mut watermarks = super::watermarks::Pacer::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shared.republish.notified() => {}
        }
        let local = shared.local.lock().clone();
        let now: BTreeSet<String> = local.iter().map(|p| p.id.clone()).collect();
        let gone: Vec<String> = published
            .difference(&now)
            .flat_map(|pod| pod_keys(pod))
            .collect();
        if !gone.is_empty() {
            membership.retract(&gone).await;
        }
        published = now;
        let mut facts = own_facts(&shared.index, &agent, &local);
        watermarks.pace(&mut facts, tokio::time::Instant::now());
        if let Err(e) = membership.publish(&facts).await {
            tracing::warn!(error = %e, "cannot publish this agent's cluster facts");
        }
    }
}
