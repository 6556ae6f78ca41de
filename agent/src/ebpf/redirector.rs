//! `Redirector`: the loaded interception programs (connect4/6, getpeername4/6, sock_ops, the
//! byte counters; sk_msg on the SOCKHASH when asked), their cgroup links and typed map handles
//! (docs/ebpf.md).
//!
//! Loaded with [`Redirector::load`], dropping it detaches every link it attached, so a crashed
//! test leaves nothing attached. Loaded with [`Redirector::load_pinned`] (the agent), maps and
//! links are pinned and outlive the process; its heartbeat then tells the programs whether it
//! is alive (`pinned.rs`).

use std::{collections::HashSet, fs::File, net::SocketAddr, path::Path, path::PathBuf, sync::Arc};

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap, SockHash},
    programs::{
        CgroupAttachMode, CgroupSockAddr, SkMsg, SockOps, cgroup_sock_addr::CgroupSockAddrLink,
        links::FdLink, sock_ops::SockOpsLink,
    },
};
use warmpath_common::{
    AFFINITY_MAP, BACKENDS_MAP, CGROUP_STATS_MAP, CONNS_MAP, COUNTERS_MAP, CgroupStats,
    EXCLUDED_MAP, Endpoint, FourTuple, HEARTBEAT_FOREVER, HEARTBEAT_INTERVAL_NS, HEARTBEAT_MAP,
    LISTENERS_MAP, Origin, SERVICES_MAP, SK_MSG_ON_MAP, SOCKHASH_MAP, STEER_MAP, SockKey,
};

use super::{
    Error, OBJECT,
    counters::{self, Counters},
    layout, logs,
    origins::{Origins, endpoint},
    pinned::{self, FailOpen},
    stats::{self, ProgramRuns},
};

/// The sock_addr entry points in the object: connect4/6 steer and fail open,
/// getpeername4/6 restore the VIP (all pinned in pinned mode), connect4/6_proxy rewrite to the
/// agent (never pinned: their links die with the process).
const SOCK_ADDR_PROGRAMS: [&str; 6] = [
    "connect4",
    "connect6",
    "getpeername4",
    "getpeername6",
    "connect4_proxy",
    "connect6_proxy",
];
/// How many of [`SOCK_ADDR_PROGRAMS`] (the first ones) are pinned in pinned mode.
const PINNED_SOCK_ADDR: usize = 4;
/// The sock_ops entry point.
const SOCK_OPS: &str = "sock_ops";
/// The sk_msg entry point, loaded and attached to the SOCKHASH only by
/// [`Redirector::enable_sk_msg`].
const SK_MSG: &str = "sk_msg_redirect";

/// One cgroup's links: the sock_addr programs and sock_ops, which also counts the bytes of
/// connections sent to a pod (only the proxy pair held when pinned).
struct Attachment {
    cgroup: PathBuf,
    // Dropping a link detaches it.
    _sock_addr: Vec<CgroupSockAddrLink>,
    _sock_ops: Option<SockOpsLink>,
}

/// Entries of the shared tables an earlier agent left in the pinned maps, and what this agent
/// wrote itself: at attach the former minus the latter are removed (this agent's flags are
/// the truth).
#[derive(Default)]
struct Adopted {
    services: HashSet<Endpoint>,
    excluded: HashSet<u64>,
    steer: HashSet<Endpoint>,
    own_services: HashSet<Endpoint>,
    own_excluded: HashSet<u64>,
    own_steer: HashSet<Endpoint>,
}

/// What [`Redirector::reconcile_adopted`] removed of an earlier agent's entries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    pub services: usize,
    pub excluded: usize,
    pub steer: usize,
    /// Listener addresses no intercepted VIP is rewritten to any more.
    pub listeners: usize,
}

/// The heartbeat map and whether the agent stood down (shared with the heartbeat task).
type Heartbeat = Arc<parking_lot::Mutex<(Array<MapData, u64>, bool)>>;

