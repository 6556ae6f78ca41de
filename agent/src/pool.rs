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
    kv_index::{AgentLoad, RouterKey, SourceId},
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
    /// Its pool's wake-up for requests yielding for KV room: woken when a request ends
    /// here (this agent's, or a peer's by its report) or a scrape updates the engine's
    /// figures.
    room: Arc<RoomSignal>,
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
    /// When this agent last sent a request here, saw one end, or heard of a peer's placement
    /// here, ms after a process-wide origin (or when the endpoint was made): how long it has
    /// been idle ([`Endpoint::idle_for`]).
    last_busy_ms: AtomicU64,
    queued_prefill_blocks: AtomicU64,
    /// When the engine started on the head of the prefill queued here, µs after a
    /// process-wide origin plus one; 0: stopped, nothing queued ([`prefill`]).
    head_since: AtomicU64,
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
    /// Peer agents' own reports of their load here (a cluster sharing loads).
    peer_loads: parking_lot::Mutex<PeerLoads>,
    /// Peers' cold placements too recent for their load reports ([`provisional`]).
    peer_placements: parking_lot::Mutex<provisional::PeerPlacements>,
    /// Requests the engine ran beyond this agent's and its peers' reported ones at the
    /// last scrape (other routers' clients), with exact peer loads.
    foreign_requests: AtomicU32,
    scraped: AtomicBool,
    /// Scrapes failed in a row (reset by one that answers): the kernel table writer's sign
    /// that a pod is gone although nothing routed to it (steer mode; docs/ebpf.md).
    scrape_failures: AtomicU32,
    /// LoRA adapters the engine serves (`/v1/models` cards whose parent is the base model) and
    /// which are running or waiting (`vllm:lora_requests_info`).
    lora: parking_lot::RwLock<LoraInfo>,
}

mod idle;
mod kv;
mod peers;
mod prefill;
mod provisional;
mod room;
mod warm;

use idle::since_origin;
use kv::{Drain, Pinned};
pub use kv::{MAX_LEASE_KEYS, MAX_LEASES, MAX_PEER_PREFILL_BLOCKS, Room};
use peers::PeerLoads;
pub use peers::{LOAD_REFRESH, MAX_PEER_AGENTS, PEER_LOAD_TTL};
use room::RoomSignal;
pub use room::Yielding;
pub use warm::{WARM_SHARE_MEMORY, WarmShare};

/// Woken (once load sharing is on: [`share_loads`]) whenever a request starts, gets its first
/// byte or ends at any endpoint: the proxy's load publisher waits on it.
pub static LOAD_CHANGED: tokio::sync::Notify = tokio::sync::Notify::const_new();
static SHARING: AtomicBool = AtomicBool::new(false);

/// Turns on [`LOAD_CHANGED`]'s wake-ups (a cluster shares this agent's loads).
pub fn share_loads() {
    SHARING.store(true, Ordering::Relaxed);
}

