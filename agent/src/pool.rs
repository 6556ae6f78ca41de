//! A pool: the endpoints (vLLM pods) serving one model, with the proxy's own live counters.
//!
//! The endpoint set is swapped whole when membership changes ([`crate::discovery`]): a
//! request reads one snapshot ([`Pool::endpoints`]) and keeps it to the end, so an
//! [`EndpointId`](crate::routing::EndpointId) (a position in that snapshot) means the same endpoint throughout. An
//! endpoint that leaves is dropped from the next snapshot; requests in flight to it hold it
//! and finish.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
};

use serde::Serialize;

use arc_swap::ArcSwap;

use crate::{
    kv_index::{RouterKey, SourceId},
    routing::{History, RoutePolicy},
};

/// How a pool talks to its engines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with keep-alive: one request per connection at a time (vLLM's default
    /// server, uvicorn, speaks only this).
    #[default]
    Http1,
    /// HTTP/2 over cleartext with prior knowledge (h2c): every request to an endpoint
    /// multiplexed over one connection (for engines behind an h2c-capable server).
    H2,
}

impl UpstreamProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http1 => "http1",
            Self::H2 => "h2",
        }
    }
}

/// One vLLM endpoint.
#[derive(Debug)]
pub struct Endpoint {
    /// `host:port` of its HTTP server.
    pub authority: String,
    /// Its Prometheus page.
    pub metrics_url: String,
    /// The authority as a shared label (telemetry attributes, no allocation per request).
    pub label: Arc<str>,
    /// Its KV event source in the index, when it publishes events.
    pub source: Option<SourceId>,
    /// Its source in the pool's routing history.
    pub history: SourceId,
    /// Its address hashed (with its DP rank): the session scorer's rendezvous key, the same
    /// on every agent and across membership changes.
    pub affinity: u64,
    /// Its number in the pool, unique among the pool's last 65,536 endpoints (telemetry's
    /// per-pod series key; the position in a snapshot changes with membership).
    pub serial: u16,
    /// Where it came from (`namespace/pod` when discovered; empty when configured).
    pub origin: String,
    /// On this agent's node (discovered endpoints).
    pub local: bool,
    /// Found by a watcher: routable only once its metrics have answered (configured
    /// endpoints are routable from the start).
    discovered: bool,
    /// The watcher's verdict: Ready and not terminating. Cleared to drain.
    wanted: AtomicBool,
    in_flight: AtomicU32,
    queued_prefill_blocks: AtomicU64,
    requests: AtomicU64,
    failures: AtomicU64,
    /// From the engine's own /metrics (scraped): requests waiting and running, KV usage.
    engine_waiting: AtomicU32,
    engine_running: AtomicU32,
    engine_kv_permille: AtomicU32,
    /// The engine's KV cache size in blocks (`vllm:cache_config_info`'s `num_gpu_blocks`;
    /// 0 until scraped, and for engines that do not report it).
    kv_capacity_blocks: AtomicU64,
    /// The KV blocks this proxy's requests in flight here hold or will ([`Pinned`]).
    pinned: parking_lot::Mutex<Pinned>,
    /// Prefill that peer agents' placements queued here ([`Endpoint::queue_peer_prefill`]).
    peer_prefill: parking_lot::Mutex<Drain>,
    scraped: AtomicBool,
    /// Scrapes failed in a row (reset by one that answers): the kernel table writer's sign
    /// that a pod is gone although nothing routed to it (steer mode; docs/ebpf.md).
    scrape_failures: AtomicU32,
    /// LoRA adapters the engine serves (`/v1/models` cards whose parent is the base model) and
    /// which are running or waiting (`vllm:lora_requests_info`).
    lora: parking_lot::RwLock<LoraInfo>,
}

/// The KV blocks a pod's in-flight requests (this proxy's) hold or will hold while they
/// run: their prompts' blocks, each counted once however many requests share it (a
/// vLLM block with several users is one block), and each request's expected output; in a
/// cluster, peers' placements too ([`Lease`]). Bounded by the requests in flight (each
/// holds its own key list) and [`MAX_LEASES`].
#[derive(Debug, Default)]
struct Pinned {
    refs: std::collections::HashMap<RouterKey, u32, foldhash::fast::RandomState>,
    output_blocks: u64,
    /// Peer agents' placements here (a cluster): held until their expected end, the first
    /// to end first, at most [`MAX_LEASES`].
    leases: std::collections::VecDeque<Lease>,
}

