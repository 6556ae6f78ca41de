//! The pods this agent routes to but does not subscribe to: whose they are and whether their
//! replicated entries can be trusted, from membership changes.
//!
//! - A peer claiming a pod (its `pod:` fact) becomes the pod's owner; a new owner, or the
//!   same one with a new incarnation, starts the replica over (`Waiting` until a snapshot).
//! - The owner's word on the pod's events (`unsure`, `stalled`) makes the replica unsure too.
//! - An owner declared dead makes its pods unsure at once: entries dropped, prefix weight 0
//!   (the pods are still routed, by load). After `grace` without the owner returning, the
//!   ownership is forgotten and the source waits for a new owner.
//! - The set of remote pods changes at run time ([`RemotePods::set_pods`]): a new pod is
//!   claimed at once by a live peer already publishing it (the last view is kept for that);
//!   a removed one is forgotten entirely, its copy emptied (the caller removes its source).

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    facts::PodHealth,
    membership::{Change, Peer, PeerPod, View, diff},
};
use crate::kv_index::{KvIndex, SourceId};

/// How long a dead owner's pods stay unsure before their ownership is forgotten.
pub const DEFAULT_REMOTE_GRACE: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Tracked {
    source: SourceId,
    /// (node id, incarnation) of the peer that claims the pod.
    owner: Option<(String, u64)>,
    /// When the owner was declared dead.
    lost_at: Option<Instant>,
}

/// The remote pods of this agent's pools, by pod id (the pools' `host:port`).
#[derive(Debug)]
pub struct RemotePods {
    index: Arc<KvIndex>,
    pods: HashMap<String, Tracked>,
    grace: Duration,
    /// The live peers as last applied with [`RemotePods::update`].
    view: View,
}

/// What one [`RemotePods::set_pods`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SetChanged {
    pub added: usize,
    pub removed: usize,
}

impl RemotePods {
    /// `pods`: each remote pod's id and its source in `index` (made with
    /// [`KvIndex::add_remote_source`]).
    pub fn new(
        index: Arc<KvIndex>,
        pods: impl IntoIterator<Item = (String, SourceId)>,
        grace: Duration,
    ) -> Self {
        let pods = pods
            .into_iter()
            .map(|(pod, source)| {
                (
                    pod,
                    Tracked {
                        source,
                        owner: None,
                        lost_at: None,
                    },
                )
            })
            .collect();
        Self {
            index,
            pods,
            grace,
            view: View::default(),
        }
    }

    /// The live peers as last applied.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// Moves to a new view of the live peers, applying the changes from the last one; false
    /// when nothing changed.
    pub fn update(&mut self, view: View, now: Instant) -> bool {
        let changes = diff(&self.view, &view);
        self.view = view;
        if changes.is_empty() {
            return false;
        }
        self.apply(&changes, now);
        true
    }

    /// Makes `pods` the remote pods (the first of two entries for one pod counts). A pod
    /// kept with the same source keeps its owner and copy; a new one (or a new source for
    /// a pod) is claimed by the first live peer, in node id order, that publishes it; a
    /// removed one is forgotten and its copy emptied (its source, the caller's, stays in the
    /// index until the caller removes it).
    pub fn set_pods(
        &mut self,
        pods: impl IntoIterator<Item = (String, SourceId)>,
        now: Instant,
    ) -> SetChanged {
        let mut old = std::mem::take(&mut self.pods);
        let mut added = Vec::new();
        for (pod, source) in pods {
            if self.pods.contains_key(&pod) {
                continue;
            }
            let tracked = match old.remove(&pod) {
                Some(t) if t.source == source => t,
                replaced => {
                    if let Some(t) = replaced {
                        old.insert(pod.clone(), t);
                    }
                    added.push(pod.clone());
                    Tracked {
                        source,
                        owner: None,
                        lost_at: None,
                    }
                }
            };
            self.pods.insert(pod, tracked);
        }
        let removed = old.len();
        let kept: std::collections::HashSet<SourceId> =
            self.pods.values().map(|t| t.source).collect();
        for t in old.into_values() {
            // A source id now another pod's (ids are reused) is not touched.
            if !kept.contains(&t.source) {
                self.index.resync_remote(t.source);
                self.index.set_owner(t.source, None);
            }
        }
        for pod in &added {
            let claim = self
                .view
                .peers
                .values()
                .find_map(|peer| Some((peer, peer.pods.get(pod)?)));
            if let (Some((peer, claim)), Some(t)) = (claim, self.pods.get_mut(pod)) {
                claim_one(&self.index, t, peer, claim, now);
            }
        }
        SetChanged {
            added: added.len(),
            removed,
        }
    }

