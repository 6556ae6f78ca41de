//! Choosing an endpoint for a request: candidates described by their prefix match and load,
//! combined by the pool's policy. Pure: no I/O, no index writes; the proxy records after the
//! pick.
//!
//! The prefix presets (precise, approximate) minimise a cost in **seconds**: the time to first
//! token the request is predicted to wait on that pod ([`cost`]), plus what its prefill does
//! to others there:
//!
//! ```text
//! uncached     = prompt_blocks - matched_blocks(pod)
//! ttft(pod)    = (uncached + queued_prefill_blocks(pod)) x secs_per_block(pod)
//!              + in_flight(pod) x secs_per_running(pod) + base(pod)      (the prediction)
//! expected     = prompt_blocks - survival(ttft(pod)) x matched_blocks(pod)
//! cost(pod)    = (expected + queued_prefill_blocks(pod)                   (its prefill wait)
//!              +  0.25 x share x expected x in_flight(pod)                (stall)
//!              +  4 x in_flight(pod)) x secs_per_block(pool) + base(pool) (spread)
//!              +  kv_wait(pod)                                            (KV room)
//! ```
//!
//! `kv_wait` ([`KvRoom`]) is the time the request would wait there for free KV blocks (in
//! the prediction too).
//!
//! `survival` ([`Survival`]) is the share of a held prefix that the pool's engines still had
//! at prefill, by the recent route receipts (delivered / captured), learnt per band of the
//! predicted TTFT the requests were routed at: a prefix survives a short wait and is evicted
//! in a long one. 1 until measured.
//!
//! `secs_per_block`, `secs_per_running` and `base` are each pod's own, calibrated online from
//! the TTFTs it answered with (the proxy's `calibration`), and make the prediction each
//! decision carries; the ranking turns every scorer's cost in blocks of prefill work into
//! seconds at the pool's median rate (per-pod fits in the ranking were measured to
//! destabilise it), and a `--weight` scales its term. The stall term is the charge for the
//! batch a prefill joins: chunked prefill shares every step with the pod's running requests,
//! so each of them waits for the uncached blocks too — a cold prompt goes where the fewest
//! requests would wait for it, while a warm one (few uncached blocks) keeps its affinity.
//! `share` ([`StallShare`]) charges it in proportion to the pool's recent warm share, whole
//! from a quarter of requests warm and before any request: where nothing is warm there is no
//! affinity to keep. The spread term keeps cold requests from piling onto one pod between
//! scrapes (measured: docs/benchmarks.md). The `history` scorer (the pull of a prefix's
//! home: `2 x survival(ttft) x (prompt_blocks - history_blocks(pod))` at
//! `--weight history=2`) is off in both presets.
//!
//! Affinity wins while the pod holding the prefix is not already busier than recomputing the
//! prefix elsewhere would be; so it can never pile requests onto an overloaded pod. A hot
//! prefix that outgrows its home is replicated deliberately instead of spilling request by
//! request ([`replication`]).
//!
//! A cold request whose pick has no KV room waits at the router, bounded, while warm ones go
//! first, and is ranked again when room frees ([`cold_yield`]).
//!
//! A pod left idle because it lacks a prefix every busy pod holds is warmed by one request
//! ([`idle`]).
//!
//! Where peer agents route to the same pods, near-ties (within one request's load, holding as
//! much of the prompt) go by each agent's own turn, so agents deciding in the same
//! milliseconds do not all pick one pod ([`near_ties_by_turn`]).
//!
//! A pod whose index is not trusted (unsure, stalled, no events yet, or a replica whose
//! owner cannot vouch for it) is scored by the approximate signal instead: `matched_blocks`
//! is replaced by its `history_blocks` (what was routed there recently: by this agent, and in
//! a cluster by its peers, whose placements it records), never counted as none. The decision
//! says which signal its pod's prefix came from ([`PrefixSource`]). The approximate policy is
//! the same rule with no index at all.

