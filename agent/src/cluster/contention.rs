//! Tenant contention across agents (docs/policy.md, "Across agents"): every gossip round this
//! agent publishes its tenants' demand for the cluster-wide concurrency as `fair:TENANT`
//! facts and hands the live peers' facts to the admission gate, through the
//! [`ContentionExchange`] seam.
//!
//! Per round (`every`, the gossip interval): the gate's tenants with demand this round (at
//! most [`MAX_CONTENTION_FACTS`], the most demanding) are published when their value
//! changed; a tenant published before and absent now is retracted at once (its demand is
//! 0). Then the peers' facts are read from the live view ([`View`]: a dead agent's demand
//! stops counting when the failure detector declares it dead) and set on the gate, fresh for
//! [`FRESH_ROUNDS`] rounds: if the exchange stops, the gate falls back to the agent's own
//! slots.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Weak},
    time::Duration,
};

use tokio::task::JoinHandle;

use super::{
    ClusterNode,
    facts::{Fact, check_tenant},
    membership::{Membership, View},
};
use crate::contention::{Contention, ContentionExchange};

/// The most tenants one agent publishes: 256 facts of at most 44 bytes of value and 69 of
/// key, under 29 KiB of state.
pub const MAX_CONTENTION_FACTS: usize = 256;
/// Rounds the peers' contention stays in force without a newer one.
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
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut published: BTreeMap<Arc<str>, Contention> = BTreeMap::new();
    loop {
        tick.tick().await;
        let Some(m) = membership.upgrade() else {
            return;
        };
        let (set, retract) = round(&mut published, gate.local_contention());
        if let Err(e) = m.publish(&set).await {
            // Unreachable: `round` checked every tenant name.
            tracing::warn!(error = %e, "cannot publish tenant contention");
        }
        m.retract(&retract).await;
        let view = View::from_live(&live.borrow(), &self_node);
        gate.set_remote_contention(remote_contention(&view), every * FRESH_ROUNDS);
    }
}

/// This round's facts to set and keys to retract, given the gate's contention; updates
/// `published`.
fn round(
    published: &mut BTreeMap<Arc<str>, Contention>,
    mut now: Vec<(Arc<str>, Contention)>,
) -> (Vec<Fact>, Vec<String>) {
    now.retain(|(t, _)| check_tenant(t).is_ok());
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
    let retract = published
        .keys()
        .map(|t| {
            Fact::Contention {
                tenant: t.to_string(),
                contention: Contention::default(),
            }
            .key()
        })
        .collect();
    *published = kept;
    (set, retract)
}

/// The peers' contention per tenant: one entry per live peer reporting it; at most
/// [`MAX_CONTENTION_FACTS`] tenants read per peer (a peer publishing more is broken).
pub fn remote_contention(view: &View) -> HashMap<Arc<str>, Vec<Contention>> {
    let mut remote: HashMap<Arc<str>, Vec<Contention>> = HashMap::new();
    for peer in view.peers.values() {
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
}
