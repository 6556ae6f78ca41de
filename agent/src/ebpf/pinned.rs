//! Pinned state under bpffs (`<bpffs>/warmpath/` by default): maps in `maps/`, links in
//! `links/`, so interception and fail-open survive the agent process (docs/ebpf.md).
//!
//! A starting agent reuses the pinned maps (aya opens a pinned map by path instead of
//! creating it), attaches and pins fresh links, then removes the links an earlier agent
//! pinned: make before break, so no connect ever finds the cgroup without programs.
//! [`cleanup`] removes everything.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use aya::{
    maps::{HashMap, Map, MapData},
    programs::links::FdLink,
};
use warmpath_common::{
    AFFINITY_MAP, AffinityKey, BACKENDS_MAP, BACKENDS_MAX, Backends, CONNS_MAP, COUNTERS_MAP,
    EXCLUDED_MAP, Endpoint, HEARTBEAT_MAP, ORIG_DST_MAP, SERVICES_MAP, STEER_MAP,
};

use super::{
    Error,
    origins::{endpoint, socket_addr},
};

/// Every map the object declares except the sk_msg ones (`WARMPATH_SOCKHASH`,
/// `WARMPATH_SK_MSG_ON`, `WARMPATH_SK_MSG_TCP`: per load, never pinned); all of these are
/// pinned.
pub const MAPS: [&str; 12] = [
    SERVICES_MAP,
    ORIG_DST_MAP,
    warmpath_common::RECENT_MAP,
    warmpath_common::LISTENERS_MAP,
    CONNS_MAP,
    EXCLUDED_MAP,
    COUNTERS_MAP,
    HEARTBEAT_MAP,
    AFFINITY_MAP,
    BACKENDS_MAP,
    STEER_MAP,
    warmpath_common::CGROUP_STATS_MAP,
];

/// The default pin directory under a bpffs mount.
pub fn default_dir(bpffs: &Path) -> PathBuf {
    bpffs.join("warmpath")
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { what, source }
}

/// `dir/maps` and `dir/links`, created (owner only) when missing.
pub fn prepare(dir: &Path) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt as _;
    for sub in ["maps", "links"] {
        let path = dir.join(sub);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&path)
            .map_err(io(format!("create {}", path.display())))?;
    }
    Ok(())
}

/// Where map `name` is pinned.
pub fn map_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("maps").join(name)
}

/// Pins `link` as `dir/links/<program>-<cgroup id>-<pid>` (this agent's generation).
pub fn pin_link(dir: &Path, program: &str, cgroup_id: u64, link: FdLink) -> Result<(), Error> {
    let path = dir
        .join("links")
        .join(format!("{program}-{cgroup_id}-{}", std::process::id()));
    link.pin(&path)
        .map(drop)
        .map_err(|e| Error::Pin(format!("{}: {e}", path.display())))
}

/// Detaches and removes the pinned links that another process pinned (an earlier agent's),
/// keeping this process's. Returns how many were removed.
pub fn remove_stale_links(dir: &Path) -> Result<usize, Error> {
    let own = format!("-{}", std::process::id());
    remove_links(dir, |name| !name.ends_with(&own))
}

fn remove_links(dir: &Path, remove: impl Fn(&str) -> bool) -> Result<usize, Error> {
    let links = dir.join("links");
    let entries = match fs::read_dir(&links) {
        Ok(e) => e,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(err) => return Err(io(format!("read {}", links.display()))(err)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(io(format!("read {}", links.display())))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !remove(&name) {
            continue;
        }
        let path = entry.path();
        // Unpinning drops the last reference: the kernel detaches the link.
        let link = aya::programs::links::PinnedLink::from_pin(&path)
            .map_err(|e| Error::Pin(format!("{}: {e}", path.display())))?;
        drop(
            link.unpin()
                .map_err(io(format!("unpin {}", path.display())))?,
        );
        removed += 1;
    }
    Ok(removed)
}

/// What [`cleanup`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cleaned {
    pub links: usize,
    pub maps: usize,
}

/// Detaches every pinned link and unpins every map under `dir`, then removes `dir`. A
/// missing `dir` is nothing to do.
pub fn cleanup(dir: &Path) -> Result<Cleaned, Error> {
    if !dir.exists() {
        return Ok(Cleaned::default());
    }
    let links = remove_links(dir, |_| true)?;
    let mut maps = 0;
    let maps_dir = dir.join("maps");
    if let Ok(entries) = fs::read_dir(&maps_dir) {
        for entry in entries.flatten() {
            fs::remove_file(entry.path())
                .map_err(io(format!("unpin {}", entry.path().display())))?;
            maps += 1;
        }
    }
    for sub in [dir.join("links"), maps_dir, dir.to_path_buf()] {
        match fs::remove_dir(&sub) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(io(format!("remove {}", sub.display()))(err)),
        }
    }
    Ok(Cleaned { links, maps })
}

/// Whose affinity entry: (client cgroup id, VIP).
pub type AffinityOf = (u64, SocketAddr);

/// The fail-open tables: (client cgroup, VIP) -> pods, and VIP -> pods.
pub struct FailOpen {
    affinity: HashMap<MapData, AffinityKey, Backends>,
    backends: HashMap<MapData, Endpoint, Backends>,
}

