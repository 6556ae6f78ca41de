//! A pool's wake-up for the requests yielding for KV room
//! ([`crate::routing::cold_yield`]): woken by its endpoints when a request ends (this
//! agent's, or a peer's by its load report) or a scrape comes in, and only while some
//! request yields.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

/// A pool's wake-up for the requests yielding for KV room
/// ([`crate::routing::cold_yield`]), and how many there are.
#[derive(Debug, Default)]
pub struct RoomSignal {
    pub(super) notify: tokio::sync::Notify,
    pub(super) waiters: AtomicUsize,
}

impl RoomSignal {
    /// Wakes every request yielding now; with none (the common case), one atomic load.
    pub(super) fn wake(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }
}

/// A request yielding for KV room ([`super::Pool::yielding`]).
#[derive(Debug)]
pub struct Yielding(pub(super) Arc<RoomSignal>);

impl Drop for Yielding {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}
