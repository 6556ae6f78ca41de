//! What `bench ebpf` builds and tears down: network namespaces (a node with a bridge and pods
//! on veths, or lone namespaces), cgroups, a pin directory and iptables rules inside its own
//! namespaces. Every piece is a guard that removes itself when dropped, so a failed or
//! interrupted run leaves nothing behind (the rules go with their namespace).

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use warmpath_agent::ebpf::{ChildCgroup, cgroup2_root};

use crate::{
    Error,
    logs::Logs,
    process::{Logged, spawn_logged},
};

/// Where `ip netns add` puts namespaces.
const NETNS_DIR: &str = "/run/netns";

/// How often [`wait_log`] reads a child's log.
const LOG_POLL: Duration = Duration::from_millis(20);

fn setup(what: impl std::fmt::Display) -> Error {
    Error::Setup(what.to_string())
}

/// Runs `program args...`; its stderr in the error when it fails.
pub fn run_tool(program: &str, args: &[&str]) -> Result<(), Error> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| Error::Io {
            what: format!("run {program} {}", args.join(" ")),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(setup(format!(
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Whether an `iptables` binary runs here (`iptables -V`).
pub fn iptables_installed() -> bool {
    Command::new("iptables")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

// === Netns ===

/// A network namespace this run created; deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// `ip netns add name` with `lo` up (fails if it exists: it may be someone else's).
    pub fn create(name: &str) -> Result<Self, Error> {
        run_tool("ip", &["netns", "add", name])?;
        let ns = Self { name: name.into() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// `ip -n <name> args...`.
    pub fn ip(&self, args: &[&str]) -> Result<(), Error> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run_tool("ip", &all)
    }

    /// `program args...` run inside the namespace (`ip netns exec`).
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<(), Error> {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        run_tool("ip", &all)
    }

    /// `iptables -w -t nat args...` inside the namespace.
    pub fn nat(&self, args: &[&str]) -> Result<(), Error> {
        let mut all = vec!["-w", "-t", "nat"];
        all.extend_from_slice(args);
        self.exec("iptables", &all)
    }

    /// Moves the calling thread (only it) into the namespace: sockets it creates from then on
    /// live there.
    pub fn enter_thread(&self) -> Result<(), Error> {
        let file = std::fs::File::open(self.path()).map_err(|source| Error::Io {
            what: format!("open {}", self.path().display()),
            source,
        })?;
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| setup(format!("setns into {}: {e}", self.name)))
    }

    /// Starts `exe args...` (with `env` added) inside the namespace (`nsenter --net`: nothing else changes, so
    /// the cgroup and bpffs mounts stay visible), its output into the next `<role>-<n>.log`.
    pub fn spawn(
        &self,
        exe: &Path,
        args: &[String],
        env: &[(&str, &str)],
        role: &str,
        logs: &Logs,
    ) -> Result<Logged, Error> {
        let log = logs.open(role)?;
        let name = log.name();
        let mut cmd = tokio::process::Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(exe)
            .args(args)
            .env("TOKIO_WORKER_THREADS", "1")
            .envs(env.iter().copied());
        spawn_logged(&mut cmd, &name, log, false)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(err) = run_tool("ip", &["netns", "del", &self.name]) {
            tracing::warn!(%err, netns = %self.name, "could not delete network namespace");
        }
    }
}

// === Node ===

/// A node namespace `<tag>n` with a bridge (`10.232.0.1/24`) and pods `<tag>0`, `<tag>1`,
/// ... on veths (`10.232.0.2`, `10.232.0.3`, ...), default route via the node. Pods are
/// deleted before the node (field order).
#[derive(Debug)]
pub struct Node {
    pub pods: Vec<Netns>,
    pub ns: Netns,
}

impl Node {
    /// The node's address on the pod network (where the agent listens).
    pub const IP: Ipv4Addr = Ipv4Addr::new(10, 232, 0, 1);

    /// Pod `i`'s address.
    pub fn pod_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 232, 0, u8::try_from(i + 2).unwrap_or(u8::MAX))
    }

    pub fn create(tag: &str, pods: usize) -> Result<Self, Error> {
        let ns = Netns::create(&format!("{tag}n"))?;
        let mut node = Self {
            pods: Vec::with_capacity(pods),
            ns,
        };
        node.ns.ip(&["link", "add", "br0", "type", "bridge"])?;
        node.ns
            .ip(&["addr", "add", &format!("{}/24", Self::IP), "dev", "br0"])?;
        node.ns.ip(&["link", "set", "br0", "up"])?;
        for i in 0..pods {
            let pod = Netns::create(&format!("{tag}{i}"))?;
            let host_side = format!("p{i}");
            node.ns.ip(&[
                "link", "add", &host_side, "type", "veth", "peer", "name", "eth0", "netns",
                &pod.name,
            ])?;
            node.ns
                .ip(&["link", "set", &host_side, "master", "br0", "up"])?;
            let ip = format!("{}/24", Self::pod_ip(i));
            pod.ip(&["addr", "add", &ip, "dev", "eth0"])?;
            pod.ip(&["link", "set", "eth0", "up"])?;
            pod.ip(&["route", "add", "default", "via", &Self::IP.to_string()])?;
            node.pods.push(pod);
        }
        Ok(node)
    }
}

// === cgroups ===

/// `warmpath-bench-<tag>` under the cgroup v2 root and named children; removed when dropped
/// (members are moved out first). Children before the parent (field order).
#[derive(Debug)]
pub struct Cgroups {
    pub children: Vec<ChildCgroup>,
    pub parent: ChildCgroup,
}

impl Cgroups {
    pub fn create(tag: &str, children: &[&str]) -> Result<Self, Error> {
        let fail = |e: warmpath_agent::ebpf::Error| setup(format!("cgroups: {e}"));
        let root = cgroup2_root().map_err(fail)?;
        let parent = ChildCgroup::create(&root, &format!("warmpath-bench-{tag}")).map_err(fail)?;
        let children = children
            .iter()
            .map(|name| ChildCgroup::create(parent.path(), name).map_err(fail))
            .collect::<Result<_, _>>()?;
        Ok(Self { children, parent })
    }
}

/// Moves this whole process into a cgroup and back to where it was when dropped.
#[derive(Debug)]
pub struct Moved {
    home: PathBuf,
}

impl Moved {
    pub fn into(cgroup: &Path) -> Result<Self, Error> {
        let home = warmpath_agent::ebpf::own_cgroup()
            .map_err(|e| setup(format!("this process's cgroup: {e}")))?;
        move_self(cgroup)?;
        Ok(Self { home })
    }
}

impl Drop for Moved {
    fn drop(&mut self) {
        if let Err(err) = move_self(&self.home) {
            tracing::warn!(%err, "could not move back to the original cgroup");
        }
    }
}

fn move_self(cgroup: &Path) -> Result<(), Error> {
    std::fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string()).map_err(|source| {
        Error::Io {
            what: format!("move this process into {}", cgroup.display()),
            source,
        }
    })
}

// === pins ===

/// A pin directory under bpffs for this run's agents; everything pinned there is detached
/// and removed when dropped.
#[derive(Debug)]
pub struct Pins {
    pub dir: PathBuf,
}

impl Pins {
    pub fn new(tag: &str) -> Self {
        Self {
            dir: Path::new(warmpath_agent::ebpf::DEFAULT_BPFFS)
                .join(format!("warmpath-bench-{tag}")),
        }
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        if let Err(err) = warmpath_agent::ebpf::cleanup(&self.dir) {
            tracing::warn!(%err, dir = %self.dir.display(), "could not remove pinned state");
        }
    }
}

/// Waits until `process`'s log contains `needle`, for at most `within`; fails at once,
/// quoting the log, if the process exits first.
pub async fn wait_log(process: &mut Logged, needle: &str, within: Duration) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        process.check_running()?;
        let text = tokio::fs::read_to_string(&process.log.path)
            .await
            .unwrap_or_default();
        if text.contains(needle) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(process.failed(&format!("did not log `{needle}` within {within:?}")));
        }
        tokio::time::sleep(LOG_POLL).await;
    }
}
