//! What agents exchange for cluster-wide quotas: each agent's offered demand per tenant
//! (docs/policy.md, "Quotas across agents"). The quota engine ([`crate::policy::quota`])
//! measures it and shares limits by it; the cluster gossips it ([`crate::cluster`]). Its own
//! module, below both, so that neither depends on the other.

use std::{collections::HashMap, sync::Arc};

/// A tenant's offered load at one agent, per second (a moving average over the recent
/// past): what it asked for, admitted or not, in each quota's unit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Demand {
    pub requests: f64,
    pub prompt_tokens: f64,
    pub output_tokens: f64,
}

/// The seam between the quota engine and the cluster's gossip.
pub trait UsageExchange: std::fmt::Debug + Send + Sync {
    /// This agent's demand per tenant, to publish (only tenants with a quota).
    fn local_demand(&self) -> Vec<(Arc<str>, Demand)>;
    /// The other live agents' latest demand per tenant (one entry per agent that reported
    /// the tenant); replaces what was set before. Tenants absent have no remote demand.
    fn set_remote_demand(&self, remote: HashMap<Arc<str>, Vec<Demand>>);
}
