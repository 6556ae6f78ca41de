//! Cold requests yield to warm ones at a full pod.
//!
//! An engine admits its waiting requests first come, first served, and only while it has
//! free KV blocks for the one at the head: a cold prompt at the head holds back every
//! request behind it, the warm ones included, until blocks free; and when it is admitted its
//! blocks are taken from the cache's least recently used, which are the contexts that other
//! sessions' next turns are about to ask for. So when the pod a request was ranked to has no
//! KV room for it ([`super::KvRoom::wait`] above 0), it brings mostly new blocks (its pick
//! holds less than half its prompt) and the pool's traffic reuses its cache (a quarter or
//! more of its recent requests were warm at their pick), the proxy holds it back for up to
//! the policy's `cold_yield` and ranks it again whenever room may have freed (a request ends
//! there, a peer agent reports one of its own ended there, a scrape changes the picture),
//! sending it as soon as its pick has room. A warm request is never held: it needs few
//! blocks and its prefix is worth most while it is still cached. Where nothing is reused, a
//! yield would only delay the cold request (measured on the no-sharing control).
//!
//! The held request waits at the router instead of at the head of an engine's queue; when
//! it goes, the ranking sees the pods as they are then (late binding). The bound keeps cold
//! prompts from starving: at worst one waits `cold_yield` more than it would have.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use serde::Serialize;

use super::{Candidate, Decision, Policy};

/// The longest a cold request yields under the prefix presets (docs/benchmarks.md, "Cold
/// requests yield" and "Every agent yields"): a request that waits the whole bound and then
/// queues at the engine is the tail, so the bound is the trade between chat's p50 at the
/// ladder's saturation and its p99. With every agent yielding, 500 ms put chat's p99 at the
/// ladder's 0.8x at 1.17-1.46x the peer's (two seed sets, four agents and central) where
/// 300 ms gave 0.93-1.22x, the p50 within 5 ms; at 1,000 ms the p99 rose by the bound. At
/// 300 ms most of chat's slowest answers at 0.8x had yielded the whole bound and then queued
/// at the engine as long again; 150 ms took that p99 down in all six rows of three seed
/// sets (5-23 %) while chat's p50 at 1.0x rose 1-8 ms: at most 0.96x vllm-router
/// kv_aware's, but 1.14-1.21x sglang-router's on the matrix's seeds in one run, 1.01-1.04x
/// the best peer's in the next (docs/benchmarks.md, "The cold yield's bound", "The matrix
/// of record on the 150 ms bound").
pub const DEFAULT_COLD_YIELD: Duration = Duration::from_millis(150);

/// The most a policy may set: a request held longer than this is better refused.
pub const MAX_COLD_YIELD: Duration = Duration::from_secs(10);

/// A policy's `coldYieldMs` for preset `kind`, checked: at most [`MAX_COLD_YIELD`], and above
/// 0 only under the presets that know each pod's KV room (precise, approximate).
pub fn check(kind: Policy, ms: u64) -> Result<Duration, String> {
    let d = Duration::from_millis(ms);
    if d > MAX_COLD_YIELD {
        return Err(format!(
            "{ms} ms: at most {} ms (a request held longer is better refused)",
            MAX_COLD_YIELD.as_millis()
        ));
    }
    if ms > 0 && !kind.prices_kv_room() {
        // The preset as the flag and the configuration spell it.
        let name = clap::ValueEnum::to_possible_value(&kind)
            .map_or_else(|| format!("{kind:?}"), |v| v.get_name().to_string());
        return Err(format!(
            "{ms} ms with preset {}: only presets precise and approximate know each pod's KV room, which a cold request yields for; use 0 or one of those",
            name
        ));
    }
    Ok(d)
}

/// The share of a pool's recent requests that must have been warm at their pick for a cold
/// one to yield: below it there is little cached worth protecting, and a yield only delays
/// (on the matrix's no-sharing control, where the share is 0, yielding cost the p90 at the
/// fleet's saturation 26-38 %; its shared workloads run at 0.5-0.8).
pub const MIN_WARM_SHARE: f64 = 0.25;

/// Whether the request whose `decision` was made over `candidates` (its prompt `blocks`
/// long) yields before it is sent: its pick has no KV room for it, holds less than half its
/// prompt, and at least [`MIN_WARM_SHARE`] of the pool's recent requests were warm
/// (`warm_share`). A request without keys (`blocks` 0) never yields.
pub fn yields(
    decision: &Decision,
    candidates: &[Candidate],
    blocks: usize,
    warm_share: f64,
) -> bool {
    let Some(pick) = decision.ranked.first().and_then(|id| candidates.get(id.0)) else {
        return false;
    };
    let full = pick.kv.is_some_and(|k| k.wait() > 0.0);
    let cold = blocks > 0 && !warm(decision.prefix_blocks, blocks);
    full && cold && warm_share >= MIN_WARM_SHARE
}

/// Whether a request that holds `prefix_blocks` of its `blocks` at its pick counts as warm
/// there (the ones a cold request yields to).
pub fn warm(prefix_blocks: usize, blocks: usize) -> bool {
    blocks > 0 && prefix_blocks.saturating_mul(2) >= blocks
}

/// A pool's yield counters.
#[derive(Debug, Default)]
pub struct ColdYields {
    requests: AtomicU64,
    at_bound: AtomicU64,
    micros: AtomicU64,
}

