//! A client's cgroup -> its pod: the eBPF path learns the cgroup id of the socket that
//! connected (the inode number of its cgroup v2 directory); the kubelet puts every pod's
//! containers under a directory named after the pod's UID, so the id names the pod, and
//! [`super::PodDirectory::workload_by_uid`] its identity. A second key beside the source
//! address, for clients whose address is not their own (host-network pods share the node's).
//!
//! The two layouts of the kubelet's cgroup drivers:
//! - `cgroupfs`: `/kubepods/burstable/pod6f1c3e02-1d7a-4c0b-9d1e-0a5c2f6e8b11/<container>`;
//! - `systemd`: `/kubepods.slice/kubepods-burstable.slice/`
//!   `kubepods-burstable-pod6f1c3e02_1d7a_4c0b_9d1e_0a5c2f6e8b11.slice/cri-containerd-<id>.scope`
//!   (dashes of the UID written as underscores).
//!
//! [`CgroupIndex::scan`] walks the `kubepods` subtree of the cgroup v2 mount once (at most
//! [`MAX_CGROUPS`] directories, [`MAX_DEPTH`] deep) into id -> pod UID. [`PodCgroups`] is
//! tenant resolution's view of it (a [`CgroupDirectory`]): id -> UID from the latest scan,
//! rescanned in the background when an id is not found (a new pod; at most once a second,
//! [`crate::tenant::cgroups::Rescanned`]), then UID -> tenant from the pod directory.

use std::{
    collections::HashMap,
    io,
    path::{Component, Path, PathBuf},
    sync::Arc,
};

use crate::tenant::{CgroupDirectory, cgroups::Rescanned};

/// Most cgroup directories walked in one scan (a node runs at most a few hundred pods of a
/// few containers each).
pub const MAX_CGROUPS: usize = 100_000;
/// Deepest directory walked below the cgroup mount (the systemd layout's container scopes
/// are 4 deep).
pub const MAX_DEPTH: usize = 8;

/// The pod UID a cgroup path names, when it lies under `kubepods`.
pub fn pod_uid(path: &Path) -> Option<String> {
    let mut under_kubepods = false;
    let mut found = None;
    for c in path.components() {
        let Component::Normal(name) = c else { continue };
        let name = name.to_str()?;
        if name.starts_with("kubepods") {
            under_kubepods = true;
        }
        if !under_kubepods {
            continue;
        }
        if let Some(uid) = uid_of(name) {
            found = Some(uid);
        }
    }
    found
}

/// The UID of a directory name `pod<uid>` (cgroupfs) or `...-pod<uid_with_underscores>.slice`
/// (systemd).
fn uid_of(name: &str) -> Option<String> {
    let base = name.strip_suffix(".slice").unwrap_or(name);
    let at = base.rfind("pod")?;
    if at > 0 && !base[..at].ends_with('-') {
        return None;
    }
    let uid = base[at + 3..].replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// A UUID as Kubernetes writes UIDs: 8-4-4-4-12 hexadecimal digits.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Cgroup id (directory inode) -> pod UID, from one walk of the cgroup tree.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CgroupIndex {
    by_id: HashMap<u64, String>,
}

