//! Watching the policy directory: every change in it (a file written, renamed over, removed,
//! a ConfigMap's `..data` link swapped) reloads the whole directory once the changes have
//! paused for [`DEBOUNCE`], and publishes the result when what serves changed.
//!
//! The directory is watched, not its files: editors and `kubectl`-style tools replace a file
//! by renaming a new one over it, and a ConfigMap mount swaps one symbolic link, so watches
//! on files would follow the old inodes. When the directory disappears the last accepted set
//! keeps serving; it is looked for again every [`RETRY`] and watched anew when it is back.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use notify::{
    EventKind, RecursiveMode, Watcher as _,
    event::{AccessKind, AccessMode, ModifyKind},
};
use opentelemetry::metrics::Meter;
use tokio::{
    sync::{Notify, watch::Sender},
    time::Instant,
};

use super::{Accepted, ReloadCounts, Reloads, Validator, load};

/// Changes are coalesced until the directory has been quiet this long: a tool writing
/// several files is one reload, and reloads are at least this far apart.
pub const DEBOUNCE: Duration = Duration::from_millis(50);
/// Changes that never pause still reload this long after the first.
pub const MAX_DELAY: Duration = Duration::from_secs(1);
/// How often a directory that disappeared is looked for.
pub const RETRY: Duration = Duration::from_secs(1);

/// Why the policy directory cannot be served from.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("policy directory {}: {source}", dir.display())]
    Unreadable {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("policy directory {}: not a directory", dir.display())]
    NotADirectory { dir: PathBuf },
    #[error("policy directory {}: cannot watch it for changes: {source}", dir.display())]
    Watch { dir: PathBuf, source: notify::Error },
    #[error("policy directory {}: watching needs a Tokio runtime", dir.display())]
    NoRuntime { dir: PathBuf },
}

/// The running watcher; dropping it stops watching (what was published stays).
#[derive(Debug)]
pub struct WatchHandle {
    task: tokio::task::JoinHandle<()>,
    counts: Arc<Reloads>,
}

/// Loads `dir`, publishes the result on `tx` (always, even when it equals the channel's
/// value), then watches it: after each change what serves is reloaded and published when
/// its [`Accepted::generation`] changed (the status of objects is updated in the channel
/// without waking receivers otherwise: `borrow()` always shows the latest statuses). Must
/// be called within a Tokio runtime; the first load runs on the calling thread.
pub fn watch(dir: PathBuf, v: Validator, tx: Sender<Arc<Accepted>>) -> Result<WatchHandle, Error> {
    let runtime =
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime { dir: dir.clone() })?;
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(Error::NotADirectory { dir }),
        Err(source) => return Err(Error::Unreadable { dir, source }),
    }
    let wake = Arc::new(Notify::new());
    let stale = Arc::new(AtomicBool::new(false));
    let (w, s, d) = (wake.clone(), stale.clone(), dir.clone());
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads (ours included) change nothing; errors are looked into by reloading.
        let changed = match &event {
            Ok(e) if ends_watch(e, &d) => {
                s.store(true, Ordering::Relaxed);
                true
            }
            Ok(e) => !changes_nothing(&e.kind),
            Err(_) => true,
        };
        if changed {
            w.notify_one();
        }
    })
    .map_err(|source| Error::Watch {
        dir: dir.clone(),
        source,
    })?;
    // Watch first, then load: a change made during the first load is not missed.
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|source| Error::Watch {
            dir: dir.clone(),
            source,
        })?;
    let first = Arc::new(load(&dir, &v, None));
    let counts = Arc::new(Reloads::default());
    counts.report(&dir.display().to_string(), None, &first);
    tx.send_replace(first.clone());
    let watched = dir_id(&dir);
    let task = runtime.spawn(run(Run {
        dir,
        v,
        tx,
        wake,
        stale,
        watcher,
        watched,
        current: first,
        counts: counts.clone(),
    }));
    Ok(WatchHandle { task, counts })
}

