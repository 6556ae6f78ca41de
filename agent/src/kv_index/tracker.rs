//! Sequence tracking for one event source (pure; the subscriber does the I/O).
//!
//! vLLM numbers batches from 0 per process. A jump forward is a gap (replay it); a return to 0
//! is an engine restart (its cache is gone); anything else older is a duplicate (e.g. a batch
//! both replayed and delivered live) and is skipped.

/// What to do with an arriving batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The next batch in order: apply it.
    Apply,
    /// The first batch seen, mid-stream: batches `0..seq` were missed (replay them if possible).
    JoinedLate { missed: u64 },
    /// Batches `from..seq` were lost: replay them, then apply this one.
    Gap { from: u64 },
    /// The engine restarted: drop the source's entries, then apply this one.
    Restart,
    /// Already applied: skip.
    Duplicate,
}

#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    next: Option<u64>,
}

impl SeqTracker {
    /// Classifies `seq` and advances past it (except for duplicates).
    pub fn observe(&mut self, seq: u64) -> Step {
        let step = match self.next {
            None if seq == 0 => Step::Apply,
            None => Step::JoinedLate { missed: seq },
            Some(n) if seq == n => Step::Apply,
            Some(_) if seq == 0 => Step::Restart,
            Some(n) if seq > n => Step::Gap { from: n },
            Some(_) => return Step::Duplicate,
        };
        self.next = Some(seq + 1);
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
        assert_eq!(t.observe(3), Step::Duplicate);
        assert_eq!(t.observe(5), Step::Apply);
        assert_eq!(t.observe(0), Step::Restart);
        assert_eq!(t.observe(1), Step::Apply);
        let mut late = SeqTracker::default();
        assert_eq!(late.observe(7), Step::JoinedLate { missed: 7 });
        assert_eq!(late.next(), Some(8));
    }
}
