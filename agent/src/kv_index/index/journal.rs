//! A local source's recent changes in router keys, for peers that replicate it
//! (docs/cluster.md): one [`KeyDelta`] per applied batch, numbered within an incarnation.
//!
//! The watermark is (incarnation, sequence). Anything that drops the source's entries outside
//! its event stream (lost events, an engine restart or reconnect) starts a new incarnation:
//! a replica cannot follow that with deltas and takes a snapshot. The ring is bounded in
//! deltas and in keys; a replica whose watermark fell out of it takes a snapshot too.

use std::collections::VecDeque;

use crate::kv_index::{RouterKey, Tier};

/// Deltas kept per source.
pub const DELTA_RING: usize = 4_096;
/// Router keys kept per source over all its deltas (8 MiB at 9 bytes each).
pub const DELTA_RING_KEYS: usize = 8 << 20 >> 3;

/// How far a replica's copy of a source has come.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Watermark {
    pub incarnation: u64,
    pub sequence: u64,
}

/// One applied batch, in router keys: `cleared` first, then `stored`, then `removed`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyDelta {
    /// The engine cleared its cache (everything held before is gone).
    pub cleared: bool,
    pub stored: Vec<(RouterKey, Tier)>,
    pub removed: Vec<(RouterKey, Tier)>,
    /// When the owner committed it: unix microseconds of its clock (0: not stamped); for
    /// the replicas' lag (`cluster::lag`).
    pub applied_unix_us: u64,
    /// When the engine published the batch (its `ts`), in unix microseconds (0: unknown).
    pub event_unix_us: u64,
}

impl KeyDelta {
    pub fn is_empty(&self) -> bool {
        !self.cleared && self.stored.is_empty() && self.removed.is_empty()
    }

    fn keys(&self) -> usize {
        self.stored.len() + self.removed.len()
    }
}

/// What a replica at some watermark needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Since {
    /// The deltas after its watermark, in order (each with its sequence); possibly none.
    Deltas(Vec<(u64, KeyDelta)>),
    /// Everything the source holds at `at`: (router key, tier bits).
    Snapshot {
        at: Watermark,
        held: Vec<(RouterKey, u8)>,
    },
}

/// An engine batch's `ts` (unix seconds, a float) in unix microseconds, for
/// [`KeyDelta::event_unix_us`]; 0 (unknown) for anything that is not a plausible time: not
/// finite, not positive, or beyond u64.
pub(super) fn micros_of_unix_seconds(ts: f64) -> u64 {
    let us = ts * 1e6;
    if us.is_finite() && us >= 1.0 && us < u64::MAX as f64 {
        us as u64
    } else {
        0
    }
}

/// The ring of one local source.
#[derive(Debug)]
pub(super) struct Journal {
    at: Watermark,
    /// (sequence, delta), oldest first; sequences consecutive, the last one `at.sequence`.
    ring: VecDeque<(u64, KeyDelta)>,
    keys: usize,
    /// The batch being applied.
    pub(super) current: KeyDelta,
}

impl Journal {
    pub(super) fn new(incarnation: u64) -> Self {
        Self {
            at: Watermark {
                incarnation,
                sequence: 0,
            },
            ring: VecDeque::new(),
            keys: 0,
            current: KeyDelta::default(),
        }
    }

    pub(super) fn watermark(&self) -> Watermark {
        self.at
    }

    /// The source's entries were dropped outside its events: replicas start over.
    pub(super) fn new_incarnation(&mut self) {
        self.at = Watermark {
            incarnation: self.at.incarnation.wrapping_add(1),
            sequence: 0,
        };
        self.ring.clear();
        self.keys = 0;
        self.current = KeyDelta::default();
    }

    /// Closes the batch being applied: numbered, stamped with the time and kept when it
    /// changed anything.
    pub(super) fn commit(&mut self) {
        let mut delta = std::mem::take(&mut self.current);
        if delta.is_empty() {
            return;
        }
        delta.applied_unix_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.at.sequence += 1;
        self.keys += delta.keys();
        self.ring.push_back((self.at.sequence, delta));
        while self.ring.len() > DELTA_RING || (self.keys > DELTA_RING_KEYS && self.ring.len() > 1) {
            if let Some((_, old)) = self.ring.pop_front() {
                self.keys -= old.keys();
            }
        }
    }

