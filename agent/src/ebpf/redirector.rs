//! `Redirector`: the loaded connect4 program, its cgroup links and typed map handles.
//!
//! Dropping it detaches every link it attached and unloads the programs, so a crashed test or
//! a stopped agent leaves nothing attached (nothing is pinned).

use std::{
    fs::File,
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    maps::{HashMap, MapData, PerCpuArray},
    programs::{CgroupAttachMode, CgroupSockAddr, cgroup_sock_addr::CgroupSockAddrLink},
};
use warmpath_common::{COUNTERS_MAP, Counter, Ipv4Endpoint, ORIG_DST_MAP, REDIRECTS_MAP};

use super::{Error, OBJECT, logs};

/// Name of the connect4 entry point in the object.
const CONNECT4: &str = "connect4";

/// Totals of the program's per-CPU counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// connect() calls inspected.
    pub seen: u64,
    /// connect() calls rewritten.
    pub redirected: u64,
    /// Rewrites whose original destination could not be saved.
    pub orig_dst_failed: u64,
}

/// The connect4 redirect program, loaded; attach it to cgroups and program its VIP table.
pub struct Redirector {
    // Field order matters for drop: links detach before the object goes away.
    links: Vec<(PathBuf, CgroupSockAddrLink)>,
    redirects: HashMap<MapData, Ipv4Endpoint, Ipv4Endpoint>,
    orig_dst: HashMap<MapData, u64, Ipv4Endpoint>,
    counters: PerCpuArray<MapData, u64>,
    log_task: Option<tokio::task::JoinHandle<()>>,
    bpf: Ebpf,
}

impl std::fmt::Debug for Redirector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redirector")
            .field("attached", &self.attached())
            .finish_non_exhaustive()
    }
}

impl Redirector {
    /// Loads the embedded object and verifies the connect4 program (not yet attached).
    pub fn load() -> Result<Self, Error> {
        let object = OBJECT.ok_or(Error::NotEmbedded)?;
        let mut bpf = Ebpf::load(object)?;
        connect4(&mut bpf)?.load().map_err(connect4_error)?;
        let redirects = take_hash_map(&mut bpf, REDIRECTS_MAP)?;
        let orig_dst = take_hash_map(&mut bpf, ORIG_DST_MAP)?;
        let counters = bpf
            .take_map(COUNTERS_MAP)
            .ok_or(Error::Missing(COUNTERS_MAP))?;
        let counters = PerCpuArray::try_from(counters).map_err(|source| Error::Map {
            name: COUNTERS_MAP,
            source,
        })?;
        Ok(Self {
            links: Vec::new(),
            redirects,
            orig_dst,
            counters,
            log_task: None,
            bpf,
        })
    }

    /// Forwards the programs' aya-log records into `tracing` (needs a tokio runtime).
    pub fn forward_logs(&mut self) -> Result<(), Error> {
        if self.log_task.is_none() {
            self.log_task = logs::spawn_forwarder(&mut self.bpf)?;
        }
        Ok(())
    }

    /// Attaches connect4 to the cgroup v2 directory `cgroup`; it then sees every IPv4
    /// connect() made by processes in that cgroup and its descendants.
    pub fn attach(&mut self, cgroup: &Path) -> Result<(), Error> {
        let file = File::open(cgroup).map_err(|source| Error::Io {
            what: format!("open cgroup {}", cgroup.display()),
            source,
        })?;
        let program = connect4(&mut self.bpf)?;
        let id = program
            // With bpf_link the kernel always allows other programs beside ours; Single just
            // means "no legacy attach flags".
            .attach(file, CgroupAttachMode::Single)
            .map_err(connect4_error)?;
        let link = program.take_link(id).map_err(connect4_error)?;
        self.links.push((cgroup.to_path_buf(), link));
        Ok(())
    }

    /// Cgroups the program is attached to.
    pub fn attached(&self) -> Vec<&Path> {
        self.links.iter().map(|(p, _)| p.as_path()).collect()
    }

    /// Detaches from every cgroup (dropping the links detaches them).
    pub fn detach_all(&mut self) {
        self.links.clear();
    }

    /// Sends connections to `vip` to `target` instead.
    pub fn set_redirect(&mut self, vip: SocketAddrV4, target: SocketAddrV4) -> Result<(), Error> {
        self.redirects
            .insert(endpoint(vip), endpoint(target), 0)
            .map_err(|source| Error::Map {
                name: REDIRECTS_MAP,
                source,
            })
    }

    /// Stops intercepting `vip`. Removing a VIP that is not intercepted is not an error.
    pub fn remove_redirect(&mut self, vip: SocketAddrV4) -> Result<(), Error> {
        match self.redirects.remove(&endpoint(vip)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(Error::Map {
                name: REDIRECTS_MAP,
                source,
            }),
        }
    }

    /// The destination the application dialled for the socket with this cookie, if the
    /// program redirected it.
    pub fn original_destination(&self, cookie: u64) -> Result<Option<SocketAddrV4>, Error> {
        match self.orig_dst.get(&cookie, 0) {
            Ok(ep) => Ok(Some(SocketAddrV4::new(
                Ipv4Addr::from(ep.octets()),
                ep.port(),
            ))),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(Error::Map {
                name: ORIG_DST_MAP,
                source,
            }),
        }
    }

    /// Sums the per-CPU counters.
    pub fn counters(&self) -> Result<Counters, Error> {
        let read = |index: u32| -> Result<u64, Error> {
            let values = self.counters.get(&index, 0).map_err(|source| Error::Map {
                name: COUNTERS_MAP,
                source,
            })?;
            Ok(values.iter().sum())
        };
        Ok(Counters {
            seen: read(Counter::SEEN)?,
            redirected: read(Counter::REDIRECTED)?,
            orig_dst_failed: read(Counter::ORIG_DST_FAILED)?,
        })
    }
}

impl Drop for Redirector {
    fn drop(&mut self) {
        self.links.clear();
        if let Some(task) = self.log_task.take() {
            task.abort();
        }
    }
}

/// The object's connect4 program.
fn connect4(bpf: &mut Ebpf) -> Result<&mut CgroupSockAddr, Error> {
    bpf.program_mut(CONNECT4)
        .ok_or(Error::Missing(CONNECT4))?
        .try_into()
        .map_err(connect4_error)
}

fn connect4_error(source: aya::programs::ProgramError) -> Error {
    Error::Program {
        name: CONNECT4,
        source,
    }
}

fn endpoint(addr: SocketAddrV4) -> Ipv4Endpoint {
    Ipv4Endpoint::new(addr.ip().octets(), addr.port())
}

fn take_hash_map<K: aya::Pod, V: aya::Pod>(
    bpf: &mut Ebpf,
    name: &'static str,
) -> Result<HashMap<MapData, K, V>, Error> {
    let map = bpf.take_map(name).ok_or(Error::Missing(name))?;
    HashMap::try_from(map).map_err(|source| Error::Map { name, source })
}
