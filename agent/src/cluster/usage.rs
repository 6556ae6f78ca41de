//! Tenant usage across agents (docs/cluster.md, "Tenant usage"): every gossip round this
//! agent publishes its demand per tenant as `usage:TENANT` facts and hands the live peers'
//! facts to the quota engine, through the [`UsageExchange`] seam.
//!
//! Publishing, per round (`every`, the gossip interval):
//! - the tenants the quota engine reports, ranked by demand (prompt plus output tokens per
//!   second, then requests per second, then name), at most [`MAX_USAGE_FACTS`] of them;
//! - a tenant's value is republished only when one of its rates moved by more than
//!   [`REPUBLISH_PERMILLE`] of itself, or to or from zero, so a steady demand costs no
//!   gossip bytes;
//! - a tenant whose demand fell to zero (or that the engine no longer reports) is published
//!   as zero for [`IDLE_ROUNDS`] rounds, then retracted, so keys do not accumulate; one that
//!   falls out of the most demanding [`MAX_USAGE_FACTS`] is retracted at once.
//!
//! Reading: the peers chitchat holds live, and of two incarnations of one node the newest
//! ([`View`]), so a dead agent's demand stops counting when the failure detector declares it
//! dead, and a restarted agent is not counted twice. Recomputed every round and whenever
//! membership changes; the engine is told only when the result differs from the last.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Weak},
    time::Duration,
};

use tokio::task::JoinHandle;

use super::{
    ClusterNode,
    facts::{Fact, UsageFact, check_tenant},
    membership::{Membership, View},
};
use crate::usage::{Demand, UsageExchange};

/// The most tenants one agent publishes (the most demanding): 256 facts of at most 57 bytes
/// of value and 70 of key, 32 KiB of state at most.
pub const MAX_USAGE_FACTS: usize = 256;
/// Rounds a tenant is published at zero demand before its fact is retracted (10 s at the
/// production 1 s interval): long enough for every peer to see the zero.
pub const IDLE_ROUNDS: u32 = 10;
/// A rate is republished when it moved by more than this many thousandths of itself (1 %):
/// the published demand is within 1 % (plus 0.001/s rounding) of the measured one.
pub const REPUBLISH_PERMILLE: u64 = 10;
/// The shortest round the task accepts (a zero interval would spin).
const MIN_EVERY: Duration = Duration::from_millis(10);

/// Starts exchanging tenant usage for `node`: every `every` (the gossip interval; at least
/// 10 ms) it publishes `usage.local_demand()` and sets `usage.set_remote_demand(..)` from
/// the live peers (one [`Demand`] per peer reporting the tenant, in node id order). The
/// task ends by itself once `node` is shut down or dropped; aborting the handle stops it
/// sooner.
pub fn spawn_usage_exchange(
    node: &ClusterNode,
    usage: Arc<dyn UsageExchange>,
    every: Duration,
) -> JoinHandle<()> {
    let membership = Arc::downgrade(&node.membership);
    tokio::spawn(exchange(membership, usage, every.max(MIN_EVERY)))
}

async fn exchange(membership: Weak<Membership>, usage: Arc<dyn UsageExchange>, every: Duration) {
    let (mut live, self_node) = match membership.upgrade() {
        Some(m) => (m.watch().await, m.node_id().to_string()),
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut published = Published::default();
    let mut told: Option<HashMap<Arc<str>, Vec<Demand>>> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let Some(m) = membership.upgrade() else {
                    return;
                };
                let round = published.round(usage.local_demand());
                if let Err(e) = m.publish(&round.set).await {
                    // Unreachable: `round` checked every tenant name.
                    tracing::warn!(error = %e, "cannot publish tenant usage");
                }
                m.retract(&round.retract).await;
            }
            changed = live.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let remote = remote_demand(&View::from_live(&live.borrow_and_update(), &self_node));
        if told.as_ref() != Some(&remote) {
            usage.set_remote_demand(remote.clone());
            told = Some(remote);
        }
    }
}