fn load_changed() {
    if SHARING.load(Ordering::Relaxed) {
        LOAD_CHANGED.notify_waiters();
    }
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
    /// The round-robin cursor (and the tie-break offset of the other policies), from a
    /// random start ([`rotation_start`]).
    pub rotation: AtomicUsize,
    /// Moving average of uncached prefill blocks per routed request, x16 (fixed point).
    mean_prefill_x16: AtomicU64,
    /// Moving average of the share of keyed requests warm at their pick
    /// ([`crate::routing::cold_yield::warm`]): [`WarmShare`] packed in one word.
    warm_share: AtomicU64,
    next_serial: AtomicU32,
    /// Bumped when the members change or one of them becomes ready or unready
    /// ([`Pool::note_change`]): the kernel table writer wakes on it.
    changes: tokio::sync::watch::Sender<u64>,
    /// Peers' loads come from their own reports ([`Pool::count_peers_exactly`]), not from
    /// leases of their placements.
    exact_peers: AtomicBool,
    /// Woken when room may have freed on any member ([`Pool::room_freed`]).
    room: Arc<RoomSignal>,
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
            rotation: AtomicUsize::new(rotation_start()),
            mean_prefill_x16: AtomicU64::new(0),
            warm_share: AtomicU64::new(0),
            next_serial: AtomicU32::new(0),
            exact_peers: AtomicBool::new(false),
            changes: tokio::sync::watch::Sender::new(0),
            room: Arc::default(),
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
            room: self.room.clone(),
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
            last_busy_ms: AtomicU64::new(since_origin(std::time::Instant::now())),
            queued_prefill_blocks: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            engine_waiting: AtomicU32::new(0),
            engine_running: AtomicU32::new(0),
            engine_kv_permille: AtomicU32::new(0),
            kv_capacity_blocks: AtomicU64::new(0),
            pinned: parking_lot::Mutex::new(Pinned::default()),
            peer_prefill: parking_lot::Mutex::new(Drain::default()),
            peer_loads: parking_lot::Mutex::new(PeerLoads::default()),
            peer_placements: parking_lot::Mutex::new(provisional::PeerPlacements::default()),
            foreign_requests: AtomicU32::new(0),
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

    /// Resolves at the next moment room may have freed on a member: a request there ended
    /// (this agent's, or a peer agent's by its load report), or a scrape (every 200 ms while
    /// the engines answer) updated an engine's figures. Only while a [`Yielding`] guard is
    /// held: without one nothing is woken (the request path pays one atomic load).
    pub fn room_freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.room.notify.notified()
    }

    /// Counts a request yielding for room until the guard drops (woken meanwhile by
    /// [`Pool::room_freed`]).
    pub fn yielding(&self) -> Yielding {
        self.room.waiters.fetch_add(1, Ordering::SeqCst);
        Yielding(self.room.clone())
    }

    /// Drops what the pool remembers of an endpoint that left.
    pub fn forget(&self, e: &Endpoint) {
        self.history.remove(e.history);
    }

    /// Folds whether a keyed request was warm at its pick into the pool's warm share
    /// ([`WarmShare`]).
    pub fn note_warm(&self, warm: bool) {
        // One word, updated whole: concurrent requests never lose each other's note.
        let _ = self
            .warm_share
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                Some(WarmShare::unpack(w).note(warm).pack())
            });
    }

    /// The share of the pool's recent keyed requests that were warm at their pick, 0-1 (0
    /// before any).
    pub fn warm_share(&self) -> f64 {
        self.warm().share()
    }

    /// The pool's warm share, 0-1, or `None` before any keyed request.
    pub fn warm_share_seen(&self) -> Option<f64> {
        let warm = self.warm();
        (warm.seen() > 0).then(|| warm.share())
    }

    fn warm(&self) -> WarmShare {
        WarmShare::unpack(self.warm_share.load(Ordering::Relaxed))
    }

    /// Folds a routed request's uncached prefill blocks into the moving average (1/8 weight).
    pub fn note_prefill(&self, blocks: u64) {
        let old = self.mean_prefill_x16.load(Ordering::Relaxed);
        let new = old - old / 8 + blocks * 16 / 8;
        self.mean_prefill_x16.store(new, Ordering::Relaxed);
    }

    /// The pool's mean uncached prefill blocks per routed request (the moving average).
    pub fn mean_prefill_blocks(&self) -> u64 {
        self.mean_prefill_x16.load(Ordering::Relaxed) / 16
    }

    /// Requests in flight at an endpoint: what this proxy sent and has not seen end, plus
    /// (`with_peers`: the prefix presets) those it did not send — the more of its peers'
    /// placements still leased there ([`Endpoint::peer_in_flight`]: each counted for the
    /// pool's mean request lifetime) and what the engine's last scrape reported running and
    /// waiting beyond this proxy's own. A lease guesses a request's end; the scrape (one
    /// interval old, about a second when one scrape timed out) sees it, so a long request
    /// outliving its lease still counts, as one another router sent does. Between scrapes
    /// this proxy's requests that ended since count among the others until the next. Without
    /// `with_peers`, its own only (least-loaded, session pools: shared counts herd, cluster.md).
    /// With exact peer loads ([`Pool::count_peers_exactly`]) the others are what the peers
    /// report in flight there, plus their cold placements too recent for their reports
    /// ([`Endpoint::provisional_peer_load`]), plus the requests the engine ran beyond all
    /// the agents' reports at the last scrape (another router's).
    pub fn in_flight(&self, e: &Endpoint, with_peers: bool) -> u32 {
        let own = e.in_flight();
        if !with_peers {
            return own;
        }
        if self.counts_peers_exactly() {
            let foreign = if e.engine_report_fresh() {
                e.foreign_requests.load(Ordering::Relaxed)
            } else {
                0
            };
            let now = std::time::Instant::now();
            return own
                .saturating_add(e.peer_load(now).in_flight)
                .saturating_add(e.provisional_peer_load(now).0)
                .saturating_add(foreign);
        }
        let engine = e.engine_requests().unwrap_or(0);
        own.saturating_add(e.peer_in_flight().max(engine.saturating_sub(own)))
    }
}

/// Where a pool's rotation starts: random, each process its own. Agents started together
/// (a DaemonSet rolled out, the bench's agents) with one start would rotate in step: each
/// sends its first request to the same pod, its second to the next, and so on, so each pod
/// gets the agents' requests in bursts of one per agent while the others idle (measured on
/// the bench's matrix, three least-loaded agents in front of six engines on its no-sharing
/// control: consecutive requests in threes on one pod, p50 TTFT 124 ms where one prefill
/// takes 57). Envoy starts its round robin at a random host for the same reason.
pub fn rotation_start() -> usize {
    use std::hash::{BuildHasher, RandomState};
    // RandomState's keys are random per process (and per state after the first).
    RandomState::new().hash_one(std::process::id()) as usize
}

