//! Per-tenant telemetry: who sent each request, how it was served, what routing decided.
//!
//! One OpenTelemetry SDK meter provider is the single aggregation. Readers pull from it: a
//! manual reader renders the admin port's Prometheus `/metrics`, and (when configured) a
//! periodic reader pushes OTLP over gRPC or HTTP/protobuf ([`export`]). Request-path recording
//! uses instruments bound once per (tenant, pool[, pod]) series, so a request costs a handful of
//! atomic adds and histogram bucket increments (see `cargo bench --bench telemetry`). Exporting
//! runs on the SDK's own thread: a slow or dead collector never blocks a request.
//!
//! Cardinality is bounded: at most `max_tenants` tenant names get their own series; later
//! ones share the [`OTHER_TENANT`] bucket (with one warning). Pods appear as an attribute only
//! when configured (`--telemetry-pod-attribute`).

pub mod export;
pub mod index;
mod live;
mod logging;
pub mod prometheus;
pub mod tenant;
pub mod usage;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use opentelemetry::{
    KeyValue,
    metrics::{BoundCounter, BoundHistogram, Counter, Histogram, Meter, MeterProvider as _},
};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use parking_lot::{Mutex, RwLock};

pub use live::LiveSummary;
pub use logging::init_tracing;
pub use usage::TokenUsage;

/// Tenants beyond the cap are counted here.
pub const OTHER_TENANT: &str = "other";
/// Distinct tenant names with their own series.
pub const DEFAULT_MAX_TENANTS: usize = 100;

/// Histogram bounds for latencies, seconds (1 ms .. 2 min).
const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0,
    3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0,
];
/// Bounds for time per output token, seconds (0.5 ms .. 2 s).
const TPOT_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 1.0, 2.0,
];
/// Bounds for time spent inside warmpath before the upstream request, seconds (10 us .. 1 s).
const QUEUE_BOUNDS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
];
/// Bounds for matched prefix blocks.
const BLOCK_BOUNDS: &[f64] = &[
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A complete 2xx response.
    Ok,
    /// 4xx: rejected by warmpath (bad JSON, unknown model, too large) or by the engine.
    ClientError,
    /// 5xx, no endpoint reachable, or the engine failed mid-stream.
    UpstreamError,
    /// Refused by a tenant quota (quotas arrive with declarative policy; see docs/roadmap).
    RejectedQuota,
    /// The client went away before the response was complete.
    Cancelled,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::ClientError,
        Outcome::UpstreamError,
        Outcome::RejectedQuota,
        Outcome::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::UpstreamError => "upstream_error",
            Outcome::RejectedQuota => "rejected_quota",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// From a status produced by warmpath or the engine.
    pub fn of_status(status: http::StatusCode) -> Self {
        if status.is_client_error() {
            Outcome::ClientError
        } else if status.is_server_error() {
            Outcome::UpstreamError
        } else {
            Outcome::Ok
        }
    }
}

/// Why the router chose the pod it chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionReason {
    /// The chosen pod holds a prefix of the prompt.
    Prefix,
    /// No usable prefix anywhere: least work ahead decided.
    Load,
    /// Session affinity.
    Session,
    /// Round-robin.
    RoundRobin,
}

impl DecisionReason {
    pub const ALL: [DecisionReason; 4] = [
        DecisionReason::Prefix,
        DecisionReason::Load,
        DecisionReason::Session,
        DecisionReason::RoundRobin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionReason::Prefix => "prefix",
            DecisionReason::Load => "load",
            DecisionReason::Session => "session",
            DecisionReason::RoundRobin => "round_robin",
        }
    }
}

/// Settings of the telemetry subsystem.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    pub max_tenants: usize,
    /// Add a `pod` attribute to per-request series (cardinality: tenants x pods).
    pub pod_attribute: bool,
    /// Push OTLP when set.
    pub otlp: Option<export::OtlpConfig>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            max_tenants: DEFAULT_MAX_TENANTS,
            pod_attribute: false,
            otlp: None,
        }
    }
}

/// Errors setting telemetry up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    #[error("{0}")]
    Config(String),
}

/// A pool as telemetry labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolId(u16);

/// Everything measured about one finished request.
#[derive(Debug, Clone)]
pub struct RequestRecord<'a> {
    pub pool: PoolId,
    /// Endpoint index and authority of the pod that served it, if one did.
    pub pod: Option<(u16, &'a str)>,
    pub outcome: Outcome,
    pub usage: Option<TokenUsage>,
    pub retries: u32,
    /// Time inside warmpath from the complete request body to the upstream request.
    pub queue: Option<Duration>,
    /// Time to the first response body bytes.
    pub ttft: Option<Duration>,
    /// Request received to response complete (or abandoned).
    pub duration: Duration,
    /// When it completed (or was abandoned).
    pub at: Instant,
    /// Streamed (SSE): time per output token is measurable.
    pub streamed: bool,
}

