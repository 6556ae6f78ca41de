//! The scorers a pool's policy combines, one per signal. Each adds a cost in **blocks of
//! prefill work** (lower is better) per live candidate; the picker sums `weight x cost`.
//! Pure functions of the request and the candidates: no I/O, no metrics, no index writes.
//!
//! | scorer | cost per candidate |
//! |---|---|
//! | `prefix` | uncached prompt blocks: `prompt_blocks - matched_blocks` (untrusted index: `history_blocks` instead) |
//! | `queue` | prefill blocks already queued there (own in-flight work + engine waiting x mean) |
//! | `kv_usage` | `kv_cache_usage x prompt_blocks`: a full cache costs a full recompute |
//! | `lora` | adapter not loaded: 64 blocks; waiting to load: 16; loaded or no adapter: 0 |
//! | `session` | 1 unless the candidate is the session's rendezvous-hash owner |
//! | `in_flight` | requests in flight there |
//! | `stall` | `expected_uncached x in_flight`, times the pool's [`StallShare`]: the requests this prefill would stall |
//! | `history` | prompt blocks this proxy did not route there recently (`prompt_blocks - history_blocks`): the pull of a prefix's home |
//! | `kv_room` | the seconds it would wait there for free KV blocks ([`super::KvRoom`]), as blocks of prefill at the pool's median rate |
//! | `evict` | blocks of other reused prefixes its new blocks would evict there ([`super::KvRoom::evicted`]): each is prefilled again when its prefix returns |

use super::{Candidate, LoraState, RequestCtx};

/// Blocks of prefill an adapter load is worth (vLLM swaps adapters between steps; a missing
/// one delays the request by roughly this much work).
pub const LORA_LOAD_BLOCKS: f64 = 64.0;
/// An adapter already queued for loading there costs less.
pub const LORA_QUEUED_BLOCKS: f64 = 16.0;

/// Everything a scorer sees.
#[derive(Debug)]
pub struct ScoreCtx<'a> {
    pub request: &'a RequestCtx,
    /// Prompt length in blocks.
    pub total_blocks: usize,
}

impl ScoreCtx<'_> {
    /// Blocks of `c`'s prefix that may be used: the index's match when trusted, else the
    /// routing history's ([`Candidate::prefix`]).
    pub fn matched(&self, c: &Candidate) -> usize {
        c.prefix().0.min(self.total_blocks)
    }

    /// The share of `c`'s prefix expected to survive until it prefills this request: the
    /// pool's survival at the TTFT predicted there ([`super::Survival`]).
    pub fn survival(&self, c: &Candidate) -> f64 {
        self.request.survival.at(super::predict(self, c))
    }

    /// The blocks `c` is expected to prefill for this request: the prompt's, less the
    /// matched prefix's share that survives to prefill.
    pub fn expected_uncached(&self, c: &Candidate) -> f64 {
        self.total_blocks as f64 - self.survival(c) * self.matched(c) as f64
    }
}

/// One signal, turned into a cost per candidate.
pub trait Scorer: std::fmt::Debug + Send + Sync {
    fn name(&self) -> &'static str;
    /// Adds `weight x cost` for each of `live` into `costs` (same order).
    fn add_costs(&self, ctx: &ScoreCtx<'_>, live: &[&Candidate], weight: f64, costs: &mut [f64]);
}

#[derive(Debug)]
pub struct Prefix;
#[derive(Debug)]
pub struct Queue;
#[derive(Debug)]
pub struct KvUsage;
#[derive(Debug)]
pub struct Lora;
#[derive(Debug)]
pub struct Session;
#[derive(Debug)]
pub struct InFlight;
#[derive(Debug)]
pub struct Home;
#[derive(Debug)]
pub struct Stall;
#[derive(Debug)]
pub struct KvRoomWait;
#[derive(Debug)]
pub struct Evict;

impl Scorer for Evict {
    fn name(&self) -> &'static str {
        "evict"
    }
    fn add_costs(&self, ctx: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        let total = ctx.total_blocks as u64;
        for (c, cost) in live.iter().zip(costs) {
            if let Some(k) = c.kv {
                *cost += w * k.evicted(ctx.matched(c) as u64, total) as f64;
            }
        }
    }
}

impl Scorer for KvRoomWait {
    fn name(&self) -> &'static str {
        "kv_room"
    }
    /// The wait for KV room ([`super::KvRoom::wait`]), in blocks of prefill at the pool's
    /// median rate, the rate [`super::rank`] turns blocks back into seconds at: the cost
    /// gains exactly the wait, however each pod's own fit stands.
    fn add_costs(&self, _: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        let scale = super::median(live.iter().map(|c| c.timing.secs_per_block)).max(1e-9);
        for (c, cost) in live.iter().zip(costs) {
            if let Some(k) = c.kv {
                *cost += w * k.wait() / scale;
            }
        }
    }
}

impl Scorer for Stall {
    fn name(&self) -> &'static str {
        "stall"
    }
    fn add_costs(&self, ctx: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        let w = w * ctx.request.stall_share.get();
        for (c, cost) in live.iter().zip(costs) {
            *cost += w * ctx.expected_uncached(c) * f64::from(c.in_flight);
        }
    }
}

