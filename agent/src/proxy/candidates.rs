//! Step 4 of a request: its candidates, the scorers' input. Each endpoint of the pool with
//! what the KV index (or, for the approximate policy, the routing history) says it holds of
//! the request's prefix, and its live load; scoring and the pick are [`crate::routing::rank`]'s.
//! The route receipt's `available` figure is read from them too ([`available_blocks`]).

use std::sync::Arc;

use smallvec::SmallVec;

use super::pools::PoolRuntime;
use crate::{
    kv_index::KvIndex,
    pool::Endpoint,
    routing::{self, Candidate, EndpointId, Policy, RequestCtx},
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
    let mut matches = Vec::new();
    if !approximate {
        index.lookup(&ctx.keys, &mut matches);
    }
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
                true => (history_blocks, true),
                false => (
                    source
                        .and_then(|s| matches.iter().find(|m| m.source == s.0))
                        .map_or(0, |m| m.blocks),
                    source.is_some_and(|s| index.trusted(s)),
                ),
            };
            Candidate {
                id: EndpointId(i),
                affinity: e.affinity,
                matched_blocks,
                prefix_trusted,
                in_flight: e.in_flight(),
                queued_prefill_blocks: pool.work_ahead(e),
                kv_usage: e.kv_usage(),
                history_blocks,
                lora: e.lora_state(ctx.lora.as_deref()),
                // A LoRA request only goes where the adapter is served; nothing goes where
                // membership says not to.
                excluded: !e.routable() || ctx.lora.as_deref().is_some_and(|l| !e.serves(l)),
            }
        })
        .collect()
}

/// The longest prefix, in blocks, that any live candidate with a trusted index (or history)
/// holds, at most the request's `blocks`: the route receipt's `available` figure, counted as
/// [`crate::routing::rank`] counts the chosen pod's (`Decision::prefix_blocks`).
pub fn available_blocks(candidates: &[Candidate], blocks: usize) -> usize {
    candidates
        .iter()
        .filter(|c| !c.excluded && c.prefix_trusted)
        .map(|c| c.matched_blocks.min(blocks))
        .max()
        .unwrap_or(0)
}
