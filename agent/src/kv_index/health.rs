//! Per-source health: whether the router may trust this source's prefix scores, and the
//! counters that explain why not.

use std::time::Instant;

use serde::Serialize;

/// Routed requests without a single confirmed block after which keys are suspected not to
/// match the engine's (tokenizer, chat template or block size differ).
pub const MISMATCH_AFTER_ROUTED: u64 = 20;

/// Whether a source's entries can be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthState {
    /// Subscribed, no batch received yet.
    Waiting,
    /// Events applied in order; entries are a faithful view.
    Healthy,
    /// Events were lost and could not be replayed; prefix scores must not be trusted.
    Unsure { reason: String, since: Instant },
    /// The engine owes events (a request routed at `since` added blocks it did not hold)
    /// and no batch came for the stall period: the stream may be stuck, so prefix scores
    /// are not trusted until the next batch (the entries are kept).
    Stalled { since: Instant },
}

/// Counters and state of one source, as `/status` shows them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SourceStatus {
    pub pod: String,
    pub rank: Option<u32>,
    /// The peer agent this source is replicated from (docs/cluster.md); absent for the
    /// agent's own subscriptions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub state: &'static str,
    pub reason: Option<String>,
    pub entries: usize,
    pub batches: u64,
    pub last_seq: Option<u64>,
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    pub malformed: u64,
    pub orphans: u64,
    pub unknown_removals: u64,
    pub ignored_groups: u64,
    pub block_size_mismatches: u64,
    pub gaps: u64,
    pub replayed: u64,
    pub unrecoverable_gaps: u64,
    pub restarts: u64,
    /// Times the publisher went away and came back (entries were dropped and resynced).
    pub reconnects: u64,
    pub routed: u64,
    pub confirmed: u64,
    /// A human-readable warning when keys look like they never match the engine's.
    pub key_mismatch: Option<String>,
}

impl SourceStatus {
    /// Refreshes `key_mismatch` from the counters; returns true when it newly appeared.
    pub fn check_mismatch(
        &mut self,
        router_block_size: usize,
        event_block_size: Option<u32>,
    ) -> bool {
        let before = self.key_mismatch.is_some();
        self.key_mismatch = if self.block_size_mismatches > 0 {
            Some(format!(
                "events use block size {} but the router uses {router_block_size}: set the pool's block size to match vLLM --block-size",
                event_block_size.map_or("?".into(), |b| b.to_string())
            ))
        } else if self.routed >= MISMATCH_AFTER_ROUTED
            && self.confirmed == 0
            && self.blocks_stored > 0
        {
            Some(format!(
                "{} requests routed here, none of their blocks confirmed by {} stored blocks: router keys do not match the engine's (check tokenizer, chat template and block size)",
                self.routed, self.blocks_stored
            ))
        } else {
            None
        };
        !before && self.key_mismatch.is_some()
    }
}
