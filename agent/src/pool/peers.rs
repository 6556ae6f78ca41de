//! Peer agents' exact loads on one endpoint (docs/cluster.md, "Shared load"): what each
//! agent of the cluster last reported it has in flight there and queued to prefill, kept
//! until it is replaced or goes stale.
//!
//! An agent reports each change and refreshes a load that is not zero every
//! [`LOAD_REFRESH`], so a report older than [`PEER_LOAD_TTL`] is an agent that stopped
//! (died, or its stream broke) and counts for nothing. At most [`MAX_PEER_AGENTS`] agents
//! are kept per endpoint (the stalest is dropped for a new one).

use std::time::{Duration, Instant};

use crate::kv_index::AgentLoad;

/// How often an agent re-sends a load that did not change and is not zero.
pub const LOAD_REFRESH: Duration = Duration::from_secs(1);
/// How long a peer's report counts without a refresh.
pub const PEER_LOAD_TTL: Duration = Duration::from_secs(3);
/// Peer agents kept per endpoint.
pub const MAX_PEER_AGENTS: usize = 1_024;

#[derive(Debug)]
struct Report {
    agent: Box<str>,
    load: AgentLoad,
    at: Instant,
}

impl Report {
    /// Still counts at `now`: refreshed within [`PEER_LOAD_TTL`].
    fn current(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) <= PEER_LOAD_TTL
    }
}

/// The latest report of each peer agent.
#[derive(Debug, Default)]
pub struct PeerLoads {
    reports: Vec<Report>,
}

impl PeerLoads {
    /// `agent` reported `load` at `now` (replacing its previous report). Returns the
    /// report it replaces while that was current (zero when there was none, or it had gone
    /// stale: it counted for nothing).
    pub fn set(&mut self, agent: &str, load: AgentLoad, now: Instant) -> AgentLoad {
        if let Some(r) = self.reports.iter_mut().find(|r| &*r.agent == agent) {
            let before = if r.current(now) {
                r.load
            } else {
                AgentLoad::default()
            };
            r.load = load;
            r.at = now;
            return before;
        }
        if load == AgentLoad::default() {
            return load;
        }
        if self.reports.len() >= MAX_PEER_AGENTS
            && let Some(stalest) = (0..self.reports.len()).min_by_key(|&i| self.reports[i].at)
        {
            self.reports.swap_remove(stalest);
        }
        self.reports.push(Report {
            agent: agent.into(),
            load,
            at: now,
        });
        AgentLoad::default()
    }

