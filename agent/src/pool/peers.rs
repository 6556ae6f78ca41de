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

/// The latest report of each peer agent.
#[derive(Debug, Default)]
pub struct PeerLoads {
    reports: Vec<Report>,
}

impl PeerLoads {
    /// `agent` reported `load` at `now` (replacing its previous report).
    pub fn set(&mut self, agent: &str, load: AgentLoad, now: Instant) {
        if let Some(r) = self.reports.iter_mut().find(|r| &*r.agent == agent) {
            r.load = load;
            r.at = now;
            return;
        }
        if load == AgentLoad::default() {
            return;
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
    }

    /// The sum of the reports still current at `now` (stale ones are dropped).
    pub fn sum(&mut self, now: Instant) -> AgentLoad {
        self.reports
            .retain(|r| now.saturating_duration_since(r.at) <= PEER_LOAD_TTL);
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
        e.lease(&[], 0, now + std::time::Duration::from_secs(60));
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
        assert_eq!(pool.work_ahead(&e, true), 150);
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
        assert_eq!(pool.work_ahead(&e, true), 50);
        // The engine sees fewer than the agents report (an ended request, not scraped yet):
        // nobody else's.
        e.set_engine_load(0, 1, 0.5);
        assert_eq!(pool.in_flight(&e, true), 5);
    }
}