    /// The source of a remote pod.
    pub fn source(&self, pod: &str) -> Option<SourceId> {
        self.pods.get(pod).map(|t| t.source)
    }

    /// Every remote pod and its source, in pod id order.
    pub fn pods(&self) -> Vec<(String, SourceId)> {
        let mut pods: Vec<_> = self
            .pods
            .iter()
            .map(|(p, t)| (p.clone(), t.source))
            .collect();
        pods.sort();
        pods
    }

    /// The owner of a remote pod, when one claims it and is alive.
    pub fn owner(&self, pod: &str) -> Option<&str> {
        let t = self.pods.get(pod)?;
        match (&t.owner, t.lost_at) {
            (Some((node, _)), None) => Some(node),
            _ => None,
        }
    }

    /// What the live owner of a remote pod says about it in the last view (its `pod:` fact,
    /// watermark and load), with the owner's node id.
    pub fn owner_says(&self, pod: &str) -> Option<(&str, &PeerPod)> {
        let owner = self.owner(pod)?;
        let said = self.view.peers.get(owner)?.pods.get(pod)?;
        Some((owner, said))
    }

    /// The live owners (node id, incarnation) and the pods each owns, in order.
    pub fn by_owner(&self) -> std::collections::BTreeMap<(String, u64), Vec<(String, SourceId)>> {
        let mut owners: std::collections::BTreeMap<_, Vec<_>> = Default::default();
        for (pod, t) in &self.pods {
            if let (Some(owner), None) = (&t.owner, t.lost_at) {
                owners
                    .entry(owner.clone())
                    .or_default()
                    .push((pod.clone(), t.source));
            }
        }
        for pods in owners.values_mut() {
            pods.sort();
        }
        owners
    }

    /// The remote pod a source stands for.
    pub fn pod_of(&self, source: SourceId) -> Option<&str> {
        self.pods
            .iter()
            .find(|(_, t)| t.source == source)
            .map(|(p, _)| p.as_str())
    }

    /// Applies membership changes.
    pub fn apply(&mut self, changes: &[Change], now: Instant) {
        for change in changes {
            match change {
                Change::Joined(peer) | Change::Changed(peer) => self.claimed(peer, now),
                Change::Left(peer) => self.lost(&peer.node_id, now),
            }
        }
    }

    fn claimed(&mut self, peer: &Peer, now: Instant) {
        for (pod, t) in &mut self.pods {
            let Some(claim) = peer.pods.get(pod) else {
                // It stopped claiming a pod it owned: the pod waits for a new owner.
                if t.owner.as_ref().is_some_and(|(n, _)| *n == peer.node_id) {
                    t.owner = None;
                    t.lost_at = None;
                    self.index.resync_remote(t.source);
                    self.index.set_owner(t.source, None);
                }
                continue;
            };
            claim_one(&self.index, t, peer, claim, now);
        }
    }

    fn lost(&mut self, node: &str, now: Instant) {
        for t in self.pods.values_mut() {
            if t.owner.as_ref().is_some_and(|(n, _)| n == node) && t.lost_at.is_none() {
                t.lost_at = Some(now);
                self.index.mark_remote_lost(
                    t.source,
                    format!("owner {node} is unreachable (declared dead by gossip)"),
                    now,
                );
            }
        }
    }

