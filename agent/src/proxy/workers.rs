//! The data path's threads. Each runs a current-thread tokio runtime and serves the client
//! connections handed to it, whole: the request, the engine exchange (on the worker's own
//! idle engine connections, see [`crate::http::client`]) and the streamed answer. The model is
//! nginx's worker processes, as threads: no work stealing, no cross-thread wake-ups within
//! a request, and none of the multi-threaded scheduler's bookkeeping per poll. Routing state
//! (index, load, telemetry) is shared by all of them.
//!
//! The listeners accept on the agent's own runtime and hand each connection to the worker
//! with the fewest open.

use std::{
    future::Future,
    io,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use crate::http::worker::{MAX_WORKERS, set_worker};

/// The workers; stopped (with every connection they serve) when dropped.
#[derive(Debug)]
pub struct Workers {
    workers: Vec<Worker>,
}

#[derive(Debug)]
struct Worker {
    handle: tokio::runtime::Handle,
    /// Client connections open on it.
    open: Arc<AtomicUsize>,
    /// Its thread stops when this is dropped.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Counts a connection open on its worker until dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Workers {
    /// Starts `n` workers (at least one, at most [`MAX_WORKERS`]).
    pub fn start(n: usize) -> io::Result<Self> {
        let n = n.clamp(1, MAX_WORKERS);
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            // The runtime is built, run and dropped on its own thread (a runtime may not be
            // dropped inside another's async context); its handle comes back here.
            let (ready, handle) = std::sync::mpsc::sync_channel(1);
            std::thread::Builder::new()
                .name(format!("warmpath-data-{i}"))
                .spawn(move || {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(err) => {
                            let _ = ready.send(Err(err));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(rt.handle().clone()));
                    set_worker(i);
                    // Serves until the sender is dropped; dropping the runtime then drops
                    // its connections.
                    rt.block_on(async {
                        let _ = stopped.await;
                    });
                })?;
            let handle = handle
                .recv()
                .map_err(|_| io::Error::other("a data-path thread ended at start"))??;
            workers.push(Worker {
                handle,
                open: Arc::new(AtomicUsize::new(0)),
                _stop: stop,
            });
        }
        Ok(Self { workers })
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Serves a connection accepted on another runtime on the worker with the fewest open:
    /// `serve` runs there, on the connection registered with that worker's poller.
    pub fn serve<F, Fut>(&self, stream: tokio::net::TcpStream, serve: F)
    where
        F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(worker) = self
            .workers
            .iter()
            .min_by_key(|w| w.open.load(Ordering::Relaxed))
        else {
            return;
        };
        // Leaves the accepting runtime's poller for the worker's.
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(err) => {
                tracing::debug!(%err, "cannot hand the connection to a worker");
                return;
            }
        };
        worker.open.fetch_add(1, Ordering::Relaxed);
        let open = Open(worker.open.clone());
        worker.handle.spawn(async move {
            let _open = open;
            match tokio::net::TcpStream::from_std(stream) {
                Ok(stream) => serve(stream).await,
                Err(err) => tracing::debug!(%err, "cannot register the connection"),
            }
        });
    }
}
