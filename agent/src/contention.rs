//! What agents exchange for cluster-wide fair admission: each agent's demand, per tenant, for
//! a cluster-wide concurrency (`clusterMaxConcurrent`: agent-wide with one pool, or a pool's
//! own; docs/policy.md, "Across agents"). The admission gate
//! ([`crate::proxy::admission`]) measures it and divides the capacity by it; the cluster
//! gossips it ([`crate::cluster`]). Its own module, below both, so that neither depends on
//! the other.

use std::{collections::HashMap, sync::Arc};

/// A tenant's contention at one agent: its class, and its requests holding or waiting for
/// an admission slot there now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Contention {
    /// The tenant's `priority` (higher first).
    pub priority: i32,
    /// The tenant's `weight` among tenants of its priority (at least 1).
    pub weight: u32,
    /// Requests in flight plus waiting.
    pub demand: u32,
}

/// The seam between the admission gate and the cluster's gossip.
pub trait ContentionExchange: std::fmt::Debug + Send + Sync {
    /// This agent's contention per tenant with demand in the round that ends now, to
    /// publish; starts the next round (the demand published is each round's peak).
    fn take_round(&self) -> Vec<(Arc<str>, Contention)>;
    /// The other live agents' latest contention per tenant (one entry per agent that
    /// reported the tenant); replaces what was set before and counts as fresh for
    /// `fresh_for` (the exchange calls again every gossip round; past it, the gate falls
    /// back to this agent's own slots alone).
    fn set_remote_contention(
        &self,
        remote: HashMap<Arc<str>, Vec<Contention>>,
        fresh_for: std::time::Duration,
    );
}