    /// Forgets owners dead for longer than the grace period; returns how many.
    pub fn sweep(&mut self, now: Instant) -> usize {
        let mut n = 0;
        for t in self.pods.values_mut() {
            if t.lost_at
                .is_some_and(|at| now.saturating_duration_since(at) >= self.grace)
            {
                t.owner = None;
                t.lost_at = None;
                self.index.resync_remote(t.source);
                self.index.set_owner(t.source, None);
                n += 1;
            }
        }
        n
    }
}

/// `peer` claims the pod `t` tracks: a new owner (or incarnation) starts the copy over; the
/// owner's word on the pod's events sets its health.
fn claim_one(index: &KvIndex, t: &mut Tracked, peer: &Peer, claim: &PeerPod, now: Instant) {
    let me = (peer.node_id.clone(), peer.incarnation);
    if t.owner.as_ref() != Some(&me) || t.lost_at.is_some() {
        t.owner = Some(me);
        t.lost_at = None;
        index.resync_remote(t.source);
        index.set_owner(t.source, Some(&peer.node_id));
    }
    let unsure = match claim.fact.health {
        PodHealth::Healthy | PodHealth::Waiting => None,
        PodHealth::Unsure | PodHealth::Stalled => Some(format!(
            "owner {}: the pod's KV events are {}",
            peer.node_id,
            claim.fact.health.as_str()
        )),
    };
    index.set_remote_health(t.source, unsure, now);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        cluster::{
            facts::PodFact,
            membership::{PeerPod, View, diff},
        },
        kv_index::{IndexConfig, RouterKey, SourceInfo, Tier},
    };

    fn peer(node: &str, incarnation: u64, pods: &[(&str, PodHealth)]) -> Peer {
        Peer {
            node_id: node.into(),
            incarnation,
            gossip: ([127, 0, 0, 1], 1).into(),
            agent: None,
            pods: pods
                .iter()
                .map(|(p, h)| {
                    (
                        p.to_string(),
                        PeerPod {
                            fact: PodFact {
                                model: "m".into(),
                                addr: p.to_string(),
                                health: *h,
                            },
                            watermark: None,
                            load: None,
                        },
                    )
                })
                .collect(),
            usage: BTreeMap::new(),
            contention: BTreeMap::new(),
            contention_round: None,
            malformed: 0,
        }
    }

    fn view(peers: &[&Peer]) -> View {
        View {
            peers: peers
                .iter()
                .map(|p| (p.node_id.clone(), (*p).clone()))
                .collect(),
        }
    }

    #[test]
    fn owners_claim_lose_and_return() {
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let src = index.add_remote_source(SourceInfo {
            pod: "pod-c1".into(),
            rank: None,
        });
        let mut remote = RemotePods::new(
            index.clone(),
            [("pod-c1".to_string(), src)],
            DEFAULT_REMOTE_GRACE,
        );
        let t0 = Instant::now();
        let c = peer("agent-c", 1, &[("pod-c1", PodHealth::Healthy)]);
        let v1 = view(&[&c]);
        remote.apply(&diff(&View::default(), &v1), t0);
        assert_eq!(remote.owner("pod-c1"), Some("agent-c"));
        assert_eq!(index.owner(src).as_deref(), Some("agent-c"));
        // Replicated entries arrive (the replication stream's job), then the owner dies.
        index.load_snapshot(src, &[(RouterKey(1), Tier::Gpu.bit())]);
        assert!(index.trusted(src));
        remote.apply(&diff(&v1, &View::default()), t0);
        assert!(!index.trusted(src));
        assert!(
            index.holders(RouterKey(1)).is_empty(),
            "entries dropped at once"
        );
        let status = &index.status()[0].1;
        assert_eq!(status.state, "unsure");
        assert!(
            status
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("agent-c"))
        );
        assert_eq!(remote.sweep(t0 + DEFAULT_REMOTE_GRACE / 2), 0);
        // It returns as a new incarnation: the replica starts over, waiting for a snapshot.
        let c2 = peer("agent-c", 2, &[("pod-c1", PodHealth::Healthy)]);
        remote.apply(&diff(&View::default(), &view(&[&c2])), t0);
        assert_eq!(index.status()[0].1.state, "waiting");
        // Its pod's events turn unsure on the owner: so does the replica.
        let c2_unsure = peer("agent-c", 2, &[("pod-c1", PodHealth::Unsure)]);
        index.load_snapshot(src, &[]);
        remote.apply(&diff(&view(&[&c2]), &view(&[&c2_unsure])), t0);
        assert!(!index.trusted(src));
        // Dead past the grace period: the ownership is forgotten.
        remote.apply(&diff(&view(&[&c2_unsure]), &View::default()), t0);
        assert_eq!(remote.sweep(t0 + DEFAULT_REMOTE_GRACE), 1);
        assert_eq!(remote.owner("pod-c1"), None);
        assert_eq!(index.owner(src), None);
    }

    #[test]
    fn pods_added_are_claimed_from_the_last_view_and_pods_removed_forgotten() {
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let info = |pod: &str| SourceInfo {
            pod: pod.into(),
            rank: None,
        };
        let mut remote = RemotePods::new(index.clone(), Vec::new(), DEFAULT_REMOTE_GRACE);
        let t0 = Instant::now();
        let c = peer("agent-c", 1, &[("pod-c1", PodHealth::Healthy)]);
        assert!(remote.update(view(&[&c]), t0), "agent-c joined");
        assert!(!remote.update(view(&[&c]), t0), "nothing changed");
        // Named after agent-c published it: claimed at once, no membership change needed.
        let c1 = index.add_remote_source(info("pod-c1"));
        let d1 = index.add_remote_source(info("pod-d1"));
        let set = remote.set_pods([("pod-c1".to_string(), c1), ("pod-d1".to_string(), d1)], t0);
        assert_eq!((set.added, set.removed), (2, 0));
        assert_eq!(remote.owner("pod-c1"), Some("agent-c"));
        assert_eq!(index.owner(c1).as_deref(), Some("agent-c"));
        assert_eq!(remote.owner("pod-d1"), None, "nobody claims it yet");
        // Its owner shows up later: claimed by the membership change.
        let d = peer("agent-d", 1, &[("pod-d1", PodHealth::Healthy)]);
        remote.update(view(&[&c, &d]), t0);
        assert_eq!(remote.owner("pod-d1"), Some("agent-d"));
        index.load_snapshot(c1, &[(RouterKey(9), Tier::Gpu.bit())]);
        // The same set again changes nothing (the copy is kept).
        let set = remote.set_pods([("pod-c1".to_string(), c1), ("pod-d1".to_string(), d1)], t0);
        assert_eq!((set.added, set.removed), (0, 0));
        assert_eq!(index.holders(RouterKey(9)).len(), 1);
        // pod-c1 removed: forgotten, its copy emptied, its source left to the caller.
        let set = remote.set_pods([("pod-d1".to_string(), d1)], t0);
        assert_eq!((set.added, set.removed), (0, 1));
        assert_eq!(remote.owner("pod-c1"), None);
        assert_eq!(remote.source("pod-c1"), None);
        assert!(index.holders(RouterKey(9)).is_empty());
        assert_eq!(index.owner(c1), None);
        assert!(index.status().iter().any(|(id, _)| *id == c1));
        assert_eq!(
            remote.by_owner().keys().cloned().collect::<Vec<_>>(),
            vec![("agent-d".to_string(), 1)]
        );
        // A membership change for agent-c touches nothing of the forgotten pod.
        remote.update(view(&[&d]), t0);
        assert_eq!(
            index
                .status()
                .iter()
                .find(|(id, _)| *id == c1)
                .map(|(_, s)| s.state),
            Some("waiting")
        );
    }
}
