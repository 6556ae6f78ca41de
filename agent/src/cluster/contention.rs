//! Tenant contention across agents (docs/policy.md, "Across agents"): every gossip round this
//! agent publishes its tenants' demand for the cluster-wide concurrencies as `fair:TENANT`
//! (agent-wide) and `fair:TENANT@POOL` (a pool's) facts and a round counter (`fair`), and hands the current peers' facts to the admission
//! gate, through the [`ContentionExchange`] seam.
//!
//! Per round (`every`, the gossip interval): the gate's tenants with demand this round (at
//! most [`MAX_CONTENTION_FACTS`], the most demanding) are published when their value
//! changed; a tenant published before and absent now is retracted at once (its demand is
//! 0); the round counter advances. Then the peers' facts are read from the live view
//! ([`View`]: a dead agent's demand stops counting when the failure detector declares it
//! dead), less the peers whose round counter has not advanced for [`FRESH_ROUNDS`] of this
//! agent's rounds (their exchange stopped though the agent lives), and set on the gate,
//! fresh for [`FRESH_ROUNDS`] rounds.
//!
//! When the exchange ends (the node shut down, the task aborted) the gate is told at once
//! that it has no fresh view (it lets go of its caps and hands free slots to the waiters
//! they held), and this agent's `fair` facts are retracted. A round whose publication waits
//! on the gossip state past the freshness does the same for the gate without waiting.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    sync::{Arc, Weak},
    time::Duration,
};

use tokio::task::JoinHandle;

use super::{
    ClusterNode,
    facts::{Fact, check_contender},
    membership::{Membership, View},
};
use crate::contention::{Contention, ContentionExchange};

/// The most tenant contention facts one agent publishes: 256 of at most 46 bytes of value
/// and, keyed `fair:TENANT@POOL`, at most 198 of key: under 61 KiB of state (and the round
/// counter, 29 bytes of value).
pub const MAX_CONTENTION_FACTS: usize = 256;
/// Rounds the peers' contention stays in force without a newer one; and the rounds of this
/// agent a peer's round counter may stand still before its facts stop counting.
pub const FRESH_ROUNDS: u32 = 4;
/// The shortest round the task accepts (a zero interval would spin).
const MIN_EVERY: Duration = Duration::from_millis(10);

/// Starts exchanging tenant contention for `node` every `every` (the gossip interval; at
/// least 10 ms). The task ends by itself once `node` is shut down or dropped.
pub fn spawn_contention_exchange(
    node: &ClusterNode,
    gate: Arc<dyn ContentionExchange>,
    every: Duration,
) -> JoinHandle<()> {
    let membership = Arc::downgrade(&node.membership);
    tokio::spawn(exchange(membership, gate, every.max(MIN_EVERY)))
}

async fn exchange(
    membership: Weak<Membership>,
    gate: Arc<dyn ContentionExchange>,
    every: Duration,
) {
    let (live, self_node) = match membership.upgrade() {
        Some(m) => (m.watch().await, m.node_id().to_string()),
        None => return,
    };
    let fresh_for = every * FRESH_ROUNDS;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state = Exchange {
        gate: gate.clone(),
        membership: membership.clone(),
        published: BTreeMap::new(),
    };
    let mut peers = PeerRounds::default();
    let mut counter: u64 = 0;
    loop {
        tick.tick().await;
        let Some(m) = membership.upgrade() else {
            return;
        };
        let (mut set, retract) = round(&mut state.published, gate.take_round());
        counter = counter.wrapping_add(1);
        set.push(Fact::ContentionRound(counter));
        let publish = async {
            if let Err(e) = m.publish(&set).await {
                // Unreachable: `round` checked every tenant name.
                tracing::warn!(error = %e, "cannot publish tenant contention");
            }
            m.retract(&retract).await;
        };
        let_go_if_late(publish, gate.as_ref(), fresh_for).await;
        let view = View::from_live(&live.borrow(), &self_node);
        peers.observe(&view);
        gate.set_remote_contention(remote_contention(&view, &peers), fresh_for);
    }
}

/// Runs `work` to its end; if it takes longer than `after`, tells the gate its view is
/// stale meanwhile (so the caps do not outlive the view while the round waits).
async fn let_go_if_late<F: Future>(work: F, gate: &dyn ContentionExchange, after: Duration) {
    let mut work = std::pin::pin!(work);
    tokio::select! {
        _ = &mut work => {}
        () = tokio::time::sleep(after) => {
            gate.set_remote_contention(HashMap::new(), Duration::ZERO);
            work.await;
        }
    }
}

