//! Step 4 of a request: its candidates, the scorers' input. Each endpoint of the pool with
//! what the KV index and the routing history say it holds of the request's prefix, whether
//! the index may be trusted for it, and its live load; scoring and the pick are
//! [`crate::routing::rank`]'s, which scores a pod whose index is not trusted (unsure,
//! stalled, waiting, a replica its owner cannot vouch for) by its history instead. The
//! approximate policy reads no index: every pod is scored by its history.
//! The route receipt's `available` figure is read from them too ([`available_blocks`]), and
//! each carries its pod's calibrated TTFT coefficients ([`super::calibration`]).

use std::sync::Arc;

use smallvec::SmallVec;

use super::pools::PoolRuntime;
use crate::{
    kv_index::KvIndex,
    pool::Endpoint,
    routing::{self, BlockTiming, Candidate, EndpointId, KvRoom, Policy, RequestCtx},
};

/// The candidates, on the stack for pools of up to `routing::INLINE` endpoints.
pub type Candidates = SmallVec<[Candidate; routing::INLINE]>;

/// The pool's `endpoints` (one snapshot of its members: candidate `i` is `endpoints[i]`) as
/// candidates for `ctx` under `policy` (whose preset picks the prefix source). An endpoint
/// that is not routable (pending its first metrics answer, or draining) is excluded.
pub fn candidates(
    index: &KvIndex,
    runtime: &PoolRuntime,
    endpoints: &[Arc<Endpoint>],
    ctx: &RequestCtx,
    policy: Policy,
) -> Candidates {
    let pool = &runtime.pool;
    let history = pool.history.lookup(&ctx.keys);
    let approximate = policy == Policy::Approximate;
    let prefix_preset = policy.prices_kv_room();
    // Each request's expected output, in blocks, and how long requests hold their KV.
    let output_blocks = runtime.calibration.output_blocks(pool.block_size);
    let lifetime = runtime.calibration.lifetime();
    let now = std::time::Instant::now();
    let mut matches = Vec::new();
    if !approximate {
        index.lookup(&ctx.keys, &mut matches);
    }
    // Each pod's resident blocks as last recounted (`super::recount_loop`), read once (the
    // lock is not held while building).
    let resident: SmallVec<[u64; routing::INLINE]> = if prefix_preset {
        let r = runtime.resident.lock();
        endpoints
            .iter()
            .map(|e| e.source.map_or(0, |s| r.blocks(s)))
            .collect()
    } else {
        SmallVec::new()
    };
    endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let source = e.source;
            let history_blocks = history
                .iter()
                .find(|(s, _)| *s == e.history)
                .map_or(0, |(_, b)| *b);
            let (matched_blocks, prefix_trusted) = match approximate {
                true => (0, false),
                false => (
                    source
                        .and_then(|s| matches.iter().find(|m| m.source == s.0))
                        .map_or(0, |m| m.blocks),
                    source.is_some_and(|s| index.trusted(s)),
                ),
            };
            let timing = BlockTiming::new(runtime.calibration.timing(e.serial), pool.block_size);
            Candidate {
                id: EndpointId(i),
                affinity: e.affinity,
                matched_blocks,
                prefix_trusted,
                // Under the prefix presets, also the requests it did not send: peers'
                // placements and what the engine reports beyond its own. Each agent then
                // weighs a pod's batch as one central agent would.
                in_flight: pool.in_flight(e, prefix_preset),
                // Less what the engine has most likely prefilled of it by now (`pool::prefill`).
                queued_prefill_blocks: pool.work_ahead(
                    e,
                    prefix_preset,
                    timing.secs_per_block,
                    now,
                ),
                kv_usage: e.kv_usage(),
                history_blocks,
                lora: e.lora_state(ctx.lora.as_deref()),
                // A LoRA request only goes where the adapter is served; nothing goes where
                // membership says not to.
                excluded: !e.routable() || ctx.lora.as_deref().is_some_and(|l| !e.serves(l)),
                timing,
                // Only the prefix presets price it (and predict with it).
                kv: prefix_preset
                    .then(|| e.kv_room(&ctx.keys))
                    .flatten()
                    .map(|r| KvRoom {
                        capacity: r.capacity,
                        pinned: r.pinned,
                        new_blocks: (ctx.keys.len() as u64 - r.shared)
                            .saturating_add(output_blocks),
                        lifetime,
                        resident: resident.get(i).copied().unwrap_or(0),
                        output: output_blocks,
                    }),
                idle_for: e.idle_for(now),
            }
        })
        .collect()
}

