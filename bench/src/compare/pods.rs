//! The intercepted row of `bench compare` (`Precise (eBPF intercept)`, issue #20's test 6):
//! precise agents behind transparent interception, with the clients where a real node has
//! them — in pod network namespaces and cgroups of their own, dialling a Service VIP.
//!
//! What the row builds (named after `wpc<pid>`, the tag; all removed when the row ends,
//! fails or is interrupted — processes first, then pins, cgroups, namespaces):
//!
//! - a node namespace `<tag>n` with a bridge at [`Node::IP`] (10.232.0.1/24) and one pod
//!   namespace per agent, `<tag>0`, `<tag>1`, ... on veths (10.232.0.2, ...), each pod with a
//!   cgroup of its own (`warmpath-bench-<tag>/pod<k>`);
//! - the simulator fleet as in every other row (in this process, where its prefix-cache
//!   counters are read, on its runtime), its sockets bound in the node namespace at the
//!   node's address ([`netns::on_main_runtime_in`]);
//! - the agents: `warmpath agent` processes in the node namespace listening at
//!   `10.232.0.1:8080+k`, flagged as the Precise row's (cluster mode, gossip on the node
//!   namespace's loopback), agent `k` with `--redirect 10.96.0.10:8000=<its listener>` on
//!   pod `k`'s cgroup and its own pin directory: one Service VIP, each node's agent
//!   intercepting its own node's pods, as a DaemonSet does;
//! - the load generator: one `bench compare-client` per node in its pod's namespace and
//!   cgroup ([`pod_client`]), sending that node's users' chains of the same plan to
//!   `http://10.96.0.10:8000`, all starting at once.
//!
//! This process orchestrates from a thread inside the node namespace ([`NetnsRuntime`]): the
//! agents' admin ports are on its loopback. Evidence that the clients ran in the pods: each
//! agent logs every connection it accepts from interception (`RUST_LOG` adds
//! `warmpath_agent::proxy::listener=debug`), with the client's address and cgroup id; the row
//! counts them per pod into `compare.json` (`intercept`).

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use super::{
    Chain, Error, Phase, Row, Setup, Target,
    drive::finish,
    netns::{self, NetnsRuntime},
    pod_client::{self, PodClient},
};
use crate::{
    agents::{Agents, Placement},
    cluster_agents::{self, AgentPods},
    ebpf::setup::{Cgroups, Node, Pins},
    logs::Logs,
    process::{Logged, start_fleet},
    run::report::Sample,
};
use warmpath_agent::routing::Policy;

/// The Service VIP every client dials (exists only as a destination inside the pods: a
/// connect the kernel did not rewrite has no route and fails).
const VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 10), 8000);
/// Agent `k` listens at the node's address, port `AGENT_PORT + k`.
const AGENT_PORT: u16 = 8080;
/// How long a (debug) agent may take to attach its programs after it answered `/ready`.
const ATTACH_WITHIN: Duration = Duration::from_secs(60);
/// How often the agents' logs are read while waiting for the attach (and the pods' cgroups
/// while waiting for their processes to exit).
const LOG_POLL: Duration = Duration::from_millis(20);
/// How long the processes of a row that failed or was interrupted may take to exit once
/// killed, before their cgroups are removed.
const EXIT_WITHIN: Duration = Duration::from_secs(5);
/// The agents' log filter added to `RUST_LOG`: one line per intercepted connection.
const ACCEPT_LOG: &str = "warmpath_agent::proxy::listener=debug";
/// What an agent logs when its programs are attached, and when it could not attach them.
const ATTACHED: &str = "interception attached";
const NOT_ATTACHED: &str = "interception off";

/// Why the row cannot run here, if it cannot: the kernel data path, cgroup v2, and the tools
/// that build the namespaces.
pub(super) fn unavailable_reason() -> Option<String> {
    if let Some(why) = warmpath_agent::ebpf::unavailable_reason() {
        return Some(why);
    }
    if let Err(e) = warmpath_agent::ebpf::cgroup2_root() {
        return Some(format!("no cgroup v2 hierarchy: {e}"));
    }
    for (tool, arg, package) in [
        ("ip", "-V", "iproute2"),
        ("nsenter", "--version", "util-linux"),
    ] {
        let runs = std::process::Command::new(tool)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success());
        if !runs {
            return Some(format!(
                "`{tool}` is not installed ({package}; the row's pods are network namespaces)"
            ));
        }
    }
    None
}

