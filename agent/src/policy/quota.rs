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
pub mod share;

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use opentelemetry::{KeyValue, metrics::Meter};
use parking_lot::{Mutex, RwLock};

use self::bucket::{Bucket, Ewma};
pub use self::share::water_fill;
use super::{
    resources,
    usage::{Demand, UsageExchange},
};

/// Tenants with quota state at most (a fixed bound on memory: well under 1 KiB each).
pub const MAX_TENANTS: usize = 4096;
/// Other agents' demand kept per tenant at most (more than any cluster warmpath runs).
pub const MAX_REMOTE_AGENTS: usize = 1024;
/// A tenant's share is recomputed at least this often (its own demand moves continuously).
pub const SHARE_REFRESH: Duration = Duration::from_millis(100);
/// A tenant unseen this long, with no stream open and full buckets, may be forgotten.
pub const IDLE_AFTER: Duration = Duration::from_secs(10);
/// `burstSeconds` when the quota does not say.
pub const DEFAULT_BURST: Duration = Duration::from_secs(1);
/// Longest `Retry-After` given (a limit so small that a request takes longer to earn).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// Weight of the newest request in the output-per-request average (about the last 8).
const OUTPUT_PER_REQUEST_WEIGHT: f64 = 0.125;

/// One quota's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    Requests,
    PromptTokens,
    OutputTokens,
    ConcurrentStreams,
}

impl Dimension {
    pub const ALL: [Dimension; 4] = [
        Dimension::Requests,
        Dimension::PromptTokens,
        Dimension::OutputTokens,
        Dimension::ConcurrentStreams,
    ];
    /// The three rate dimensions, in bucket order.
    const RATES: [Dimension; 3] = [
        Dimension::Requests,
        Dimension::PromptTokens,
        Dimension::OutputTokens,
    ];

    /// The `dimension` attribute of the quota metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::PromptTokens => "prompt_tokens",
            Dimension::OutputTokens => "output_tokens",
            Dimension::ConcurrentStreams => "concurrent_streams",
        }
    }

    /// The field of `spec.quotas`.
    pub fn field(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::PromptTokens => "promptTokens",
            Dimension::OutputTokens => "outputTokens",
            Dimension::ConcurrentStreams => "concurrentStreams",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Dimension::Requests => "requests/s",
            Dimension::PromptTokens => "prompt tokens/s",
            Dimension::OutputTokens => "output tokens/s",
            Dimension::ConcurrentStreams => "concurrent streams",
        }
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tenant's quotas in the engine's units: rates per second, cluster-wide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaLimits {
    pub requests_per_s: Option<f64>,
    pub prompt_tokens_per_s: Option<f64>,
    pub output_tokens_per_s: Option<f64>,
    pub concurrent_streams: Option<u32>,
    /// Seconds of each rate that may be spent at once.
    pub burst: Duration,
}

impl Default for QuotaLimits {
    /// No limit at all.
    fn default() -> Self {
        Self {
            requests_per_s: None,
            prompt_tokens_per_s: None,
            output_tokens_per_s: None,
            concurrent_streams: None,
            burst: DEFAULT_BURST,
        }
    }
}

/// A quota field that cannot be used: which field of `spec.quotas`, its value, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.quotas.{field}: `{value}`: {reason}")]
pub struct LimitError {
    pub field: &'static str,
    pub value: String,
    pub reason: String,
}

impl QuotaLimits {
    /// The limits of a `Tenant`'s `spec.quotas`.
    pub fn from_spec(spec: &resources::Quotas) -> Result<Self, LimitError> {
        let rate = |dim: Dimension, v: &Option<String>| {
            v.as_deref()
                .map(|s| {
                    parse_rate(s).map_err(|reason| LimitError {
                        field: dim.field(),
                        value: s.to_owned(),
                        reason,
                    })
                })
                .transpose()
        };
        let concurrent_streams = match spec.concurrent_streams {
            Some(0) => {
                return Err(LimitError {
                    field: Dimension::ConcurrentStreams.field(),
                    value: "0".into(),
                    reason: "must be at least 1".into(),
                });
            }
            n => n,
        };
        let burst = match spec.burst_seconds {
            None => DEFAULT_BURST,
            Some(s) if (0.05..=60.0).contains(&s) => Duration::from_secs_f64(s),
            Some(s) => {
                return Err(LimitError {
                    field: "burstSeconds",
                    value: s.to_string(),
                    reason: "must be between 0.05 and 60 seconds".into(),
                });
            }
        };
        Ok(Self {
            requests_per_s: rate(Dimension::Requests, &spec.requests)?,
            prompt_tokens_per_s: rate(Dimension::PromptTokens, &spec.prompt_tokens)?,
            output_tokens_per_s: rate(Dimension::OutputTokens, &spec.output_tokens)?,
            concurrent_streams,
            burst,
        })
    }

    /// Nothing is limited: [`Quotas::admit`] keeps no state for the tenant.
    pub fn is_unlimited(&self) -> bool {
        self.rates().iter().all(Option::is_none) && self.concurrent_streams.is_none()
    }

    fn rates(&self) -> [Option<f64>; 3] {
        [
            self.requests_per_s,
            self.prompt_tokens_per_s,
            self.output_tokens_per_s,
        ]
    }
}

/// `N/s`, `N/min` or `N/h` (N a positive finite decimal) as a rate per second.
// TODO(#22): use crate::policy::validate::parse_rate when it lands, so that validation and
// the engine read rates by one function.
fn parse_rate(s: &str) -> Result<f64, String> {
    let Some((n, unit)) = s.trim().split_once('/') else {
        return Err("a rate is `N/s`, `N/min` or `N/h`".into());
    };
    let per = match unit.trim() {
        "s" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown unit `{other}`: use `s`, `min` or `h`")),
    };
    match n.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v / per),
        Ok(_) => Err("the amount must be a positive number".into()),
        Err(_) => Err(format!("`{}` is not a number", n.trim())),
    }
}

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