/// The longest prefix, in blocks, that any live candidate holds by the signal it is scored
/// by (its trusted index, else its routing history), at most the request's `blocks`: the
/// route receipt's `available` figure, counted as [`crate::routing::rank`] counts the chosen
/// pod's (`Decision::prefix_blocks`).
pub fn available_blocks(candidates: &[Candidate], blocks: usize) -> usize {
    candidates
        .iter()
        .filter(|c| !c.excluded)
        .map(|c| c.prefix().0.min(blocks))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
pub(super) mod tests {
    use std::{sync::atomic::AtomicUsize, time::Instant};

    use super::*;
    use crate::{
        kv_index::{IndexConfig, RouterKey, SourceInfo, wire::Batch},
        pool::Pool,
        proxy::{Proxy, TokenSource},
        routing::{PrefixSource, SessionSource, rank},
        telemetry::{Telemetry, TelemetryConfig},
    };

    /// A precise pool of two pods (`a:1`, `b:1`) with their own index sources.
    pub(in crate::proxy) fn proxy() -> Proxy {
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let source = |pod: &str| {
            index.add_source(SourceInfo {
                pod: pod.into(),
                rank: None,
            })
        };
        let endpoints = vec![
            ("a:1".to_string(), Some(source("a:1"))),
            ("b:1".to_string(), Some(source("b:1"))),
        ];
        let telemetry = Arc::new(Telemetry::new(&TelemetryConfig::default()).expect("telemetry"));
        let mut proxy = Proxy::new(index, telemetry, Default::default());
        let pool = Pool::new("m".into(), 16, Policy::Precise, endpoints);
        proxy.add_pool(
            "p",
            pool,
            TokenSource::Approximate,
            SessionSource::default(),
        );
        proxy
    }

    /// Ranks the request as `forward` does and records the pick as it does (speculative
    /// index entries, routing history); returns the pick and its prefix.
    fn route(proxy: &Proxy, ctx: &RequestCtx) -> (usize, usize, PrefixSource) {
        let runtime = &proxy.pools[0];
        let endpoints = runtime.pool.endpoints();
        let c = candidates(&proxy.index, runtime, &endpoints, ctx, Policy::Precise);
        let d = rank(Policy::Precise, ctx, &c, &AtomicUsize::new(0)).expect("a live pod");
        let e = &endpoints[d.ranked[0].0];
        let now = Instant::now();
        proxy
            .index
            .speculate(e.source.expect("sourced"), &ctx.keys, now);
        runtime.pool.history.record(e.history, &ctx.keys, now);
        (d.ranked[0].0, d.prefix_blocks, d.prefix_source)
    }

    #[test]
    fn a_pod_whose_source_turned_unsure_keeps_its_prefix_by_history() {
        let proxy = proxy();
        let ctx = RequestCtx {
            keys: (1..=32).map(RouterKey).collect(),
            ..RequestCtx::default()
        };
        let sources: Vec<_> = proxy.pools[0]
            .pool
            .endpoints()
            .iter()
            .map(|e| e.source.expect("sourced"))
            .collect();
        // Both pods' streams are live (a batch each: trusted).
        for &s in &sources {
            let empty = Batch {
                ts: 0.0,
                events: Vec::new(),
                dp_rank: None,
            };
            proxy.index.apply(s, &empty, 0);
        }
        let (home, blocks, _) = route(&proxy, &ctx);
        assert_eq!(blocks, 0, "cold everywhere");
        let (again, blocks, source) = route(&proxy, &ctx);
        assert_eq!(
            (again, blocks, source),
            (home, 32, PrefixSource::Index),
            "its speculative entries hold the prefix"
        );
        // The pod's events are lost: its entries are dropped and its index is not trusted.
        proxy
            .index
            .mark_unsure(sources[home], "lost events".into(), Instant::now());
        assert!(!proxy.index.trusted(sources[home]));
        let runtime = &proxy.pools[0];
        let endpoints = runtime.pool.endpoints();
        let c = candidates(&proxy.index, runtime, &endpoints, &ctx, Policy::Precise);
        assert!(!c[home].prefix_trusted);
        assert_eq!(c[home].history_blocks, 32);
        assert_eq!(available_blocks(&c, ctx.keys.len()), 32);
        // Still chosen for the prefix it served, by the routing history, and it says so.
        for _ in 0..3 {
            assert_eq!(route(&proxy, &ctx), (home, 32, PrefixSource::History));
        }
    }
}
