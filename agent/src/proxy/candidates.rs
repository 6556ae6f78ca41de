//! Step 4 of a request: its candidates, the scorers' input. Each endpoint of the pool with
//! what the KV index (or, for the approximate policy, the routing history) says it holds of
//! the request's prefix, and its live load; scoring and the pick are [`crate::routing::rank`]'s.
//! The route receipt's `available` figure is read from them too ([`available_blocks`]).

use smallvec::SmallVec;

use super::pools::PoolRuntime;
use crate::{
    kv_index::KvIndex,
    routing::{self, Candidate, Policy, RequestCtx},
};

/// The candidates, on the stack for pools of up to `routing::INLINE` endpoints.
pub type Candidates = SmallVec<[Candidate; routing::INLINE]>;

/// The pool's endpoints as candidates for `ctx` under `policy` (whose preset picks the
/// prefix source).
pub fn candidates(
    index: &KvIndex,
    runtime: &PoolRuntime,
    ctx: &RequestCtx,
    policy: Policy,
) -> Candidates {
    let pool = &runtime.pool;
    let history = runtime.history.as_ref().map(|h| h.lookup(&ctx.keys));
    let approximate = policy == Policy::Approximate;
    let mut matches = Vec::new();
    if !approximate {
        index.lookup(&ctx.keys, &mut matches);
    }
    pool.endpoints
        .iter()
        .map(|e| {
            let source = e.source;
            let history_blocks = history
                .as_ref()
                .and_then(|h| h.iter().find(|(id, _)| *id == e.id))
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
                id: e.id,
                matched_blocks,
                prefix_trusted,
                in_flight: e.in_flight(),
                queued_prefill_blocks: pool.work_ahead(e),
                kv_usage: e.kv_usage(),
                history_blocks,
                lora: e.lora_state(ctx.lora.as_deref()),
                // A LoRA request only goes where the adapter is served.
                excluded: ctx.lora.as_deref().is_some_and(|l| !e.serves(l)),
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
