//! Tenant quotas: requests, prompt tokens and output tokens per second as token buckets,
//! and a cap on concurrent streams, each limit cluster-wide (docs/policy.md, "Quotas and
//! fairness").
//!
//! The algorithm, per tenant and dimension:
//!
//! - **Buckets.** Capacity = this agent's rate x `burstSeconds`, refilled continuously. A
//!   request is admitted when the requests bucket holds 1, the prompt-token bucket holds
//!   the request's estimated prompt tokens (or is full, for a prompt larger than the burst),
//!   the output-token bucket is not in debt, and fewer than the stream cap are open. Then 1
//!   request and the estimated prompt tokens are paid; the [`QuotaPermit`] holds the stream
//!   until dropped. [`QuotaPermit::settle`] charges the output tokens the engine reported
//!   and corrects the prompt charge; both may leave a bucket in debt, which the refill
//!   repays before the tenant is admitted again. A refusal pays nothing.
//! - **Demand.** Every attempt, admitted or not, adds to the tenant's offered demand: 1
//!   request, its prompt tokens and, for output, the settled output of admitted requests
//!   plus, per refused request, the tenant's recent output per request. Each is an
//!   exponentially weighted rate with a 2 s time constant ([`bucket::DEMAND_TAU`]).
//! - **Shares.** Limits are cluster-wide. The agents gossip their demand
//!   ([`UsageExchange`]); each agent's rate is its share of the limit by max-min fair
//!   water-filling over all agents' demands ([`share::water_fill`]), floored at 5 % of an
//!   equal split; streams are shared by request demand (rounded down, at least 1). Shares
//!   are recomputed when new remote demand arrives and at least every
//!   [`SHARE_REFRESH`]. With no other agent the share is the whole limit.
//! - **Bounds.** State is kept for at most [`MAX_TENANTS`] tenants, only for tenants with a
//!   quota. When a new one would exceed it, tenants idle for [`IDLE_AFTER`] (no stream
//!   open, buckets full) are forgotten first — forgetting them changes no decision, only
//!   their demand history and refusal counts —, else the one seen least recently.

mod bucket;
mod limits;
pub mod share;
mod tenant;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use opentelemetry::{KeyValue, metrics::Meter};
use parking_lot::{Mutex, RwLock};

use self::tenant::TenantState;
pub use self::{
    limits::{DEFAULT_BURST, Dimension, LimitError, QuotaLimits},
    share::water_fill,
};
use crate::usage::{Demand, UsageExchange};

/// Tenants with quota state at most (a fixed bound on memory: well under 1 KiB each).
pub const MAX_TENANTS: usize = 4096;
/// Other agents' demand kept per tenant at most (more than any cluster warmpath runs).
pub const MAX_REMOTE_AGENTS: usize = 1024;
/// A tenant's share is recomputed at least this often (its own demand moves continuously).
pub const SHARE_REFRESH: Duration = Duration::from_millis(100);
/// A tenant unseen this long, with no stream open and full buckets, may be forgotten.
pub const IDLE_AFTER: Duration = Duration::from_secs(10);
/// Longest `Retry-After` given (a limit so small that a request takes longer to earn).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// Weight of the newest request in the output-per-request average (about the last 8).
const OUTPUT_PER_REQUEST_WEIGHT: f64 = 0.125;

/// Why a request was refused, and when trying again may succeed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct QuotaRefusal {
    pub dimension: Dimension,
    /// Until the bucket can pay (a second for a stream cap: streams end when they end).
    pub retry_after: Duration,
    pub message: String,
}

impl QuotaRefusal {
    /// `retry_after` in whole seconds for the `Retry-After` field: rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u32 {
        let s = self.retry_after.as_millis().div_ceil(1000).max(1);
        u32::try_from(s).unwrap_or(u32::MAX)
    }
}

// === impl Quotas ===

/// The agent's quota state, one for the whole agent, shared by every data-path thread.
#[derive(Debug, Default)]
pub struct Quotas {
    tenants: RwLock<HashMap<Arc<str>, Arc<Tenant>>>,
    /// Other agents' demand per tenant, as last gossiped.
    remote: RwLock<HashMap<Arc<str>, Vec<Demand>>>,
    /// Bumped by each [`UsageExchange::set_remote_demand`]: shares are then recomputed.
    remote_generation: AtomicU64,
}

#[derive(Debug)]
struct Tenant {
    name: Arc<str>,
    state: Mutex<TenantState>,
}

