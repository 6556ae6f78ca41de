//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz): thin wrappers over the decoders
//! of untrusted input that are not public API. Not for use by the rest of the agent.

use bytes::Bytes;

/// A live ZeroMQ KV event message `[topic, seq (8 bytes BE), payload]` -> (seq, payload);
/// `None`: not of that shape (the subscriber counts it as malformed).
pub fn split_frames(frames: &[Bytes]) -> Option<(u64, &[u8])> {
    crate::kv_index::subscriber::split_frames(frames)
}

/// One replay reply message -> (seq, payload), `None` for the END marker, `Err` for a reply
/// of another shape (the replay is then given up).
pub fn replay_entry(frames: &[Bytes]) -> Result<Option<(u64, &Bytes)>, String> {
    crate::kv_index::subscriber::replay_entry(frames)
}