/// The exchange's state that outlives its rounds; on drop (the task's end, however it
/// ends) the gate lets go and this agent's `fair` facts are retracted.
struct Exchange {
    gate: Arc<dyn ContentionExchange>,
    membership: Weak<Membership>,
    published: BTreeMap<Arc<str>, Contention>,
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // Pumps: waiters held by a cap start on free slots now.
        self.gate
            .set_remote_contention(HashMap::new(), Duration::ZERO);
        let (Some(m), Ok(rt)) = (
            self.membership.upgrade(),
            tokio::runtime::Handle::try_current(),
        ) else {
            // The node is gone, and its facts with it.
            return;
        };
        let mut keys = retract_keys(std::mem::take(&mut self.published).keys());
        keys.push(Fact::ContentionRound(0).key());
        rt.spawn(async move { m.retract(&keys).await });
    }
}

/// Each live peer's round counter as last seen (by incarnation) and this agent's rounds
/// since it advanced.
#[derive(Debug, Default)]
struct PeerRounds(HashMap<String, ((u64, u64), u32)>);

impl PeerRounds {
    /// Takes in a round's view: forgets peers no longer in it.
    fn observe(&mut self, view: &View) {
        self.0.retain(|id, _| view.peers.contains_key(id));
        for (id, peer) in &view.peers {
            let Some(round) = peer.contention_round else {
                self.0.remove(id);
                continue;
            };
            let now = (peer.incarnation, round);
            match self.0.get_mut(id) {
                Some((seen, still)) if *seen == now => *still = still.saturating_add(1),
                Some(entry) => *entry = (now, 0),
                None => {
                    self.0.insert(id.clone(), (now, 0));
                }
            }
        }
    }

    /// Whether `peer`'s exchange is current: it published a round counter that advanced
    /// within the last [`FRESH_ROUNDS`] rounds (a peer first seen counts as advancing).
    fn current(&self, peer: &str) -> bool {
        self.0
            .get(peer)
            .is_some_and(|(_, still)| *still < FRESH_ROUNDS)
    }
}

/// This round's facts to set and keys to retract, given the gate's contention; updates
/// `published`.
fn round(
    published: &mut BTreeMap<Arc<str>, Contention>,
    mut now: Vec<(Arc<str>, Contention)>,
) -> (Vec<Fact>, Vec<String>) {
    now.retain(|(t, _)| check_contender(t).is_ok());
    now.sort_by(|(a, ca), (b, cb)| cb.demand.cmp(&ca.demand).then_with(|| a.cmp(b)));
    now.truncate(MAX_CONTENTION_FACTS);
    let mut set = Vec::new();
    let mut kept = BTreeMap::new();
    for (tenant, c) in now {
        if published.remove(&tenant) != Some(c) {
            set.push(Fact::Contention {
                tenant: tenant.to_string(),
                contention: c,
            });
        }
        kept.insert(tenant, c);
    }
    let retract = retract_keys(published.keys());
    *published = kept;
    (set, retract)
}

/// The `fair:` keys of `tenants`.
fn retract_keys<'a>(tenants: impl Iterator<Item = &'a Arc<str>>) -> Vec<String> {
    let key = |t: &Arc<str>| {
        Fact::Contention {
            tenant: t.to_string(),
            contention: Contention::default(),
        }
        .key()
    };
    tenants.map(key).collect()
}