/// The directory itself was removed or renamed: its watch follows the old inode (or is
/// gone), whatever the path names now (a new directory may even reuse the inode number).
fn ends_watch(e: &notify::Event, dir: &Path) -> bool {
    matches!(
        e.kind,
        EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
    ) && e.paths.iter().any(|p| p == dir)
}

fn changes_nothing(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Access(a) if *a != AccessKind::Close(AccessMode::Write))
}

// === impl WatchHandle ===

impl WatchHandle {
    /// Reloads so far.
    pub fn counts(&self) -> ReloadCounts {
        self.counts.counts()
    }

    /// Registers `warmpath.policy.reloads{result}` and `warmpath.policy.rejected` on
    /// `meter`; the callbacks live as long as the provider.
    pub fn observe(&self, meter: &Meter) {
        self.counts.observe(meter);
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the watching task owns.
struct Run {
    dir: PathBuf,
    v: Validator,
    tx: Sender<Arc<Accepted>>,
    wake: Arc<Notify>,
    /// Set when the watched directory was removed or renamed.
    stale: Arc<AtomicBool>,
    watcher: notify::RecommendedWatcher,
    /// The directory being watched (`None`: it is gone, looked for every RETRY).
    watched: Option<DirId>,
    current: Arc<Accepted>,
    counts: Arc<Reloads>,
}

async fn run(mut r: Run) {
    loop {
        if r.watched.is_some() {
            r.wake.notified().await;
        } else {
            tokio::select! {
                () = r.wake.notified() => {}
                () = tokio::time::sleep(RETRY) => {
                    if dir_id(&r.dir).is_none() {
                        continue;
                    }
                }
            }
        }
        quiet(&r.wake).await;
        r.rewatch();
        let (dir, v, prev) = (r.dir.clone(), r.v, r.current.clone());
        let next = match tokio::task::spawn_blocking(move || load(&dir, &v, Some(&prev))).await {
            Ok(next) => Arc::new(next),
            Err(e) => {
                tracing::warn!(dir = %r.dir.display(), error = %e, "policy reload did not finish; keeping the current policies");
                continue;
            }
        };
        r.counts
            .report(&r.dir.display().to_string(), Some(&r.current), &next);
        r.current = next.clone();
        r.tx.send_if_modified(|cur| {
            // Statuses too: a rejected update changes nothing that serves, but it must be
            // reported (status, conditions).
            let changed = cur.generation != next.generation
                || cur.objects != next.objects
                || cur.files != next.files;
            *cur = next;
            changed
        });
    }
}

/// Waits until no change came for [`DEBOUNCE`], or [`MAX_DELAY`] passed.
pub async fn quiet(wake: &Notify) {
    let deadline = Instant::now() + MAX_DELAY;
    loop {
        let until = (Instant::now() + DEBOUNCE).min(deadline);
        tokio::select! {
            () = wake.notified() => if Instant::now() >= deadline { return },
            () = tokio::time::sleep_until(until) => return,
        }
    }
}

// === impl Run ===

impl Run {
    /// Watches the directory again when it was removed, renamed or replaced, or is back
    /// after it disappeared.
    fn rewatch(&mut self) {
        let now = dir_id(&self.dir);
        let stale = self.stale.swap(false, Ordering::Relaxed);
        if now == self.watched && !stale {
            return;
        }
        if self.watched.is_some() {
            // Fails when the kernel already dropped the watch with the directory.
            let _ = self.watcher.unwatch(&self.dir);
        }
        self.watched = match now {
            Some(id) => match self.watcher.watch(&self.dir, RecursiveMode::NonRecursive) {
                Ok(()) => Some(id),
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "cannot watch the policy directory; looking again in {RETRY:?}");
                    None
                }
            },
            None => None,
        };
    }
}

/// Which directory a path names now (device and inode), `None` when there is none.
type DirId = (u64, u64);

fn dir_id(dir: &Path) -> Option<DirId> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(dir)
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests;