pub mod cold_yield;
pub mod cost;
mod history;
pub mod idle;
pub mod replication;
pub mod resident;
pub mod scorers;
pub mod session;
pub mod stagger;

use smallvec::SmallVec;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use cost::Timing;
pub use history::History;
pub use scorers::StallShare;
use scorers::{ScoreCtx, Scorer};
pub use session::{DEFAULT_SESSION_HEADER, SessionSource};

use crate::kv_index::RouterKey;

/// An endpoint's position in its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(pub usize);

/// What the router knows about the request.
#[derive(Debug, Clone, Default)]
pub struct RequestCtx {
    pub keys: Vec<RouterKey>,
    /// Session affinity key (header or cookie), if any.
    pub session: Option<String>,
    /// The LoRA adapter the request names, if it names one.
    pub lora: Option<String>,
    /// How much of a prefix a pod holds at decision reaches prefill, by the request's
    /// predicted wait there and the pool's recent route receipts.
    pub survival: Survival,
    /// How much of the stall charge applies: by the pool's recent warm share.
    pub stall_share: StallShare,
}

/// The share of a prefix a pod holds at decision that its engine still has when it
/// prefills the request, by how long the request is predicted to wait there: the pool's
/// recent route receipts, delivered / captured, learnt per band of predicted TTFT
/// (`proxy::calibration`). Blocks a pod holds are evicted while the request waits in its
/// queue when the pod's KV cache is too small for what runs there, and the longer it waits
/// the more of them go (measured on chat: 0-4 % of captured prefixes lost under 50 ms of
/// predicted TTFT, 79-100 % from 150 ms; docs/benchmarks.md). The prefix presets count a
/// block a pod holds as [`Survival::at`] its predicted TTFT of a block (the `prefix`,
/// `stall` and `history` terms), so they chase a cache where it will still be there and
/// balance load where it will be gone. 1 (the index at its word) by default.
///
/// Band `i` holds predictions in `[BAND_START x 2^(i-1), BAND_START x 2^i)` (the first from
/// 0, the last open); between the bands' geometric midpoints the share is interpolated
/// linearly in log2 of the prediction, so the cost has no step at a band's edge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Survival([f64; SURVIVAL_BANDS]);

/// Bands of predicted TTFT survival is learnt in.
pub const SURVIVAL_BANDS: usize = 8;
/// The upper edge of the first band, seconds (each next band's edge doubles: 25 ms .. 1.6 s,
/// and the last band is open).
pub const BAND_START: f64 = 0.025;

impl Survival {
    /// The same `share` at every wait, clamped to 0..=1 (NaN: 1).
    pub fn new(share: f64) -> Self {
        Self([Self::clamp(share); SURVIVAL_BANDS])
    }

    /// One share per band of predicted TTFT, each clamped to 0..=1 (NaN: 1).
    pub fn by_wait(shares: [f64; SURVIVAL_BANDS]) -> Self {
        Self(shares.map(Self::clamp))
    }

    fn clamp(share: f64) -> f64 {
        if share.is_nan() {
            1.0
        } else {
            share.clamp(0.0, 1.0)
        }
    }

    /// The band a prediction of `predicted` seconds is learnt in.
    pub fn band(predicted: f64) -> usize {
        if predicted.is_nan() || predicted < BAND_START {
            return 0;
        }
        // In f64 until clamped: an infinite prediction is the last band, not an overflow.
        let i = ((predicted / BAND_START).log2().floor() + 1.0).min((SURVIVAL_BANDS - 1) as f64);
        i as usize
    }

    /// The share that survives a predicted TTFT of `predicted` seconds: interpolated between
    /// the bands' midpoints (band `i`'s is `BAND_START x 2^i / sqrt 2`), flat beyond the
    /// first and the last.
    pub fn at(self, predicted: f64) -> f64 {
        let u = if predicted > 0.0 {
            (predicted / BAND_START).log2() + 0.5
        } else {
            0.0
        };
        let u = if u.is_nan() {
            0.0
        } else {
            u.clamp(0.0, (SURVIVAL_BANDS - 1) as f64)
        };
        let i = (u.floor() as usize).min(SURVIVAL_BANDS - 2);
        let f = u - i as f64;
        self.0[i] * (1.0 - f) + self.0[i + 1] * f
    }