/// A peer's request as this agent counts its KV: it does not see the request end, so it
/// holds its blocks for the pool's mean lifetime.
#[derive(Debug)]
struct Lease {
    until: std::time::Instant,
    keys: Vec<RouterKey>,
    output_blocks: u64,
}

/// Blocks of prefill queued at a pod by peer agents, which this agent does not see start or
/// end: each placement adds the blocks new to the pod, and the queue drains at the pod's
/// calibrated prefill rate (the last placement's), first placed first done, as the engine
/// works through its waiting prompts.
#[derive(Debug, Default)]
struct Drain {
    blocks: f64,
    at: Option<std::time::Instant>,
    secs_per_block: f64,
}

impl Drain {
    /// Blocks still queued at `now`.
    fn left(&self, now: std::time::Instant) -> f64 {
        let Some(at) = self.at else { return 0.0 };
        if !(self.secs_per_block.is_finite() && self.secs_per_block > 0.0) {
            return 0.0;
        }
        let done = now.saturating_duration_since(at).as_secs_f64() / self.secs_per_block;
        (self.blocks - done).max(0.0)
    }
}

/// Peer placements a pod's KV accounting holds at most (beyond it, the first to end goes).
pub const MAX_LEASES: usize = 256;
/// Peer prefill a pod's queue counts at most, blocks (1M tokens at block size 16): a bound
/// on the estimate, far above any real queue.
pub const MAX_PEER_PREFILL_BLOCKS: f64 = 65_536.0;
/// Prompt keys a lease keeps (16k tokens at block size 16): its blocks beyond them count as
/// its own, never shared, so a pod's leases keep at most 2 MiB of keys.
pub const MAX_LEASE_KEYS: usize = 1024;

impl Pinned {
    fn hold(&mut self, keys: &[RouterKey], output_blocks: u64) {
        for k in keys {
            *self.refs.entry(*k).or_insert(0) += 1;
        }
        self.output_blocks = self.output_blocks.saturating_add(output_blocks);
    }

    /// Blocks held: the distinct prompt blocks and the outputs.
    fn blocks(&self) -> u64 {
        (self.refs.len() as u64).saturating_add(self.output_blocks)
    }

    fn release(&mut self, keys: &[RouterKey], output_blocks: u64) {
        for k in keys {
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.refs.entry(*k) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        self.output_blocks = self.output_blocks.saturating_sub(output_blocks);
    }

    /// Ends the leases due by `now` (and the oldest beyond [`MAX_LEASES`]).
    fn expire(&mut self, now: std::time::Instant) {
        while let Some(l) = self.leases.front() {
            if l.until > now && self.leases.len() <= MAX_LEASES {
                break;
            }
            let l = self.leases.pop_front().expect("front exists");
            self.release(&l.keys, l.output_blocks);
        }
    }
}

/// A pod's KV room as one request sees it ([`Endpoint::kv_room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// The engine's KV cache, blocks.
    pub capacity: u64,
    /// Blocks its requests in flight hold or will: this proxy's, or the engine's own last
    /// report if that is more (other routers).
    pub pinned: u64,
    /// Blocks of the request's prompt already held by one of them (shared, not new).
    pub shared: u64,
}

/// What an engine says about its LoRA adapters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LoraInfo {
    /// Adapters it can serve.
    pub served: Vec<String>,
    /// Loaded and running (from `vllm:lora_requests_info`; `None`: not reported).
    pub running: Option<Vec<String>>,
    pub waiting: Vec<String>,
}

/// The endpoints of one model and how to choose among them.
#[derive(Debug)]
pub struct Pool {
    pub model: String,
    /// Tokens per KV block; must match vLLM --block-size.
    pub block_size: usize,
    pub policy: RoutePolicy,
    endpoints: ArcSwap<Vec<Arc<Endpoint>>>,
    /// Where requests were routed (the approximate prefix signal), per endpoint.
    pub history: History,
    pub rotation: AtomicUsize,
    /// Moving average of uncached prefill blocks per routed request, x16 (fixed point).
    mean_prefill_x16: AtomicU64,
    next_serial: AtomicU32,
    /// Bumped when the members change or one of them becomes ready or unready
    /// ([`Pool::note_change`]): the kernel table writer wakes on it.
    changes: tokio::sync::watch::Sender<u64>,
}

