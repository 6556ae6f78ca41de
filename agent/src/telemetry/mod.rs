//! Per-tenant telemetry: who sent each request, how it was served, what routing decided.
//!
//! Request-path recording goes to warmpath's own cells, aggregated per thread without locks
//! ([`cells`]): a request costs a thread-local lookup and a few plain stores (see
//! `cargo bench --bench telemetry`). The families and their labels are defined once
//! ([`series`]). Two exports read them: the admin port's Prometheus `/metrics`
//! ([`prometheus`]) and, when configured, an OTLP push over gRPC or HTTP/protobuf ([`push`]),
//! which runs on its own thread, so a slow or dead collector never blocks a request. Other
//! subsystems' observable instruments (index health, ...) live on an OpenTelemetry SDK meter
//! ([`Telemetry::meter`]); both exports include them.
//!
//! Cardinality is bounded: at most `max_tenants` tenant names get their own series; later
//! ones share the [`OTHER_TENANT`] bucket (with one warning). Pods appear as an attribute only
//! when configured (`--telemetry-pod-attribute`).

mod cells;
pub mod export;
pub mod index;
pub mod kernel;
mod live;
mod logging;
pub mod prometheus;
mod push;
mod series;
pub mod tls;
pub mod usage;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::{Resource, metrics::SdkMeterProvider};
use parking_lot::{Mutex, RwLock};

use cells::{Labels, SeriesKey};
use series::PoolNames;

pub use live::{LiveReceipts, LiveSummary};
pub use logging::init_tracing;
pub use usage::{Receipt, TokenUsage};

/// Tenants beyond the cap are counted here.
pub const OTHER_TENANT: &str = "other";
/// Distinct tenant names with their own series.
pub const DEFAULT_MAX_TENANTS: usize = 100;

/// The instrumentation scope of warmpath's own metrics (and its SDK meter).
const SCOPE: &str = "warmpath";

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
    /// Sent to warm an idle pod that lacks a prefix the busy pods hold
    /// ([`crate::routing::idle`]).
    IdleWarm,
}