    /// Each band's share, shortest wait first.
    pub fn bands(self) -> [f64; SURVIVAL_BANDS] {
        self.0
    }
}

impl Default for Survival {
    fn default() -> Self {
        Self::new(1.0)
    }
}

/// Whether a candidate has the request's LoRA adapter (from `vllm:lora_requests_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoraState {
    /// Not a LoRA request, or the engine does not report adapters.
    #[default]
    NotApplicable,
    Loaded,
    /// Waiting to be loaded there.
    Queued,
    NotLoaded,
}

/// One endpoint as a candidate for this request.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: EndpointId,
    /// The endpoint's stable name for rendezvous hashing (its address, hashed): the same
    /// on every agent and across membership changes, unlike `id` (a position).
    pub affinity: u64,
    /// Consecutive prefix blocks the index says this pod holds.
    pub matched_blocks: usize,
    /// Whether `matched_blocks` may be used (index healthy for this pod); when not, the
    /// routing history's `history_blocks` stand in for it.
    pub prefix_trusted: bool,
    /// Requests the proxy has in flight to this pod.
    pub in_flight: u32,
    /// Uncached prompt blocks of requests sent here that have not produced a first byte.
    pub queued_prefill_blocks: u64,
    /// The engine's KV cache usage, 0..1 (0 when not scraped).
    pub kv_usage: f64,
    /// Consecutive prefix blocks this proxy routed here recently (routing history).
    pub history_blocks: usize,
    pub lora: LoraState,
    /// Excluded (failed earlier in this request's retries).
    pub excluded: bool,
    /// The pod's calibrated TTFT coefficients, per block of prefill ([`BlockTiming`]).
    pub timing: BlockTiming,
    /// The pod's KV room for this request, when the engine reports its KV size.
    pub kv: Option<KvRoom>,
    /// How long the pod has had nothing in flight from this agent and been sent nothing by
    /// it or its peers (zero while busy): [`idle`].
    pub idle_for: std::time::Duration,
}

/// A pod's KV cache as one request would find it: the engine admits a request only while
/// it has free blocks for it, so where the requests in flight already hold (or will hold)
/// nearly all of it, a new one waits in the queue for some of them to finish — whatever
/// its prefix. Prompts sharing a prefix share its blocks, so a pod serving one hot
/// document runs many more of its requests at once than a pod serving several.
///
/// ```text
/// over = pinned + new_blocks - capacity            (blocks the pod lacks, if any)
/// wait = min(over / pinned, MAX_TURNOVERS) x lifetime
/// ```
///
/// The blocks pinned turn over once per request lifetime (each request in flight frees
/// its own when it ends), so the share of them that must be freed takes that share of a
/// lifetime.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvRoom {
    /// The engine's KV cache, blocks.
    pub capacity: u64,
    /// Blocks the requests in flight there hold or will hold.
    pub pinned: u64,
    /// Blocks this request would add: its prompt's beyond those already pinned there, and
    /// its expected output.
    pub new_blocks: u64,
    /// Mean seconds a request holds its blocks (the pool's answers).
    pub lifetime: f64,
    /// Blocks of the prefixes requests reuse there ([`resident`]).
    pub resident: u64,
    /// Blocks of the request's expected output.
    pub output: u64,
}

/// The longest a KV wait is predicted at, in request lifetimes: past that a pod is full
/// whatever it is sent, and the other terms decide.
pub const MAX_TURNOVERS: f64 = 2.0;

