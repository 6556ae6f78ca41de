//! Routing history: the approximate prefix signal, for engines without KV events.
//!
//! Every decision records the request's key chain for the chosen endpoint, as if the engine
//! had cached it, for `HISTORY_TTL`; a bounded LRU caps it. It knows nothing of evictions —
//! which is exactly why approximate routing is close to precise while caches are roomy and
//! collapses under KV pressure (docs/benchmarks.md).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use crate::kv_index::{IndexConfig, KvIndex, Match, RouterKey, SourceId, SourceInfo};

/// How long a routed chain is assumed cached.
pub const HISTORY_TTL: Duration = Duration::from_secs(300);
/// (block, endpoint) entries remembered at most.
pub const HISTORY_ENTRIES: usize = 4_000_000;

/// How often recording also expires old records: a record outlives [`HISTORY_TTL`] by at
/// most this (and a sweep's cost is not paid per request).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Per-pool routing history: one source per endpoint (added and removed as the pool's
/// membership changes).
#[derive(Debug)]
pub struct History {
    index: KvIndex,
    origin: Instant,
    /// Milliseconds after `origin` when the next sweep is due.
    next_sweep: AtomicU64,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    pub fn new() -> Self {
        let index = KvIndex::new(IndexConfig {
            max_entries: HISTORY_ENTRIES,
            speculative_ttl: HISTORY_TTL,
            // No engine feeds it: nothing is ever owed.
            stall_after: None,
            ..Default::default()
        });
        Self {
            index,
            origin: Instant::now(),
            next_sweep: AtomicU64::new(0),
        }
    }

    /// A new endpoint's history (named for status and logs).
    pub fn add(&self, endpoint: &str) -> SourceId {
        self.index.add_source(SourceInfo {
            pod: format!("history-{endpoint}"),
            rank: None,
        })
    }

    /// Forgets an endpoint that left the pool, and everything routed to it.
    pub fn remove(&self, source: SourceId) {
        self.index.remove_source(source);
    }

    /// Consecutive prefix blocks each endpoint was routed, by the endpoint's history source.
    pub fn lookup(&self, keys: &[RouterKey]) -> Vec<(SourceId, usize)> {
        let mut out: Vec<Match> = Vec::new();
        self.index.lookup(keys, &mut out);
        out.iter().map(|m| (SourceId(m.source), m.blocks)).collect()
    }

    /// Remembers that `keys` went to the endpoint whose history is `source`; expires old
    /// records.
    pub fn record(&self, source: SourceId, keys: &[RouterKey], now: Instant) {
        let at = now.saturating_duration_since(self.origin).as_millis() as u64;
        let due = self.next_sweep.load(Ordering::Relaxed);
        if at >= due
            && self
                .next_sweep
                .compare_exchange(
                    due,
                    at + SWEEP_EVERY.as_millis() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            self.index.sweep(now);
        }
        self.index.speculate(source, keys, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_routed_chains_until_they_expire() {
        let h = History::new();
        let (a, b) = (h.add("a:1"), h.add("b:1"));
        let keys: Vec<RouterKey> = (1..=4).map(RouterKey).collect();
        let t0 = Instant::now();
        h.record(b, &keys, t0);
        assert_eq!(h.lookup(&keys[..3]), vec![(b, 3)]);
        h.record(a, &keys[..1], t0 + HISTORY_TTL * 2);
        assert_eq!(h.lookup(&keys), vec![(a, 1)]);
        // An endpoint that leaves takes its history with it.
        h.record(b, &keys, t0 + HISTORY_TTL * 2);
        h.remove(b);
        assert_eq!(h.lookup(&keys), vec![(a, 1)]);
    }
}