#[derive(Debug)]
struct TenantState {
    limits: QuotaLimits,
    /// Requests, prompt tokens, output tokens ([`Dimension::RATES`] order).
    buckets: [Bucket; 3],
    demand: [Ewma; 3],
    /// This agent's share of the stream cap.
    streams_cap: Option<u32>,
    open_streams: u32,
    output_per_request: f64,
    shared_at: Option<(Instant, u64)>,
    last_seen: Instant,
    refused: [u64; 4],
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

// === impl TenantState ===

impl TenantState {
    fn new(now: Instant) -> Self {
        Self {
            limits: QuotaLimits::default(),
            buckets: Default::default(),
            demand: Default::default(),
            streams_cap: None,
            open_streams: 0,
            output_per_request: 0.0,
            shared_at: None,
            last_seen: now,
            refused: [0; 4],
        }
    }

    /// Brings the buckets to `now` and, when stale, the shares to the latest limits and
    /// demands.
    fn refresh(
        &mut self,
        limits: &QuotaLimits,
        now: Instant,
        generation: u64,
        remote: impl FnOnce() -> Vec<Demand>,
    ) {
        for b in &mut self.buckets {
            b.advance(now);
        }
        self.last_seen = self.last_seen.max(now);
        let fresh = self.limits == *limits
            && self.shared_at.is_some_and(|(at, g)| {
                g == generation && now.saturating_duration_since(at) < SHARE_REFRESH
            });
        if fresh {
            return;
        }
        self.limits = *limits;
        self.shared_at = Some((now, generation));
        let remote = remote();
        let own = self.demand_at(now);
        let pick = [
            |d: &Demand| d.requests,
            |d: &Demand| d.prompt_tokens,
            |d: &Demand| d.output_tokens,
        ];
        let own = [own.requests, own.prompt_tokens, own.output_tokens];
        for (i, limit) in limits.rates().into_iter().enumerate() {
            let Some(limit) = limit else {
                self.buckets[i].clear();
                continue;
            };
            let others: Vec<f64> = remote.iter().map(pick[i]).collect();
            let rate = share::local_share(limit, own[i], &others);
            self.buckets[i].set_rate(rate, limits.burst, now);
        }
        self.streams_cap = limits.concurrent_streams.map(|cap| {
            let others: Vec<f64> = remote.iter().map(|d| d.requests).collect();
            share::local_streams(cap, own[0], &others)
        });
    }

    /// The limit that refuses a request of `prompt` tokens now, with the longest wait among
    /// those that would (so a retry after it finds every bucket able to pay).
    fn refusal(&self, prompt: f64) -> Option<(Dimension, Duration)> {
        let needs = [1.0, prompt, 0.0];
        let mut worst: Option<(Dimension, Duration)> = None;
        for (i, d) in Dimension::RATES.into_iter().enumerate() {
            if !self.buckets[i].is_set() {
                continue;
            }
            if let Some(wait) = self.buckets[i].wait_for(needs[i])
                && worst.is_none_or(|(_, w)| wait > w)
            {
                worst = Some((d, wait));
            }
        }
        let stream_wait = Duration::from_secs(1);
        if let Some(cap) = self.streams_cap
            && self.open_streams >= cap
            && worst.is_none_or(|(_, w)| stream_wait > w)
        {
            worst = Some((Dimension::ConcurrentStreams, stream_wait));
        }
        worst
    }

    fn message(&self, tenant: &str, d: Dimension, wait: Duration) -> String {
        let secs = QuotaRefusal {
            dimension: d,
            retry_after: wait.min(MAX_RETRY_AFTER),
            message: String::new(),
        }
        .retry_after_secs();
        let cluster = match d {
            Dimension::Requests => self.limits.requests_per_s,
            Dimension::PromptTokens => self.limits.prompt_tokens_per_s,
            Dimension::OutputTokens => self.limits.output_tokens_per_s,
            Dimension::ConcurrentStreams => self.limits.concurrent_streams.map(f64::from),
        }
        .unwrap_or_default();
        let local = self.local_limit(d).unwrap_or_default();
        let what = match d {
            Dimension::OutputTokens => "output tokens already generated exceed",
            _ => "this request would exceed",
        };
        format!(
            "Rate limit reached for tenant `{tenant}` on {}: {what} its quota of {} {} \
             ({} at this router). Please try again in {secs} s.",
            d.as_str().replace('_', " "),
            number(cluster),
            d.unit(),
            number(local),
        )
    }

    fn local_limit(&self, d: Dimension) -> Option<f64> {
        match d {
            Dimension::ConcurrentStreams => self.streams_cap.map(f64::from),
            _ => {
                let b = &self.buckets[d as usize];
                b.is_set().then(|| b.rate())
            }
        }
    }

    fn demand_at(&self, now: Instant) -> Demand {
        Demand {
            requests: self.demand[0].get(now),
            prompt_tokens: self.demand[1].get(now),
            output_tokens: self.demand[2].get(now),
        }
    }

    fn is_idle(&self, now: Instant) -> bool {
        self.open_streams == 0
            && now.saturating_duration_since(self.last_seen) >= IDLE_AFTER
            && self.buckets.iter().all(|b| {
                let mut b = b.clone();
                b.advance(now);
                b.is_full()
            })
    }
}

/// A rate for a message: whole above 100, else up to three decimals.
fn number(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
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