impl KvRoom {
    /// Seconds a request would wait for room there (0 with room to spare).
    pub fn wait(&self) -> f64 {
        let over = self
            .pinned
            .saturating_add(self.new_blocks)
            .saturating_sub(self.capacity);
        if over == 0 {
            return 0.0;
        }
        let lifetime = if self.lifetime.is_finite() {
            self.lifetime.max(0.0)
        } else {
            0.0
        };
        (over as f64 / self.pinned.max(1) as f64).min(MAX_TURNOVERS) * lifetime
    }
}

/// A pod's [`Timing`] with prefill in seconds per block (tokens per block x per token).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockTiming {
    pub secs_per_block: f64,
    pub secs_per_running: f64,
    pub base: f64,
}

impl BlockTiming {
    pub fn new(t: Timing, block_size: usize) -> Self {
        Self {
            secs_per_block: t.secs_per_token * block_size as f64,
            secs_per_running: t.secs_per_running,
            base: t.base,
        }
    }
}

impl Default for BlockTiming {
    /// The prior at 16 tokens per block (vLLM's default).
    fn default() -> Self {
        Self::new(Timing::PRIOR, 16)
    }
}

/// Which signal a candidate's prefix comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrefixSource {
    /// The KV index, built from the engine's own events (trusted).
    Index,
    /// The routing history: what was sent there recently, by this agent and (in a cluster)
    /// its peers (the approximate signal).
    History,
}

impl PrefixSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Index => "index",
            Self::History => "history",
        }
    }
}

// === impl Candidate ===

impl Candidate {
    /// The prefix this candidate is scored by, in blocks (not capped to the request), and
    /// where it comes from: the index's match when trusted, else the routing history's.
    pub fn prefix(&self) -> (usize, PrefixSource) {
        if self.prefix_trusted {
            (self.matched_blocks, PrefixSource::Index)
        } else {
            (self.history_blocks, PrefixSource::History)
        }
    }
}

/// How a pool picks (a preset of scorer weights, or rotation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Prefix-cache aware, by predicted time to first token in seconds (warmpath's default).
    Precise,
    /// The same cost rule, with prefixes guessed from routing history instead of KV events
    /// (what routers without an event index do).
    Approximate,
    /// Rotate over endpoints, like a plain Service.
    RoundRobin,
    /// Fewest in-flight requests.
    LeastLoaded,
    /// Same session (header or cookie), same endpoint (rendezvous hash), else least loaded.
    Session,
}

/// Scorer weights: the cost of a candidate is `sum(weight x scorer cost)`; under the prefix
/// presets the sum, in blocks, is turned into seconds at the pool's median prefill rate.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Weights {
    pub prefix: f64,
    pub queue: f64,
    pub kv_usage: f64,
    pub lora: f64,
    pub session: f64,
    pub in_flight: f64,
    pub history: f64,
    pub stall: f64,
    pub kv_room: f64,
    pub evict: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Policy::Precise.weights()
    }
}

impl Weights {
    const ZERO: Weights = Weights {
        prefix: 0.0,
        queue: 0.0,
        kv_usage: 0.0,
        lora: 0.0,
        session: 0.0,
        in_flight: 0.0,
        history: 0.0,
        stall: 0.0,
        kv_room: 0.0,
        evict: 0.0,
    };