impl Quotas {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Admits one request of `tenant` with `prompt_tokens` (estimated) at `now`, or says
    /// which limit refused it and when to retry.
    pub fn admit(
        &self,
        tenant: &Arc<str>,
        limits: &QuotaLimits,
        prompt_tokens: u64,
        now: Instant,
    ) -> Result<QuotaPermit, QuotaRefusal> {
        if limits.is_unlimited() {
            return Ok(QuotaPermit::unlimited());
        }
        let cell = self.tenant(tenant, now);
        let generation = self.remote_generation.load(Ordering::Acquire);
        let prompt = prompt_tokens as f64;
        let mut st = cell.state.lock();
        // Demand first, so that the share reflects this attempt.
        st.demand[0].add(1.0, now);
        st.demand[1].add(prompt, now);
        st.refresh(limits, now, generation, || self.remote_of(tenant));
        if let Some((dimension, wait)) = st.refusal(prompt) {
            let output = st.output_per_request;
            st.demand[2].add(output, now);
            st.refused[dimension as usize] += 1;
            let message = st.message(tenant, dimension, wait);
            return Err(QuotaRefusal {
                dimension,
                retry_after: wait.min(MAX_RETRY_AFTER),
                message,
            });
        }
        st.buckets[0].charge(1.0);
        st.buckets[1].charge(prompt);
        st.open_streams = st.open_streams.saturating_add(1);
        drop(st);
        Ok(QuotaPermit {
            tenant: Some(cell),
            estimated_prompt: prompt_tokens,
            charged_prompt: prompt_tokens,
            charged_output: 0,
            settled: false,
        })
    }

    /// This agent's current rate (or stream cap) for `tenant` in `dimension`: its share of
    /// the cluster-wide limit; `None` when unlimited or the tenant has no state.
    pub fn local_limit(&self, tenant: &str, dimension: Dimension) -> Option<f64> {
        let cell = self.tenants.read().get(tenant).cloned()?;
        let st = cell.state.lock();
        st.local_limit(dimension)
    }

    /// This agent's demand for every tenant with a quota, at `now`.
    pub fn local_demand_at(&self, now: Instant) -> Vec<(Arc<str>, Demand)> {
        let cells: Vec<Arc<Tenant>> = self.tenants.read().values().cloned().collect();
        cells
            .iter()
            .filter_map(|t| {
                let st = t.state.lock();
                (!st.limits.is_unlimited()).then(|| (t.name.clone(), st.demand_at(now)))
            })
            .collect()
    }

    /// Tenants with state now (at most [`MAX_TENANTS`]).
    pub fn tenants(&self) -> usize {
        self.tenants.read().len()
    }

    fn remote_of(&self, tenant: &str) -> Vec<Demand> {
        self.remote.read().get(tenant).cloned().unwrap_or_default()
    }

    fn tenant(&self, name: &Arc<str>, now: Instant) -> Arc<Tenant> {
        if let Some(t) = self.tenants.read().get(name) {
            return t.clone();
        }
        let mut map = self.tenants.write();
        if let Some(t) = map.get(name) {
            return t.clone();
        }
        if map.len() >= MAX_TENANTS {
            evict(&mut map, now);
        }
        let t = Arc::new(Tenant {
            name: name.clone(),
            state: Mutex::new(TenantState::new(now)),
        });
        map.insert(name.clone(), t.clone());
        t
    }

    /// Registers `warmpath.quota.*` on `meter` (read at collection time: nothing on the
    /// request path touches telemetry).
    pub fn observe(self: &Arc<Self>, meter: &Meter) {
        let q = self.clone();
        meter
            .u64_observable_counter("warmpath.quota.refused")
            .with_unit("{request}")
            .with_description("Requests refused by a tenant quota, by tenant and dimension")
            .with_callback(move |o| {
                q.each(|name, st| {
                    for d in Dimension::ALL {
                        if st.local_limit(d).is_some() || st.refused[d as usize] > 0 {
                            o.observe(st.refused[d as usize], &labels(name, d));
                        }
                    }
                });
            })
            .build();
        let q = self.clone();
        meter
            .f64_observable_gauge("warmpath.quota.local_limit")
            .with_description(
                "This agent's share of a tenant's cluster-wide quota (per second, or streams)",
            )
            .with_callback(move |o| {
                q.each(|name, st| {
                    for d in Dimension::ALL {
                        if let Some(v) = st.local_limit(d) {
                            o.observe(v, &labels(name, d));
                        }
                    }
                });
            })
            .build();
    }

    fn each(&self, mut f: impl FnMut(&str, &TenantState)) {
        let cells: Vec<Arc<Tenant>> = self.tenants.read().values().cloned().collect();
        for t in cells {
            f(&t.name, &t.state.lock());
        }
    }
}