impl CgroupIndex {
    /// Walks the `kubepods*` directories under `root` (the cgroup v2 mount).
    pub fn scan(root: &Path) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let mut by_id = HashMap::new();
        let mut stack = Vec::new();
        for entry in std::fs::read_dir(root)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with("kubepods") {
                stack.push((entry.path(), 1));
            }
        }
        let mut walked = 0usize;
        while let Some((dir, depth)) = stack.pop() {
            walked += 1;
            if walked > MAX_CGROUPS {
                tracing::warn!(root = %root.display(), "more than {MAX_CGROUPS} cgroups under kubepods: the rest are not indexed");
                break;
            }
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            if let Some(uid) = pod_uid(dir.strip_prefix(root).unwrap_or(&dir)) {
                by_id.insert(meta.ino(), uid);
            }
            if depth >= MAX_DEPTH {
                continue;
            }
            // A cgroup removed while walking is simply not indexed.
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((entry.path(), depth + 1));
                }
            }
        }
        Ok(Self { by_id })
    }

    /// The UID of the pod whose cgroup (or a container's under it) has this id.
    pub fn pod_uid(&self, cgroup_id: u64) -> Option<&str> {
        self.by_id.get(&cgroup_id).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// Tenants of intercepted clients by their pod's cgroup (see the module docs).
#[derive(Debug)]
pub struct PodCgroups {
    pods: Arc<super::PodDirectory>,
    uids: Arc<Rescanned<Arc<str>>>,
}

impl PodCgroups {
    /// Cgroups under `root` (the cgroup v2 mount), pods from `pods`. Nothing is scanned
    /// until the first lookup: an agent that intercepts nothing never walks the tree.
    pub fn new(pods: Arc<super::PodDirectory>, root: PathBuf) -> Self {
        let uids = Rescanned::new(Box::new(move || match CgroupIndex::scan(&root) {
            Ok(index) => index
                .by_id
                .into_iter()
                .map(|(id, uid)| (id, Arc::<str>::from(uid)))
                .collect(),
            Err(err) => {
                tracing::debug!(root = %root.display(), %err, "cannot walk the pod cgroups");
                HashMap::new()
            }
        }));
        Self { pods, uids }
    }

    /// Cgroups known from the latest scan.
    pub fn len(&self) -> usize {
        self.uids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.uids.is_empty()
    }
}

impl CgroupDirectory for PodCgroups {
    fn tenant_of_cgroup(&self, cgroup_id: u64) -> Option<Arc<str>> {
        self.pods.tenant_of_uid(&self.uids.get(cgroup_id)?)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    const UID: &str = "6f1c3e02-1d7a-4c0b-9d1e-0a5c2f6e8b11";

    #[test]
    fn paths_of_both_drivers_name_the_pod() {
        let cases: [(&str, Option<&str>); 8] = [
            (
                "/kubepods/burstable/pod6f1c3e02-1d7a-4c0b-9d1e-0a5c2f6e8b11/abc123",
                Some(UID),
            ),
            (
                "/kubepods/pod6f1c3e02-1d7a-4c0b-9d1e-0a5c2f6e8b11",
                Some(UID),
            ),
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1c3e02_1d7a_4c0b_9d1e_0a5c2f6e8b11.slice/cri-containerd-abc.scope",
                Some(UID),
            ),
            (
                "/kubepods.slice/kubepods-pod6f1c3e02_1d7a_4c0b_9d1e_0a5c2f6e8b11.slice",
                Some(UID),
            ),
            ("/kubepods.slice/kubepods-burstable.slice", None),
            (
                "/system.slice/pod6f1c3e02-1d7a-4c0b-9d1e-0a5c2f6e8b11",
                None,
            ),
            ("/kubepods/burstable/podnot-a-uid", None),
            (
                "/kubepods/burstable/xpod6f1c3e02-1d7a-4c0b-9d1e-0a5c2f6e8b11",
                None,
            ),
        ];
        for (path, want) in cases {
            assert_eq!(pod_uid(Path::new(path)).as_deref(), want, "{path}");
        }
    }

    /// A directory tree removed on drop, also after a failed assertion.
    struct Tree(std::path::PathBuf);

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_scan_maps_pod_and_container_cgroups_to_the_pod() {
        let tree =
            Tree(std::env::temp_dir().join(format!("warmpath-cgroup-{}", std::process::id())));
        let root = &tree.0;
        let _ = std::fs::remove_dir_all(root);
        let pod = root.join(format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
            UID.replace('-', "_")
        ));
        let container = pod.join("cri-containerd-abc.scope");
        let qos = root.join("kubepods.slice/kubepods-besteffort.slice");
        let other = root.join("system.slice/sshd.service");
        for d in [&container, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let index = CgroupIndex::scan(root).unwrap();
        assert_eq!(index.pod_uid(ino(&pod)), Some(UID));
        assert_eq!(index.pod_uid(ino(&container)), Some(UID));
        assert_eq!(index.pod_uid(ino(&qos)), None, "a QoS class is no pod");
        assert_eq!(index.pod_uid(ino(&other)), None, "outside kubepods");
        assert_eq!(index.len(), 2);
    }

    #[tokio::test]
    async fn a_client_cgroup_resolves_to_its_pod_s_tenant_once_scanned() {
        use crate::tenant::{WorkloadSelectors, Workloads as _};
        let tree =
            Tree(std::env::temp_dir().join(format!("warmpath-podcgroups-{}", std::process::id())));
        let root = tree.0.clone();
        let _ = std::fs::remove_dir_all(&root);
        let container = root.join(format!("kubepods/besteffort/pod{UID}/abc"));
        std::fs::create_dir_all(&container).unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "a", "uid": UID},
            "spec": {"containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.1"},
        }))
        .unwrap();
        let pods = Arc::new(super::super::PodDirectory::default());
        pods.replace_pods([&pod]);
        let mut selectors = WorkloadSelectors::default();
        selectors.add(&Arc::from("team-a"), &["a".to_string()], &[], None);
        pods.select(Arc::new(selectors));
        let cgroups = PodCgroups::new(pods.clone(), root.clone());
        let mut scans = cgroups.uids.subscribe();
        // Nothing scanned before the first lookup; that lookup misses and starts the scan.
        assert!(cgroups.is_empty());
        assert_eq!(cgroups.tenant_of_cgroup(ino(&container)), None);
        scans.changed().await.expect("the map lives");
        assert_eq!(cgroups.len(), 2, "the pod's cgroup and its container's");
        assert_eq!(
            cgroups.tenant_of_cgroup(ino(&container)).as_deref(),
            Some("team-a")
        );
        // The selectors change: the same cgroup follows its pod to the new tenant.
        let mut selectors = WorkloadSelectors::default();
        selectors.add(&Arc::from("team-b"), &["a".to_string()], &[], None);
        pods.select(Arc::new(selectors));
        assert_eq!(
            cgroups.tenant_of_cgroup(ino(&container)).as_deref(),
            Some("team-b")
        );
    }
}