    /// Pairs of (scorer, weight) with a non-zero weight.
    fn active(&self) -> impl Iterator<Item = (&'static dyn Scorer, f64)> {
        [
            (&scorers::Prefix as &'static dyn Scorer, self.prefix),
            (&scorers::Queue, self.queue),
            (&scorers::KvUsage, self.kv_usage),
            (&scorers::Lora, self.lora),
            (&scorers::Session, self.session),
            (&scorers::InFlight, self.in_flight),
            (&scorers::Home, self.history),
            (&scorers::Stall, self.stall),
            (&scorers::KvRoomWait, self.kv_room),
            (&scorers::Evict, self.evict),
        ]
        .into_iter()
        .filter(|(_, w)| *w != 0.0)
    }

    /// The first weight above 0 that only the presets ranking in seconds (precise,
    /// approximate) price, as (its policy name, what it prices): the KV room wait and the
    /// evict charge need each pod's KV room, which the others do not compute.
    pub fn priced_in_seconds(&self) -> Option<(&'static str, &'static str)> {
        if self.kv_room > 0.0 {
            Some(("kvRoom", "the KV room wait"))
        } else if self.evict > 0.0 {
            Some(("evict", "the evict charge"))
        } else {
            None
        }
    }

    /// Sets one weight by its name (`prefix`, `queue`, `kv-usage`, `lora`, `session`,
    /// `in-flight`).
    pub fn set(&mut self, name: &str, value: f64) -> Result<(), String> {
        if !(value.is_finite() && value >= 0.0) {
            return Err(format!(
                "weight {name}={value}: must be a finite number >= 0"
            ));
        }
        // kv-usage, kv_usage and kvUsage all name the same scorer.
        let mut key = String::with_capacity(name.len() + 2);
        for ch in name.chars() {
            if ch.is_ascii_uppercase() {
                key.push('-');
                key.push(ch.to_ascii_lowercase());
            } else {
                key.push(if ch == '_' { '-' } else { ch });
            }
        }
        let slot = match key.as_str() {
            "prefix" => &mut self.prefix,
            "queue" => &mut self.queue,
            "kv-usage" => &mut self.kv_usage,
            "lora" => &mut self.lora,
            "session" => &mut self.session,
            "in-flight" => &mut self.in_flight,
            "history" => &mut self.history,
            "stall" => &mut self.stall,
            "kv-room" => &mut self.kv_room,
            "evict" => &mut self.evict,
            other => {
                return Err(format!(
                    "unknown scorer `{other}`: expected prefix, queue, kv-usage, lora, session, in-flight, history, stall, kv-room or evict"
                ));
            }
        };
        *slot = value;
        Ok(())
    }
}

/// Blocks of prefill one request in flight is worth in the precise preset (measured: with 0,
/// precise trailed least-loaded's TTFT tail by 13-17 % when nothing is shared; with 4 it is
/// within 5 % on every figure and the shared-prefix tail shortened — docs/benchmarks.md).
pub const IN_FLIGHT_BLOCKS: f64 = 4.0;
/// Weight of the stall scorer (uncached blocks x requests in flight there) in the prefix
/// presets: a prefill delays each request sharing its batch steps by its own length, but a
/// running request's later tokens are not a waiting request's first one, so a block of
/// that delay is charged a quarter of a block of prefill wait. With 1 (the weight before
/// KV room and peers' placements priced load) the charge outgrew the pull of a prefix's
/// home whenever its pod ran two more requests than another, and cold copies of hot
/// documents were spread over every cache (four agents' RAG p90 TTFT 1.1-2.0x this weight's
/// on the same seeds); with 0 new agentic sessions piled onto busy pods (docs/benchmarks.md,
/// "The stall charge").
pub const STALL_WEIGHT: f64 = 0.25;

impl Policy {
    /// Whether this preset prices the wait for KV room ([`KvRoom`]): the prefix presets,
    /// which rank in seconds.
    pub fn prices_kv_room(self) -> bool {
        matches!(self, Policy::Precise | Policy::Approximate)
    }

    /// How long a cold request yields at a full pod under this preset
    /// ([`cold_yield::DEFAULT_COLD_YIELD`] for the prefix presets, which know each pod's KV
    /// room; zero for the others).
    pub fn cold_yield(self) -> std::time::Duration {
        match self {
            Policy::Precise | Policy::Approximate => cold_yield::DEFAULT_COLD_YIELD,
            _ => std::time::Duration::ZERO,
        }
    }

