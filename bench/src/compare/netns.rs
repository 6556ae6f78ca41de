//! Work this process does inside a network namespace it created, for the intercepted row:
//! `setns` moves only the calling thread, so each piece runs on a thread of its own that
//! entered the namespace first. Sockets opened from that thread live in the namespace, and so
//! do the processes it starts.
//!
//! - [`NetnsRuntime`]: a current-thread tokio runtime on such a thread, for the row's
//!   orchestration (starting the agents, polling their admin ports, driving the pod clients):
//!   every task on it, and every socket those tasks open, is in the namespace.
//! - [`on_main_runtime_in`]: one future polled on such a thread but on the caller's runtime,
//!   so that sockets it binds while polled there are in the namespace while the tasks it
//!   spawns (the simulator fleet's servers) run on the caller's runtime like every other
//!   row's fleet.

use std::{future::Future, path::Path, time::Duration};

use tokio::sync::oneshot;

use crate::Error;

/// How long a new thread may take to enter the namespace and build its runtime.
const START_WITHIN: Duration = Duration::from_secs(10);

fn setup(what: impl std::fmt::Display) -> Error {
    Error::Setup(what.to_string())
}

/// Moves the calling thread into the network namespace at `path` (`/run/netns/<name>`).
fn enter(path: &Path) -> Result<(), Error> {
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        what: format!("open {}", path.display()),
        source,
    })?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| setup(format!("setns into {}: {e}", path.display())))
}

/// A current-thread runtime on a thread inside a network namespace. Dropping it stops the
/// runtime, which drops every task still on it (their child processes are killed on drop),
/// and waits for the thread.
#[derive(Debug)]
pub(super) struct NetnsRuntime {
    handle: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NetnsRuntime {
    /// Starts the thread in the namespace at `path`.
    pub(super) fn start(path: &Path) -> Result<Self, Error> {
        let path = path.to_path_buf();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-netns".into())
            .spawn(move || {
                let built = enter(&path).and_then(|()| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|source| Error::Io {
                            what: "build a runtime in the node namespace".into(),
                            source,
                        })
                });
                let rt = match built {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    // Until the owner is dropped (sent or not, the channel closes).
                    let _ = stopped.await;
                });
            })
            .map_err(|source| Error::Io {
                what: "start a thread for the node namespace".into(),
                source,
            })?;
        let handle = ready_rx
            .recv_timeout(START_WITHIN)
            .map_err(|e| setup(format!("the node namespace's thread did not start: {e}")))??;
        Ok(Self {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Runs `fut` on the namespace's thread and waits for its output.
    pub(super) async fn run<F>(&self, fut: F) -> Result<F::Output, Error>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle
            .spawn(fut)
            .await
            .map_err(|e| setup(format!("a task in the node namespace failed: {e}")))
    }
}

impl Drop for NetnsRuntime {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("the node namespace's thread panicked");
        }
    }
}

/// Polls `fut` to completion on a new thread inside the namespace at `path`, on the runtime
/// of `handle` (its spawned tasks run there).
pub(super) async fn on_main_runtime_in<F>(
    path: &Path,
    handle: tokio::runtime::Handle,
    fut: F,
) -> Result<F::Output, Error>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let path = path.to_path_buf();
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("bench-netns-bind".into())
        .spawn(move || {
            let out = enter(&path).map(|()| handle.block_on(fut));
            let _ = tx.send(out);
        })
        .map_err(|source| Error::Io {
            what: "start a thread for the node namespace".into(),
            source,
        })?;
    rx.await
        .map_err(|_| setup("the node namespace's thread ended without an answer"))?
}
