//! Choosing an endpoint for a request: candidates described by their prefix match and load,
//! combined by the pool's policy. Pure: no I/O, no index writes; the proxy records after the
//! pick.
//!
//! The prefix presets (precise, approximate) minimise a cost in **seconds**: the time to first
//! token the request is predicted to wait on that pod ([`cost`]), plus what its prefill does
//! to others there and the pull of the prefix's home:
//!
//! ```text
//! uncached     = prompt_blocks - matched_blocks(pod)
//! ttft(pod)    = (uncached + queued_prefill_blocks(pod)) x secs_per_block(pod)
//!              + in_flight(pod) x secs_per_running(pod) + base(pod)
//! cost(pod)    = ttft(pod)
//!              + uncached x in_flight(pod) x secs_per_block(pod)             (stall)
//!              + 2 x (prompt_blocks - history_blocks(pod)) x secs_per_block(pod) (home)
//!              + 4 x in_flight(pod) x secs_per_block(pod)                    (spread)
//! ```
//!
//! `secs_per_block`, `secs_per_running` and `base` are the pod's own, calibrated online from
//! the TTFTs it answered with (the proxy's `calibration`); every scorer's cost in blocks of
//! prefill work is turned into seconds at that pod's prefill rate, and a `--weight` scales
//! its term. The stall term is the charge for the batch a prefill joins: chunked prefill
//! shares every step with the pod's running requests, so each of them waits for the uncached
//! blocks too — a cold prompt goes where the fewest requests would wait for it, while a warm
//! one (few uncached blocks) keeps its affinity. The home term is the pull of a prefix's home
//! (where this proxy last sent it): when the prefix was evicted everywhere it returns there
//! instead of being duplicated into whichever cache is idlest. The spread term keeps cold
//! requests from piling onto one pod between scrapes (measured: docs/benchmarks.md).
//!
//! Affinity wins while the pod holding the prefix is not already busier than recomputing the
//! prefix elsewhere would be; so it can never pile requests onto an overloaded pod. A hot
//! prefix that outgrows its home is replicated deliberately instead of spilling request by
//! request ([`replication`]).
//!
//! A pod whose index is not trusted (unsure, stalled, no events yet, or a replica whose
//! owner cannot vouch for it) is scored by the approximate signal instead: `matched_blocks`
//! is replaced by its `history_blocks` (what was routed there recently: by this agent, and in
//! a cluster by its peers, whose placements it records), never counted as none. The decision
//! says which signal its pod's prefix came from ([`PrefixSource`]). The approximate policy is
//! the same rule with no index at all.

pub mod cost;
mod history;
pub mod replication;
pub mod scorers;
pub mod session;

use smallvec::SmallVec;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use cost::Timing;
pub use history::History;
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
/// presets each scorer's cost in blocks is turned into seconds at the pod's prefill rate, and
/// `queue` also weighs the pod's calibrated time per running request.
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
        ]
        .into_iter()
        .filter(|(_, w)| *w != 0.0)
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
            other => {
                return Err(format!(
                    "unknown scorer `{other}`: expected prefix, queue, kv-usage, lora, session, in-flight, history or stall"
                ));
            }
        };
        *slot = value;
        Ok(())
    }
}

/// Weight of the routing-history ("home") scorer in the precise preset: leaving a prefix's
/// home costs its blocks twice — the prefill now, and the blocks of other prefixes its new
/// copy evicts over there (recomputed later). Measured against 1 with four agents: p90 TTFT
/// 0.16-0.20 s vs 0.24 s, prefix hits 76-78 % vs 73-74 %; one agent 0.09-0.10 s vs
/// 0.12-0.13 s; nothing changes when nothing is shared (docs/benchmarks.md).
pub const HOME_WEIGHT: f64 = 2.0;
/// Blocks of prefill one request in flight is worth in the precise preset (measured: with 0,
/// precise trailed least-loaded's TTFT tail by 13-17 % when nothing is shared; with 4 it is
/// within 5 % on every figure and the shared-prefix tail shortened — docs/benchmarks.md).
pub const IN_FLIGHT_BLOCKS: f64 = 4.0;
/// Weight of the stall scorer (uncached blocks x requests in flight there) in the prefix
/// presets: a prefill delays each request sharing its batch steps by its own length
/// (measured: without it precise's end-to-end latency trailed least-loaded's by up to 10 %
/// when nothing is shared, and its shared-prefix TTFT p99 was 0.82 s instead of 0.21-0.50 s —
/// docs/benchmarks.md).
pub const STALL_WEIGHT: f64 = 1.0;