/// The instruments, created once.
#[derive(Debug)]
struct Instruments {
    requests: Counter<u64>,
    prompt_tokens: Counter<u64>,
    cached_tokens: Counter<u64>,
    completion_tokens: Counter<u64>,
    retries: Counter<u64>,
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    duration: Histogram<f64>,
    queue: Histogram<f64>,
    prefix_blocks: Histogram<u64>,
    decisions: Counter<u64>,
}

/// Instruments bound to one series' attributes.
#[derive(Debug)]
struct Bound {
    requests: [BoundCounter<u64>; 5],
    prompt_tokens: BoundCounter<u64>,
    cached_tokens: BoundCounter<u64>,
    completion_tokens: BoundCounter<u64>,
    retries: BoundCounter<u64>,
    ttft: BoundHistogram<f64>,
    tpot: BoundHistogram<f64>,
    duration: BoundHistogram<f64>,
    queue: BoundHistogram<f64>,
}

/// Per-pool routing series.
#[derive(Debug)]
struct PoolSeries {
    name: Arc<str>,
    model: Arc<str>,
    prefix_blocks: BoundHistogram<u64>,
    decisions: [BoundCounter<u64>; 4],
}

/// A tenant's series within a pool, per pod when pods are an attribute.
type SeriesKey = (PoolId, Option<u16>);

/// The request path's maps: looked up per request, keyed by the agent's own bounded names
/// (tenants are capped), so a fast hash.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One tenant: its series and its live window.
#[derive(Debug)]
pub struct Tenant {
    name: Arc<str>,
    series: RwLock<FastMap<SeriesKey, Arc<Bound>>>,
    live: Mutex<live::Live>,
}

impl Tenant {
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The telemetry subsystem; one per agent.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkMeterProvider,
    prometheus: prometheus::PromReader,
    meter: Meter,
    inst: Instruments,
    pools: RwLock<Vec<PoolSeries>>,
    tenants: RwLock<FastMap<Arc<str>, Arc<Tenant>>>,
    max_tenants: usize,
    pod_attribute: bool,
    origin: Instant,
    overflow_warned: AtomicBool,
    /// Tells instances apart in [`LAST_TENANT`].
    id: u64,
}

/// Telemetry instance ids.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Per thread cache of [`Telemetry::tenant`]: instance id, name, tenant.
type LastTenant = Option<(u64, Arc<str>, Arc<Tenant>)>;

thread_local! {
    static LAST_TENANT: std::cell::RefCell<LastTenant> = const { std::cell::RefCell::new(None) };
}