    /// The sum of the reports still current at `now` (stale ones are dropped).
    pub fn sum(&mut self, now: Instant) -> AgentLoad {
        self.reports.retain(|r| r.current(now));
        self.reports
            .iter()
            .fold(AgentLoad::default(), |s, r| AgentLoad {
                in_flight: s.in_flight.saturating_add(r.load.in_flight),
                queued_prefill_blocks: s
                    .queued_prefill_blocks
                    .saturating_add(r.load.queued_prefill_blocks),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::tests::one_pod;

    fn load(in_flight: u32, queued_prefill_blocks: u64) -> AgentLoad {
        AgentLoad {
            in_flight,
            queued_prefill_blocks,
        }
    }

    #[test]
    fn each_agents_latest_report_counts_once() {
        let t0 = Instant::now();
        let mut p = PeerLoads::default();
        p.set("b", load(2, 100), t0);
        p.set("c", load(1, 30), t0);
        // b's request got its first byte, then another ended.
        p.set("b", load(2, 0), t0 + Duration::from_millis(5));
        p.set("b", load(1, 0), t0 + Duration::from_millis(9));
        assert_eq!(p.sum(t0 + Duration::from_millis(10)), load(2, 30));
    }

    #[test]
    fn a_report_returns_the_current_one_it_replaces() {
        let t0 = Instant::now();
        let mut p = PeerLoads::default();
        assert_eq!(p.set("b", load(2, 10), t0), load(0, 0), "none before");
        assert_eq!(p.set("b", load(1, 0), t0 + PEER_LOAD_TTL), load(2, 10));
        // One not refreshed for longer than the TTL counted for nothing.
        let late = t0 + PEER_LOAD_TTL + PEER_LOAD_TTL + Duration::from_millis(1);
        assert_eq!(p.set("b", load(3, 0), late), load(0, 0));
        assert_eq!(p.set("idle", load(0, 0), late), load(0, 0));
    }

    #[test]
    fn a_report_not_refreshed_for_the_ttl_counts_for_nothing() {
        let t0 = Instant::now();
        let mut p = PeerLoads::default();
        p.set("b", load(3, 10), t0);
        p.set("c", load(1, 0), t0 + Duration::from_secs(2));
        assert_eq!(p.sum(t0 + PEER_LOAD_TTL), load(4, 10));
        // b stopped reporting (died): only c's, refreshed, counts.
        p.set("c", load(1, 0), t0 + Duration::from_secs(3));
        assert_eq!(
            p.sum(t0 + PEER_LOAD_TTL + Duration::from_millis(1)),
            load(1, 0)
        );
    }

    #[test]
    fn agents_beyond_the_cap_replace_the_stalest() {
        let t0 = Instant::now();
        let mut p = PeerLoads::default();
        for i in 0..MAX_PEER_AGENTS {
            p.set(
                &format!("a{i}"),
                load(1, 0),
                t0 + Duration::from_micros(i as u64),
            );
        }
        p.set("new", load(5, 0), t0 + Duration::from_secs(1));
        assert_eq!(p.reports.len(), MAX_PEER_AGENTS);
        // a0 (the stalest) is gone: 1,023 agents x 1 + 5.
        assert_eq!(p.sum(t0 + Duration::from_secs(1)).in_flight, 1_023 + 5);
        // An idle agent never seen takes no slot.
        p.set("idle", AgentLoad::default(), t0 + Duration::from_secs(1));
        assert_eq!(p.reports.len(), MAX_PEER_AGENTS);
    }

    #[test]
    fn with_exact_peer_loads_peers_count_as_they_report_and_other_routers_by_the_engine() {
        let pool = one_pod();
        pool.count_peers_exactly();
        let e = pool.endpoints()[0].clone();
        let _a = e.start(40, &[], 0);
        let _b = e.start(10, &[], 0);
        // Leases of placements no longer count: the peers' reports do.
        let now = std::time::Instant::now();
        e.lease(&[], 0, now, now + std::time::Duration::from_secs(60));
        assert_eq!(pool.in_flight(&e, true), 2, "own two, no report");
        e.set_peer_load(
            "b",
            AgentLoad {
                in_flight: 3,
                queued_prefill_blocks: 100,
            },
            now,
        );
        e.set_peer_load(
            "c",
            AgentLoad {
                in_flight: 1,
                queued_prefill_blocks: 0,
            },
            now,
        );
        assert_eq!(pool.in_flight(&e, true), 6, "own two, b's three, c's one");
        assert_eq!(pool.in_flight(&e, false), 2);
        // Queued prefill: own 50 blocks and b's 100; the engine's waiting count is not read
        // while it sees no request beyond the agents'.
        assert_eq!(
            pool.work_ahead(&e, true, f64::NAN, std::time::Instant::now()),
            150
        );
        // The engine runs 6 and queues 3: three more than the agents report (another
        // router's), counted until the next scrape.
        e.set_engine_load(3, 6, 0.5);
        assert_eq!(pool.in_flight(&e, true), 9);
        // b's request got its first byte and ended; the next scrape agrees.
        e.set_peer_load(
            "b",
            AgentLoad {
                in_flight: 2,
                queued_prefill_blocks: 0,
            },
            now,
        );
        e.set_engine_load(0, 5, 0.5);
        assert_eq!(pool.in_flight(&e, true), 5, "own two, b's two, c's one");
        assert_eq!(
            pool.work_ahead(&e, true, f64::NAN, std::time::Instant::now()),
            50
        );
        // The engine sees fewer than the agents report (an ended request, not scraped yet):
        // nobody else's.
        e.set_engine_load(0, 1, 0.5);
        assert_eq!(pool.in_flight(&e, true), 5);
    }

    #[test]
    fn a_peer_reporting_ended_requests_ends_the_first_due_settled_leases_and_wakes_yielders() {
        use futures::FutureExt;

        use super::super::kv::PLACEMENT_REPORT_LAG;
        use crate::{kv_index::RouterKey, pool::Endpoint};

        let pool = one_pod();
        pool.count_peers_exactly();
        let e = pool.endpoints()[0].clone();
        e.set_kv_capacity(1_000);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let hour = Duration::from_secs(3600);
        // Peers' placements of 10 prompt blocks and 2 of output each, arriving at t0 and due
        // an hour on: prompt 2 is due first, then 1, then 3 (out of arrival order).
        let prompt =
            |p: u64| -> Vec<RouterKey> { (0..10).map(|i| RouterKey(p * 100 + i)).collect() };
        for (p, due) in [(1, ms(20)), (2, ms(10)), (3, ms(30))] {
            e.lease(&prompt(p), 2, t0, t0 + hour + due);
        }
        let pinned = |e: &Endpoint| e.kv_room(&[]).expect("sized").pinned;
        let held = |e: &Endpoint| -> Vec<u64> {
            (1..=4)
                .map(|p| e.kv_room(&prompt(p)).expect("sized").shared)
                .collect()
        };
        // The reports come a second later: b runs two requests, c one.
        let t1 = t0 + Duration::from_secs(1);
        e.set_peer_load("b", load(2, 0), t1);
        e.set_peer_load("c", load(1, 0), t1);
        assert_eq!(pinned(&e), 36);
        // A request yields for room meanwhile.
        let _yielding = pool.yielding();
        let woken = pool.room_freed();
        tokio::pin!(woken);
        woken.as_mut().enable();
        // b reports one request fewer: the peers run two, so the first due lease (prompt 2)
        // ends, output included, long before its time, and the yielding request is woken.
        e.set_peer_load("b", load(1, 0), t1);
        assert_eq!(pinned(&e), 24);
        assert_eq!(held(&e), [10, 0, 10, 0]);
        assert!(woken.as_mut().now_or_never().is_some(), "woken");
        // A placement (prompt 4) arrives before the report that counts its request: three
        // leases for two reported requests. A refresh or a rise ends nothing; nor does a
        // fall within the lag, which ends the settled lease due first (prompt 1), not the
        // young one.
        e.lease(&prompt(4), 2, t1, t1 + hour);
        e.set_peer_load("c", load(1, 0), t1);
        e.set_peer_load("c", load(2, 0), t1);
        assert_eq!(held(&e), [10, 0, 10, 10]);
        // c's two end within the lag: the peers run one (b's), and the settled lease due
        // first (prompt 1) ends, not the young one.
        let quiet = pool.room_freed();
        tokio::pin!(quiet);
        quiet.as_mut().enable();
        let soon = t1 + PLACEMENT_REPORT_LAG - ms(1);
        e.set_peer_load("c", load(0, 0), soon);
        assert_eq!(held(&e), [0, 0, 10, 10], "b's one and the young one");
        assert_eq!(pinned(&e), 24);
        assert!(quiet.as_mut().now_or_never().is_some());
        // A fall that ends no lease wakes no one: c starts one request and it ends, while
        // the leases (3 and 4) are no more than b's one plus the young one.
        let idle = pool.room_freed();
        tokio::pin!(idle);
        idle.as_mut().enable();
        e.set_peer_load("c", load(1, 0), soon);
        e.set_peer_load("c", load(0, 0), soon);
        assert_eq!(held(&e), [0, 0, 10, 10]);
        assert!(idle.as_mut().now_or_never().is_none(), "nothing ended");
        // b's reports go stale: it counts no request, and the next fall (a new agent d's)
        // leaves no settled lease.
        let late = t1 + PEER_LOAD_TTL + ms(1);
        e.set_peer_load("d", load(1, 0), late);
        e.set_peer_load("d", load(0, 0), late);
        assert_eq!(pinned(&e), 0);
    }
}