/// Scrapes failed in a row (200 ms apart) after which an endpoint counts as not ready for
/// the kernel table ([`Endpoint::scrape_healthy`]).
pub const FAILED_SCRAPES: u32 = 2;

/// What an endpoint is made from.
#[derive(Debug, Clone, Default)]
pub struct EndpointParts {
    pub authority: String,
    /// Default: `http://{authority}/metrics`.
    pub metrics_url: Option<String>,
    pub source: Option<SourceId>,
    pub origin: String,
    pub local: bool,
    /// Data-parallel rank, when the engine runs several behind one address.
    pub dp_rank: Option<u32>,
    /// Found by a watcher (see [`Endpoint::routable`]).
    pub discovered: bool,
    pub wanted: bool,
}

impl Pool {
    /// Sets each endpoint's metrics URL (same order as the endpoints), before the pool is
    /// shared.
    pub fn with_metrics_urls(self, urls: Vec<String>) -> Self {
        // Taken out of the swap, so that each endpoint's Arc is the only one.
        let taken = self.endpoints.swap(Arc::new(Vec::new()));
        let mut endpoints = Arc::try_unwrap(taken).unwrap_or_else(|shared| (*shared).clone());
        for (e, url) in endpoints.iter_mut().zip(urls) {
            if let Some(e) = Arc::get_mut(e) {
                e.metrics_url = url;
            }
        }
        self.endpoints.store(Arc::new(endpoints));
        self
    }

    /// A pool of configured endpoints (`(authority, KV source)`, routable at once).
    pub fn new(
        model: String,
        block_size: usize,
        policy: impl Into<RoutePolicy>,
        endpoints: Vec<(String, Option<SourceId>)>,
    ) -> Self {
        let pool = Self {
            model,
            block_size,
            policy: policy.into(),
            endpoints: ArcSwap::from_pointee(Vec::new()),
            history: History::new(),
            rotation: AtomicUsize::new(0),
            mean_prefill_x16: AtomicU64::new(0),
            next_serial: AtomicU32::new(0),
            changes: tokio::sync::watch::Sender::new(0),
        };
        let endpoints = endpoints
            .into_iter()
            .map(|(authority, source)| {
                pool.endpoint(EndpointParts {
                    authority,
                    source,
                    wanted: true,
                    ..Default::default()
                })
            })
            .collect();
        pool.endpoints.store(Arc::new(endpoints));
        pool
    }

    /// A new endpoint of this pool (not yet a member: see [`Pool::set_endpoints`]).
    pub fn endpoint(&self, parts: EndpointParts) -> Arc<Endpoint> {
        let authority = parts.authority;
        Arc::new(Endpoint {
            label: Arc::from(authority.as_str()),
            metrics_url: parts
                .metrics_url
                .unwrap_or_else(|| format!("http://{authority}/metrics")),
            history: self.history.add(&authority),
            serial: self.next_serial.fetch_add(1, Ordering::Relaxed) as u16,
            affinity: xxhash_rust::xxh3::xxh3_64(
                format!("{authority}#{}", parts.dp_rank.map_or(-1, i64::from)).as_bytes(),
            ),
            authority,
            source: parts.source,
            origin: parts.origin,
            local: parts.local,
            discovered: parts.discovered,
            wanted: AtomicBool::new(parts.wanted),
            in_flight: AtomicU32::new(0),
            queued_prefill_blocks: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            engine_waiting: AtomicU32::new(0),
            engine_running: AtomicU32::new(0),
            engine_kv_permille: AtomicU32::new(0),
            kv_capacity_blocks: AtomicU64::new(0),
            pinned: parking_lot::Mutex::new(Pinned::default()),
            peer_prefill: parking_lot::Mutex::new(Drain::default()),
            scraped: AtomicBool::new(false),
            scrape_failures: AtomicU32::new(0),
            lora: parking_lot::RwLock::new(LoraInfo::default()),
        })
    }

    /// The members now: one snapshot, for one request (or one scrape round) to the end.
    pub fn endpoints(&self) -> Arc<Vec<Arc<Endpoint>>> {
        self.endpoints.load_full()
    }

    /// Replaces the members. Endpoints left out are gone for new requests; the caller
    /// forgets their routing history ([`Pool::forget`]) and KV source.
    pub fn set_endpoints(&self, endpoints: Vec<Arc<Endpoint>>) {
        self.endpoints.store(Arc::new(endpoints));
        self.note_change();
    }

