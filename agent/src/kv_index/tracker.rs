//! Sequence tracking for one event source (pure; the subscriber does the I/O).
//!
//! vLLM numbers batches from 0 per process. A jump forward is a gap (replay it); a number
//! lower than expected is an engine restart (its cache is gone) — batches 0..seq of the new
//! process were lost if seq > 0. ZeroMQ never redelivers, and replayed batches always precede
//! the live one that revealed the gap, so there are no duplicates to skip.

/// What to do with an arriving batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The next batch in order: apply it.
    Apply,
    /// The first batch seen, mid-stream: batches `0..seq` were missed (replay them if possible).
    JoinedLate { missed: u64 },
    /// Batches `from..seq` were lost: replay them, then apply this one.
    Gap { from: u64 },
    /// The engine restarted: drop the source's entries, recover batches `0..missed` of the
    /// new process (replay), then apply this one.
    Restart { missed: u64 },
}

#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    next: Option<u64>,
}

impl SeqTracker {
    /// Classifies `seq` and advances past it.
    pub fn observe(&mut self, seq: u64) -> Step {
        let step = match self.next {
            None if seq == 0 => Step::Apply,
            None => Step::JoinedLate { missed: seq },
            Some(n) if seq == n => Step::Apply,
            Some(n) if seq > n => Step::Gap { from: n },
            Some(_) => Step::Restart { missed: seq },
        };
        // Saturating: u64::MAX never comes from a real engine, but a frame may say so (a
        // following MAX is then taken in order, anything lower as a restart).
        self.next = Some(seq.saturating_add(1));
        step
    }

    /// The next expected sequence number.
    pub fn next(&self) -> Option<u64> {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_in_order_gaps_restarts_and_duplicates() {
        let mut t = SeqTracker::default();
        assert_eq!(t.observe(0), Step::Apply);
        assert_eq!(t.observe(1), Step::Apply);
        assert_eq!(t.observe(4), Step::Gap { from: 2 });
        assert_eq!(t.observe(5), Step::Apply);
        assert_eq!(t.observe(0), Step::Restart { missed: 0 });
        assert_eq!(t.observe(1), Step::Apply);
        assert_eq!(
            t.observe(1),
            Step::Restart { missed: 1 },
            "restarted and lost batch 0"
        );
        // Found by fuzzing (zmq_frames): the last sequence number must not overflow.
        let mut max = SeqTracker::default();
        assert_eq!(max.observe(u64::MAX), Step::JoinedLate { missed: u64::MAX });
        assert_eq!(max.next(), Some(u64::MAX));
        assert_eq!(max.observe(3), Step::Restart { missed: 3 });
        let mut late = SeqTracker::default();
        assert_eq!(late.observe(7), Step::JoinedLate { missed: 7 });
        assert_eq!(late.next(), Some(8));
    }
}
