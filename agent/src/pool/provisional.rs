//! Peers' cold requests too recent for their load reports (docs/cluster.md, "Shared load":
//! "Placements before their reports").
//!
//! Where a cluster shares its loads, an agent counts its peers' requests on a pod from their
//! own reports, not from their placements. A placement is sent as its agent decides, and its
//! load once the request has started, through a publisher that sends at most once a
//! millisecond, so the report follows the placement by up to a few milliseconds; meanwhile
//! the peer's request counted for nothing, and an agent deciding then ranked the pod as if it
//! had not been chosen. On the matrix's chat at 0.8x, two agents' cold requests sent within
//! 2 ms of each other went to the same pod in 42 % of the pairs (one central agent: 6 %),
//! ranked with identical loads although the first placement had arrived (placement to
//! arrival: p50 0.34 ms, p99 1.2 ms). So a peer's cold placement (at least [`COLD_BLOCKS`]
//! new to the pod, and at least half its prompt) counts on its pod, as one request in
//! flight and its new blocks as queued prefill, for [`PROVISIONAL`] after it arrives,
//! beside the reports. One its report already counts is counted twice for that moment: the
//! pod looks one cold request busier than it is for a few milliseconds. Measured: such
//! pairs on one pod 48 % -> 19 % over six chat seeds, the whole matrix level or better
//! (docs/benchmarks.md, "Placements as load before their reports").

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use super::Endpoint;

/// How long after it arrives a peer's cold placement counts as load on its pod: until the
/// report that counts it has arrived too (a millisecond of the publisher's pacing, a stream
/// hop or two, and room for a loaded host).
pub const PROVISIONAL: Duration = Duration::from_millis(3);

/// Blocks new to a pod that make a peer's placement a cold request's (with at least half its
/// prompt new), counted until its report comes: 16 blocks are 256 tokens at vLLM's default
/// block size. A warm request's new blocks are left to the reports: counted twice for a
/// moment, a long context's next step (an agent loop's tool output: dozens of new blocks,
/// a small share of its prompt) made its home look busier than it was and moved the loops
/// off their contexts (measured: the four agents' agentic p90 at 1.0x 394 -> 737 ms when
/// every placement with 16 new blocks counted).
pub const COLD_BLOCKS: usize = 16;

/// Placements kept per endpoint (the newest): more than arrive in [`PROVISIONAL`] at
/// thousands of requests a second across the cluster's agents would be dropped oldest first.
const KEPT: usize = 32;

/// A peer's cold placement here.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Placed {
    arrived: Instant,
    /// Blocks new to the pod: its prefill.
    new_blocks: u64,
}

/// The latest cold placements peers made on one endpoint.
#[derive(Debug, Default)]
pub(super) struct PeerPlacements(VecDeque<Placed>);

impl PeerPlacements {
    fn push(&mut self, arrived: Instant, new_blocks: u64) {
        // Those past their time go first; then the oldest, if still full.
        while self
            .0
            .front()
            .is_some_and(|p| arrived.saturating_duration_since(p.arrived) >= PROVISIONAL)
        {
            self.0.pop_front();
        }
        if self.0.len() >= KEPT {
            self.0.pop_front();
        }
        self.0.push_back(Placed {
            arrived,
            new_blocks,
        });
    }

    /// Those that arrived less than [`PROVISIONAL`] before `now` (or after it: noted by
    /// another thread since `now` was read): how many, and their blocks.
    fn provisional(&self, now: Instant) -> (u32, u64) {
        self.0
            .iter()
            .filter(|p| now.saturating_duration_since(p.arrived) < PROVISIONAL)
            .fold((0, 0), |(n, b), p| {
                (n.saturating_add(1), b.saturating_add(p.new_blocks))
            })
    }
}

impl Endpoint {
    /// A peer placed a request of `blocks` here whose prefill adds `new_blocks` (by this
    /// agent's index), arriving at `now`. Only a cold one is kept: at least [`COLD_BLOCKS`]
    /// new, and at least half its prompt.
    pub fn note_cold_placement(&self, new_blocks: usize, blocks: usize, now: Instant) {
        if new_blocks < COLD_BLOCKS || new_blocks.saturating_mul(2) < blocks {
            return;
        }
        self.peer_placements.lock().push(now, new_blocks as u64);
    }

    /// Peers' cold requests placed here within [`PROVISIONAL`] before `now` (how many, and
    /// their prefill blocks): load their agents' reports may not count yet.
    pub fn provisional_peer_load(&self, now: Instant) -> (u32, u64) {
        self.peer_placements.lock().provisional(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::tests::one_pod;

    #[test]
    fn a_peers_cold_placement_counts_as_load_until_its_report_can_have_come() {
        let pool = one_pod();
        let e = &pool.endpoints()[0];
        let t0 = Instant::now();
        e.note_cold_placement(90, 100, t0);
        e.note_cold_placement(40, 80, t0 + Duration::from_millis(1));
        // A warm request's new blocks, few or a small share of its prompt (a long context's
        // next step): left to the reports.
        e.note_cold_placement(COLD_BLOCKS - 1, COLD_BLOCKS, t0 + Duration::from_millis(1));
        e.note_cold_placement(60, 400, t0 + Duration::from_millis(1));
        assert_eq!(
            e.provisional_peer_load(t0 + Duration::from_millis(2)),
            (2, 130)
        );
        // The first one's report is due by now.
        assert_eq!(e.provisional_peer_load(t0 + PROVISIONAL), (1, 40));
        assert_eq!(
            e.provisional_peer_load(t0 + PROVISIONAL + Duration::from_millis(1)),
            (0, 0)
        );
    }

    #[test]
    fn at_most_the_newest_are_kept_and_expired_ones_leave_first() {
        let pool = one_pod();
        let e = &pool.endpoints()[0];
        let t0 = Instant::now();
        e.note_cold_placement(1_000, 1_000, t0);
        // A burst of more than are kept, all current: the oldest give way.
        let t1 = t0 + PROVISIONAL;
        for _ in 0..KEPT + 5 {
            e.note_cold_placement(COLD_BLOCKS, COLD_BLOCKS, t1);
        }
        assert_eq!(e.peer_placements.lock().0.len(), KEPT);
        assert_eq!(
            e.provisional_peer_load(t1),
            (KEPT as u32, (KEPT * COLD_BLOCKS) as u64),
            "the expired one left first, then the burst's oldest"
        );
    }

    #[test]
    fn in_a_cluster_sharing_loads_the_pool_counts_them_beside_the_reports() {
        let pool = one_pod();
        let e = pool.endpoints()[0].clone();
        pool.count_peers_exactly();
        e.set_peer_load(
            "peer-b",
            crate::kv_index::AgentLoad {
                in_flight: 2,
                queued_prefill_blocks: 10,
            },
            Instant::now(),
        );
        // Stamped a minute ahead, so it is still current whenever the pool reads it.
        e.note_cold_placement(90, 120, Instant::now() + Duration::from_secs(60));
        // Its report's 2 requests and 10 blocks, and the placement not yet in a report.
        assert_eq!(pool.in_flight(&e, true), 3);
        assert_eq!(
            pool.work_ahead(&e, true, f64::NAN, std::time::Instant::now()),
            100
        );
        // A pool ranking by its own view only (least-loaded) does not count either.
        assert_eq!(pool.in_flight(&e, false), 0);
    }
}