    /// The scorer weights this policy starts from.
    pub fn weights(self) -> Weights {
        match self {
            // Cost in blocks: uncached prefill here + prefill queued here (+ an adapter load).
            // No pull of a prefix's home (`history`, 0): the index, with a speculative entry
            // for every pick its engine has not yet confirmed, already prices what each pod
            // holds, so the pull counted a held prefix three times over and sent an evicted
            // one back to a pod as cold as any other (measured: docs/benchmarks.md, "The home
            // pull on the new ladder").
            // And a few blocks per request in flight there: running requests share every batch
            // step, so a pod busy decoding prefills more slowly; and the uncached blocks once
            // more (at a quarter of a block each) per request in flight there, which this
            // prefill would stall. And the blocks of reused prefixes it would evict there,
            // each prefilled again when its prefix returns ([`resident`]).
            Policy::Precise => Weights {
                prefix: 1.0,
                queue: 1.0,
                lora: 1.0,
                in_flight: IN_FLIGHT_BLOCKS,
                stall: STALL_WEIGHT,
                kv_room: 1.0,
                evict: 1.0,
                ..Weights::ZERO
            },
            // The approximate policy's prefix signal *is* the history; its other terms are
            // precise's, so the two differ only in what they know of the caches — except
            // the evict charge, counted from the KV index, which the engines this preset is
            // for (no KV events) leave empty.
            Policy::Approximate => Weights {
                prefix: 1.0,
                queue: 1.0,
                lora: 1.0,
                in_flight: IN_FLIGHT_BLOCKS,
                stall: STALL_WEIGHT,
                kv_room: 1.0,
                ..Weights::ZERO
            },
            Policy::LeastLoaded => Weights {
                in_flight: 1.0,
                ..Weights::ZERO
            },
            // A session miss outweighs any load difference; without a session, least loaded.
            Policy::Session => Weights {
                session: 1e9,
                in_flight: 1.0,
                ..Weights::ZERO
            },
            Policy::RoundRobin => Weights::ZERO,
        }
    }
}

/// A pool's routing policy: the preset (which also picks the prefix source and rotation) and
/// the weights actually used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutePolicy {
    pub kind: Policy,
    pub weights: Weights,
    /// The longest a cold request yields to warm ones at a full pod ([`cold_yield`]; zero:
    /// never).
    pub cold_yield: std::time::Duration,
    /// Other agents route to the same pods at the same time (a cluster sharing its loads):
    /// under the prefix presets, near-ties go by this agent's own turn ([`rank`]). Set per
    /// request by the proxy, not by configuration.
    pub peers_route: bool,
}

impl From<Policy> for RoutePolicy {
    fn from(kind: Policy) -> Self {
        Self {
            kind,
            weights: kind.weights(),
            cold_yield: kind.cold_yield(),
            peers_route: false,
        }
    }
}

/// Endpoints a decision handles without allocating.
pub const INLINE: usize = 16;

/// A decision: endpoints best first (the rest are retry candidates) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub ranked: SmallVec<[EndpointId; INLINE]>,
    /// Matched prefix blocks on the chosen endpoint.
    pub prefix_blocks: usize,
    /// Where `prefix_blocks` came from.
    pub prefix_source: PrefixSource,
    /// The chosen endpoint's cost (seconds under the prefix presets) or rotation position.
    pub score: f64,
    /// The cost model's TTFT for the request on each of `ranked`, in the same order, seconds.
    pub predicted: SmallVec<[f64; INLINE]>,
    /// Each of `ranked`'s cost, in the same order (`score` is the first).
    pub costs: SmallVec<[f64; INLINE]>,
}

impl Decision {
    /// Predicted TTFT on the chosen endpoint, seconds.
    pub fn predicted_ttft(&self) -> f64 {
        self.predicted.first().copied().unwrap_or(0.0)
    }

    /// Moves `id` to the front (replication warming a new home), keeping the others' order.
    pub fn promote(&mut self, id: EndpointId) {
        if let Some(i) = self.ranked.iter().position(|&r| r == id) {
            self.ranked[..=i].rotate_right(1);
            self.predicted[..=i].rotate_right(1);
            self.costs[..=i].rotate_right(1);
            self.score = self.costs[0];
        }
    }