/// The interception programs, loaded; attach them to cgroups and program their VIP table.
pub struct Redirector {
    // Field order matters for drop: links detach before the object goes away.
    attachments: Vec<Attachment>,
    services: HashMap<MapData, Endpoint, Endpoint>,
    /// Every address `services` rewrites to (entries are added, never removed: a listener no
    /// VIP uses any more costs sock_ops a lookup that finds no origin).
    listeners: HashMap<MapData, Endpoint, u32>,
    excluded: HashMap<MapData, u64, u32>,
    steer: HashMap<MapData, Endpoint, u32>,
    origins: Arc<Origins>,
    failopen: FailOpen,
    counters: PerCpuArray<MapData, u64>,
    cgroup_stats: PerCpuHashMap<MapData, u64, CgroupStats>,
    /// The node-local hops' sockets, once sk_msg acceleration is on (never pinned).
    sockhash: Option<SockHash<MapData, SockKey>>,
    /// Pinned mode: the earlier agent's entries found at load, reconciled at the first attach.
    adopted: Option<Adopted>,
    /// The heartbeat map (pinned mode), shared with the heartbeat task; `true` once stood
    /// down (the task writes nothing more).
    heartbeat: Option<Heartbeat>,
    heartbeat_task: Option<tokio::task::JoinHandle<()>>,
    pin_dir: Option<PathBuf>,
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
    /// Loads the embedded object and verifies every program (not yet attached). Nothing is
    /// pinned: links detach when this value drops, so the heartbeat is "forever".
    pub fn load() -> Result<Self, Error> {
        let mut r = Self::load_with(None)?;
        r.write_heartbeat(HEARTBEAT_FOREVER)?;
        r.heartbeat = None;
        Ok(r)
    }

    /// Loads with every map pinned under `dir/maps` (reusing maps an earlier agent pinned
    /// there) and links pinned under `dir/links` on attach; writes a fresh heartbeat.
    pub fn load_pinned(dir: &Path) -> Result<Self, Error> {
        pinned::prepare(dir)?;
        layout::replace_mismatched(dir)?;
        let mut r = Self::load_with(Some(dir))?;
        r.write_heartbeat(monotonic_ns())?;
        Ok(r)
    }

    fn load_with(pin_dir: Option<&Path>) -> Result<Self, Error> {
        let object = OBJECT.ok_or(Error::NotEmbedded)?;
        let mut loader = aya::EbpfLoader::new();
        let log_level = logs::level();
        loader.override_global(aya_log::LEVEL, &log_level, true);
        let paths: Vec<(&str, PathBuf)> = match pin_dir {
            Some(dir) => pinned::MAPS
                .iter()
                .map(|name| (*name, pinned::map_path(dir, name)))
                .collect(),
            None => Vec::new(),
        };
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut bpf = loader.load(object)?;
        for name in SOCK_ADDR_PROGRAMS {
            sock_addr(&mut bpf, name)?
                .load()
                .map_err(program_error(name))?;
        }
        sock_ops(&mut bpf)?
            .load()
            .map_err(program_error(SOCK_OPS))?;
        let services = take_hash_map(&mut bpf, SERVICES_MAP)?;
        let listeners = take_hash_map(&mut bpf, LISTENERS_MAP)?;
        let excluded = take_hash_map(&mut bpf, EXCLUDED_MAP)?;
        let steer = take_hash_map(&mut bpf, STEER_MAP)?;
        let origins = Arc::new(Origins::new(take_hash_map(&mut bpf, CONNS_MAP)?));
        let failopen = FailOpen::new(
            take_hash_map(&mut bpf, AFFINITY_MAP)?,
            take_hash_map(&mut bpf, BACKENDS_MAP)?,
        );
        let heartbeat = bpf
            .take_map(HEARTBEAT_MAP)
            .ok_or(Error::Missing(HEARTBEAT_MAP))?;
        let heartbeat = Array::try_from(heartbeat).map_err(|source| Error::Map {
            name: HEARTBEAT_MAP,
            source,
        })?;
        let counters = bpf
            .take_map(COUNTERS_MAP)
            .ok_or(Error::Missing(COUNTERS_MAP))?;
        let counters = PerCpuArray::try_from(counters).map_err(|source| Error::Map {
            name: COUNTERS_MAP,
            source,
        })?;
        let cgroup_stats = bpf
            .take_map(CGROUP_STATS_MAP)
            .ok_or(Error::Missing(CGROUP_STATS_MAP))?;
        let cgroup_stats = PerCpuHashMap::try_from(cgroup_stats).map_err(|source| Error::Map {
            name: CGROUP_STATS_MAP,
            source,
        })?;
        let adopted = match pin_dir {
            Some(_) => Some(Adopted {
                services: keys(&services, SERVICES_MAP)?,
                excluded: keys(&excluded, EXCLUDED_MAP)?,
                steer: keys(&steer, STEER_MAP)?,
                ..Adopted::default()
            }),
            None => None,
        };
        Ok(Self {
            attachments: Vec::new(),
            services,
            listeners,
            excluded,
            steer,
            origins,
            failopen,
            counters,
            cgroup_stats,
            sockhash: None,
            adopted,
            heartbeat: Some(Arc::new(parking_lot::Mutex::new((heartbeat, false)))),
            heartbeat_task: None,
            pin_dir: pin_dir.map(Path::to_path_buf),
            log_task: None,
            bpf,
        })
    }

