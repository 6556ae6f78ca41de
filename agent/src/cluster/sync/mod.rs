//! IndexSync (docs/cluster.md, "Bulk state"): the owner of a pod streams its index state to
//! the agents that replicate it — a snapshot, then one delta per applied batch, in order —
//! and relays the placements its subscribers make on it.
//!
//! proto (the messages) -> server (the owner's side: one producer per stream, waiting on the
//! index's change notifications, bounded by its channel) and client (the replica's side: one
//! task per owning peer, resuming from its watermarks after any break).

pub mod client;
pub mod proto;
pub mod server;

use std::time::Duration;

use crate::kv_index::{RouterKey, Tier};

/// The gRPC path of the one method.
pub const SYNC_PATH: &str = "/warmpath.cluster.v1.IndexSync/Sync";
/// Messages queued per stream before the producer waits for the client.
pub const STREAM_QUEUE: usize = 256;
/// Keys per snapshot chunk (768 KiB of keys, under tonic's 4 MiB message limit).
pub const SNAPSHOT_CHUNK: usize = 64 * 1024;
/// Placements queued towards one peer; more are dropped (speculation is a hint).
pub const PLACEMENT_QUEUE: usize = 1_024;
/// Reconnect backoff bounds.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);

fn key_tier(key: RouterKey, tier: u8) -> proto::KeyTier {
    proto::KeyTier {
        key: key.0,
        tier: u32::from(tier),
    }
}

fn tier_of(t: &proto::KeyTier) -> Tier {
    Tier::from_index(u8::try_from(t.tier).unwrap_or(u8::MAX))
}

/// The `authorization` value for a token.
fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[cfg(test)]
pub(super) mod tests;