    /// Moves the endpoints `keep` accepts ahead of the rest, each group in its order.
    pub fn prefer(&mut self, keep: impl Fn(EndpointId) -> bool) {
        let mut rows: SmallVec<[(EndpointId, f64, f64); INLINE]> = (0..self.ranked.len())
            .map(|i| (self.ranked[i], self.predicted[i], self.costs[i]))
            .collect();
        // Stable: each group keeps its cost order.
        rows.sort_by_key(|r| !keep(r.0));
        self.ranked = rows.iter().map(|r| r.0).collect();
        self.predicted = rows.iter().map(|r| r.1).collect();
        self.costs = rows.iter().map(|r| r.2).collect();
        self.score = self.costs[0];
    }
}

/// The cost model's TTFT for the request on `c`, seconds ([`cost`]).
pub fn predict(ctx: &ScoreCtx<'_>, c: &Candidate) -> f64 {
    let uncached = (ctx.total_blocks - ctx.matched(c)) as f64;
    let t = c.timing;
    (uncached + c.queued_prefill_blocks as f64) * t.secs_per_block
        + f64::from(c.in_flight) * t.secs_per_running
        + t.base
        + c.kv.map_or(0.0, |k| k.wait())
}

/// The median of `values` (the mean of the middle two for an even count; 0 for none).
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: SmallVec<[f64; INLINE]> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Ranks candidates under `policy`. `rotation` is the round-robin cursor.
pub fn rank(
    policy: impl Into<RoutePolicy>,
    ctx: &RequestCtx,
    candidates: &[Candidate],
    rotation: &AtomicUsize,
) -> Option<Decision> {
    let policy = policy.into();
    // Pools rarely have more endpoints than fit inline: no allocation per decision.
    let live: SmallVec<[&Candidate; INLINE]> = candidates.iter().filter(|c| !c.excluded).collect();
    if live.is_empty() {
        return None;
    }
    let sctx = ScoreCtx {
        request: ctx,
        total_blocks: ctx.keys.len(),
    };
    let n = live.len();
    let mut costs: SmallVec<[f64; INLINE]> = smallvec::smallvec![0.0; n];
    // Seconds per block of the ranking (the prefix presets'; 0 for the others).
    let mut scale = 0.0;
    if policy.kind == Policy::RoundRobin {
        let start = rotation.fetch_add(1, Ordering::Relaxed);
        for (i, c) in costs.iter_mut().enumerate() {
            *c = ((i + n - start % n) % n) as f64;
        }
    } else {
        for (scorer, weight) in policy.weights.active() {
            scorer.add_costs(&sctx, &live, weight, &mut costs);
        }
        if matches!(policy.kind, Policy::Precise | Policy::Approximate) {
            // Blocks of prefill work -> seconds at the pool's median calibrated rate, plus the
            // median fixed part: the ranking is in seconds, but per-pod fits stay in the
            // prediction only. Measured (debug, --time-scale 1, four agents, the demo): ranking
            // by each pod's own rate and base, prefix hits fell from 88 % to 51 % and p90 TTFT
            // rose from 0.18 s to 6.0 s (a pod whose fit credits its TTFTs to queueing looks
            // nearly free to prefill on, and draws every cold prompt); with each pod's running
            // term too, 83 % and 0.36 s.
            scale = median(live.iter().map(|c| c.timing.secs_per_block));
            let base = median(live.iter().map(|c| c.timing.base));
            for cost in costs.iter_mut() {
                *cost = *cost * scale + base;
            }
        }
    }
    // Ties: fewer in flight, then a rotating offset so equal pods share the load.
    let offset = rotation.load(Ordering::Relaxed);
    let mut order: SmallVec<[usize; INLINE]> = (0..n).collect();
    order.sort_by(|&a, &b| {
        costs[a]
            .total_cmp(&costs[b])
            .then(live[a].in_flight.cmp(&live[b].in_flight))
            .then(((a + n - offset % n) % n).cmp(&((b + n - offset % n) % n)))
    });
    if policy.peers_route && scale > 0.0 {
        near_ties_by_turn(&policy, &sctx, &live, &costs, scale, offset, &mut order);
    }
    if policy.kind != Policy::RoundRobin {
        rotation.fetch_add(1, Ordering::Relaxed);
    }
    let best = order[0];
    Some(Decision {
        ranked: order.iter().map(|&i| live[i].id).collect(),
        prefix_blocks: sctx.matched(live[best]),
        prefix_source: live[best].prefix().1,
        score: costs[best],
        predicted: order.iter().map(|&i| predict(&sctx, live[i])).collect(),
        costs: order.iter().map(|&i| costs[i]).collect(),
    })
}