    fn write_heartbeat(&mut self, value: u64) -> Result<(), Error> {
        if let Some(map) = self.heartbeat.as_ref() {
            map.lock().0.set(0, value, 0).map_err(|source| Error::Map {
                name: HEARTBEAT_MAP,
                source,
            })?;
        }
        Ok(())
    }

    /// Writes the heartbeat every `HEARTBEAT_INTERVAL_NS` on the current tokio runtime until
    /// this value drops (pinned mode; a no-op otherwise).
    pub fn start_heartbeat(&mut self) {
        let Some(map) = self.heartbeat.clone() else {
            return;
        };
        self.heartbeat_task = Some(tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(std::time::Duration::from_nanos(HEARTBEAT_INTERVAL_NS));
            loop {
                tick.tick().await;
                let mut map = map.lock();
                if map.1 {
                    return;
                }
                if let Err(err) = map.0.set(0, monotonic_ns(), 0) {
                    tracing::warn!(%err, "writing the eBPF heartbeat failed; connects fail open");
                }
            }
        }));
    }

    /// Stops the heartbeat and marks it stale at once (pinned mode): from now on the
    /// programs send no new connect to this agent — they fail open (affinity table, backend
    /// set, or the VIP untouched) — while connections already accepted finish. What an agent
    /// does when told to stop; the next agent writes a fresh heartbeat and takes over.
    pub fn stand_down(&mut self) -> Result<(), Error> {
        if let Some(task) = self.heartbeat_task.take() {
            task.abort();
        }
        // Under the lock: a heartbeat task woken at this moment sees the flag and writes no
        // fresh timestamp over the 0.
        if let Some(map) = self.heartbeat.as_ref() {
            let mut map = map.lock();
            map.1 = true;
            map.0.set(0, 0, 0).map_err(|source| Error::Map {
                name: HEARTBEAT_MAP,
                source,
            })?;
        }
        Ok(())
    }

    /// The fail-open tables (affinity per client cgroup and VIP, backends per VIP).
    pub fn failopen(&mut self) -> &mut FailOpen {
        &mut self.failopen
    }

    /// Forwards the programs' aya-log records into `tracing` (needs a tokio runtime).
    pub fn forward_logs(&mut self) -> Result<(), Error> {
        if self.log_task.is_none() {
            self.log_task = logs::spawn_forwarder(&mut self.bpf)?;
        }
        Ok(())
    }

    /// Attaches every program to the cgroup v2 directory `cgroup`: they then see every
    /// connect(), getpeername() and TCP connection of processes in it and its descendants.
    pub fn attach(&mut self, cgroup: &Path) -> Result<(), Error> {
        let file = File::open(cgroup).map_err(|source| Error::Io {
            what: format!("open cgroup {}", cgroup.display()),
            source,
        })?;
        let mut links = Vec::with_capacity(SOCK_ADDR_PROGRAMS.len());
        for name in SOCK_ADDR_PROGRAMS {
            let program = sock_addr(&mut self.bpf, name)?;
            // With bpf_link the kernel always allows other programs beside ours; Single
            // just means "no legacy attach flags".
            let id = program
                .attach(&file, CgroupAttachMode::Single)
                .map_err(program_error(name))?;
            links.push(program.take_link(id).map_err(program_error(name))?);
        }
        let program = sock_ops(&mut self.bpf)?;
        let id = program
            .attach(&file, CgroupAttachMode::Single)
            .map_err(program_error(SOCK_OPS))?;
        let ops = program.take_link(id).map_err(program_error(SOCK_OPS))?;
        let Some(dir) = self.pin_dir.clone() else {
            self.attachments.push(Attachment {
                cgroup: cgroup.to_path_buf(),
                _sock_addr: links,
                _sock_ops: Some(ops),
            });
            return Ok(());
        };
        let cgroup_id = super::cgroup::cgroup_id(cgroup)?;
        let mut links = links.into_iter();
        for (name, link) in SOCK_ADDR_PROGRAMS[..PINNED_SOCK_ADDR]
            .iter()
            .zip(links.by_ref())
        {
            let fd = FdLink::try_from(link).map_err(|e| Error::Pin(format!("{name}: {e}")))?;
            pinned::pin_link(&dir, name, cgroup_id, fd)?;
        }
        // The proxy rewrite stays with this process (see SOCK_ADDR_PROGRAMS).
        let proxy: Vec<CgroupSockAddrLink> = links.collect();
        let fd = FdLink::try_from(ops).map_err(|e| Error::Pin(format!("{SOCK_OPS}: {e}")))?;
        pinned::pin_link(&dir, SOCK_OPS, cgroup_id, fd)?;
        // Ours are attached: now the links an earlier agent pinned can go.
        let stale = pinned::remove_stale_links(&dir)?;
        if stale > 0 {
            tracing::info!(stale, "removed an earlier agent's pinned links");
        }
        self.attachments.push(Attachment {
            cgroup: cgroup.to_path_buf(),
            _sock_addr: proxy,
            _sock_ops: None,
        });
        let gone = self.reconcile_adopted()?;
        if gone != Reconciled::default() {
            tracing::info!(
                services = gone.services,
                listeners = gone.listeners,
                excluded = gone.excluded,
                steer = gone.steer,
                "removed an earlier agent's pinned entries that this agent's flags do not name"
            );
        }
        Ok(())
    }

    /// Cgroups the programs are attached to.
    pub fn attached(&self) -> Vec<&Path> {
        self.attachments
            .iter()
            .map(|a| a.cgroup.as_path())
            .collect()
    }

    /// Detaches from every cgroup (dropping the links detaches them).
    pub fn detach_all(&mut self) {
        self.attachments.clear();
    }

    /// Sends connections to `vip` to `target` instead. Both must be of one address family
    /// (the rewrite cannot change a socket's family).
    pub fn set_redirect(
        &mut self,
        vip: impl Into<SocketAddr>,
        target: impl Into<SocketAddr>,
    ) -> Result<(), Error> {
        let (vip, target) = (vip.into(), target.into());
        if vip.is_ipv4() != target.is_ipv4() {
            return Err(Error::Family { vip, target });
        }
        // The listener first: a VIP whose listener sock_ops does not know would have its
        // proxy-mode connections reach the agent without their origin.
        self.listeners
            .insert(endpoint(target), 1, 0)
            .map_err(|source| Error::Map {
                name: LISTENERS_MAP,
                source,
            })?;
        self.services
            .insert(endpoint(vip), endpoint(target), 0)
            .map_err(|source| Error::Map {
                name: SERVICES_MAP,
                source,
            })?;
        if let Some(a) = self.adopted.as_mut() {
            a.own_services.insert(endpoint(vip));
        }
        Ok(())
    }

    /// Stops intercepting `vip`. Removing a VIP that is not intercepted is not an error.
    pub fn remove_redirect(&mut self, vip: impl Into<SocketAddr>) -> Result<(), Error> {
        let key = endpoint(vip.into());
        if let Some(a) = self.adopted.as_mut() {
            a.own_services.remove(&key);
        }
        match self.services.remove(&key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(Error::Map {
                name: SERVICES_MAP,
                source,
            }),
        }
    }

    /// Steer mode for `vip` (on) or proxy mode (off): steered connects go straight to a pod
    /// from the fail-open tables, through the agent only when they have no entry.
    pub fn set_steer(&mut self, vip: impl Into<SocketAddr>, on: bool) -> Result<(), Error> {
        let key = endpoint(vip.into());
        if let Some(a) = self.adopted.as_mut() {
            if on {
                a.own_steer.insert(key);
            } else {
                a.own_steer.remove(&key);
            }
        }
        let done = if on {
            self.steer.insert(key, 1, 0)
        } else {
            match self.steer.remove(&key) {
                Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                other => other,
            }
        };
        done.map_err(|source| Error::Map {
            name: STEER_MAP,
            source,
        })
    }

    /// Never rewrites connects made from the cgroup `dir` (the agent's own, so its upstream
    /// connections are not sent back to itself). Only that cgroup: not its descendants.
    pub fn exclude_cgroup(&mut self, dir: &Path) -> Result<u64, Error> {
        let id = super::cgroup::cgroup_id(dir)?;
        self.excluded
            .insert(id, 1, 0)
            .map_err(|source| Error::Map {
                name: EXCLUDED_MAP,
                source,
            })?;
        if let Some(a) = self.adopted.as_mut() {
            a.own_excluded.insert(id);
        }
        Ok(id)
    }

    /// Removes the `SERVICES`, `STEER` and `EXCLUDED` entries an earlier agent left in the
    /// pinned maps that this one did not write itself (`set_redirect`, `set_steer`,
    /// `exclude_cgroup`), and the `LISTENERS` no remaining VIP is rewritten to: a VIP dropped from the flags stops being intercepted, and an earlier
    /// agent's cgroup id (an inode number, reusable) is no longer excluded. Done once, at the
    /// first [`attach`](Self::attach) in pinned mode; a no-op otherwise. Service VIPs that a
    /// Kubernetes watch installs later are removed and installed again: in between, their
    /// connects reach the VIP untouched.
    pub fn reconcile_adopted(&mut self) -> Result<Reconciled, Error> {
        let Some(a) = self.adopted.take() else {
            return Ok(Reconciled::default());
        };
        let mut done = Reconciled::default();
        for key in a.services.difference(&a.own_services) {
            remove_key(&mut self.services, key, SERVICES_MAP)?;
            done.services += 1;
        }
        for key in a.steer.difference(&a.own_steer) {
            remove_key(&mut self.steer, key, STEER_MAP)?;
            done.steer += 1;
        }
        for key in a.excluded.difference(&a.own_excluded) {
            remove_key(&mut self.excluded, key, EXCLUDED_MAP)?;
            done.excluded += 1;
        }
        // Listeners: the map is bounded and never pruned at runtime, so an earlier agent's
        // addresses (another port, another node address) go here.
        let in_use: HashSet<Endpoint> = self
            .services
            .iter()
            .map(|entry| entry.map(|(_, listener)| listener))
            .collect::<Result<_, _>>()
            .map_err(|source| Error::Map {
                name: SERVICES_MAP,
                source,
            })?;
        let listeners = keys(&self.listeners, LISTENERS_MAP)?;
        for key in listeners.difference(&in_use) {
            remove_key(&mut self.listeners, key, LISTENERS_MAP)?;
            done.listeners += 1;
        }
        Ok(done)
    }

    /// Every client cgroup's connects and bytes as the programs counted them (summed over
    /// CPUs): at most `CGROUP_STATS_CAPACITY` entries, the least recently active aged out.
    pub fn cgroup_stats(&self) -> Result<Vec<(u64, CgroupStats)>, Error> {
        sum_cgroup_stats(&self.cgroup_stats)
    }

    /// The accepted-connection lookup (share it with the listeners).
    pub fn origins(&self) -> Arc<Origins> {
        self.origins.clone()
    }

    /// Sums the per-CPU counters.
    pub fn counters(&self) -> Result<Counters, Error> {
        counters::read(&self.counters)
    }

    /// Turns sk_msg acceleration of node-local hops on (`warmpath agent --sk-msg`;
    /// docs/ebpf.md): loads the sk_msg program, attaches it to the SOCKHASH, then sets the flag
    /// that makes sock_ops add both ends of each new proxy-mode connection — in that order,
    /// since a socket takes the map's programs when it is added. Connections established
    /// before stay on TCP. Nothing of it is pinned: the map and the flag belong to this load,
    /// and a restarted agent without the flag starts with it off.
    pub fn enable_sk_msg(&mut self) -> Result<(), Error> {
        if self.sockhash.is_some() {
            return Ok(());
        }
        let map = |name: &'static str| move |source| Error::Map { name, source };
        let sockhash: SockHash<MapData, SockKey> = self
            .bpf
            .take_map(SOCKHASH_MAP)
            .ok_or(Error::Missing(SOCKHASH_MAP))?
            .try_into()
            .map_err(map(SOCKHASH_MAP))?;
        let fd = sockhash.fd().try_clone().map_err(|source| Error::Io {
            what: format!("duplicate the {SOCKHASH_MAP} fd"),
            source,
        })?;
        let program: &mut SkMsg = self
            .bpf
            .program_mut(SK_MSG)
            .ok_or(Error::Missing(SK_MSG))?
            .try_into()
            .map_err(program_error(SK_MSG))?;
        program.load().map_err(program_error(SK_MSG))?;
        program.attach(&fd).map_err(program_error(SK_MSG))?;
        let mut on: Array<MapData, u32> = self
            .bpf
            .take_map(SK_MSG_ON_MAP)
            .ok_or(Error::Missing(SK_MSG_ON_MAP))?
            .try_into()
            .map_err(map(SK_MSG_ON_MAP))?;
        on.set(0, 1, 0).map_err(map(SK_MSG_ON_MAP))?;
        self.sockhash = Some(sockhash);
        Ok(())
    }

    /// Whether [`enable_sk_msg`](Self::enable_sk_msg) turned acceleration on.
    pub fn sk_msg_on(&self) -> bool {
        self.sockhash.is_some()
    }

    /// Every loaded program's run count and run time, as the kernel accounted them while
    /// run-time stats were on ([`super::RunTimeStats`]).
    pub fn program_runs(&self) -> Result<Vec<ProgramRuns>, Error> {
        let mut names: Vec<&'static str> = SOCK_ADDR_PROGRAMS.to_vec();
        names.push(SOCK_OPS);
        names.push(SK_MSG);
        stats::runs(&self.bpf, &names)
    }
}