fn labels(tenant: &str, d: Dimension) -> [KeyValue; 2] {
    [
        KeyValue::new("tenant", tenant.to_owned()),
        KeyValue::new("dimension", d.as_str()),
    ]
}

/// Makes room for one tenant: forgets the idle ones, else the one seen least recently (one
/// with no stream open if there is one; the permits of a forgotten tenant still release
/// into its old state).
fn evict(map: &mut HashMap<Arc<str>, Arc<Tenant>>, now: Instant) {
    map.retain(|_, t| !t.state.lock().is_idle(now));
    if map.len() < MAX_TENANTS {
        return;
    }
    let oldest = map
        .iter()
        .map(|(name, t)| {
            let st = t.state.lock();
            ((st.open_streams > 0, st.last_seen), name.clone())
        })
        .min_by_key(|(key, _)| *key)
        .map(|(_, name)| name);
    if let Some(name) = oldest {
        map.remove(&name);
    }
}

impl UsageExchange for Quotas {
    fn local_demand(&self) -> Vec<(Arc<str>, Demand)> {
        self.local_demand_at(Instant::now())
    }

    fn set_remote_demand(&self, remote: HashMap<Arc<str>, Vec<Demand>>) {
        let clean = |d: f64| if d.is_finite() && d > 0.0 { d } else { 0.0 };
        let remote = remote
            .into_iter()
            .take(MAX_TENANTS)
            .map(|(tenant, mut demands)| {
                demands.truncate(MAX_REMOTE_AGENTS);
                for d in &mut demands {
                    d.requests = clean(d.requests);
                    d.prompt_tokens = clean(d.prompt_tokens);
                    d.output_tokens = clean(d.output_tokens);
                }
                (tenant, demands)
            })
            .collect();
        *self.remote.write() = remote;
        self.remote_generation.fetch_add(1, Ordering::Release);
    }
}

// === impl QuotaPermit ===

/// An admitted request's quota: its stream until dropped, and the charges still to settle.
#[derive(Debug)]
pub struct QuotaPermit {
    /// `None`: the tenant has no quota.
    tenant: Option<Arc<Tenant>>,
    estimated_prompt: u64,
    charged_prompt: u64,
    charged_output: u64,
    settled: bool,
}

impl QuotaPermit {
    /// A permit that limits nothing (a tenant without quotas).
    pub fn unlimited() -> Self {
        Self {
            tenant: None,
            estimated_prompt: 0,
            charged_prompt: 0,
            charged_output: 0,
            settled: false,
        }
    }

    /// Charges the usage the engine reported: the request's totals so far (prompt tokens
    /// and output tokens). Each call charges the difference from what was charged before,
    /// so it may be called once at the end or as usage arrives. The output bucket may go
    /// into debt; the prompt charge moves by (reported - charged), a refund at most up to
    /// the bucket's capacity. Cheap (one uncontended lock), never blocks on I/O: it is
    /// called where the response body ends.
    pub fn settle(&mut self, prompt_tokens: u64, output_tokens: u64, now: Instant) {
        let Some(t) = &self.tenant else { return };
        let prompt_delta = prompt_tokens as f64 - self.charged_prompt as f64;
        let output_delta = output_tokens.saturating_sub(self.charged_output) as f64;
        self.charged_prompt = prompt_tokens;
        self.charged_output = self.charged_output.max(output_tokens);
        self.settled = true;
        let mut st = t.state.lock();
        for b in &mut st.buckets {
            b.advance(now);
        }
        if st.buckets[1].is_set() {
            st.buckets[1].charge(prompt_delta);
        }
        if st.buckets[2].is_set() {
            st.buckets[2].charge(output_delta);
        }
        st.demand[1].add(prompt_delta, now);
        st.demand[2].add(output_delta, now);
    }

    /// The prompt tokens charged at admission (the estimate).
    pub fn estimated_prompt(&self) -> u64 {
        self.estimated_prompt
    }
}

impl Drop for QuotaPermit {
    fn drop(&mut self) {
        let Some(t) = &self.tenant else { return };
        let mut st = t.state.lock();
        st.open_streams = st.open_streams.saturating_sub(1);
        // Only settled requests tell what a request produces (a cancelled one may not).
        if self.settled {
            let w = OUTPUT_PER_REQUEST_WEIGHT;
            st.output_per_request =
                (1.0 - w) * st.output_per_request + w * self.charged_output as f64;
        }
    }
}

#[cfg(test)]
mod tests;