/// How much of the stall charge ([`Stall`]) a request pays: the pool's recent warm share
/// over [`STALL_WARM_SHARE`], capped at 1; the whole charge before the pool has seen a keyed
/// request. A fresh pool's first requests find every cache empty, so its share starts low
/// and the charge with it, until a quarter of the requests seen were warm.
///
/// The charge keeps a cold prefill off a pod whose running requests it would delay, which
/// is worth a time to first token where what waits behind it is warm work that pod serves
/// at once (measured: with none, new agentic sessions piled onto busy pods;
/// docs/benchmarks.md, "The stall charge"). Where nothing is warm every pod's next prompt
/// is a whole prefill anyway, and the charge only outbids the prefill already queued: on
/// the no-sharing control the central agent sent a prompt to a busy pod while another was
/// idle 57-97 times in 600, for a few more requests running on the idle one, where a
/// running request adds about 0.2 ms to a prefill; 18-44 times without the charge
/// (docs/benchmarks.md, "The stall charge where nothing is warm").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StallShare(f64);

/// The warm share from which a request pays the whole stall charge: the share from which a
/// cold request yields to warm ones ([`super::cold_yield::MIN_WARM_SHARE`]).
pub const STALL_WARM_SHARE: f64 = super::cold_yield::MIN_WARM_SHARE;

impl Default for StallShare {
    fn default() -> Self {
        Self(1.0)
    }
}

impl StallShare {
    /// From the pool's warm share, 0-1 (`crate::pool::WarmShare`; `None` before the pool has
    /// seen a keyed request).
    pub fn of(warm_share: Option<f64>) -> Self {
        match warm_share {
            Some(share) if share.is_finite() => Self((share / STALL_WARM_SHARE).clamp(0.0, 1.0)),
            _ => Self::default(),
        }
    }

    /// The share, 0-1.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl Scorer for Home {
    fn name(&self) -> &'static str {
        "history"
    }
    fn add_costs(&self, ctx: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        // Leaving home costs what would have survived there (its prefill now, and the
        // blocks of other prefixes a new copy evicts elsewhere): nothing, where nothing
        // survives. Survival is read at each candidate's own predicted wait, as the other
        // prefix terms read it.
        for (c, cost) in live.iter().zip(costs) {
            let away = (ctx.total_blocks - c.history_blocks.min(ctx.total_blocks)) as f64;
            *cost += w * ctx.survival(c) * away;
        }
    }
}

impl Scorer for Prefix {
    fn name(&self) -> &'static str {
        "prefix"
    }
    fn add_costs(&self, ctx: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        for (c, cost) in live.iter().zip(costs) {
            *cost += w * ctx.expected_uncached(c);
        }
    }
}

impl Scorer for Queue {
    fn name(&self) -> &'static str {
        "queue"
    }
    fn add_costs(&self, _: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        for (c, cost) in live.iter().zip(costs) {
            *cost += w * c.queued_prefill_blocks as f64;
        }
    }
}

impl Scorer for KvUsage {
    fn name(&self) -> &'static str {
        "kv_usage"
    }
    fn add_costs(&self, ctx: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        let blocks = ctx.total_blocks.max(1) as f64;
        for (c, cost) in live.iter().zip(costs) {
            *cost += w * c.kv_usage.clamp(0.0, 1.0) * blocks;
        }
    }
}

impl Scorer for Lora {
    fn name(&self) -> &'static str {
        "lora"
    }
    fn add_costs(&self, _: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        for (c, cost) in live.iter().zip(costs) {
            *cost += w * match c.lora {
                LoraState::NotLoaded => LORA_LOAD_BLOCKS,
                LoraState::Queued => LORA_QUEUED_BLOCKS,
                LoraState::Loaded | LoraState::NotApplicable => 0.0,
            };
        }
    }
}

impl Scorer for Session {
    fn name(&self) -> &'static str {
        "session"
    }
    /// Rendezvous hashing: the live candidate with the highest hash of (session, endpoint)
    /// owns the session, so a pod leaving moves only its own sessions.
    fn add_costs(&self, ctx: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        let Some(session) = &ctx.request.session else {
            return;
        };
        let seed = xxhash_rust::xxh3::xxh3_64(session.as_bytes());
        let owner = live
            .iter()
            .enumerate()
            .max_by_key(|(_, c)| {
                xxhash_rust::xxh3::xxh3_64_with_seed(&c.affinity.to_le_bytes(), seed)
            })
            .map(|(i, _)| i);
        for (i, cost) in costs.iter_mut().enumerate() {
            if Some(i) != owner {
                *cost += w;
            }
        }
    }
}

impl Scorer for InFlight {
    fn name(&self) -> &'static str {
        "in_flight"
    }
    fn add_costs(&self, _: &ScoreCtx<'_>, live: &[&Candidate], w: f64, costs: &mut [f64]) {
        for (c, cost) in live.iter().zip(costs) {
            *cost += w * f64::from(c.in_flight);
        }
    }
}