/// What the row built and what its pods' clients did, for `compare.json`: where each client
/// ran and how many of its connections its node's agent saw intercepted.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Intercept {
    pub vip: SocketAddrV4,
    pub node_netns: String,
    pub node_address: Ipv4Addr,
    /// The pods' parent cgroup and the agents' pin directories (all removed after the row).
    pub cgroup: PathBuf,
    pub pin_dirs: Vec<PathBuf>,
    pub pods: Vec<PodRecord>,
}

/// One client pod.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PodRecord {
    pub netns: String,
    pub address: Ipv4Addr,
    pub cgroup: PathBuf,
    pub cgroup_id: u64,
    /// Its node's agent's listener (where connect4 sends its connects to the VIP).
    pub agent: SocketAddr,
    /// Requests it got answered.
    pub requests: usize,
    /// Connections its node's agent accepted from interception from this pod's address and
    /// cgroup id (the agent's log).
    pub intercepted: usize,
    /// Connections that agent accepted from interception from anywhere else (none expected).
    pub intercepted_other: usize,
}

/// The namespaces, cgroups and pins of one run of the row; dropped in field order: the
/// runtime (and with it every process it started), then pins, cgroups, namespaces.
struct Built {
    rt: Option<NetnsRuntime>,
    pins: Vec<Pins>,
    cgroups: Cgroups,
    node: Node,
}

impl Drop for Built {
    fn drop(&mut self) {
        // Processes killed on drop take a moment to exit; a cgroup is busy until they have.
        drop(self.rt.take());
        let deadline = std::time::Instant::now() + EXIT_WITHIN;
        for pod in &self.cgroups.children {
            while populated(pod.path()) && std::time::Instant::now() < deadline {
                std::thread::sleep(LOG_POLL);
            }
        }
    }
}

/// Whether a process is still in the cgroup at `dir` or below (`cgroup.events`).
fn populated(dir: &std::path::Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|events| events.lines().any(|l| l == "populated 1"))
}