/// The peers' contention per tenant: one entry per live peer whose exchange is current
/// reporting it; at most [`MAX_CONTENTION_FACTS`] tenants read per peer (a peer publishing
/// more is broken).
fn remote_contention(view: &View, rounds: &PeerRounds) -> HashMap<Arc<str>, Vec<Contention>> {
    let mut remote: HashMap<Arc<str>, Vec<Contention>> = HashMap::new();
    let current = view.peers.values().filter(|p| rounds.current(&p.node_id));
    for peer in current {
        for (tenant, c) in peer.contention.iter().take(MAX_CONTENTION_FACTS) {
            remote
                .entry(Arc::from(tenant.as_str()))
                .or_default()
                .push(*c);
        }
    }
    remote
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::Peer;

    fn c(demand: u32) -> Contention {
        Contention {
            priority: 1,
            weight: 2,
            demand,
        }
    }

    #[test]
    fn only_changes_are_published_and_absent_tenants_retracted() {
        let mut published = BTreeMap::new();
        let (set, retract) = round(&mut published, vec![("a".into(), c(3)), ("b".into(), c(1))]);
        assert_eq!(set.len(), 2);
        assert!(retract.is_empty());
        // `a` unchanged, `b` gone, an invalid name skipped.
        let (set, retract) = round(
            &mut published,
            vec![("a".into(), c(3)), ("bad name".into(), c(9))],
        );
        assert!(set.is_empty());
        assert_eq!(retract, vec!["fair:b".to_string()]);
        let (set, _) = round(&mut published, vec![("a".into(), c(4))]);
        assert_eq!(
            set,
            vec![Fact::Contention {
                tenant: "a".into(),
                contention: c(4)
            }]
        );
    }

    #[test]
    fn the_most_demanding_are_published_first() {
        let mut published = BTreeMap::new();
        let many: Vec<(Arc<str>, Contention)> = (0..MAX_CONTENTION_FACTS as u32 + 10)
            .map(|i| (Arc::from(format!("t{i}")), c(i + 1)))
            .collect();
        let (set, _) = round(&mut published, many);
        assert_eq!(set.len(), MAX_CONTENTION_FACTS);
        assert!(
            !set.iter().any(|f| f.key() == "fair:t0"),
            "the least demanding left out"
        );
    }

    fn peer(id: &str, incarnation: u64, round: Option<u64>, demand: u32) -> Peer {
        Peer {
            contention: BTreeMap::from([("t".to_string(), c(demand))]),
            contention_round: round,
            ..Peer::bare(id, incarnation)
        }
    }

    fn view(peers: &[Peer]) -> View {
        let peers = peers.iter().map(|p| (p.node_id.clone(), p.clone()));
        View {
            peers: peers.collect(),
        }
    }

    /// The demands of `t` counted from `view`, sorted.
    fn counted(rounds: &mut PeerRounds, view: &View) -> Vec<u32> {
        rounds.observe(view);
        let remote = remote_contention(view, rounds);
        let mut d: Vec<u32> = remote
            .get("t")
            .map(|cs| cs.iter().map(|c| c.demand).collect())
            .unwrap_or_default();
        d.sort_unstable();
        d
    }

    #[test]
    fn a_peer_whose_round_stands_still_stops_counting() {
        let mut rounds = PeerRounds::default();
        // `a` advances every round; `b` stopped at round 7; `c` never published a round.
        let mut b = peer("b", 1, Some(7), 2);
        let c = peer("c", 1, None, 3);
        for r in 1..=4u64 {
            let v = view(&[peer("a", 1, Some(r), 1), b.clone(), c.clone()]);
            // `b` first seen in round 1, then still for 1, 2, 3 rounds: counted.
            assert_eq!(counted(&mut rounds, &v), vec![1, 2], "round {r}");
        }
        // Still for 4 rounds: no longer counted.
        let v = view(&[peer("a", 1, Some(5), 1), b.clone(), c.clone()]);
        assert_eq!(counted(&mut rounds, &v), vec![1]);
        // `b` advances again: counted at once.
        b.contention_round = Some(8);
        let v = view(&[peer("a", 1, Some(6), 1), b.clone()]);
        assert_eq!(counted(&mut rounds, &v), vec![1, 2]);
        // `b` restarts (a new incarnation) at round 1: that is an advance.
        let v = view(&[peer("a", 1, Some(7), 1), peer("b", 2, Some(1), 4)]);
        assert_eq!(counted(&mut rounds, &v), vec![1, 4]);
        // Peers that left are forgotten.
        counted(&mut rounds, &view(&[]));
        assert!(rounds.0.is_empty());
    }

    /// Records what the exchange set on the gate.
    #[derive(Debug, Default)]
    struct Recorder(parking_lot::Mutex<Vec<Duration>>);

    impl ContentionExchange for Recorder {
        fn take_round(&self) -> Vec<(Arc<str>, Contention)> {
            Vec::new()
        }
        fn set_remote_contention(
            &self,
            _: HashMap<Arc<str>, Vec<Contention>>,
            fresh_for: Duration,
        ) {
            self.0.lock().push(fresh_for);
        }
    }

    #[test]
    fn the_gate_lets_go_when_the_exchange_ends() {
        let gate = Arc::new(Recorder::default());
        drop(Exchange {
            gate: gate.clone(),
            membership: Weak::new(),
            published: BTreeMap::new(),
        });
        assert_eq!(*gate.0.lock(), vec![Duration::ZERO]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_late_past_the_freshness_lets_the_gate_go_meanwhile() {
        let gate = Recorder::default();
        let after = Duration::from_millis(400);
        // On time: nothing said.
        let_go_if_late(tokio::time::sleep(after / 2), &gate, after).await;
        assert!(gate.0.lock().is_empty());
        // Late: the gate is told at `after`, and the work still runs to its end.
        let started = tokio::time::Instant::now();
        let_go_if_late(tokio::time::sleep(after * 2), &gate, after).await;
        assert_eq!(*gate.0.lock(), vec![Duration::ZERO]);
        assert_eq!(started.elapsed(), after * 2);
    }
}