impl Telemetry {
    pub fn new(config: &TelemetryConfig) -> Result<Self, Error> {
        let prometheus = prometheus::PromReader::new();
        let mut builder = SdkMeterProvider::builder()
            .with_resource(export::resource())
            .with_reader(prometheus.reader());
        if let Some(otlp) = &config.otlp {
            builder = builder.with_reader(export::periodic_reader(otlp)?);
        }
        let provider = builder.build();
        let meter = provider.meter("warmpath");
        let counter = |name: &'static str, unit: &'static str, desc: &'static str| {
            meter
                .u64_counter(name)
                .with_unit(unit)
                .with_description(desc)
                .build()
        };
        let seconds = |name: &'static str, desc: &'static str, bounds: &[f64]| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(desc)
                .with_boundaries(bounds.to_vec())
                .build()
        };
        let inst = Instruments {
            requests: counter(
                "warmpath.requests",
                "{request}",
                "Requests by tenant and outcome",
            ),
            prompt_tokens: counter(
                "warmpath.prompt_tokens",
                "{token}",
                "Prompt tokens (engine usage)",
            ),
            cached_tokens: counter(
                "warmpath.cached_prompt_tokens",
                "{token}",
                "Prompt tokens served from the engine's prefix cache",
            ),
            completion_tokens: counter(
                "warmpath.completion_tokens",
                "{token}",
                "Completion tokens (engine usage)",
            ),
            retries: counter(
                "warmpath.retries",
                "{retry}",
                "Upstream attempts retried on another pod before the first byte",
            ),
            ttft: seconds(
                "warmpath.ttft",
                "Time to first token (first response body bytes)",
                LATENCY_BOUNDS,
            ),
            tpot: seconds(
                "warmpath.tpot",
                "Time per output token after the first (streams)",
                TPOT_BOUNDS,
            ),
            duration: seconds(
                "warmpath.request.duration",
                "Request received to response complete",
                LATENCY_BOUNDS,
            ),
            queue: seconds(
                "warmpath.queue.duration",
                "Time inside warmpath before the upstream request",
                QUEUE_BOUNDS,
            ),
            prefix_blocks: meter
                .u64_histogram("warmpath.prefix_blocks")
                .with_unit("{block}")
                .with_description("Cached prefix blocks of the chosen pod per routing decision")
                .with_boundaries(BLOCK_BOUNDS.to_vec())
                .build(),
            decisions: counter(
                "warmpath.decisions",
                "{decision}",
                "Routing decisions by reason",
            ),
        };
        Ok(Self {
            provider,
            prometheus,
            meter,
            inst,
            pools: RwLock::new(Vec::new()),
            tenants: RwLock::new(FastMap::default()),
            max_tenants: config.max_tenants.max(1),
            pod_attribute: config.pod_attribute,
            origin: Instant::now(),
            overflow_warned: AtomicBool::new(false),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The meter, for subsystems registering their own observable instruments.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Registers a pool; its name and model label every series of it.
    pub fn register_pool(&self, name: &str, model: &str) -> PoolId {
        let mut pools = self.pools.write();
        if let Some(i) = pools
            .iter()
            .position(|p| &*p.name == name && &*p.model == model)
        {
            return PoolId(i as u16);
        }
        let attrs = [
            KeyValue::new("pool", name.to_string()),
            KeyValue::new("model", model.to_string()),
        ];
        let decisions = DecisionReason::ALL.map(|r| {
            let mut a = attrs.to_vec();
            a.push(KeyValue::new("reason", r.as_str()));
            self.inst.decisions.bind(&a)
        });
        pools.push(PoolSeries {
            name: name.into(),
            model: model.into(),
            prefix_blocks: self.inst.prefix_blocks.bind(&attrs),
            decisions,
        });
        PoolId(u16::try_from(pools.len() - 1).unwrap_or(u16::MAX))
    }

    /// The tenant called `name`, or the overflow bucket once `max_tenants` exist.
    pub fn tenant(&self, name: &Arc<str>) -> Arc<Tenant> {
        // Most requests name the tenant the previous one on this thread named, by the very
        // same `Arc` (the default tenant, a CIDR rule's): no lock, no hash.
        let hit = LAST_TENANT.with_borrow(|last| {
            last.as_ref()
                .filter(|(id, n, _)| *id == self.id && Arc::ptr_eq(n, name))
                .map(|(_, _, t)| t.clone())
        });
        if let Some(t) = hit {
            return t;
        }
        let t = self.lookup_tenant(name);
        LAST_TENANT.set(Some((self.id, name.clone(), t.clone())));
        t
    }

    fn lookup_tenant(&self, name: &Arc<str>) -> Arc<Tenant> {
        if let Some(t) = self.tenants.read().get(name) {
            return t.clone();
        }
        let mut tenants = self.tenants.write();
        let name = if tenants.len() >= self.max_tenants && !tenants.contains_key(name) {
            if !self.overflow_warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(max_tenants = self.max_tenants, tenant = %name, "tenant cap reached: further tenants are counted as `{OTHER_TENANT}`");
            }
            Arc::from(OTHER_TENANT)
        } else {
            name.clone()
        };
        tenants
            .entry(name.clone())
            .or_insert_with(|| {
                Arc::new(Tenant {
                    name,
                    series: RwLock::new(FastMap::default()),
                    live: Mutex::new(live::Live::new(self.origin)),
                })
            })
            .clone()
    }

    /// Records a routing decision.
    pub fn record_decision(&self, pool: PoolId, reason: DecisionReason, prefix_blocks: usize) {
        let pools = self.pools.read();
        if let Some(p) = pools.get(usize::from(pool.0)) {
            p.decisions[reason as usize].add(1);
            p.prefix_blocks.record(prefix_blocks as u64);
        }
    }

    /// Records one finished request for `tenant`.
    pub fn record(&self, tenant: &Tenant, rec: &RequestRecord<'_>) {
        let pod = rec.pod.filter(|_| self.pod_attribute);
        let key = (rec.pool, pod.map(|(i, _)| i));
        // The series' instruments are used under the read lock (no reference count taken);
        // a series seen for the first time is bound once.
        let series = tenant.series.read();
        match series.get(&key) {
            Some(bound) => Self::apply(bound, rec),
            None => {
                drop(series);
                Self::apply(&self.bind(tenant, key, rec, pod), rec);
            }
        }
        tenant
            .live
            .lock()
            .record(rec.at, rec.outcome == Outcome::Ok, rec.usage, rec.ttft);
    }

    fn apply(bound: &Bound, rec: &RequestRecord<'_>) {
        bound.requests[rec.outcome as usize].add(1);
        if let Some(u) = rec.usage {
            bound.prompt_tokens.add(u.prompt);
            bound.cached_tokens.add(u.cached);
            bound.completion_tokens.add(u.completion);
        }
        if rec.retries > 0 {
            bound.retries.add(u64::from(rec.retries));
        }
        bound.duration.record(rec.duration.as_secs_f64());
        if let Some(q) = rec.queue {
            bound.queue.record(q.as_secs_f64());
        }
        if let Some(ttft) = rec.ttft {
            bound.ttft.record(ttft.as_secs_f64());
            if let Some(u) = rec.usage.filter(|u| rec.streamed && u.completion > 1) {
                let decode = rec.duration.saturating_sub(ttft).as_secs_f64();
                bound.tpot.record(decode / (u.completion - 1) as f64);
            }
        }
    }

    /// Binds the instruments of a tenant's series (once per series).
    fn bind(
        &self,
        tenant: &Tenant,
        key: SeriesKey,
        rec: &RequestRecord<'_>,
        pod: Option<(u16, &str)>,
    ) -> Arc<Bound> {
        let mut attrs = vec![KeyValue::new("tenant", tenant.name.to_string())];
        if let Some(p) = self.pools.read().get(usize::from(rec.pool.0)) {
            attrs.push(KeyValue::new("pool", p.name.to_string()));
            attrs.push(KeyValue::new("model", p.model.to_string()));
        }
        if let Some((_, authority)) = pod {
            attrs.push(KeyValue::new("pod", authority.to_string()));
        }
        let i = &self.inst;
        let bound = Arc::new(Bound {
            requests: Outcome::ALL.map(|o| {
                let mut a = attrs.clone();
                a.push(KeyValue::new("outcome", o.as_str()));
                i.requests.bind(&a)
            }),
            prompt_tokens: i.prompt_tokens.bind(&attrs),
            cached_tokens: i.cached_tokens.bind(&attrs),
            completion_tokens: i.completion_tokens.bind(&attrs),
            retries: i.retries.bind(&attrs),
            ttft: i.ttft.bind(&attrs),
            tpot: i.tpot.bind(&attrs),
            duration: i.duration.bind(&attrs),
            queue: i.queue.bind(&attrs),
        });
        tenant.series.write().entry(key).or_insert(bound).clone()
    }

    /// Live per-tenant figures over the last minute, busiest first.
    pub fn live(&self) -> Vec<LiveSummary> {
        let now = Instant::now();
        let mut rows: Vec<LiveSummary> = self
            .tenants
            .read()
            .values()
            .map(|t| t.live.lock().summary(&t.name, now))
            .collect();
        rows.sort_by(|a, b| b.requests.cmp(&a.requests).then(a.tenant.cmp(&b.tenant)));
        rows
    }

    /// The Prometheus text exposition of everything recorded.
    pub fn prometheus(&self) -> String {
        self.prometheus.render()
    }

    /// Pushes pending OTLP data now (tests, shutdown).
    pub fn flush(&self) {
        if let Err(err) = self.provider.force_flush() {
            tracing::debug!(%err, "telemetry flush");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Err(err) = self.provider.shutdown() {
            tracing::debug!(%err, "telemetry shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenant_cache_tells_instances_and_names_apart() {
        let a = Telemetry::new(&TelemetryConfig::default()).unwrap();
        let b = Telemetry::new(&TelemetryConfig::default()).unwrap();
        let x: Arc<str> = Arc::from("team-x");
        let y: Arc<str> = Arc::from("team-y");
        let ax = a.tenant(&x);
        assert!(Arc::ptr_eq(&ax, &a.tenant(&x)), "the same tenant again");
        let bx = b.tenant(&x);
        assert!(!Arc::ptr_eq(&ax, &bx), "another instance's own tenant");
        assert_eq!(a.tenant(&y).name(), "team-y");
        // An equal name in another allocation finds the same tenant.
        assert!(Arc::ptr_eq(&ax, &a.tenant(&Arc::from("team-x"))));
        assert!(Arc::ptr_eq(&bx, &b.tenant(&x)));
    }
}