/// Where other agents route to the same pods, the pods within one request's load of the
/// cheapest that hold as much of the prompt go by this agent's turn (`offset`, its rotation:
/// random at its start, one step a decision), not by the smallest cost: moves the pick to
/// the front of `order`.
///
/// Every agent ranks the same fleet by the same figures, so two agents deciding within the
/// few milliseconds before they hear of each other's request pick the same cheapest pod, and
/// one prefill waits for the other (docs/benchmarks.md, "Off the design point": on the
/// no-sharing control, requests sent within 5 ms of another to its pod, 3-8 a run for three
/// agents, none for one central agent). One request's load is what the ranking charges for
/// one more request running there: `in-flight`, plus `stall` for the pick's uncached blocks
/// where the pick holds at least half the prompt (warm: a few blocks). So a pod a single
/// decoding request busier is a near-tie. A cold prompt's stall charge is not traded: sent
/// by turn to a pod serving warm traffic, its prefill stalls the warm requests that follow
/// it there, and they spill to a second copy of their prefix (docs/benchmarks.md, "Cold
/// prompts keep the stall charge in near-ties"). A pod holding less of the prompt, or with
/// more prefill queued or a longer wait for KV room than the cheapest, is never a near-tie.
/// An agent whose pool has never heard from a peer keeps the cheapest.
fn near_ties_by_turn(
    policy: &RoutePolicy,
    sctx: &ScoreCtx<'_>,
    live: &[&Candidate],
    costs: &[f64],
    scale: f64,
    offset: usize,
    order: &mut [usize],
) {
    let Some(&best) = order.first() else {
        return;
    };
    let (held, queued, waits) = (
        sctx.matched(live[best]),
        live[best].queued_prefill_blocks,
        kv_wait(live[best]),
    );
    // A cold prompt's stall charge is not traded (see above); a warm one's is small.
    let stall = if cold_yield::warm(held, sctx.total_blocks) {
        policy.weights.stall * sctx.request.stall_share.get() * sctx.expected_uncached(live[best])
    } else {
        0.0
    };
    let one_request = (policy.weights.in_flight + stall) * scale;
    let mut ties: SmallVec<[usize; INLINE]> = order
        .iter()
        .copied()
        // (A pod exactly one request busier is a near-tie, rounding aside.)
        .filter(|&i| {
            let c = live[i];
            costs[i] <= costs[best] + one_request * (1.0 + 1e-9)
                && sctx.matched(c) == held
                && c.queued_prefill_blocks <= queued
                && kv_wait(c) <= waits
        })
        .collect();
    if ties.len() < 2 {
        return;
    }
    // In the pool's own order: `order` already rotated exact ties by `offset`, and a second
    // rotation would undo it (2 x offset: with two tied pods, always the first).
    ties.sort_unstable();
    let pick = ties[offset % ties.len()];
    if let Some(at) = order.iter().position(|&i| i == pick) {
        order[..=at].rotate_right(1);
    }
}

/// The seconds a request would wait for KV room on `c` (0 without a figure).
fn kv_wait(c: &Candidate) -> f64 {
    c.kv.map_or(0.0, |k| k.wait())
}

#[cfg(test)]
mod tests;
