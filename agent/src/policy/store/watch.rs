//! Watching the policy directory: every change in it (a file written, renamed over, removed,
//! a ConfigMap's `..data` link swapped) reloads the whole directory once the changes have
//! paused for [`DEBOUNCE`], and publishes the result when what serves changed.
//!
//! The directory is watched, not its files: editors and `kubectl`-style tools replace a file
//! by renaming a new one over it, and a ConfigMap mount swaps one symbolic link, so watches
//! on files would follow the old inodes. When the directory disappears the last accepted set
//! keeps serving; it is looked for again every [`RETRY`] and watched anew when it is back.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use notify::{
    EventKind, RecursiveMode, Watcher as _,
    event::{AccessKind, AccessMode, ModifyKind},
};
use opentelemetry::{KeyValue, metrics::Meter};
use tokio::{
    sync::{Notify, watch::Sender},
    time::Instant,
};

use super::{Accepted, Serving, Validator, load};

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
    counts: Arc<Counts>,
}

/// Reloads so far, by result, and objects rejected by the latest one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReloadCounts {
    /// What serves changed, and nothing was rejected.
    pub applied: u64,
    /// Nothing changed, and nothing was rejected.
    pub unchanged: u64,
    /// At least one object or file could not be used (it keeps its previous state).
    pub rejected: u64,
    /// Objects not serving their latest version after the latest reload.
    pub rejected_objects: u64,
}

#[derive(Debug, Default)]
struct Counts {
    applied: AtomicU64,
    unchanged: AtomicU64,
    rejected: AtomicU64,
    rejected_objects: AtomicU64,
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
    let counts = Arc::new(Counts::default());
    report(None, &first, &counts);
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
        let c = &self.counts;
        ReloadCounts {
            applied: c.applied.load(Ordering::Relaxed),
            unchanged: c.unchanged.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            rejected_objects: c.rejected_objects.load(Ordering::Relaxed),
        }
    }

    /// Registers `warmpath.policy.reloads{result}` and `warmpath.policy.rejected` on
    /// `meter`; the callbacks live as long as the provider.
    pub fn observe(&self, meter: &Meter) {
        let c = self.counts.clone();
        meter
            .u64_observable_counter("warmpath.policy.reloads")
            .with_unit("{reload}")
            .with_description(
                "Policy directory reloads by result: applied, unchanged, rejected (at least \
                 one object or file kept its previous state)",
            )
            .with_callback(move |o| {
                for (result, n) in [
                    ("applied", &c.applied),
                    ("unchanged", &c.unchanged),
                    ("rejected", &c.rejected),
                ] {
                    o.observe(
                        n.load(Ordering::Relaxed),
                        &[KeyValue::new("result", result)],
                    );
                }
            })
            .build();
        let c = self.counts.clone();
        meter
            .u64_observable_gauge("warmpath.policy.rejected")
            .with_unit("{object}")
            .with_description("Policy objects not serving their latest version")
            .with_callback(move |o| o.observe(c.rejected_objects.load(Ordering::Relaxed), &[]))
            .build();
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
    counts: Arc<Counts>,
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
        report(Some(&r.current), &next, &r.counts);
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
async fn quiet(wake: &Notify) {
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

/// Counts a reload and logs it: at info always, each rejection at warn when it is new.
fn report(prev: Option<&Accepted>, next: &Accepted, counts: &Counts) {
    let rejected = next.rejected();
    let file_errors = next.file_errors().count();
    let result = if rejected + file_errors > 0 {
        &counts.rejected
    } else if prev.is_none_or(|p| p.generation != next.generation) {
        &counts.applied
    } else {
        &counts.unchanged
    };
    result.fetch_add(1, Ordering::Relaxed);
    counts
        .rejected_objects
        .store(rejected as u64, Ordering::Relaxed);
    tracing::info!(
        generation = next.generation,
        serving = next.resources.len(),
        rejected,
        file_errors,
        "policy directory loaded"
    );
    for f in next.file_errors() {
        let seen = prev.is_some_and(|p| p.files.contains(f));
        if !seen {
            tracing::warn!(file = %f.file.display(), "policy file rejected: {}", f.error.as_deref().unwrap_or(""));
        }
    }
    let before: HashMap<_, _> = prev
        .map(|p| &p.objects[..])
        .unwrap_or_default()
        .iter()
        .filter(|o| o.is_rejected())
        .map(|o| ((o.kind, o.key.as_str(), o.file.as_path()), o))
        .collect();
    for o in next.objects.iter().filter(|o| o.is_rejected()) {
        let Some(c) = o.accepted() else { continue };
        let seen = before
            .get(&(o.kind, o.key.as_str(), o.file.as_path()))
            .and_then(|p| p.accepted())
            .is_some_and(|p| {
                p.reason == c.reason
                    && p.message == c.message
                    && p.observed_generation == c.observed_generation
            });
        if seen {
            continue;
        }
        let serving = match o.serving {
            Serving::Current => "its latest version".to_string(),
            Serving::LastGood { generation } => format!("generation {generation} keeps serving"),
            Serving::None => "not serving".to_string(),
        };
        tracing::warn!(kind = o.kind, key = %o.key, file = %o.file.display(), generation = o.observed_generation, reason = %c.reason, "policy object rejected ({serving}): {}", c.message);
    }
}

#[cfg(test)]
mod tests;