impl std::fmt::Debug for FailOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailOpen").finish_non_exhaustive()
    }
}

impl FailOpen {
    pub(super) fn new(
        affinity: HashMap<MapData, AffinityKey, Backends>,
        backends: HashMap<MapData, Endpoint, Backends>,
    ) -> Self {
        Self { affinity, backends }
    }

    /// The tables of the agent whose state is pinned under `dir` (for inspection and tests).
    pub fn open_pinned(dir: &Path) -> Result<Self, Error> {
        Ok(Self {
            affinity: open_hash(dir, AFFINITY_MAP)?,
            backends: open_hash(dir, BACKENDS_MAP)?,
        })
    }

    /// While the agent is down, the client in cgroup `cgroup_id` dialling `vip` goes to one
    /// of `pods` (at most [`BACKENDS_MAX`], same family as `vip`).
    pub fn set_affinity(
        &mut self,
        cgroup_id: u64,
        vip: SocketAddr,
        pods: &[SocketAddr],
    ) -> Result<(), Error> {
        let key = AffinityKey {
            cgroup_id,
            vip: endpoint(vip),
            _pad: 0,
        };
        let set = backends(vip, pods)?;
        self.affinity
            .insert(key, set, 0)
            .map_err(|source| Error::Map {
                name: AFFINITY_MAP,
                source,
            })
    }

    /// Drops a client's affinity entry (absent is not an error).
    pub fn remove_affinity(&mut self, cgroup_id: u64, vip: SocketAddr) -> Result<(), Error> {
        let key = AffinityKey {
            cgroup_id,
            vip: endpoint(vip),
            _pad: 0,
        };
        match self.affinity.remove(&key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(Error::Map {
                name: AFFINITY_MAP,
                source,
            }),
        }
    }

    /// While the agent is down, clients with no affinity entry dialling `vip` go to one of
    /// `pods`.
    pub fn set_backends(&mut self, vip: SocketAddr, pods: &[SocketAddr]) -> Result<(), Error> {
        let set = backends(vip, pods)?;
        self.backends
            .insert(endpoint(vip), set, 0)
            .map_err(|source| Error::Map {
                name: BACKENDS_MAP,
                source,
            })
    }

    /// Drops a VIP's backend set (absent is not an error).
    pub fn remove_backends(&mut self, vip: SocketAddr) -> Result<(), Error> {
        match self.backends.remove(&endpoint(vip)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(Error::Map {
                name: BACKENDS_MAP,
                source,
            }),
        }
    }

    /// Every affinity entry in the map now — (cgroup id, VIP) -> pods, a pod listed as
    /// often as it is in the entry — e.g. what an earlier agent wrote (pinned maps). Entries
    /// that do not decode are left out.
    pub fn affinity_entries(&self) -> Result<Vec<(AffinityOf, Vec<SocketAddr>)>, Error> {
        let map = |source| Error::Map {
            name: AFFINITY_MAP,
            source,
        };
        let mut out = Vec::new();
        for item in self.affinity.iter() {
            let (key, set) = item.map_err(map)?;
            if let Some(vip) = socket_addr(&key.vip) {
                out.push(((key.cgroup_id, vip), pods_of(&set)));
            }
        }
        Ok(out)
    }

    /// Every backend set in the map now (VIP -> pods), as [`FailOpen::affinity_entries`].
    pub fn backends_entries(&self) -> Result<Vec<(SocketAddr, Vec<SocketAddr>)>, Error> {
        let map = |source| Error::Map {
            name: BACKENDS_MAP,
            source,
        };
        let mut out = Vec::new();
        for item in self.backends.iter() {
            let (vip, set) = item.map_err(map)?;
            if let Some(vip) = socket_addr(&vip) {
                out.push((vip, pods_of(&set)));
            }
        }
        Ok(out)
    }
}

/// The pods of a set, in slot order (at most its `len`, undecodable slots left out).
fn pods_of(set: &Backends) -> Vec<SocketAddr> {
    let len = (set.len as usize).min(BACKENDS_MAX);
    set.pods[..len].iter().filter_map(socket_addr).collect()
}

fn backends(vip: SocketAddr, pods: &[SocketAddr]) -> Result<Backends, Error> {
    if pods.is_empty() || pods.len() > BACKENDS_MAX {
        return Err(Error::Backends(format!(
            "{} pods for {vip}; between 1 and {BACKENDS_MAX}",
            pods.len()
        )));
    }
    let mut set = Backends {
        len: pods.len() as u32,
        ..Backends::default()
    };
    for (slot, pod) in set.pods.iter_mut().zip(pods) {
        if pod.is_ipv4() != vip.is_ipv4() {
            return Err(Error::Family { vip, target: *pod });
        }
        *slot = endpoint(*pod);
    }
    Ok(set)
}

fn open_hash<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    name: &'static str,
) -> Result<HashMap<MapData, K, V>, Error> {
    let map = |source| Error::Map { name, source };
    let data = MapData::from_pin(map_path(dir, name)).map_err(map)?;
    HashMap::try_from(Map::from_map_data(data).map_err(map)?).map_err(map)
}