    /// The deltas after `from`, or `None` when they are not all here (another incarnation,
    /// or older than the ring): the replica needs a snapshot.
    pub(super) fn since(&self, from: Watermark) -> Option<Vec<(u64, KeyDelta)>> {
        if from.incarnation != self.at.incarnation || from.sequence > self.at.sequence {
            return None;
        }
        if from.sequence == self.at.sequence {
            return Some(Vec::new());
        }
        let first = self.ring.front()?.0;
        if from.sequence + 1 < first {
            return None;
        }
        let skip = (from.sequence + 1 - first) as usize;
        Some(self.ring.iter().skip(skip).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(keys: &[u64]) -> KeyDelta {
        KeyDelta {
            stored: keys.iter().map(|&k| (RouterKey(k), Tier::Gpu)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn deltas_after_a_watermark_are_the_ones_committed_after_it() {
        let mut j = Journal::new(7);
        for k in 1..=5u64 {
            j.current = stored(&[k]);
            j.commit();
        }
        // An empty batch is not a delta.
        j.commit();
        assert_eq!(
            j.watermark(),
            Watermark {
                incarnation: 7,
                sequence: 5
            }
        );
        let got = j
            .since(Watermark {
                incarnation: 7,
                sequence: 3,
            })
            .expect("in the ring");
        let sequences: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(sequences, [4, 5]);
        for ((_, d), k) in got.iter().zip([4, 5]) {
            assert_eq!(d.stored, stored(&[k]).stored);
            // Stamped when committed (a wall clock after 2020).
            assert!(d.applied_unix_us > 1_577_836_800_000_000, "{d:?}");
        }
        assert_eq!(j.since(j.watermark()), Some(Vec::new()));
        // Another incarnation, or a watermark from the future: a snapshot.
        assert_eq!(
            j.since(Watermark {
                incarnation: 6,
                sequence: 3
            }),
            None
        );
        assert_eq!(
            j.since(Watermark {
                incarnation: 7,
                sequence: 9
            }),
            None
        );
        j.new_incarnation();
        assert_eq!(
            j.since(Watermark {
                incarnation: 7,
                sequence: 5
            }),
            None
        );
        assert_eq!(
            j.since(Watermark {
                incarnation: 8,
                sequence: 0
            }),
            Some(Vec::new())
        );
    }

    #[test]
    fn engine_timestamps_in_seconds_become_micros_and_nonsense_is_unknown() {
        assert_eq!(
            micros_of_unix_seconds(1_764_000_000.25),
            1_764_000_000_250_000
        );
        for bad in [f64::NAN, f64::INFINITY, -1.0, 0.0, 1e30] {
            assert_eq!(micros_of_unix_seconds(bad), 0, "{bad}");
        }
    }

    #[test]
    fn the_ring_is_bounded_and_a_watermark_older_than_it_needs_a_snapshot() {
        let mut j = Journal::new(1);
        for k in 0..(DELTA_RING as u64 + 10) {
            j.current = stored(&[k]);
            j.commit();
        }
        assert_eq!(j.ring.len(), DELTA_RING);
        let oldest_kept = 11;
        assert_eq!(j.ring.front().map(|d| d.0), Some(oldest_kept));
        let from = |sequence| Watermark {
            incarnation: 1,
            sequence,
        };
        assert_eq!(j.since(from(oldest_kept - 2)), None);
        assert_eq!(
            j.since(from(oldest_kept - 1)).map(|d| d.len()),
            Some(DELTA_RING)
        );
        // Bounded in keys too: one huge delta pushes the older ones out.
        j.current = stored(&(0..DELTA_RING_KEYS as u64).collect::<Vec<_>>());
        j.commit();
        assert_eq!(j.ring.len(), 1);
        assert_eq!(j.keys, DELTA_RING_KEYS);
    }
}