/// Runs the row: `sim_flags` are the other rows' fleet flags.
pub(super) async fn run_row(
    args: &Setup,
    mut sim_flags: Vec<String>,
    plan: Arc<Vec<Chain>>,
    logs: &Logs,
    phase: &Arc<Phase>,
) -> Result<Row, Error> {
    let nodes = usize::from(args.agents);
    let tag = format!("wpc{}", std::process::id() % 100_000);
    let node = Node::create(&tag, nodes)?;
    let names: Vec<String> = (0..nodes).map(|k| format!("pod{k}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let cgroups = Cgroups::create(&tag, &names)?;
    let pins = (0..nodes)
        .map(|k| Pins::new(&format!("{tag}a{k}")))
        .collect();
    let mut built = Built {
        rt: None,
        pins,
        cgroups,
        node,
    };
    sim_flags.extend(["--host".into(), Node::IP.to_string()]);
    let handle = tokio::runtime::Handle::current();
    let (_, engines) =
        netns::on_main_runtime_in(&built.node.ns.path(), handle, start_fleet(sim_flags)).await??;
    let result = in_node(args, &mut built, &engines, plan.clone(), logs, phase)
        .await
        .map(|(per_agent, wall, held, intercept)| Row {
            cluster: held,
            intercept: Some(intercept),
            ..finish(args, &Target::Intercepted, &plan, per_agent, wall, &engines)
        });
    for e in engines {
        e.shutdown();
    }
    drop(built);
    result
}

/// What the row's part inside the node namespace hands back: each node's answered requests,
/// the wall seconds, the cluster's convergence and the pods' record.
type InNode = (Vec<Vec<Sample>>, f64, Vec<AgentPods>, Intercept);

async fn in_node(
    args: &Setup,
    built: &mut Built,
    engines: &[warmpath_sim::fleet::RunningEngine],
    plan: Arc<Vec<Chain>>,
    logs: &Logs,
    phase: &Arc<Phase>,
) -> Result<InNode, Error> {
    let (flags, cluster) = super::agent_flags(args, Target::Intercepted, Policy::Precise, engines)?;
    let pods = built
        .node
        .pods
        .iter()
        .zip(&built.cgroups.children)
        .enumerate()
        .map(|(k, (ns, cgroup))| {
            let cgroup_id = warmpath_agent::ebpf::cgroup_id(cgroup.path())
                .map_err(|e| Error::Setup(format!("pod {k}'s cgroup: {e}")))?;
            Ok(PodSpec {
                netns: ns.path(),
                address: Node::pod_ip(k),
                cgroup: cgroup.path().to_path_buf(),
                cgroup_id,
                agent: SocketAddr::from((Node::IP, AGENT_PORT + k as u16)),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let job = NodeJob {
        args: args.clone(),
        flags,
        cluster,
        ids: cluster_agents::engine_ids(engines),
        node_netns: built.node.ns.path(),
        pods,
        pin_dirs: built.pins.iter().map(|p| p.dir.clone()).collect(),
        plan,
        logs: logs.clone(),
        phase: phase.clone(),
    };
    let rt = built.rt.insert(NetnsRuntime::start(&built.node.ns.path())?);
    let (per_agent, wall, held, pods) = rt.run(job.run()).await??;
    let intercept = Intercept {
        vip: VIP,
        node_netns: name_of(&built.node.ns.path()),
        node_address: Node::IP,
        cgroup: built.cgroups.parent.path().to_path_buf(),
        pin_dirs: built.pins.iter().map(|p| p.dir.clone()).collect(),
        pods,
    };
    note(phase, &intercept);
    Ok((per_agent, wall, held, intercept))
}

/// The last part of a path (a namespace's name).
fn name_of(path: &std::path::Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// The row's phase line about its pods.
fn note(phase: &Phase, intercept: &Intercept) {
    let total: usize = intercept.pods.iter().map(|p| p.intercepted).sum();
    let per_pod: Vec<String> = intercept
        .pods
        .iter()
        .map(|p| format!("{} (cgroup {}): {}", p.address, p.cgroup_id, p.intercepted))
        .collect();
    phase.note(&format!(
        "  eBPF: clients in {} pod namespaces; {total} connections to {} intercepted by their node's agent ({})",
        intercept.pods.len(),
        intercept.vip,
        per_pod.join(", ")
    ));
    let other: usize = intercept.pods.iter().map(|p| p.intercepted_other).sum();
    let silent = intercept
        .pods
        .iter()
        .filter(|p| p.requests > 0 && p.intercepted == 0)
        .count();
    if other > 0 || silent > 0 {
        phase.note(&format!(
            "  eBPF: unexpected: {other} intercepted connections from another address or cgroup, {silent} pods answered without an intercepted connection (see the agents' logs)"
        ));
    }
}

/// One client pod, before its client runs.
#[derive(Debug, Clone)]
struct PodSpec {
    netns: PathBuf,
    address: Ipv4Addr,
    cgroup: PathBuf,
    cgroup_id: u64,
    agent: SocketAddr,
}

/// Everything the part inside the node namespace needs, owned (it runs on that namespace's
/// thread).
struct NodeJob {
    args: Setup,
    flags: Vec<Vec<String>>,
    cluster: bool,
    ids: Vec<String>,
    node_netns: PathBuf,
    pods: Vec<PodSpec>,
    pin_dirs: Vec<PathBuf>,
    plan: Arc<Vec<Chain>>,
    logs: Logs,
    phase: Arc<Phase>,
}

impl NodeJob {
    /// Agents up and attached (and converged, on cluster mode), the clients run, the agents
    /// stopped; then what their logs say about each pod.
    async fn run(self) -> Result<(Vec<Vec<Sample>>, f64, Vec<AgentPods>, Vec<PodRecord>), Error> {
        let mut flags = self.flags.clone();
        for ((f, pod), pins) in flags.iter_mut().zip(&self.pods).zip(&self.pin_dirs) {
            f.extend([
                "--redirect".into(),
                format!("{VIP}={}", pod.agent),
                "--cgroup".into(),
                pod.cgroup.display().to_string(),
                "--pin-dir".into(),
                pins.display().to_string(),
            ]);
        }
        let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
        let placement = Placement {
            listens: self.pods.iter().map(|p| p.agent).collect(),
            netns: Some(self.node_netns.clone()),
            env: vec![("RUST_LOG".into(), format!("{filter},{ACCEPT_LOG}"))],
        };
        let mut agents =
            Agents::start_at(&flags, &placement, "agent-precise-ebpf", &self.logs).await?;
        let logs: Vec<PathBuf> = agents.processes().map(|p| p.log.path.clone()).collect();
        let outcome = self.with_agents(&mut agents).await;
        if outcome.is_ok() {
            agents.check_running()?;
        }
        agents.stop().await;
        let (per_node, wall, held) = outcome?;
        let mut records = Vec::with_capacity(self.pods.len());
        for ((pod, log), answered) in self.pods.iter().zip(&logs).zip(&per_node) {
            let text = tokio::fs::read_to_string(log).await.unwrap_or_default();
            let (mine, other) = count_intercepted(&text, pod.address, pod.cgroup_id);
            records.push(PodRecord {
                netns: name_of(&pod.netns),
                address: pod.address,
                cgroup: pod.cgroup.clone(),
                cgroup_id: pod.cgroup_id,
                agent: pod.agent,
                requests: answered.len(),
                intercepted: mine,
                intercepted_other: other,
            });
        }
        Ok((per_node, wall, held, records))
    }

    async fn with_agents(
        &self,
        agents: &mut Agents,
    ) -> Result<(Vec<Vec<Sample>>, f64, Vec<AgentPods>), Error> {
        for agent in agents.processes() {
            wait_attached(agent).await?;
        }
        let mut held = Vec::new();
        if self.cluster {
            let (pods, took) = cluster_agents::wait_converged_on(agents, &self.ids).await?;
            self.phase.note(&format!(
                "  cluster: {} agents converged {:.1} s after they were ready (each subscribed to its own node's engines, replicating the others')",
                self.pods.len(),
                took.as_secs_f64()
            ));
            held = pods;
        }
        let mut clients = self
            .pods
            .iter()
            .map(|p| PodClient::start(&p.netns, &p.cgroup, "client-precise-ebpf", &self.logs))
            .collect::<Result<Vec<_>, _>>()?;
        let url = format!("http://{VIP}/v1/completions");
        let (per_node, wall) =
            pod_client::drive(&mut clients, &self.plan, &url, &self.args, &self.phase).await?;
        Ok((per_node, wall, held))
    }
}

/// Until `agent` logs that its programs are attached, for at most [`ATTACH_WITHIN`]; fails
/// at once when it logs that interception is off, or exits.
async fn wait_attached(agent: &mut Logged) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + ATTACH_WITHIN;
    loop {
        agent.check_running()?;
        let text = tokio::fs::read_to_string(&agent.log.path)
            .await
            .unwrap_or_default();
        if text.contains(ATTACHED) {
            return Ok(());
        }
        if let Some(line) = text.lines().find(|l| l.contains(NOT_ATTACHED)) {
            return Err(agent.failed(&format!("could not intercept: {line}")));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(agent.failed(&format!(
                "did not log `{ATTACHED}` within {ATTACH_WITHIN:?}"
            )));
        }
        tokio::time::sleep(LOG_POLL).await;
    }
}

/// An agent log's intercepted connections (`intercepted connection peer=IP:PORT vip=...
/// cgroup_id=N`): those from `address` and `cgroup_id`, and all others.
fn count_intercepted(log: &str, address: Ipv4Addr, cgroup_id: u64) -> (usize, usize) {
    let field = |line: &str, name: &str| -> Option<String> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        Some(line[at..].split_whitespace().next()?.to_string())
    };
    let mut mine = 0;
    let mut other = 0;
    for line in log.lines().filter(|l| l.contains("intercepted connection")) {
        let peer = field(line, "peer").and_then(|p| p.parse::<SocketAddr>().ok());
        let id = field(line, "cgroup_id").and_then(|c| c.parse::<u64>().ok());
        let vip = field(line, "vip");
        let from_pod = peer.is_some_and(|p| p.ip() == address)
            && id == Some(cgroup_id)
            && vip.as_deref() == Some(VIP.to_string().as_str());
        if from_pod {
            mine += 1;
        } else {
            other += 1;
        }
    }
    (mine, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intercepted_connections_are_counted_by_address_and_cgroup() {
        let log = "\
2026-12-02T10:00:00Z  INFO warmpath_agent::agent::intercept: interception attached (connect4/6, getpeername4/6, sock_ops) cgroup=/sys/fs/cgroup/x
2026-12-02T10:00:01Z DEBUG warmpath_agent::proxy::listener: intercepted connection peer=10.232.0.2:40112 vip=10.96.0.10:8000 cgroup_id=4242
2026-12-02T10:00:01Z DEBUG warmpath_agent::proxy::listener: intercepted connection peer=10.232.0.2:40114 vip=10.96.0.10:8000 cgroup_id=4242
2026-12-02T10:00:02Z DEBUG warmpath_agent::proxy::listener: intercepted connection peer=10.232.0.3:40116 vip=10.96.0.10:8000 cgroup_id=4242
2026-12-02T10:00:02Z DEBUG warmpath_agent::proxy::listener: intercepted connection peer=10.232.0.2:40118 vip=10.96.0.10:8000 cgroup_id=7
";
        let pod = Ipv4Addr::new(10, 232, 0, 2);
        assert_eq!(count_intercepted(log, pod, 4242), (2, 2));
        assert_eq!(count_intercepted("", pod, 4242), (0, 0));
    }
}