impl Pool {
    /// From now on peers' requests and queued prefill here are the ones they report
    /// ([`Endpoint::set_peer_load`]: a cluster sharing loads), not leases of their placements.
    pub fn count_peers_exactly(&self) {
        self.exact_peers.store(true, Ordering::Relaxed);
    }

    pub fn counts_peers_exactly(&self) -> bool {
        self.exact_peers.load(Ordering::Relaxed)
    }
}

impl Endpoint {
    /// A peer agent reported its load here. A report of fewer requests than its last
    /// (current) one says requests of its ended: the peers' placements here are then held
    /// for no more requests than the peers' current reports count, plus those placed too
    /// recently to be in them (`Pinned::keep_leases`, `pool/kv.rs`: a lease
    /// guesses when a peer's request ends, a report says how many did), and if that ended a
    /// lease, requests yielding for room in the pool are woken, as the end of one of this
    /// agent's own wakes them. A peer whose reports went stale ([`PEER_LOAD_TTL`]) counts no
    /// request, as in [`Pool::in_flight`].
    pub fn set_peer_load(&self, agent: &str, load: AgentLoad, now: std::time::Instant) {
        let live = {
            let mut loads = self.peer_loads.lock();
            let before = loads.set(agent, load, now);
            let queued = load
                .queued_prefill_blocks
                .cmp(&before.queued_prefill_blocks);
            let in_flight_fell = load.in_flight < before.in_flight;
            // The peers' sum only on a fall (most reports are rises and refreshes), once.
            let sum = (queued.is_lt() || in_flight_fell).then(|| loads.sum(now));
            // The head clock: more queued joins the queue; fewer is a prefill that finished.
            if queued.is_gt() {
                self.note_queued(now);
            } else if let Some(sum) = sum.filter(|_| queued.is_lt()) {
                let left = sum
                    .queued_prefill_blocks
                    .saturating_add(self.queued_prefill_blocks());
                self.note_prefilled(left, now);
            }
            sum.filter(|_| in_flight_fell).map(|s| s.in_flight)
        };
        if let Some(live) = live
            && self.pinned.lock().keep_leases(live as usize, now)
        {
            self.room.wake();
        }
    }

    /// The peers' reported loads here still current at `now`, summed.
    pub fn peer_load(&self, now: std::time::Instant) -> AgentLoad {
        self.peer_loads.lock().sum(now)
    }

    /// This agent's own load here: what it reports to its peers.
    pub fn own_load(&self) -> AgentLoad {
        AgentLoad {
            in_flight: self.in_flight(),
            queued_prefill_blocks: self.queued_prefill_blocks(),
        }
    }

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

    /// Whether the engine's last scraped figures speak for now: scraped, and fewer than
    /// [`FAILED_SCRAPES`] scrapes failed in a row since.
    fn engine_report_fresh(&self) -> bool {
        self.scraped() && self.scrape_failures() < FAILED_SCRAPES
    }

    /// The requests the engine last reported running and waiting: `None` until scraped, and
    /// once [`FAILED_SCRAPES`] scrapes in a row failed (a count that old says nothing of now).
    pub fn engine_requests(&self) -> Option<u32> {
        self.engine_report_fresh().then(|| {
            self.engine_running
                .load(Ordering::Relaxed)
                .saturating_add(self.engine_waiting.load(Ordering::Relaxed))
        })
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
        let agents = self
            .in_flight()
            .saturating_add(self.peer_load(std::time::Instant::now()).in_flight);
        self.foreign_requests.store(
            waiting.saturating_add(running).saturating_sub(agents),
            Ordering::Relaxed,
        );
        self.room.wake();
    }

    /// Records the engine's KV cache size in blocks (from its metrics page).
    pub fn set_kv_capacity(&self, blocks: u64) {
        self.kv_capacity_blocks.store(blocks, Ordering::Relaxed);
        self.room.wake();
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
        self.mark_busy();
        self.requests.fetch_add(1, Ordering::Relaxed);
        let before = self
            .queued_prefill_blocks
            .fetch_add(prefill_blocks, Ordering::Relaxed);
        if prefill_blocks > 0 {
            self.note_joined(before, std::time::Instant::now());
        }
        load_changed();
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
        if blocks > 0 {
            let e = &self.endpoint;
            let left = e
                .queued_prefill_blocks
                .fetch_sub(blocks, Ordering::Relaxed)
                .saturating_sub(blocks);
            e.note_own_prefilled(left, std::time::Instant::now());
            load_changed();
        }
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
        self.endpoint.mark_busy();
        load_changed();
        // Its KV blocks are free: requests yielding for room may go.
        self.endpoint.room.wake();
    }
}

#[cfg(test)]
mod tests;
