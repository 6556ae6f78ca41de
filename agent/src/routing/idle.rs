//! An idle pod left out of a common prefix is warmed: when every request carries a prefix
//! that the busy pods hold and an idle one lacks (a deployment's system prompt; a pod
//! added by a scale-out, or idle when the first requests came), the cost model never sends
//! it a request — each one would prefill the prefix cold there, slower than a warm pod that
//! is only somewhat busy — so its compute and, worse, its KV cache stay unused while the
//! others' caches evict what their sessions will ask for again (measured on `chat:2000`:
//! docs/benchmarks.md, "A system prompt every session shares"). The ranking is per request
//! and cannot see that one cold prefill makes the pod a peer of the others from then on.
//!
//! The rule, after the ranking (and replication):
//!
//! - the best pick is busy (a request in flight there, this agent's or its peers');
//! - the prefix it holds of the request is common: at least one other live pod holds as
//!   much (a context of one session, held by its pod alone, is never moved by this rule);
//! - a live pod lacks that prefix and has been idle — nothing in flight there, nothing
//!   queued, nothing sent by this agent or placed there by its peers — for
//!   [`IDLE_WARM_AFTER`].
//!
//! Then the request goes to that pod (the one idle longest) and warms it: one cold prefill
//! per idle period, after which the cost model ranks it as any other. An idle pod that
//! holds the prefix needs no rule (the cost model already prefers it), nor one in a pool
//! with nothing to do.

use std::time::Duration;

use super::{Candidate, Decision, EndpointId};

/// How long a pod must have been idle, while the pool routes past it, before a request
/// warms it: long enough that a pod between two requests never counts, short enough that
/// a pod left out is brought in within seconds.
pub const IDLE_WARM_AFTER: Duration = Duration::from_secs(4);

/// The idle pod `decision`'s request should warm, if the rule holds ([module docs](self)).
/// `blocks`: the request's prompt blocks.
pub fn warm(decision: &Decision, candidates: &[Candidate], blocks: usize) -> Option<EndpointId> {
    let first = *decision.ranked.first()?;
    let best = candidates.iter().find(|c| c.id == first)?;
    if best.in_flight == 0 {
        return None;
    }
    let held = |c: &Candidate| c.prefix().0.min(blocks);
    let common = held(best);
    if common == 0 {
        return None;
    }
    let live = || candidates.iter().filter(|c| !c.excluded);
    let holders = live().filter(|c| held(c) >= common).count();
    if holders < 2 {
        return None;
    }
    live()
        .filter(|c| {
            held(c) < common
                && c.in_flight == 0
                && c.queued_prefill_blocks == 0
                && c.idle_for >= IDLE_WARM_AFTER
        })
        .max_by_key(|c| c.idle_for)
        .map(|c| c.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(id: usize, matched: usize, in_flight: u32, idle_for: Duration) -> Candidate {
        Candidate {
            idle_for,
            ..crate::routing::tests::cand(id, matched, 0, in_flight)
        }
    }

    fn first(id: usize) -> Decision {
        Decision {
            ranked: [EndpointId(id)].into_iter().collect(),
            prefix_blocks: 0,
            prefix_source: crate::routing::PrefixSource::Index,
            score: 0.0,
            predicted: [0.0].into_iter().collect(),
            costs: [0.0].into_iter().collect(),
        }
    }

    const IDLE: Duration = IDLE_WARM_AFTER;
    const BUSY: Duration = Duration::ZERO;

    #[test]
    fn a_busy_pool_warms_the_pod_left_out_of_a_common_prefix() {
        // A 125-block system prompt on pods 0-2 (busy); pod 3 lacks it, idle 4 s; pod 4
        // lacks it too, idle longer: the longest idle is warmed.
        let pods = [
            pod(0, 125, 3, BUSY),
            pod(1, 125, 4, BUSY),
            pod(2, 125, 2, BUSY),
            pod(3, 0, 0, IDLE),
            pod(4, 0, 0, IDLE * 2),
        ];
        assert_eq!(warm(&first(2), &pods, 165), Some(EndpointId(4)));
        // Not idle long enough, or something in flight or queued there (a peer's request):
        // nothing.
        let mut p = pods.clone();
        p[3].idle_for = IDLE - Duration::from_millis(1);
        p[4].in_flight = 1;
        assert_eq!(warm(&first(2), &p, 165), None);
        p[4].in_flight = 0;
        p[4].queued_prefill_blocks = 10;
        assert_eq!(warm(&first(2), &p, 165), None);
        // Excluded (draining, not serving the adapter): never.
        let mut p = pods.clone();
        p[3].excluded = true;
        p[4].excluded = true;
        assert_eq!(warm(&first(2), &p, 165), None);
    }

    #[test]
    fn a_private_context_an_idle_best_pick_or_an_idle_holder_leave_the_pick_alone() {
        // The best pick alone holds 160 blocks (one session's context); the others hold the
        // 125 common ones or nothing: moving it would lose its context.
        let pods = [
            pod(0, 160, 3, BUSY),
            pod(1, 125, 4, BUSY),
            pod(2, 0, 0, IDLE),
        ];
        assert_eq!(warm(&first(0), &pods, 170), None);
        // The same request ranked to a pod holding the common prefix: the idle pod is warmed.
        assert_eq!(warm(&first(1), &pods, 170), Some(EndpointId(2)));
        // The best pick is idle itself: the pool is not busy where the request goes.
        let mut p = pods.clone();
        p[1].in_flight = 0;
        assert_eq!(warm(&first(1), &p, 170), None);
        // The idle pod holds the prefix: the cost model already weighs it as a peer.
        let mut p = pods.clone();
        p[2].matched_blocks = 125;
        assert_eq!(warm(&first(1), &p, 170), None);
        // Nothing held anywhere: nothing to be left out of.
        let cold = [pod(0, 0, 3, BUSY), pod(1, 0, 4, BUSY), pod(2, 0, 0, IDLE)];
        assert_eq!(warm(&first(0), &cold, 170), None);
    }
}
