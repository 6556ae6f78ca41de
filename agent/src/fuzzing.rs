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

/// A replica of IndexSync'd pods, fed the owner's messages one at a time the way
/// `cluster::sync::client` applies a peer's stream (a delta out of order starts the copy
/// over, as the stream does before it reconnects).
#[derive(Debug)]
pub struct SyncReplica {
    index: crate::kv_index::KvIndex,
    copies: std::collections::HashMap<String, crate::cluster::sync::client::Copy>,
    sources: Vec<(String, crate::kv_index::SourceId)>,
}

impl SyncReplica {
    /// An index capped at `max_entries` replicating `pods` (remote sources, in that order).
    pub fn new(max_entries: usize, pods: &[&str]) -> Self {
        let index = crate::kv_index::KvIndex::new(crate::kv_index::IndexConfig {
            max_entries,
            ..Default::default()
        });
        let sources: Vec<_> = pods
            .iter()
            .map(|pod| {
                let info = crate::kv_index::SourceInfo {
                    pod: pod.to_string(),
                    rank: None,
                };
                (pod.to_string(), index.add_remote_source(info))
            })
            .collect();
        let copies = sources
            .iter()
            .map(|(pod, source)| {
                let copy = crate::cluster::sync::client::Copy::new(*source);
                (pod.clone(), copy)
            })
            .collect();
        Self {
            index,
            copies,
            sources,
        }
    }

    /// Applies one message; `Err` (the reason) when a delta was out of order and its copy
    /// was started over.
    pub fn apply(
        &mut self,
        msg: crate::cluster::sync::proto::server_msg::Msg,
    ) -> Result<(), String> {
        use crate::cluster::sync::client::{StreamEnd, apply, start_over};
        match apply(&self.index, &mut self.copies, msg) {
            Ok(()) => Ok(()),
            Err(end) => {
                if let StreamEnd::OutOfOrder { pod, .. } = &end {
                    start_over(&self.index, &mut self.copies, pod);
                }
                Err(end.to_string())
            }
        }
    }

    /// How far the copy of `pod` has come.
    pub fn watermark(&self, pod: &str) -> Option<crate::kv_index::Watermark> {
        self.copies.get(pod).map(|c| c.at())
    }

    /// The index source replicating `pod`.
    pub fn source(&self, pod: &str) -> Option<crate::kv_index::SourceId> {
        self.sources.iter().find(|(p, _)| p == pod).map(|(_, s)| *s)
    }

    pub fn index(&self) -> &crate::kv_index::KvIndex {
        &self.index
    }
}
