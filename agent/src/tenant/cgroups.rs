//! Tenants by client cgroup. An intercepted connection carries the cgroup v2 id of the
//! socket that connected (set by the kernel, docs/ebpf.md): the inode number of the client
//! process's cgroup directory. A client cannot choose it, so it names the tenant before
//! anything the request says.
//!
//! Ids are learned by walking directories, not by asking the kernel per connection:
//! [`Rescanned`] keeps one map id -> value from a scan, swapped whole (a request costs one
//! atomic load and a hash lookup), and scans again in the background when an id is not in
//! it — at most one scan at a time and one per [`MIN_RESCAN`] — so a cgroup created after
//! the last scan (a new pod, a recreated directory) is found within a request or two of its
//! first connection. Off-cluster the directories are the configuration's
//! ([`CgroupPaths`], `tenants.cgroups`); on Kubernetes the kubelet's pod cgroups
//! (`k8s::identity::cgroup`).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;

use super::CgroupDirectory;

/// Least time between two scans started by unknown ids: a client whose cgroup is claimed by
/// nobody costs one walk a second, not one per request.
pub const MIN_RESCAN: Duration = Duration::from_secs(1);
/// Most cgroup directories one scan of [`CgroupPaths`] walks.
pub const MAX_CGROUPS: usize = 100_000;
/// Deepest directory walked below a listed one.
pub const MAX_DEPTH: usize = 8;

/// The scan a [`Rescanned`] runs: every id it knows, with its value.
pub type Scan<V> = Box<dyn Fn() -> HashMap<u64, V> + Send + Sync>;

/// A map cgroup id -> `V` from the latest scan, scanned again (off the caller's thread)
/// when asked for an id it does not hold.
pub struct Rescanned<V> {
    map: ArcSwap<HashMap<u64, V>>,
    scan: Scan<V>,
    /// A scan is running.
    running: AtomicBool,
    /// No miss starts a scan before this many milliseconds after `epoch`.
    next_ms: AtomicU64,
    epoch: Instant,
    /// Counts finished scans (for whoever awaits one).
    scans: tokio::sync::watch::Sender<u64>,
}

impl<V> std::fmt::Debug for Rescanned<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rescanned")
            .field("ids", &self.map.load().len())
            .field("scans", &*self.scans.borrow())
            .finish_non_exhaustive()
    }
}

// === impl Rescanned ===