impl Drop for Redirector {
    fn drop(&mut self) {
        self.attachments.clear();
        for task in [self.log_task.take(), self.heartbeat_task.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds, the clock `bpf_ktime_get_ns` reads.
fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => {
            let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
            secs.saturating_mul(1_000_000_000).saturating_add(nanos)
        }
        // Cannot happen for CLOCK_MONOTONIC; 0 reads as stale, which fails open.
        Err(_) => 0,
    }
}

/// One of the object's sock_addr programs.
fn sock_addr<'a>(bpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut CgroupSockAddr, Error> {
    bpf.program_mut(name)
        .ok_or(Error::Missing(name))?
        .try_into()
        .map_err(program_error(name))
}

/// The map `name` pinned under `dir`, as aya's typed map `M`.
fn open_pinned<M>(dir: &Path, name: &'static str) -> Result<M, Error>
where
    M: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = |source| Error::Map { name, source };
    let data = MapData::from_pin(pinned::map_path(dir, name)).map_err(map)?;
    M::try_from(aya::maps::Map::from_map_data(data).map_err(map)?).map_err(map)
}

/// Every client cgroup's stats in the map pinned under `dir` (for inspection and tests).
pub fn pinned_cgroup_stats(dir: &Path) -> Result<Vec<(u64, CgroupStats)>, Error> {
    let stats: PerCpuHashMap<MapData, u64, CgroupStats> = open_pinned(dir, CGROUP_STATS_MAP)?;
    sum_cgroup_stats(&stats)
}

