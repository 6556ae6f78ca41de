//! Which data-path worker thread this is: the shard index the HTTP/1.1 client keeps idle
//! engine connections by (a connection is only used on the runtime whose poller it is
//! registered with). Owned here; the proxy's workers only mark their threads.

/// Most data-path worker threads (`--workers`).
pub const MAX_WORKERS: usize = 256;

thread_local! {
    /// The data-path worker this thread is, if it is one.
    static WORKER: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Marks this thread as data-path worker `i` (< [`MAX_WORKERS`]): its engine connections
/// are pooled apart from every other thread's.
pub fn set_worker(i: usize) {
    WORKER.set(Some(i.min(MAX_WORKERS - 1)));
}

/// This thread's shard: 0 for any thread but the workers', 1 + i for worker i.
pub(super) fn shard() -> usize {
    WORKER.get().map_or(0, |i| i + 1)
}
