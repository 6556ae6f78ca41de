//! Choosing an endpoint for a request: candidates described by their prefix match and load,
//! combined by the pool's policy. Pure: no I/O, no index writes; the proxy records after the
//! pick.
//!
//! The precise policy minimises a cost in blocks of prefill work — the request's uncached
//! blocks on that pod plus the prefill work already queued there:
//!
//! ```text
//! cost(pod) = (prompt_blocks - matched_blocks(pod)) + queued_prefill_blocks(pod)
//! ```
//!
//! Affinity wins while the pod holding the prefix is not already busier (in prefill blocks)
//! than recomputing the prefix elsewhere would be; so it can never pile requests onto an
//! overloaded pod. An untrusted index (unsure, no events yet) counts as no match.

mod history;

use std::sync::atomic::{AtomicUsize, Ordering};

pub use history::History;

use crate::kv_index::RouterKey;

/// An endpoint's position in its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(pub usize);

/// What the router knows about the request.
#[derive(Debug, Clone, Default)]
pub struct RequestCtx {
    pub keys: Vec<RouterKey>,
    /// Session affinity key (header), if any.
    pub session: Option<String>,
}

/// One endpoint as a candidate for this request.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: EndpointId,
    /// Consecutive prefix blocks the index says this pod holds.
    pub matched_blocks: usize,
    /// Whether the prefix match may be used (index healthy for this pod).
    pub prefix_trusted: bool,
    /// Requests the proxy has in flight to this pod.
    pub in_flight: u32,
    /// Uncached prompt blocks of requests sent here that have not produced a first byte.
    pub queued_prefill_blocks: u64,
    /// Excluded (failed earlier in this request's retries).
    pub excluded: bool,
}

/// How a pool picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// Prefix-cache aware, load-balanced in blocks of prefill work (warmpath's default).
    Precise,
    /// The same cost rule, with prefixes guessed from routing history instead of KV events
    /// (what routers without an event index do).
    Approximate,
    /// Rotate over endpoints, like a plain Service.
    RoundRobin,
    /// Fewest in-flight requests.
    LeastLoaded,
    /// Same session header, same endpoint (hash), else least loaded.
    Session,
}

/// A decision: endpoints best first (the rest are retry candidates) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub ranked: Vec<EndpointId>,
    /// Matched prefix blocks on the chosen endpoint.
    pub prefix_blocks: usize,
    /// The chosen endpoint's cost (precise) or rank score.
    pub score: f64,
}

/// Ranks candidates under `policy`. `rotation` is the round-robin cursor.
pub fn rank(
    policy: Policy,
    ctx: &RequestCtx,
    candidates: &[Candidate],
    rotation: &AtomicUsize,
) -> Option<Decision> {
    let live: Vec<&Candidate> = candidates.iter().filter(|c| !c.excluded).collect();
    if live.is_empty() {
        return None;
    }
    let total = ctx.keys.len();
    let matched = |c: &Candidate| {
        if c.prefix_trusted {
            c.matched_blocks.min(total)
        } else {
            0
        }
    };
    let mut scored: Vec<(f64, u32, usize, &Candidate)> = match policy {
        Policy::Precise | Policy::Approximate => live
            .iter()
            .map(|c| {
                (
                    (total - matched(c)) as f64 + c.queued_prefill_blocks as f64,
                    c.in_flight,
                    0,
                    *c,
                )
            })
            .collect(),
        Policy::LeastLoaded => live
            .iter()
            .map(|c| (f64::from(c.in_flight), 0, 0, *c))
            .collect(),
        Policy::RoundRobin => {
            let start = rotation.fetch_add(1, Ordering::Relaxed);
            let n = live.len();
            live.iter()
                .enumerate()
                .map(|(i, c)| (((i + n - start % n) % n) as f64, 0, 0, *c))
                .collect()
        }
        Policy::Session => match &ctx.session {
            Some(s) => {
                let h = xxhash_rust::xxh3::xxh3_64(s.as_bytes()) as usize % live.len();
                let n = live.len();
                live.iter()
                    .enumerate()
                    .map(|(i, c)| (((i + n - h) % n) as f64, 0, 0, *c))
                    .collect()
            }
            None => live
                .iter()
                .map(|c| (f64::from(c.in_flight), 0, 0, *c))
                .collect(),
        },
    };
    // Ties: fewer in flight, then a rotating offset so equal pods share the load.
    let offset = rotation.load(Ordering::Relaxed);
    let n = scored.len();
    for (i, s) in scored.iter_mut().enumerate() {
        s.2 = (i + n - offset % n) % n;
    }
    scored.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    if policy != Policy::RoundRobin {
        rotation.fetch_add(1, Ordering::Relaxed);
    }
    let best = scored[0].3;
    Some(Decision {
        ranked: scored.iter().map(|s| s.3.id).collect(),
        prefix_blocks: matched(best),
        score: scored[0].0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: usize, matched: usize, queued: u64, in_flight: u32) -> Candidate {
        Candidate {
            id: EndpointId(id),
            matched_blocks: matched,
            prefix_trusted: true,
            in_flight,
            queued_prefill_blocks: queued,
            excluded: false,
        }
    }

    fn ctx(blocks: usize) -> RequestCtx {
        RequestCtx {
            keys: (0..blocks as u64).map(RouterKey).collect(),
            session: None,
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
    fn untrusted_prefix_counts_as_no_match_and_excluded_are_skipped() {
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
        assert_eq!(d.ranked, vec![EndpointId(1)]);
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
            keys: vec![],
            session: Some("user-42".into()),
        };
        let a = rank(Policy::Session, &c, &cands, &rr).unwrap().ranked[0];
        let b = rank(Policy::Session, &c, &cands, &rr).unwrap().ranked[0];
        assert_eq!(a, b);
    }
}