/// How many proxy-mode connections the pinned `WARMPATH_CONNS` under `dir` holds an origin
/// for: those established and not yet closed by the agent (plus any a client closed before
/// the agent accepted it, until they age out).
pub fn pinned_conns(dir: &Path) -> Result<usize, Error> {
    let conns: HashMap<MapData, FourTuple, Origin> = open_pinned(dir, CONNS_MAP)?;
    let mut n = 0;
    for key in conns.keys() {
        match key {
            Ok(_) => n += 1,
            // Removed between two steps of the walk.
            Err(aya::maps::MapError::KeyNotFound) => {}
            Err(source) => {
                return Err(Error::Map {
                    name: CONNS_MAP,
                    source,
                });
            }
        }
    }
    Ok(n)
}

/// The per-CPU values of every entry, summed.
fn sum_cgroup_stats(
    map: &PerCpuHashMap<MapData, u64, CgroupStats>,
) -> Result<Vec<(u64, CgroupStats)>, Error> {
    let mut out = Vec::new();
    for entry in map.iter() {
        let (cgroup_id, per_cpu) = match entry {
            Ok(e) => e,
            // Aged out between the key walk and the read.
            Err(aya::maps::MapError::KeyNotFound) => continue,
            Err(source) => {
                return Err(Error::Map {
                    name: CGROUP_STATS_MAP,
                    source,
                });
            }
        };
        let total = per_cpu
            .iter()
            .fold(CgroupStats::default(), |t, c| CgroupStats {
                connects_proxy: t.connects_proxy.wrapping_add(c.connects_proxy),
                connects_steered: t.connects_steered.wrapping_add(c.connects_steered),
                connects_failopen: t.connects_failopen.wrapping_add(c.connects_failopen),
                bytes_sent: t.bytes_sent.wrapping_add(c.bytes_sent),
                bytes_received: t.bytes_received.wrapping_add(c.bytes_received),
            });
        out.push((cgroup_id, total));
    }
    Ok(out)
}