impl DecisionReason {
    pub const ALL: [DecisionReason; 5] = [
        DecisionReason::Prefix,
        DecisionReason::Load,
        DecisionReason::Session,
        DecisionReason::RoundRobin,
        DecisionReason::IdleWarm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionReason::Prefix => "prefix",
            DecisionReason::Load => "load",
            DecisionReason::Session => "session",
            DecisionReason::RoundRobin => "round_robin",
            DecisionReason::IdleWarm => "idle_warm",
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
    /// What the router saw of the prompt's prefix when it picked the pod (routed requests).
    pub receipt: Option<Receipt>,
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

/// The request path's maps: looked up per request, keyed by the agent's own bounded names
/// (tenants are capped), so a fast hash.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One tenant: its series and its live window.
#[derive(Debug)]
pub struct Tenant {
    name: Arc<str>,
    /// Its number in series keys.
    index: u32,
    live: Mutex<live::Live>,
}

impl Tenant {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its small stable number (for per-tenant queues; tenants beyond the series cap share
    /// the `other` tenant's).
    pub fn id(&self) -> u32 {
        self.index
    }
}

/// What the exports read: the per-request cells, the pools' names, the resource.
#[derive(Debug)]
pub struct Sources {
    cells: cells::Registry,
    pools: RwLock<Vec<PoolNames>>,
    resource: Resource,
    /// Start of every cumulative series.
    started: SystemTime,
}

impl Sources {
    /// Every series summed, and the pools' names.
    fn snapshot(&self) -> (cells::Totals, Vec<PoolNames>) {
        (self.cells.totals(), self.pools.read().clone())
    }
}

/// The telemetry subsystem; one per agent.
#[derive(Debug)]
pub struct Telemetry {
    sources: Arc<Sources>,
    provider: SdkMeterProvider,
    prometheus: prometheus::SdkReader,
    meter: Meter,
    /// Dropped first (see `Drop`), so its final push still collects from the SDK.
    push: Option<push::Pusher>,
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
        let resource = export::resource();
        let prometheus = prometheus::SdkReader::new();
        let mut builder = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(prometheus.reader());
        let otlp_reader = config.otlp.as_ref().map(|_| prometheus::SdkReader::new());
        if let Some(r) = &otlp_reader {
            builder = builder.with_reader(r.reader());
        }
        let provider = builder.build();
        let meter = provider.meter(SCOPE);
        let sources = Arc::new(Sources {
            cells: cells::Registry::default(),
            pools: RwLock::new(Vec::new()),
            resource,
            started: SystemTime::now(),
        });
        let push = match (&config.otlp, otlp_reader) {
            (Some(otlp), Some(reader)) => Some(push::Pusher::start(otlp, sources.clone(), reader)?),
            _ => None,
        };
        Ok(Self {
            sources,
            provider,
            prometheus,
            meter,
            push,
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

    /// Distinct tenant names with their own series (later ones share [`OTHER_TENANT`]).
    pub fn max_tenants(&self) -> usize {
        self.max_tenants
    }

    /// Registers a pool; its name and model label every series of it.
    pub fn register_pool(&self, name: &str, model: &str) -> PoolId {
        let mut pools = self.sources.pools.write();
        if let Some(i) = pools
            .iter()
            .position(|p| &*p.name == name && &*p.model == model)
        {
            return PoolId(i as u16);
        }
        pools.push(PoolNames {
            name: name.into(),
            model: model.into(),
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
        let index = u32::try_from(tenants.len()).unwrap_or(u32::MAX);
        tenants
            .entry(name.clone())
            .or_insert_with(|| {
                Arc::new(Tenant {
                    name,
                    index,
                    live: Mutex::new(live::Live::new(self.origin)),
                })
            })
            .clone()
    }

    /// Records a routing decision.
    pub fn record_decision(&self, pool: PoolId, reason: DecisionReason, prefix_blocks: usize) {
        let key = SeriesKey {
            kind: series::POOL,
            tenant: 0,
            pool: pool.0,
            pod: None,
        };
        self.sources
            .cells
            .with(key, &series::POOL_LAYOUT, Labels::default, |c| {
                c.counters[reason as usize].add(1);
                c.histograms[0].record(prefix_blocks as f64);
            });
    }

    /// Records the cost model's absolute TTFT prediction error for one stream of `pool`.
    pub fn record_prediction_error(&self, pool: PoolId, error_secs: f64) {
        let key = SeriesKey {
            kind: series::POOL,
            tenant: 0,
            pool: pool.0,
            pod: None,
        };
        self.sources
            .cells
            .with(key, &series::POOL_LAYOUT, Labels::default, |c| {
                c.histograms[series::PREDICTION_ERROR].record(error_secs);
            });
    }

    /// Records one finished request for `tenant`.
    pub fn record(&self, tenant: &Tenant, rec: &RequestRecord<'_>) {
        let pod = rec.pod.filter(|_| self.pod_attribute);
        let key = SeriesKey {
            kind: series::REQUEST,
            tenant: tenant.index,
            pool: rec.pool.0,
            pod: pod.map(|(i, _)| i),
        };
        let labels = || Labels {
            tenant: Some(tenant.name.clone()),
            pod: pod.map(|(_, authority)| Arc::from(authority)),
        };
        self.sources
            .cells
            .with(key, &series::REQUEST_LAYOUT, labels, |c| apply(c, rec));
        tenant.live.lock().record(
            rec.at,
            rec.outcome == Outcome::Ok,
            rec.usage,
            receipt(rec),
            rec.ttft,
        );
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
        let mut out = String::new();
        let (totals, pools) = self.sources.snapshot();
        for family in series::FAMILIES {
            prometheus::render_family(family, &series::points(family, &totals, &pools), &mut out);
        }
        self.prometheus.render(&mut out);
        out
    }

    /// Pushes to the OTLP collector now and waits for it (tests, shutdown).
    pub fn flush(&self) {
        if let Some(push) = &self.push {
            push.flush();
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        // The final push first, while the SDK's readers can still collect.
        drop(self.push.take());
        if let Err(err) = self.provider.shutdown() {
            tracing::debug!(%err, "telemetry shutdown");
        }
    }
}

/// Adds one request to its series' cells.
#[inline]
fn apply(c: &cells::Cells, rec: &RequestRecord<'_>) {
    use series::*;
    c.counters[rec.outcome as usize].add(1);
    if let Some(u) = rec.usage {
        c.counters[PROMPT_TOKENS].add(u.prompt);
        c.counters[CACHED_TOKENS].add(u.cached);
        c.counters[COMPLETION_TOKENS].add(u.completion);
    }
    if let Some((r, delivered)) = receipt(rec) {
        c.counters[RECEIPTS].add(1);
        c.counters[AVAILABLE_TOKENS].add(r.available);
        c.counters[CAPTURED_TOKENS].add(r.captured);
        c.counters[DELIVERED_TOKENS].add(delivered);
        c.counters[SHORTFALL].add(u64::from(r.captured > delivered));
    }
    if rec.retries > 0 {
        c.counters[RETRIES].add(u64::from(rec.retries));
    }
    c.histograms[DURATION].record(rec.duration.as_secs_f64());
    if let Some(q) = rec.queue {
        c.histograms[QUEUE].record(q.as_secs_f64());
    }
    if let Some(ttft) = rec.ttft {
        c.histograms[TTFT].record(ttft.as_secs_f64());
        if let Some(u) = rec.usage.filter(|u| rec.streamed && u.completion > 1) {
            let decode = rec.duration.saturating_sub(ttft).as_secs_f64();
            c.histograms[TPOT].record(decode / (u.completion - 1) as f64);
        }
    }
}

/// A routed request's receipt with its delivered tokens (the engine's `cached_tokens`):
/// only requests whose usage was reported, so the three figures compare.
#[inline]
fn receipt(rec: &RequestRecord<'_>) -> Option<(Receipt, u64)> {
    Some((rec.receipt?, rec.usage?.cached))
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

    fn request(outcome: Outcome, ttft_ms: u64) -> RequestRecord<'static> {
        RequestRecord {
            pool: PoolId(0),
            pod: Some((1, "127.0.0.1:8101")),
            outcome,
            usage: Some(TokenUsage {
                prompt: 100,
                cached: 60,
                completion: 8,
                cached_reported: true,
            }),
            receipt: Some(Receipt {
                available: 80,
                captured: 64,
            }),
            retries: 0,
            queue: Some(Duration::from_micros(20)),
            ttft: Some(Duration::from_millis(ttft_ms)),
            duration: Duration::from_millis(ttft_ms + 10),
            at: Instant::now(),
            streamed: false,
        }
    }

    #[test]
    fn prometheus_shows_every_thread_s_records_exactly() {
        let t = Arc::new(
            Telemetry::new(&TelemetryConfig {
                pod_attribute: true,
                ..TelemetryConfig::default()
            })
            .unwrap(),
        );
        assert_eq!(t.register_pool("chat", "m"), PoolId(0));
        let a = t.tenant(&Arc::from("team-a"));
        t.record(&a, &request(Outcome::Ok, 3));
        t.record_decision(PoolId(0), DecisionReason::Prefix, 5);
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let b = t.tenant(&Arc::from("team-b"));
                    t.record(&b, &request(Outcome::Ok, 40));
                    t.record(&b, &request(Outcome::Cancelled, 40));
                    t.record_decision(PoolId(0), DecisionReason::Load, 0);
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let text = t.prometheus();
        let line = |l: &str| assert!(text.lines().any(|x| x == l), "missing `{l}` in\n{text}");
        let labels_b = r#"model="m",pod="127.0.0.1:8101",pool="chat",tenant="team-b""#;
        line("# TYPE warmpath_requests_total counter");
        line(
            r#"warmpath_requests_total{model="m",outcome="ok",pod="127.0.0.1:8101",pool="chat",tenant="team-a"} 1"#,
        );
        line(
            r#"warmpath_requests_total{model="m",outcome="cancelled",pod="127.0.0.1:8101",pool="chat",tenant="team-b"} 3"#,
        );
        line(&format!("warmpath_prompt_tokens_total{{{labels_b}}} 600"));
        line(&format!(
            "warmpath_cached_prompt_tokens_total{{{labels_b}}} 360"
        ));
        line("# TYPE warmpath_ttft_seconds histogram");
        line(&format!(
            r#"warmpath_ttft_seconds_bucket{{{labels_b},le="0.025"}} 0"#
        ));
        line(&format!(
            r#"warmpath_ttft_seconds_bucket{{{labels_b},le="0.05"}} 6"#
        ));
        line(&format!(
            r#"warmpath_ttft_seconds_bucket{{{labels_b},le="+Inf"}} 6"#
        ));
        line(&format!("warmpath_ttft_seconds_count{{{labels_b}}} 6"));
        line(r#"warmpath_decisions_total{model="m",pool="chat",reason="load"} 3"#);
        line(r#"warmpath_decisions_total{model="m",pool="chat",reason="prefix"} 1"#);
        line(r#"warmpath_prefix_blocks_bucket{model="m",pool="chat",le="0"} 3"#);
        line(r#"warmpath_prefix_blocks_sum{model="m",pool="chat"} 5"#);
        // Route receipts: 80 available, 64 captured and 60 delivered (cached) six times.
        line(&format!("warmpath_receipt_requests_total{{{labels_b}}} 6"));
        line(&format!(
            "warmpath_receipt_available_tokens_total{{{labels_b}}} 480"
        ));
        line(&format!(
            "warmpath_receipt_captured_tokens_total{{{labels_b}}} 384"
        ));
        line(&format!(
            "warmpath_receipt_delivered_tokens_total{{{labels_b}}} 360"
        ));
        line(&format!(
            "warmpath_receipt_shortfall_requests_total{{{labels_b}}} 6"
        ));
        // Not streamed: no time per output token, but the series is there, empty.
        line(&format!("warmpath_tpot_seconds_count{{{labels_b}}} 0"));
    }
}