    /// Tells whoever follows [`Pool::changes`] that membership or readiness changed.
    pub fn note_change(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that sees every [`Pool::note_change`] after it is made.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Drops what the pool remembers of an endpoint that left.
    pub fn forget(&self, e: &Endpoint) {
        self.history.remove(e.history);
    }

    /// Folds a routed request's uncached prefill blocks into the moving average (1/8 weight).
    pub fn note_prefill(&self, blocks: u64) {
        let old = self.mean_prefill_x16.load(Ordering::Relaxed);
        let new = old - old / 8 + blocks * 16 / 8;
        self.mean_prefill_x16.store(new, Ordering::Relaxed);
    }

    /// Prefill work queued at an endpoint, in blocks: what this proxy sent that has not
    /// started answering and, in a cluster, what peers' placements left to prefill there; or
    /// — when the engine reports more waiting requests than that explains (other routers) —
    /// its waiting count times the mean prefill.
    /// `with_peers`: count peers' placements' prefill (the prefix presets do; the others rank
    /// by this agent's own view).
    pub fn work_ahead(&self, e: &Endpoint, with_peers: bool) -> u64 {
        let mut own = e.queued_prefill_blocks();
        if with_peers {
            own = own.saturating_add(e.peer_prefill_blocks(std::time::Instant::now()));
        }
        if !e.scraped.load(Ordering::Relaxed) {
            return own;
        }
        let mean = self.mean_prefill_x16.load(Ordering::Relaxed) / 16;
        own.max(u64::from(e.engine_waiting.load(Ordering::Relaxed)) * mean)
    }
}

impl Endpoint {
    /// Whether new requests may go here: the watcher wants it (Ready, not terminating) and,
    /// for a discovered endpoint, its metrics have answered once.
    pub fn routable(&self) -> bool {
        self.wanted.load(Ordering::Relaxed) && (!self.discovered || self.scraped())
    }

    /// Sets the watcher's verdict (`false`: drain).
    pub fn set_wanted(&self, wanted: bool) {
        self.wanted.store(wanted, Ordering::Relaxed);
    }

    /// Whether its metrics have answered at least once.
    pub fn scraped(&self) -> bool {
        self.scraped.load(Ordering::Relaxed)
    }