/// The keys of a hash map (a pinned map's entries at load).
fn keys<K: aya::Pod + Eq + std::hash::Hash, V: aya::Pod>(
    map: &HashMap<MapData, K, V>,
    name: &'static str,
) -> Result<HashSet<K>, Error> {
    map.keys()
        .collect::<Result<_, _>>()
        .map_err(|source| Error::Map { name, source })
}

/// Removes `key` (absent is not an error).
fn remove_key<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    key: &K,
    name: &'static str,
) -> Result<(), Error> {
    match map.remove(key) {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(source) => Err(Error::Map { name, source }),
    }
}

/// The object's sock_ops program.
fn sock_ops(bpf: &mut Ebpf) -> Result<&mut SockOps, Error> {
    bpf.program_mut(SOCK_OPS)
        .ok_or(Error::Missing(SOCK_OPS))?
        .try_into()
        .map_err(program_error(SOCK_OPS))
}

fn program_error(name: &'static str) -> impl Fn(aya::programs::ProgramError) -> Error {
    move |source| Error::Program { name, source }
}

fn take_hash_map<K: aya::Pod, V: aya::Pod>(
    bpf: &mut Ebpf,
    name: &'static str,
) -> Result<HashMap<MapData, K, V>, Error> {
    let map = bpf.take_map(name).ok_or(Error::Missing(name))?;
    HashMap::try_from(map).map_err(|source| Error::Map { name, source })
}
