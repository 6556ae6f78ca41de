//! A pod's idle clock: how long nothing has been sent there, by this agent or its peers,
//! and nothing of this agent's has run there (the idle-pod rule, [`crate::routing::idle`]).

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use super::Endpoint;

/// A process-wide instant the endpoints' idle and prefill clocks count from (set by the
/// first endpoint made: [`since_origin`] marks it busy).
pub(super) fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Milliseconds from [`origin`] to `at` (0 before it).
pub(super) fn since_origin(at: Instant) -> u64 {
    at.saturating_duration_since(origin()).as_millis() as u64
}

impl Endpoint {
    pub(super) fn mark_busy(&self) {
        self.mark_busy_at(Instant::now());
    }

    /// Busy at `at` (the latest mark holds).
    pub(super) fn mark_busy_at(&self, at: Instant) {
        self.last_busy_ms
            .fetch_max(since_origin(at), Ordering::Relaxed);
    }

    /// How long this agent has had nothing in flight here, sent nothing here and heard of no
    /// peer's placement here (zero while a request of its own runs): the idle-pod rule's
    /// clock ([`crate::routing::idle`]).
    pub fn idle_for(&self, now: Instant) -> Duration {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let last = self.last_busy_ms.load(Ordering::Relaxed);
        Duration::from_millis(since_origin(now).saturating_sub(last))
    }
}