/// What `/status` shows of them (`pools[].cold_yields`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct ColdYieldStatus {
    /// Requests that yielded.
    pub requests: u64,
    /// Of those, the ones sent when the bound passed, still without room.
    pub at_bound: u64,
    /// Seconds yielded, all requests together.
    pub seconds: f64,
}

impl ColdYields {
    pub fn note(&self, waited: Duration, at_bound: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.at_bound
            .fetch_add(u64::from(at_bound), Ordering::Relaxed);
        self.micros.fetch_add(
            u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub fn status(&self) -> ColdYieldStatus {
        ColdYieldStatus {
            requests: self.requests.load(Ordering::Relaxed),
            at_bound: self.at_bound.load(Ordering::Relaxed),
            seconds: self.micros.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::routing::{BlockTiming, EndpointId, KvRoom, LoraState, RequestCtx, rank};

    /// A pod of 100 KV blocks, `pinned` of them held by requests in flight, holding the
    /// request's first `matched` blocks, idle otherwise.
    fn pod(id: usize, matched: usize, pinned: u64, new_blocks: u64) -> Candidate {
        Candidate {
            id: EndpointId(id),
            affinity: id as u64,
            matched_blocks: matched,
            prefix_trusted: true,
            in_flight: 0,
            queued_prefill_blocks: 0,
            kv_usage: 0.0,
            history_blocks: 0,
            lora: LoraState::NotApplicable,
            excluded: false,
            timing: BlockTiming::default(),
            kv: Some(KvRoom {
                capacity: 100,
                pinned,
                new_blocks,
                lifetime: 1.0,
                resident: 0,
                output: 0,
            }),
            idle_for: std::time::Duration::ZERO,
        }
    }

    /// Half the pool's recent requests were warm at their pick.
    const SHARED: f64 = 0.5;

    fn decide(candidates: &[Candidate], blocks: usize) -> Decision {
        let ctx = RequestCtx {
            keys: (1..=blocks as u64)
                .map(crate::kv_index::RouterKey)
                .collect(),
            ..RequestCtx::default()
        };
        rank(Policy::Precise, &ctx, candidates, &AtomicUsize::new(0)).expect("a live pod")
    }

    #[test]
    fn a_cold_request_yields_only_where_its_pick_has_no_room() {
        // 40 new blocks (prompt and output) on pods with 90 blocks pinned: no room anywhere.
        let full = [pod(0, 0, 90, 40), pod(1, 0, 90, 40)];
        let d = decide(&full, 32);
        assert_eq!(d.prefix_blocks, 0);
        assert!(yields(&d, &full, 32, SHARED), "cold, and its pick is full");
        // Where few recent requests were warm, there is little cached to protect.
        assert!(!yields(&d, &full, 32, 0.0));
        assert!(!yields(&d, &full, 32, MIN_WARM_SHARE - 0.01));
        assert!(yields(&d, &full, 32, MIN_WARM_SHARE));
        // One pod has room: the ranking picks it (its KV wait is 0) and nothing waits.
        let roomy = [pod(0, 0, 90, 40), pod(1, 0, 10, 40)];
        let d = decide(&roomy, 32);
        assert_eq!(d.ranked[0], EndpointId(1));
        assert!(!yields(&d, &roomy, 32, SHARED));
    }

    #[test]
    fn a_warm_request_never_yields() {
        // Its pick holds 24 of its 32 blocks: 8 new prompt blocks and 2 of output still do
        // not fit (95 pinned of 100), but it goes at once.
        let held = [pod(0, 24, 95, 10), pod(1, 0, 95, 34)];
        let d = decide(&held, 32);
        assert_eq!((d.ranked[0], d.prefix_blocks), (EndpointId(0), 24));
        assert!(!yields(&d, &held, 32, SHARED));
        // Holding exactly half is warm; less than half is cold.
        assert!(warm(16, 32) && !warm(15, 32) && !warm(0, 0));
        let half = [pod(0, 16, 95, 20)];
        assert!(!yields(&decide(&half, 32), &half, 32, SHARED));
        let less = [pod(0, 15, 95, 21)];
        assert!(yields(&decide(&less, 32), &less, 32, SHARED));
    }

    #[test]
    fn a_bound_is_checked_against_its_preset() {
        assert_eq!(check(Policy::Precise, 750), Ok(Duration::from_millis(750)));
        assert_eq!(check(Policy::Approximate, 10_000), Ok(MAX_COLD_YIELD));
        assert_eq!(check(Policy::LeastLoaded, 0), Ok(Duration::ZERO));
        let long = check(Policy::Precise, 10_001).unwrap_err();
        assert!(long.contains("at most 10000 ms"), "{long}");
        let blind = check(Policy::Session, 500).unwrap_err();
        assert!(blind.contains("precise and approximate"), "{blind}");
    }

    #[test]
    fn requests_without_keys_or_room_figures_never_yield() {
        let full = [pod(0, 0, 100, 10)];
        assert!(
            !yields(&decide(&full, 0), &full, 0, SHARED),
            "no keys: no size known"
        );
        // An engine that does not report its cache size has no KV room figure.
        let unknown = [Candidate {
            kv: None,
            ..pod(0, 0, 0, 0)
        }];
        assert!(!yields(&decide(&unknown, 32), &unknown, 32, SHARED));
    }
}