impl<V: Clone + Send + Sync + 'static> Rescanned<V> {
    /// A map filled by `scan`, empty until the first scan ([`Rescanned::rescan_now`], or the
    /// first miss).
    pub fn new(scan: Scan<V>) -> Arc<Self> {
        Arc::new(Self {
            map: ArcSwap::default(),
            scan,
            running: AtomicBool::new(false),
            next_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            scans: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The value of `id`; a miss starts a background scan (see the module docs).
    pub fn get(self: &Arc<Self>, id: u64) -> Option<V> {
        let found = self.map.load().get(&id).cloned();
        if found.is_none() {
            self.rescan_soon();
        }
        found
    }

    /// Starts a scan on Tokio's blocking pool unless one runs, one finished less than
    /// [`MIN_RESCAN`] ago, or there is no runtime; whether it started one.
    pub fn rescan_soon(self: &Arc<Self>) -> bool {
        if self.now_ms() < self.next_ms.load(Ordering::Relaxed) {
            return false;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if self
            .running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let this = self.clone();
        runtime.spawn_blocking(move || this.rescan_now());
        true
    }

    /// Scans now, on this thread, and publishes the result.
    pub fn rescan_now(&self) {
        let map = (self.scan)();
        self.map.store(Arc::new(map));
        let next = self.now_ms() + MIN_RESCAN.as_millis() as u64;
        self.next_ms.store(next, Ordering::Relaxed);
        self.running.store(false, Ordering::Release);
        self.scans.send_modify(|n| *n += 1);
    }

    /// Changes after every scan (its value counts them).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.scans.subscribe()
    }

    /// Ids held.
    pub fn len(&self) -> usize {
        self.map.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// The configuration's cgroup selectors (`tenants.cgroups`): each listed cgroup v2
/// directory, and every cgroup below it, belongs to its tenant; of nested listed
/// directories the deepest decides.
#[derive(Debug)]
pub struct CgroupPaths {
    ids: Arc<Rescanned<Arc<str>>>,
}

impl CgroupPaths {
    /// Selectors of `paths` (directory, tenant), scanned once now. A directory that does not
    /// exist yet (or is no cgroup v2 directory) claims nothing until it does: it is logged,
    /// not refused, since cgroups come and go with their workloads.
    pub fn new(paths: Vec<(PathBuf, Arc<str>)>) -> Self {
        for (dir, tenant) in &paths {
            if !is_cgroup2(dir) {
                tracing::warn!(dir = %dir.display(), %tenant, "tenants.cgroups: not a cgroup v2 directory (yet); it claims nothing until it is");
            }
        }
        let mut paths = paths;
        // Shallow first: a deeper listed directory overwrites what its ancestor claimed.
        paths.sort_by_key(|(dir, _)| dir.components().count());
        let ids = Rescanned::new(Box::new(move || scan_paths(&paths)));
        ids.rescan_now();
        Self { ids }
    }

    /// Cgroups known from the latest scan.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

impl CgroupDirectory for CgroupPaths {
    fn tenant_of_cgroup(&self, cgroup_id: u64) -> Option<Arc<str>> {
        self.ids.get(cgroup_id)
    }
}

/// Whether `dir` is a directory of the cgroup v2 filesystem.
pub fn is_cgroup2(dir: &Path) -> bool {
    use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, statfs};
    statfs(dir).is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// Walks each listed directory (in order: later ones overwrite) and the cgroups below it,
/// at most [`MAX_CGROUPS`] in all and [`MAX_DEPTH`] deep.
fn scan_paths(paths: &[(PathBuf, Arc<str>)]) -> HashMap<u64, Arc<str>> {
    use std::os::unix::fs::MetadataExt as _;
    let mut ids = HashMap::new();
    let mut walked = 0usize;
    for (dir, tenant) in paths {
        if !is_cgroup2(dir) {
            continue;
        }
        let mut stack = vec![(dir.clone(), 0usize)];
        while let Some((d, depth)) = stack.pop() {
            walked += 1;
            if walked > MAX_CGROUPS {
                tracing::warn!(
                    "tenants.cgroups: more than {MAX_CGROUPS} cgroups below the listed directories; the rest are not identified"
                );
                return ids;
            }
            // Removed while walking: simply not identified.
            let Ok(meta) = std::fs::metadata(&d) else {
                continue;
            };
            ids.insert(meta.ino(), tenant.clone());
            if depth >= MAX_DEPTH {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((e.path(), depth + 1));
                }
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A map whose scans count themselves and find id 7 from the second scan on.
    fn counted() -> (Arc<Rescanned<Arc<str>>>, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let map = Rescanned::new(Box::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            let mut m = HashMap::new();
            if n >= 2 {
                m.insert(7, Arc::<str>::from("team-a"));
            }
            m
        }));
        (map, calls)
    }

    #[tokio::test]
    async fn a_miss_rescans_in_the_background_once_per_interval() {
        let (map, calls) = counted();
        map.rescan_now();
        assert_eq!(map.len(), 0);
        let mut scans = map.subscribe();
        scans.borrow_and_update();
        // Just scanned: a miss does not scan again within MIN_RESCAN.
        assert_eq!(map.get(7), None);
        assert!(!map.rescan_soon());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Past the interval a miss starts one scan, and the id is found once it ends.
        map.next_ms.store(0, Ordering::Relaxed);
        map.running.store(true, Ordering::Relaxed);
        assert!(!map.rescan_soon(), "one scan at a time");
        map.running.store(false, Ordering::Relaxed);
        assert_eq!(map.get(7), None);
        scans.changed().await.expect("the map lives");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(map.get(7).as_deref(), Some("team-a"));
    }

    #[test]
    fn without_a_runtime_a_miss_scans_nothing() {
        let (map, calls) = counted();
        assert_eq!(map.get(7), None);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn directories_outside_cgroup2_claim_nothing() {
        let dir = std::env::temp_dir();
        assert!(!is_cgroup2(&dir));
        let paths = CgroupPaths::new(vec![(dir, Arc::from("team-a"))]);
        assert!(paths.is_empty());
    }

    /// With cgroup v2 and privilege (skipped, with a line saying so, elsewhere): the mount's
    /// root and a child made here are claimed, the deeper listing wins for the child.
    #[test]
    fn listed_directories_and_their_children_are_claimed_deepest_first() {
        use std::os::unix::fs::MetadataExt as _;
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let Some(root) = mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_ascii_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| std::path::PathBuf::from(f[1]))
        }) else {
            eprintln!("skipped: no cgroup v2 mount here");
            return;
        };
        let root = root.as_path();
        assert!(is_cgroup2(root));
        // A child cgroup of this test's own (needs privilege: skipped without).
        let child = root.join(format!("warmpath-tenant-test-{}", std::process::id()));
        if let Err(err) = std::fs::create_dir(&child) {
            eprintln!(
                "skipped: cannot create a cgroup under {}: {err}",
                root.display()
            );
            return;
        }
        struct Rmdir(std::path::PathBuf);
        impl Drop for Rmdir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir(&self.0);
            }
        }
        let _child = Rmdir(child.clone());
        let ino = |p: &Path| std::fs::metadata(p).expect("listed above").ino();
        let paths = CgroupPaths::new(vec![
            (child.clone(), Arc::from("inner")),
            (root.to_path_buf(), Arc::from("outer")),
        ]);
        assert_eq!(paths.tenant_of_cgroup(ino(root)).as_deref(), Some("outer"));
        assert_eq!(
            paths.tenant_of_cgroup(ino(&child)).as_deref(),
            Some("inner")
        );
    }
}
