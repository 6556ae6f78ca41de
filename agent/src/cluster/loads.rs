//! Load summaries of this agent's pods over gossip (docs/cluster.md, "Load facts"): every
//! [`LOAD_ROUNDS`] gossip rounds (2.5 s in production) the owner publishes, per local pod,
//! what its last scrape of the engine's `/metrics` said (`load:POD` =
//! `v1 running=N waiting=N kv=PERMILLE`), through the [`LoadSource`] seam (the proxy's
//! endpoints, which scrape every 200 ms).
//!
//! - **Change-driven, bounded.** A pod's value is set only when it differs from the last one
//!   published, and at most once per period, so a steady pod costs nothing and a busy one at
//!   most one fact (at most 48 bytes of value) per period.
//! - **Only what was measured.** A pod the source has no figure for (never scraped, scrape
//!   failing) publishes nothing new; its last value stays until the pod leaves this agent's
//!   pods, when the publisher (`pods`) retracts it with the pod's other facts. A pod no
//!   longer local whose load this task published is retracted here too (its next pass).
//! - **Readers.** A replica keeps its own scrape of the pod for routing (fresher: 200 ms
//!   against the period plus the gossip spread) and shows the owner's figures beside it in
//!   `/status` and the metrics ([`super::ClusterNode::status`]).

use std::{
    collections::BTreeMap,
    sync::{Arc, Weak},
    time::Duration,
};

use tokio::task::JoinHandle;

use super::{
    ClusterNode, Shared,
    facts::{Fact, LoadFact, MAX_KV_PERMILLE},
    membership::Membership,
};

/// How often a pod's load fact may change, in gossip rounds: 2.5 s at the production 500 ms
/// interval. Gossip spreads each change to every node, so the period bounds what loads cost
/// the cluster: at most 8 pods x 70 bytes of key and value per period and node, received by
/// every node.
pub const LOAD_ROUNDS: u32 = 5;
/// The shortest period the task accepts (a zero interval would spin).
const MIN_EVERY: Duration = Duration::from_millis(10);

/// Where the owner's figures come from: the load of a local pod by its id, `None` while
/// it has none (not scraped yet).
pub type LoadSource = Arc<dyn Fn(&str) -> Option<LoadFact> + Send + Sync>;

/// A load figure from an engine's scraped numbers (`kv_cache_usage` 0..1, clamped).
pub fn load_fact(running: u32, waiting: u32, kv_cache_usage: f64) -> LoadFact {
    let permille = if kv_cache_usage.is_nan() {
        0
    } else {
        (kv_cache_usage.clamp(0.0, 1.0) * f64::from(MAX_KV_PERMILLE)).round() as u32
    };
    LoadFact {
        running,
        waiting,
        kv_permille: permille,
    }
}

/// Starts publishing `node`'s local pods' loads from `source` every [`LOAD_ROUNDS`] gossip
/// rounds. The task ends by itself once `node` is shut down or dropped.
pub fn spawn_load_publisher(node: &ClusterNode, source: LoadSource) -> JoinHandle<()> {
    let membership = Arc::downgrade(&node.membership);
    let shared = Arc::downgrade(&node.shared);
    let every = node
        .gossip_interval()
        .saturating_mul(LOAD_ROUNDS)
        .max(MIN_EVERY);
    tokio::spawn(publish(membership, shared, source, every))
}

async fn publish(
    membership: Weak<Membership>,
    shared: Weak<Shared>,
    source: LoadSource,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut published = BTreeMap::new();
    loop {
        tick.tick().await;
        let (Some(m), Some(shared)) = (membership.upgrade(), shared.upgrade()) else {
            return;
        };
        let local: Vec<String> = shared.local.lock().iter().map(|p| p.id.clone()).collect();
        drop(shared);
        let round = pass(&mut published, &local, source.as_ref());
        if let Err(e) = m.publish(&round.set).await {
            // Unreachable: local pods' ids were checked when they were set.
            tracing::warn!(error = %e, "cannot publish pod loads");
        }
        m.retract(&round.retract).await;
    }
}

/// One pass's changes.
#[derive(Debug, Default, PartialEq, Eq)]
struct Round {
    set: Vec<Fact>,
    retract: Vec<String>,
}

/// What to set and retract now, given what was `published` (updated): the loads of `local`
/// pods that changed, and the keys of published pods no longer local.
fn pass(
    published: &mut BTreeMap<String, LoadFact>,
    local: &[String],
    source: &(dyn Fn(&str) -> Option<LoadFact> + Send + Sync),
) -> Round {
    let mut round = Round::default();
    published.retain(|pod, _| {
        let keep = local.contains(pod);
        if !keep {
            round.retract.push(
                Fact::Load {
                    pod: pod.clone(),
                    load: LoadFact::default(),
                }
                .key(),
            );
        }
        keep
    });
    for pod in local {
        let Some(load) = source(pod) else {
            continue;
        };
        if published.get(pod) != Some(&load) {
            published.insert(pod.clone(), load);
            round.set.push(Fact::Load {
                pod: pod.clone(),
                load,
            });
        }
    }
    round
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;

    fn load(running: u32) -> LoadFact {
        LoadFact {
            running,
            waiting: 1,
            kv_permille: 500,
        }
    }

    #[test]
    fn loads_are_set_when_they_change_and_retracted_when_the_pod_leaves() {
        let figures: Mutex<BTreeMap<String, LoadFact>> = Mutex::default();
        let source = |pod: &str| figures.lock().get(pod).copied();
        let mut published = BTreeMap::new();
        let pods = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // Not scraped yet: nothing to say.
        assert_eq!(
            pass(&mut published, &pods(&["a:1"]), &source),
            Round::default()
        );
        figures.lock().insert("a:1".into(), load(3));
        figures.lock().insert("b:1".into(), load(0));
        let first = pass(&mut published, &pods(&["a:1", "b:1"]), &source);
        assert_eq!(
            first.set,
            vec![
                Fact::Load {
                    pod: "a:1".into(),
                    load: load(3)
                },
                Fact::Load {
                    pod: "b:1".into(),
                    load: load(0)
                },
            ]
        );
        // Steady: nothing travels.
        assert_eq!(
            pass(&mut published, &pods(&["a:1", "b:1"]), &source),
            Round::default()
        );
        // One moved; the other left this agent's pods.
        figures.lock().insert("a:1".into(), load(4));
        let next = pass(&mut published, &pods(&["a:1"]), &source);
        assert_eq!(
            next,
            Round {
                set: vec![Fact::Load {
                    pod: "a:1".into(),
                    load: load(4)
                }],
                retract: vec!["load:b:1".into()],
            }
        );
        // A scrape that fails keeps the last value published (no new word).
        figures.lock().clear();
        assert_eq!(
            pass(&mut published, &pods(&["a:1"]), &source),
            Round::default()
        );
    }

    #[test]
    fn kv_usage_becomes_permille_clamped() {
        assert_eq!(load_fact(1, 2, 0.4126).kv_permille, 413);
        assert_eq!(load_fact(1, 2, 1.7).kv_permille, 1_000);
        assert_eq!(load_fact(1, 2, -0.1).kv_permille, 0);
        assert_eq!(load_fact(1, 2, f64::NAN).kv_permille, 0);
    }
}