    /// `serving`; `unready` (not Ready, or terminating: no new requests, those in flight
    /// finish); or `pending` (Ready, its metrics not answered yet).
    pub fn state(&self) -> &'static str {
        match (self.wanted.load(Ordering::Relaxed), self.routable()) {
            (_, true) => "serving",
            (false, _) => "unready",
            (true, false) => "pending",
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn queued_prefill_blocks(&self) -> u64 {
        self.queued_prefill_blocks.load(Ordering::Relaxed)
    }

    /// Records a scrape of the engine's /metrics.
    pub fn set_engine_load(&self, waiting: u32, running: u32, kv_usage: f64) {
        self.engine_waiting.store(waiting, Ordering::Relaxed);
        self.engine_running.store(running, Ordering::Relaxed);
        self.engine_kv_permille.store(
            (kv_usage.clamp(0.0, 1.0) * 1000.0) as u32,
            Ordering::Relaxed,
        );
        self.scraped.store(true, Ordering::Relaxed);
        self.scrape_failures.store(0, Ordering::Relaxed);
    }

    /// Records the engine's KV cache size in blocks (from its metrics page).
    pub fn set_kv_capacity(&self, blocks: u64) {
        self.kv_capacity_blocks.store(blocks, Ordering::Relaxed);
    }

    /// The pod's KV room for a request of `keys` (chained: a held key means its whole
    /// prefix is held), or `None` when the engine's KV size is unknown.
    pub fn kv_room(&self, keys: &[RouterKey]) -> Option<Room> {
        let mut p = self.pinned.lock();
        p.expire(std::time::Instant::now());
        let capacity = self.kv_capacity_blocks.load(Ordering::Relaxed);
        if capacity == 0 {
            return None;
        }
        // The held keys of a chained prompt are a prefix of it: binary search.
        let shared = keys.partition_point(|k| p.refs.contains_key(k)) as u64;
        let own = p.blocks();
        drop(p);
        let reported = (self.kv_usage() * capacity as f64) as u64;
        Some(Room {
            capacity,
            pinned: own.max(reported),
            shared,
        })
    }

    /// A peer agent's request here will prefill `blocks` (new to the pod): queued behind the
    /// peers' prefill still left, drained at `secs_per_block` from `now`.
    /// A placement that adds no block leaves the queue as it is; a rate no calibration gives
    /// (0, NaN, infinite) keeps the queue's last rate, and with none queues nothing.
    pub fn queue_peer_prefill(&self, blocks: u64, secs_per_block: f64, now: std::time::Instant) {
        if blocks == 0 {
            return;
        }
        let mut d = self.peer_prefill.lock();
        let valid = |r: f64| r.is_finite() && r > 0.0;
        let rate = match (valid(secs_per_block), valid(d.secs_per_block)) {
            (true, _) => secs_per_block,
            (false, true) => d.secs_per_block,
            (false, false) => return,
        };
        let left = d.left(now);
        // The whole queue is bounded (a sum of placements, however many).
        d.blocks = (left + blocks as f64).min(MAX_PEER_PREFILL_BLOCKS);
        d.at = Some(now);
        d.secs_per_block = rate;
    }

    /// Blocks of peers' prefill still queued here at `now` (0 without a cluster).
    pub fn peer_prefill_blocks(&self, now: std::time::Instant) -> u64 {
        self.peer_prefill.lock().left(now).ceil() as u64
    }

    /// Peer agents' requests here that this agent counts as still running: their placements
    /// whose lease has not ended ([`Endpoint::lease`]; 0 without a cluster).
    pub fn peer_in_flight(&self) -> u32 {
        let mut p = self.pinned.lock();
        p.expire(std::time::Instant::now());
        u32::try_from(p.leases.len()).unwrap_or(u32::MAX)
    }

    /// A peer agent placed a request of `keys` here: its blocks and `output_blocks` count as
    /// held until `until` (this agent does not see it end).
    pub fn lease(&self, keys: &[RouterKey], output_blocks: u64, until: std::time::Instant) {
        let (keys, rest) = keys.split_at(keys.len().min(MAX_LEASE_KEYS));
        let output_blocks = output_blocks.saturating_add(rest.len() as u64);
        let mut p = self.pinned.lock();
        p.hold(keys, output_blocks);
        // Kept in order of `until` (nearly always the back: lifetimes change slowly).
        let at = p.leases.partition_point(|l| l.until <= until);
        p.leases.insert(
            at,
            Lease {
                until,
                keys: keys.to_vec(),
                output_blocks,
            },
        );
        if p.leases.len() > MAX_LEASES {
            p.expire(std::time::Instant::now());
        }
    }

    /// Records a scrape that did not answer (or answered nothing usable).
    pub fn note_scrape_failure(&self) {
        self.scrape_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Scrapes failed in a row since the last one that answered.
    pub fn scrape_failures(&self) -> u32 {
        self.scrape_failures.load(Ordering::Relaxed)
    }

    /// Ready for the kernel table: routable, and its `/metrics` answered at least once in
    /// the last [`FAILED_SCRAPES`] scrapes.
    pub fn scrape_healthy(&self) -> bool {
        self.routable() && self.scrape_failures() < FAILED_SCRAPES
    }

    /// The engine's KV cache usage, 0..1 (0 before the first scrape).
    pub fn kv_usage(&self) -> f64 {
        f64::from(self.engine_kv_permille.load(Ordering::Relaxed)) / 1000.0
    }

    pub fn set_served_adapters(&self, served: Vec<String>) {
        let mut l = self.lora.write();
        if l.served != served {
            l.served = served;
        }
    }

    pub fn set_adapter_activity(&self, running: Vec<String>, waiting: Vec<String>) {
        let mut l = self.lora.write();
        l.running = Some(running);
        l.waiting = waiting;
    }

    /// Whether this engine serves `adapter`.
    pub fn serves(&self, adapter: &str) -> bool {
        self.lora.read().served.iter().any(|a| a == adapter)
    }

    /// The state of `adapter` on this engine, for the LoRA scorer.
    pub fn lora_state(&self, adapter: Option<&str>) -> crate::routing::LoraState {
        use crate::routing::LoraState;
        let Some(adapter) = adapter else {
            return LoraState::NotApplicable;
        };
        let l = self.lora.read();
        match &l.running {
            None => LoraState::NotApplicable,
            Some(running) if running.iter().any(|a| a == adapter) => LoraState::Loaded,
            Some(_) if l.waiting.iter().any(|a| a == adapter) => LoraState::Queued,
            Some(_) => LoraState::NotLoaded,
        }
    }

    pub fn lora_info(&self) -> LoraInfo {
        self.lora.read().clone()
    }

    pub fn note_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request sent here until the returned guard drops; its uncached prefill
    /// blocks count as queued until the first response byte, and its prompt's `keys` and
    /// `output_blocks` as the KV it holds ([`Endpoint::kv_room`]; none given, none held).
    pub fn start(
        self: &Arc<Self>,
        prefill_blocks: u64,
        keys: &[RouterKey],
        output_blocks: u64,
    ) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.queued_prefill_blocks
            .fetch_add(prefill_blocks, Ordering::Relaxed);
        if !keys.is_empty() || output_blocks > 0 {
            self.pinned.lock().hold(keys, output_blocks);
        }
        InFlight {
            endpoint: self.clone(),
            prefill_blocks,
            keys: keys.to_vec(),
            output_blocks,
        }
    }

    /// Counters for /status.
    pub fn snapshot(&self) -> EndpointStatus {
        EndpointStatus {
            endpoint: self.authority.clone(),
            state: self.state(),
            origin: self.origin.clone(),
            in_flight: self.in_flight(),
            queued_prefill_blocks: self.queued_prefill_blocks(),
            kv_capacity_blocks: match self.kv_capacity_blocks.load(Ordering::Relaxed) {
                0 => None,
                b => Some(b),
            },
            kv_pinned_blocks: {
                let mut p = self.pinned.lock();
                p.expire(std::time::Instant::now());
                p.blocks()
            },
            requests: self.requests.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            engine: self.scraped.load(Ordering::Relaxed).then(|| EngineLoad {
                waiting: self.engine_waiting.load(Ordering::Relaxed),
                running: self.engine_running.load(Ordering::Relaxed),
                kv_cache_usage: f64::from(self.engine_kv_permille.load(Ordering::Relaxed)) / 1000.0,
            }),
        }
    }
}

/// An endpoint's counters as /status shows them.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointStatus {
    pub endpoint: String,
    /// `serving`, `unready` or `pending` ([`Endpoint::state`]).
    pub state: &'static str,
    /// `namespace/pod` for a discovered endpoint.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub origin: String,
    pub in_flight: u32,
    pub queued_prefill_blocks: u64,
    /// The engine's KV cache size, blocks (`vllm:cache_config_info`), once scraped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_capacity_blocks: Option<u64>,
    /// KV blocks this proxy's requests in flight there hold or will (their prompts' blocks,
    /// shared ones once, and expected output), and its peers' placements there.
    pub kv_pinned_blocks: u64,
    pub requests: u64,
    pub failures: u64,
    /// The engine's own numbers, once scraped.
    pub engine: Option<EngineLoad>,
}

/// What an engine's /metrics says about its load.
#[derive(Debug, Clone, Serialize)]
pub struct EngineLoad {
    pub waiting: u32,
    pub running: u32,
    pub kv_cache_usage: f64,
}

/// A request in flight to an endpoint.
#[derive(Debug)]
pub struct InFlight {
    endpoint: Arc<Endpoint>,
    prefill_blocks: u64,
    keys: Vec<RouterKey>,
    output_blocks: u64,
}

impl InFlight {
    /// The first response byte arrived: prefill is done.
    pub fn first_byte(&mut self) {
        let blocks = std::mem::take(&mut self.prefill_blocks);
        self.endpoint
            .queued_prefill_blocks
            .fetch_sub(blocks, Ordering::Relaxed);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.first_byte();
        if !self.keys.is_empty() || self.output_blocks > 0 {
            self.endpoint
                .pinned
                .lock()
                .release(&self.keys, self.output_blocks);
        }
        self.endpoint.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A precise pool of one configured pod, `a:1`.
    fn one_pod() -> Pool {
        Pool::new(
            "m".into(),
            16,
            crate::routing::Policy::Precise,
            vec![("a:1".into(), None)],
        )
    }

    #[test]
    fn configured_metrics_urls_are_kept_and_affinity_follows_the_address() {
        let endpoints = vec![("a:1".to_string(), None), ("b:1".to_string(), None)];
        let pool = Pool::new("m".into(), 16, crate::routing::Policy::Precise, endpoints)
            .with_metrics_urls(vec!["http://a:9/metrics".into(), "http://b:9/m".into()]);
        let urls: Vec<String> = pool
            .endpoints()
            .iter()
            .map(|e| e.metrics_url.clone())
            .collect();
        assert_eq!(urls, ["http://a:9/metrics", "http://b:9/m"]);
        // The same address hashes the same in another pool (another agent), whatever its
        // position.
        let other = Pool::new(
            "m".into(),
            16,
            crate::routing::Policy::Precise,
            vec![("b:1".to_string(), None)],
        );
        assert_eq!(pool.endpoints()[1].affinity, other.endpoints()[0].affinity);
        assert_ne!(pool.endpoints()[0].affinity, pool.endpoints()[1].affinity);
    }

    #[test]
    fn kv_room_counts_shared_prompt_blocks_once_and_frees_them_with_the_last_user() {
        let pool = one_pod();
        let e = pool.endpoints()[0].clone();
        let keys = |doc: u64, question: u64| -> Vec<RouterKey> {
            // 60 blocks of a document, then 4 of the request's own (chained keys: the
            // question's blocks are its own even after a shared document).
            (0..60)
                .map(|i| RouterKey(doc * 1000 + i))
                .chain((0..4).map(|i| RouterKey(doc * 1000 + 500 + question * 10 + i)))
                .collect()
        };
        assert_eq!(e.kv_room(&keys(1, 0)), None, "KV size not reported yet");
        e.set_kv_capacity(253);
        let empty = Room {
            capacity: 253,
            pinned: 0,
            shared: 0,
        };
        assert_eq!(e.kv_room(&keys(1, 0)), Some(empty));
        let a = e.start(64, &keys(1, 0), 4);
        let b = e.start(4, &keys(1, 1), 4);
        // The document once, two questions, two outputs: 60 + 4 + 4 + 4 + 4.
        let room = e.kv_room(&keys(1, 2)).expect("sized");
        assert_eq!((room.pinned, room.shared), (76, 60));
        let other = e.kv_room(&keys(2, 0)).expect("sized");
        assert_eq!((other.pinned, other.shared), (76, 0));
        drop(a);
        assert_eq!(
            e.kv_room(&keys(1, 2)).expect("sized").pinned,
            68,
            "b still holds the document"
        );
        drop(b);
        assert_eq!(e.kv_room(&keys(1, 2)), Some(empty));
        // A peer agent's placement holds its blocks until its expected end; one already
        // due holds nothing.
        let now = std::time::Instant::now();
        e.lease(&keys(1, 0), 4, now + std::time::Duration::from_secs(3600));
        e.lease(&keys(2, 0), 4, now);
        let room = e.kv_room(&keys(1, 2)).expect("sized");
        assert_eq!((room.pinned, room.shared), (68, 60));
        // The engine's own report wins when it says more (requests of other routers).
        e.set_engine_load(0, 3, 0.5);
        assert_eq!(e.kv_room(&keys(1, 2)).expect("sized").pinned, 126);
    }

    #[test]
    fn peer_leases_are_bounded_the_first_to_end_going_first() {
        let pool = one_pod();
        let e = pool.endpoints()[0].clone();
        e.set_kv_capacity(10_000);
        let now = std::time::Instant::now();
        let hour = std::time::Duration::from_secs(3600);
        // More peer placements than a pod keeps, each of one block of its own, ending in
        // the order they came: the first ones are dropped.
        for i in 0..MAX_LEASES as u64 + 44 {
            e.lease(
                &[RouterKey(i)],
                0,
                now + hour + std::time::Duration::from_millis(i),
            );
        }
        let room = e.kv_room(&[RouterKey(0)]).expect("sized");
        assert_eq!(room.pinned, MAX_LEASES as u64);
        assert_eq!(room.shared, 0, "the first lease ended first");
        assert_eq!(
            e.kv_room(&[RouterKey(MAX_LEASES as u64 + 43)])
                .expect("sized")
                .shared,
            1
        );
    }

    #[test]
    fn a_long_peer_prompt_keeps_its_first_keys_and_counts_the_rest_as_its_own() {
        let pool = one_pod();
        let e = pool.endpoints()[0].clone();
        e.set_kv_capacity(100_000);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(3600);
        // Two peers' placements of the same 1,030-block prompt, 2 output blocks each: the
        // first 1,024 blocks are shared, the last 6 of each counted apart.
        let keys: Vec<RouterKey> = (0..1030).map(RouterKey).collect();
        e.lease(&keys, 2, until);
        e.lease(&keys, 2, until);
        let room = e.kv_room(&keys).expect("sized");
        assert_eq!(room.pinned, 1024 + 2 * (6 + 2));
        assert_eq!(room.shared, 1024);
    }

    #[test]
    fn membership_changes_are_announced_and_scrape_health_follows_failures() {
        let pool = one_pod();
        let changes = pool.changes();
        assert!(!changes.has_changed().unwrap());
        let discovered = pool.endpoint(EndpointParts {
            authority: "b:1".into(),
            wanted: true,
            discovered: true,
            ..Default::default()
        });
        pool.set_endpoints(vec![pool.endpoints()[0].clone(), discovered.clone()]);
        assert!(changes.has_changed().unwrap(), "set_endpoints announces");

        // A discovered endpoint is healthy once its metrics answered, and until two scrapes
        // in a row fail.
        assert!(!discovered.scrape_healthy(), "never scraped");
        discovered.set_engine_load(0, 0, 0.0);
        assert!(discovered.scrape_healthy());
        discovered.note_scrape_failure();
        assert!(discovered.scrape_healthy(), "one failure is tolerated");
        discovered.note_scrape_failure();
        assert!(!discovered.scrape_healthy(), "two in a row are not");
        discovered.set_engine_load(0, 0, 0.0);
        assert!(discovered.scrape_healthy(), "an answer resets the count");
        discovered.set_wanted(false);
        assert!(!discovered.scrape_healthy(), "draining");
    }

    #[test]
    fn peers_prefill_queues_at_a_pod_and_drains_at_its_rate() {
        let e = one_pod().endpoints()[0].clone();
        let t0 = std::time::Instant::now();
        let ms = std::time::Duration::from_millis;
        // 1/128 s a block: 250 ms drain 32 blocks, 500 ms 64.
        let rate = 1.0 / 128.0;
        e.queue_peer_prefill(100, rate, t0);
        assert_eq!(e.peer_prefill_blocks(t0), 100);
        assert_eq!(e.peer_prefill_blocks(t0 + ms(250)), 68);
        // 50 more queue behind the 68 left.
        e.queue_peer_prefill(50, rate, t0 + ms(250));
        assert_eq!(e.peer_prefill_blocks(t0 + ms(250)), 118);
        assert_eq!(e.peer_prefill_blocks(t0 + ms(750)), 54);
        assert_eq!(e.peer_prefill_blocks(t0 + ms(2000)), 0);
        // A rate no calibration gives (0, NaN) drains at the last good one: 10 blocks, 1/128 s
        // each, gone 1,280 ms later.
        e.queue_peer_prefill(10, 0.0, t0 + ms(2000));
        e.queue_peer_prefill(10, f64::NAN, t0 + ms(2000));
        assert_eq!(e.peer_prefill_blocks(t0 + ms(2000)), 20);
        assert_eq!(e.peer_prefill_blocks(t0 + ms(2000) + ms(1250)), 0);
        // Without any good rate, nothing is queued (it could never drain); nor by a placement
        // of nothing new.
        let fresh = one_pod().endpoints()[0].clone();
        fresh.queue_peer_prefill(10, f64::INFINITY, t0);
        fresh.queue_peer_prefill(0, rate, t0);
        assert_eq!(fresh.peer_prefill_blocks(t0), 0);
        // Bounded however much is placed.
        e.queue_peer_prefill(u64::MAX, rate, t0);
        assert_eq!(e.peer_prefill_blocks(t0), MAX_PEER_PREFILL_BLOCKS as u64);
    }

    #[test]
    fn work_ahead_counts_engine_queues_the_proxy_did_not_fill() {
        let pool = one_pod();
        let e = pool.endpoints()[0].clone();
        for _ in 0..64 {
            pool.note_prefill(10);
        }
        let _guard = e.start(7, &[], 0);
        assert_eq!(
            pool.work_ahead(&e, true),
            7,
            "not scraped yet: own queue only"
        );
        e.set_engine_load(5, 2, 0.5);
        let ahead = pool.work_ahead(&e, true);
        assert!(
            (45..=50).contains(&ahead),
            "5 waiting x ~10 blocks, got {ahead}"
        );
        e.set_engine_load(0, 2, 0.5);
        assert_eq!(pool.work_ahead(&e, true), 7);
    }
}