impl Policy {
    /// The scorer weights this policy starts from.
    pub fn weights(self) -> Weights {
        match self {
            // Cost in blocks: uncached prefill here + prefill queued here (+ an adapter load),
            // and the prompt's blocks again for leaving the pod a prefix was last sent to: when
            // its blocks were evicted everywhere, the prefix goes home instead of to whichever
            // pod is idlest, so it is not duplicated over every cache (thrashing under KV
            // pressure).
            // And a few blocks per request in flight there: running requests share every batch
            // step, so a pod busy decoding prefills more slowly; and the uncached blocks once
            // more per request in flight there, which this prefill would stall.
            Policy::Precise => Weights {
                prefix: 1.0,
                queue: 1.0,
                lora: 1.0,
                history: HOME_WEIGHT,
                in_flight: IN_FLIGHT_BLOCKS,
                stall: STALL_WEIGHT,
                ..Weights::ZERO
            },
            // The approximate policy's prefix signal *is* the history; its load terms are
            // precise's, so the two differ only in what they know of the caches.
            Policy::Approximate => Weights {
                prefix: 1.0,
                queue: 1.0,
                lora: 1.0,
                in_flight: IN_FLIGHT_BLOCKS,
                stall: STALL_WEIGHT,
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
}

impl From<Policy> for RoutePolicy {
    fn from(kind: Policy) -> Self {
        Self {
            kind,
            weights: kind.weights(),
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
            // Blocks of prefill work -> seconds on that pod, plus the rest of its TTFT.
            for (c, cost) in live.iter().zip(costs.iter_mut()) {
                let t = c.timing;
                *cost = *cost * t.secs_per_block
                    + policy.weights.queue * f64::from(c.in_flight) * t.secs_per_running
                    + t.base;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: usize, matched: usize, queued: u64, in_flight: u32) -> Candidate {
        Candidate {
            id: EndpointId(id),
            affinity: id as u64,
            matched_blocks: matched,
            prefix_trusted: true,
            in_flight,
            queued_prefill_blocks: queued,
            kv_usage: 0.0,
            history_blocks: 0,
            lora: LoraState::NotApplicable,
            excluded: false,
            timing: BlockTiming::default(),
        }
    }

    fn ctx(blocks: usize) -> RequestCtx {
        RequestCtx {
            keys: (0..blocks as u64).map(RouterKey).collect(),
            ..RequestCtx::default()
        }
    }

    #[test]
    fn precise_prefers_the_prefix_until_its_queue_costs_more() {
        let rr = AtomicUsize::new(0);
        let d = rank(
            Policy::Precise,
            &ctx(100),
            &[cand(0, 0, 0, 0), cand(1, 90, 0, 3)],
            &rr,
        )
        .unwrap();
        assert_eq!((d.ranked[0], d.prefix_blocks), (EndpointId(1), 90));
        // The holder has 200 blocks of prefill queued: recomputing 100 elsewhere is cheaper.
        let d = rank(
            Policy::Precise,
            &ctx(100),
            &[cand(0, 0, 0, 0), cand(1, 90, 200, 3)],
            &rr,
        )
        .unwrap();
        assert_eq!(d.ranked[0], EndpointId(0));
    }

    #[test]
    fn cold_prefills_avoid_stalling_busy_decoders_warm_ones_keep_affinity() {
        let rr = AtomicUsize::new(0);
        // A: six requests decoding, nothing queued; B: one request, 30 blocks queued.
        let busy = cand(0, 0, 0, 6);
        let queued = cand(1, 0, 30, 1);
        // Cold everywhere: 100 blocks of prefill would stall A's six decoders.
        let d = rank(
            Policy::Precise,
            &ctx(100),
            &[busy.clone(), queued.clone()],
            &rr,
        )
        .unwrap();
        assert_eq!(d.ranked[0], EndpointId(1));
        // Without the stall term the cheaper queue wins.
        let mut no_stall = RoutePolicy::from(Policy::Precise);
        no_stall.weights.stall = 0.0;
        let d = rank(no_stall, &ctx(100), &[busy.clone(), queued.clone()], &rr).unwrap();
        assert_eq!(d.ranked[0], EndpointId(0));
        // Warm on A: five uncached blocks stall little; affinity wins.
        let warm = cand(0, 95, 0, 6);
        let d = rank(Policy::Precise, &ctx(100), &[warm, queued], &rr).unwrap();
        assert_eq!((d.ranked[0], d.prefix_blocks), (EndpointId(0), 95));
    }

    #[test]
    fn an_untrusted_pod_is_scored_by_its_history_and_wins_over_a_cold_pod() {
        let rr = AtomicUsize::new(0);
        // Pod 1's index is unsure: whatever it says (90 blocks, maybe stale) is not used,
        // but this agent sent it 80 blocks of this prefix recently.
        let mut unsure = cand(1, 90, 0, 0);
        unsure.prefix_trusted = false;
        unsure.history_blocks = 80;
        let d = rank(
            Policy::Precise,
            &ctx(100),
            &[cand(0, 0, 0, 0), unsure.clone()],
            &rr,
        )
        .unwrap();
        assert_eq!(
            (d.ranked[0], d.prefix_blocks, d.prefix_source),
            (EndpointId(1), 80, PrefixSource::History)
        );
        // Cost: 20 uncached + 2 x 20 away from home, at the prior's 1.6 ms per block, + 20 ms
        // base; the cold pod: 100 + 2 x 100 blocks.
        assert!(
            (d.score - (60.0 * 0.0016 + 0.02)).abs() < 1e-12,
            "{}",
            d.score
        );
        // Level on history, a trusted pod holding more by its index wins (5 + 40), and
        // says its prefix is the index's.
        let mut warm = cand(0, 95, 0, 0);
        warm.history_blocks = 80;
        let d = rank(Policy::Precise, &ctx(100), &[warm, unsure], &rr).unwrap();
        assert_eq!(
            (d.ranked[0], d.prefix_blocks, d.prefix_source),
            (EndpointId(0), 95, PrefixSource::Index)
        );
    }

    #[test]
    fn untrusted_prefix_without_history_counts_as_no_match_and_excluded_are_skipped() {
        let rr = AtomicUsize::new(0);
        let mut unsure = cand(1, 90, 0, 0);
        unsure.prefix_trusted = false;
        let d = rank(
            Policy::Precise,
            &ctx(100),
            &[cand(0, 10, 0, 0), unsure],
            &rr,
        )
        .unwrap();
        assert_eq!(d.ranked[0], EndpointId(0));
        let mut gone = cand(0, 10, 0, 0);
        gone.excluded = true;
        let d = rank(Policy::Precise, &ctx(100), &[gone, cand(1, 0, 0, 0)], &rr).unwrap();
        assert_eq!(d.ranked.as_slice(), [EndpointId(1)]);
        let mut all = cand(0, 0, 0, 0);
        all.excluded = true;
        assert!(rank(Policy::Precise, &ctx(1), &[all], &rr).is_none());
    }

    #[test]
    fn cold_requests_spread_and_round_robin_rotates() {
        let rr = AtomicUsize::new(0);
        let cands = [cand(0, 0, 0, 0), cand(1, 0, 0, 0), cand(2, 0, 0, 0)];
        let firsts: Vec<_> = (0..3)
            .map(|_| rank(Policy::Precise, &ctx(4), &cands, &rr).unwrap().ranked[0])
            .collect();
        assert_eq!(
            firsts
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
            3,
            "ties rotate"
        );
        let rr = AtomicUsize::new(0);
        let firsts: Vec<_> = (0..3)
            .map(|_| {
                rank(Policy::RoundRobin, &ctx(4), &cands, &rr)
                    .unwrap()
                    .ranked[0]
                    .0
            })
            .collect();
        assert_eq!(firsts, vec![0, 1, 2]);
        let d = rank(
            Policy::LeastLoaded,
            &ctx(4),
            &[cand(0, 0, 0, 5), cand(1, 0, 0, 1)],
            &rr,
        )
        .unwrap();
        assert_eq!(d.ranked[0], EndpointId(1));
    }

    #[test]
    fn session_is_sticky() {
        let rr = AtomicUsize::new(0);
        let cands = [cand(0, 0, 0, 0), cand(1, 0, 0, 0), cand(2, 0, 0, 0)];
        let c = RequestCtx {
            session: Some("user-42".into()),
            ..RequestCtx::default()
        };
        let a = rank(Policy::Session, &c, &cands, &rr).unwrap().ranked[0];
        let b = rank(Policy::Session, &c, &cands, &rr).unwrap().ranked[0];
        assert_eq!(a, b);
        // Rendezvous: removing another pod never moves this session.
        let others: Vec<Candidate> = cands
            .iter()
            .map(|x| Candidate {
                excluded: x.id != a && x.id.0 == (a.0 + 1) % 3,
                ..x.clone()
            })
            .collect();
        assert_eq!(
            rank(Policy::Session, &c, &others, &rr).unwrap().ranked[0],
            a
        );
        // Many sessions spread over all pods.
        let owners: std::collections::HashSet<_> = (0..64)
            .map(|i| {
                let c = RequestCtx {
                    session: Some(format!("user-{i}")),
                    ..RequestCtx::default()
                };
                rank(Policy::Session, &c, &cands, &rr).unwrap().ranked[0]
            })
            .collect();
        assert_eq!(owners.len(), 3);
    }

    #[test]
    fn kv_usage_and_lora_weights_move_the_pick() {
        let rr = AtomicUsize::new(0);
        let mut full = cand(0, 0, 0, 0);
        full.kv_usage = 0.95;
        let empty = cand(1, 0, 0, 1);
        // Precise ignores KV usage by default: the pod with nothing in flight wins.
        assert_eq!(
            rank(
                Policy::Precise,
                &ctx(10),
                &[full.clone(), empty.clone()],
                &rr
            )
            .unwrap()
            .ranked[0],
            EndpointId(0)
        );
        let mut w = Policy::Precise.weights();
        // A nearly full cache (19 blocks at weight 2) outweighs one request in flight
        // (4 + 10 blocks it would stall).
        w.set("kv-usage", 2.0).unwrap();
        let p = RoutePolicy {
            kind: Policy::Precise,
            weights: w,
        };
        assert_eq!(
            rank(p, &ctx(10), &[full, empty], &rr).unwrap().ranked[0],
            EndpointId(1)
        );
        // A pod with the adapter loaded wins over one that must load it, unless its queue
        // costs more than the load.
        let mut loaded = cand(0, 0, 10, 0);
        loaded.lora = LoraState::Loaded;
        let mut missing = cand(1, 0, 0, 0);
        missing.lora = LoraState::NotLoaded;
        assert_eq!(
            rank(
                Policy::Precise,
                &ctx(10),
                &[loaded.clone(), missing.clone()],
                &rr
            )
            .unwrap()
            .ranked[0],
            EndpointId(0)
        );
        loaded.queued_prefill_blocks = 100;
        assert_eq!(
            rank(Policy::Precise, &ctx(10), &[loaded, missing], &rr)
                .unwrap()
                .ranked[0],
            EndpointId(1)
        );
    }

    #[test]
    fn an_evicted_prefix_goes_home_unless_home_is_too_busy() {
        let rr = AtomicUsize::new(0);
        // Nobody holds the prefix any more; pod 1 served it last.
        let idle = cand(0, 0, 0, 0);
        let first = |home_queued: u64| {
            let mut home = cand(1, 0, home_queued, 0);
            home.history_blocks = 100;
            rank(Policy::Precise, &ctx(100), &[idle.clone(), home], &rr)
                .unwrap()
                .ranked[0]
        };
        assert_eq!(
            first(10),
            EndpointId(1),
            "10 queued blocks < the 200-block pull of home"
        );
        assert_eq!(
            first(190),
            EndpointId(1),
            "190 queued blocks do not outweigh it"
        );
        assert_eq!(first(230), EndpointId(0), "230 queued blocks outweigh it");
    }

    #[test]
    fn the_cost_is_predicted_seconds_on_each_pods_own_calibration() {
        let rr = AtomicUsize::new(0);
        // Both cold for a 100-block prompt. Pod 0 prefills 16k tokens/s (1 ms per 16-token
        // block), pod 1 4k tokens/s (4 ms per block) but has nothing running.
        let mut fast = cand(0, 0, 20, 2);
        fast.timing = BlockTiming {
            secs_per_block: 0.001,
            secs_per_running: 0.005,
            base: 0.01,
        };
        let mut slow = cand(1, 0, 0, 0);
        slow.timing = BlockTiming {
            secs_per_block: 0.004,
            secs_per_running: 0.005,
            base: 0.01,
        };
        let d = rank(Policy::Precise, &ctx(100), &[fast, slow], &rr).unwrap();
        // Fast: (100 + 20) x 1 ms + 2 x 5 ms + 10 ms = 140 ms predicted; its cost adds the
        // stall (100 x 2 x 1 ms), home (2 x 100 x 1 ms) and spread (4 x 2 x 1 ms): 548 ms.
        // Slow: 100 x 4 ms + 10 ms = 410 ms; + home 800 ms = 1,210 ms.
        assert_eq!(d.ranked[0], EndpointId(0));
        assert!((d.predicted_ttft() - 0.140).abs() < 1e-12);
        assert!((d.predicted[1] - 0.410).abs() < 1e-12);
        assert!((d.score - 0.548).abs() < 1e-12, "{}", d.score);
        // Replication moving the slow pod first keeps each row's figures with its pod.
        let mut moved = d.clone();
        moved.promote(EndpointId(1));
        assert_eq!(moved.ranked.as_slice(), [EndpointId(1), EndpointId(0)]);
        assert!((moved.predicted_ttft() - 0.410).abs() < 1e-12);
        assert!((moved.score - 1.210).abs() < 1e-12);
        moved.prefer(|id| id == EndpointId(0));
        assert_eq!(moved, d);
    }

    #[test]
    fn weights_are_validated_by_name() {
        let mut w = Weights::default();
        assert!(w.set("in_flight", 2.0).is_ok());
        assert_eq!(w.in_flight, 2.0);
        assert!(w.set("prefix", -1.0).unwrap_err().contains(">= 0"));
        assert!(w.set("magic", 1.0).unwrap_err().contains("unknown scorer"));
    }
}