/// The peers' demand per tenant: one entry per live peer reporting it, in node id order;
/// at most [`MAX_USAGE_FACTS`] tenants read per peer (a peer publishing more is broken).
pub fn remote_demand(view: &View) -> HashMap<Arc<str>, Vec<Demand>> {
    let mut remote: HashMap<Arc<str>, Vec<Demand>> = HashMap::new();
    for peer in view.peers.values() {
        for (tenant, fact) in peer.usage.iter().take(MAX_USAGE_FACTS) {
            remote
                .entry(Arc::from(tenant.as_str()))
                .or_default()
                .push(fact.demand());
        }
    }
    remote
}

/// What this agent has published, per tenant.
#[derive(Debug, Default)]
struct Published {
    tenants: BTreeMap<Arc<str>, Entry>,
    warned_invalid: bool,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    fact: UsageFact,
    /// Rounds published at zero.
    idle: u32,
}

/// One round's changes to this agent's usage facts.
#[derive(Debug, Default, PartialEq, Eq)]
struct Round {
    set: Vec<Fact>,
    retract: Vec<String>,
}

// === impl Published ===

impl Published {
    /// The facts to set and the keys to retract this round, given the engine's demand.
    fn round(&mut self, demand: Vec<(Arc<str>, Demand)>) -> Round {
        let mut now: BTreeMap<Arc<str>, UsageFact> = BTreeMap::new();
        for (tenant, d) in demand {
            if let Err(e) = check_tenant(&tenant) {
                if !std::mem::replace(&mut self.warned_invalid, true) {
                    tracing::warn!(error = %e, "a tenant's usage is not published");
                }
                continue;
            }
            now.insert(tenant, UsageFact::from_demand(&d));
        }
        // A tenant published before and not reported now has no demand.
        for tenant in self.tenants.keys() {
            now.entry(tenant.clone()).or_default();
        }
        // Zero demand is published only for tenants already published (to be retracted).
        let mut ranked: Vec<(Arc<str>, UsageFact)> = now
            .into_iter()
            .filter(|(t, f)| !f.is_zero() || self.tenants.contains_key(t))
            .collect();
        ranked.sort_by(|(a, fa), (b, fb)| rank(fb).cmp(&rank(fa)).then_with(|| a.cmp(b)));
        ranked.truncate(MAX_USAGE_FACTS);

        let mut round = Round::default();
        let mut kept = BTreeMap::new();
        for (tenant, fact) in ranked {
            let before = self.tenants.remove(&tenant);
            let idle = match (&before, fact.is_zero()) {
                (Some(e), true) => e.idle + 1,
                _ => 0,
            };
            if idle > IDLE_ROUNDS {
                round.retract.push(usage_key(&tenant));
                continue;
            }
            let entry = match before {
                Some(e) if !moved(&e.fact, &fact) => Entry { idle, ..e },
                _ => {
                    round.set.push(Fact::Usage {
                        tenant: tenant.to_string(),
                        usage: fact,
                    });
                    Entry { fact, idle }
                }
            };
            kept.insert(tenant, entry);
        }
        // Published before, not among the most demanding now.
        round
            .retract
            .extend(self.tenants.keys().map(|t| usage_key(t)));
        self.tenants = kept;
        round
    }
}

fn usage_key(tenant: &str) -> String {
    Fact::Usage {
        tenant: tenant.to_string(),
        usage: UsageFact::default(),
    }
    .key()
}

/// Most demanding first: tokens per second, then requests per second.
fn rank(f: &UsageFact) -> (u64, u64) {
    (
        f.prompt_tokens
            .milli()
            .saturating_add(f.output_tokens.milli()),
        f.requests.milli(),
    )
}

/// Whether `new` differs enough from the published `old` to be republished.
fn moved(old: &UsageFact, new: &UsageFact) -> bool {
    let pairs = [
        (old.requests, new.requests),
        (old.prompt_tokens, new.prompt_tokens),
        (old.output_tokens, new.output_tokens),
    ];
    pairs.iter().any(|(o, n)| {
        let (o, n) = (o.milli(), n.milli());
        // Rates are at most 1e12 thousandths: no overflow at 1,000x.
        (o == 0) != (n == 0) || o.abs_diff(n) * 1_000 > o.max(n) * REPUBLISH_PERMILLE
    })
}

#[cfg(test)]
mod tests;
