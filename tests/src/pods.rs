//! A node and its pods built from network namespaces, a bridge, veth pairs and child cgroups,
//! for the eBPF suites (docs/ebpf.md). Root only.
//!
//! ```text
//!   netns <tag>n ("node"): br0 10.231.0.1/24, fd00:231::1/64 — the agent runs here
//!     ├─ veth p<i> ── netns <tag><i> ("pod i"): eth0 10.231.0.<i+2>/24, fd00:231::<i+2>/64
//! ```
//!
//! Every address lives inside a namespace this fixture created; the host's own namespace
//! gets nothing. Processes are started in a namespace with `nsenter --net` (only the network
//! namespace changes, so the cgroup v2 and bpffs mounts stay visible). Dropping the node
//! deletes its namespaces (and with them the bridge and veths); the caller drops the
//! processes first (declare them after the node).

use std::{
    io::{BufRead as _, BufReader},
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use warmpath_agent::ebpf::{ChildCgroup, cgroup2_root};

use crate::process::OwnedChild;

/// Where `ip netns add` puts namespaces.
const NETNS_DIR: &str = "/run/netns";

/// One network namespace created by the test; deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// `ip netns add name` (fails if it exists: it may be someone else's).
    pub fn create(name: &str) -> Result<Self, String> {
        ip(&["netns", "add", name])?;
        let ns = Self { name: name.into() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its file, for `nsenter --net=`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// Runs `ip -n <name> args...`.
    pub fn ip(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// A command that runs `program` inside this namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(err) = ip(&["netns", "del", &self.name]) {
            crate::gate::announce(&format!("could not delete netns {}: {err}", self.name));
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A pod: its namespace and addresses on the pod network.
#[derive(Debug)]
pub struct Pod {
    pub ns: Netns,
    pub ip4: Ipv4Addr,
    pub ip6: Ipv6Addr,
}

/// The node namespace with its bridge, and the pods plugged into it. Pods are deleted before
/// the node (field order).
#[derive(Debug)]
pub struct Node {
    pub pods: Vec<Pod>,
    pub ns: Netns,
}

impl Node {
    /// The node's address on the pod network (IPv4).
    pub const IP4: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 1);
    /// The node's address on the pod network (IPv6).
    pub const IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x231, 0, 0, 0, 0, 0, 1);

    /// A node `<tag>n` with `pods` pods `<tag>0`, `<tag>1`, ... (tag: a few characters,
    /// unique per test run, e.g. from the pid).
    pub fn create(tag: &str, pods: u8) -> Result<Self, String> {
        let ns = Netns::create(&format!("{tag}n"))?;
        let mut node = Self {
            pods: Vec::new(),
            ns,
        };
        node.ns.ip(&["link", "add", "br0", "type", "bridge"])?;
        node.ns
            .ip(&["addr", "add", &format!("{}/24", Self::IP4), "dev", "br0"])?;
        node.ns.ip(&[
            "addr",
            "add",
            &format!("{}/64", Self::IP6),
            "dev",
            "br0",
            "nodad",
        ])?;
        node.ns.ip(&["link", "set", "br0", "up"])?;
        for i in 0..pods {
            let pod = node.plug(tag, i)?;
            node.pods.push(pod);
        }
        Ok(node)
    }

    fn plug(&self, tag: &str, i: u8) -> Result<Pod, String> {
        let ns = Netns::create(&format!("{tag}{i}"))?;
        let host_side = format!("p{i}");
        self.ns.ip(&[
            "link",
            "add",
            &host_side,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ])?;
        self.ns
            .ip(&["link", "set", &host_side, "master", "br0", "up"])?;
        let ip4 = Ipv4Addr::new(10, 231, 0, i + 2);
        let ip6 = Ipv6Addr::new(0xfd00, 0x231, 0, 0, 0, 0, 0, u16::from(i) + 2);
        ns.ip(&["addr", "add", &format!("{ip4}/24"), "dev", "eth0"])?;
        ns.ip(&["addr", "add", &format!("{ip6}/64"), "dev", "eth0", "nodad"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        ns.ip(&["route", "add", "default", "via", &Self::IP4.to_string()])?;
        ns.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &Self::IP6.to_string(),
        ])?;
        Ok(Pod { ns, ip4, ip6 })
    }
}

/// A pin directory for one test's agent under bpffs; everything pinned there is detached
/// and removed on drop ([`warmpath_agent::ebpf::cleanup`]).
#[derive(Debug)]
pub struct PinDir {
    pub path: PathBuf,
}

impl PinDir {
    /// `<bpffs>/warmpath-test-<tag>`.
    pub fn new(tag: &str) -> Self {
        Self {
            path: PathBuf::from(warmpath_agent::ebpf::DEFAULT_BPFFS)
                .join(format!("warmpath-test-{tag}")),
        }
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(err) = warmpath_agent::ebpf::cleanup(&self.path) {
            crate::gate::announce(&format!("could not clean {}: {err}", self.path.display()));
        }
    }
}

// === one test's node, cgroups and pins ===

/// Everything an interception test sets up before its processes: a node of pods, a parent
/// cgroup the programs attach to with the agent's and pod 0's (the client's) cgroups under
/// it, and a pin directory. Dropped pins first, then cgroups, then namespaces (field order);
/// the test declares its processes after the bed, so they go before all of it.
#[derive(Debug)]
pub struct Bed {
    pub pins: PinDir,
    pub client_cgroup: ChildCgroup,
    pub agent_cgroup: ChildCgroup,
    pub parent: ChildCgroup,
    pub node: Node,
}

impl Bed {
    /// Node `<tag>n` with `pods` pods (see [`Node::create`]), the parent cgroup
    /// `warmpath-test-<name>-<pid>` under the cgroup v2 root, and pins `<bpffs>/warmpath-test-<tag>`.
    pub fn create(tag: &str, name: &str, pods: u8) -> Result<Self, String> {
        let node = Node::create(tag, pods)?;
        let root = cgroup2_root().map_err(|e| format!("cgroup v2 root: {e}"))?;
        let parent_name = format!("warmpath-test-{name}-{}", std::process::id());
        let parent = ChildCgroup::create(&root, &parent_name)
            .map_err(|e| format!("cgroup {parent_name}: {e}"))?;
        let child = |name: &str| {
            ChildCgroup::create(parent.path(), name).map_err(|e| format!("cgroup {name}: {e}"))
        };
        let agent_cgroup = child("agent")?;
        let client_cgroup = child("pod-0")?;
        Ok(Self {
            pins: PinDir::new(tag),
            client_cgroup,
            agent_cgroup,
            parent,
            node,
        })
    }

    /// The agent in the node namespace and its own cgroup, with `args` plus `--cgroup` (the
    /// parent) and `--pin-dir`, logging at `rust_log`; returned once every line in `ready`
    /// has been logged.
    pub fn agent(
        &self,
        args: &[String],
        rust_log: &str,
        ready: &[&str],
        timeout: Duration,
    ) -> Result<PodProcess, String> {
        let mut args = args.to_vec();
        args.extend([
            "--cgroup".into(),
            self.parent.path().display().to_string(),
            "--pin-dir".into(),
            self.pins.path.display().to_string(),
        ]);
        let agent = PodProcess::start(
            &self.node.ns,
            Some(self.agent_cgroup.path()),
            "agent",
            &args,
            &[("RUST_LOG", rust_log)],
        )?;
        for line in ready {
            agent.wait_for_log(&[line], timeout)?;
        }
        Ok(agent)
    }

    /// A simulator in pod `pod`, listening on `host:port`.
    pub fn sim(&self, pod: usize, host: &str, port: u16) -> Result<PodProcess, String> {
        let args = ["--host", host, "--port", &port.to_string()].map(String::from);
        PodProcess::start(&self.node.pods[pod].ns, None, "sim", &args, &[])
    }

    /// The Python `script` run in pod 0's namespace and moved into the client cgroup.
    pub fn client(&self, script: &str) -> Result<OwnedChild, String> {
        let mut cmd = self.node.pods[0].ns.command("python3");
        cmd.args(["-c", script]);
        let client = OwnedChild::spawn(cmd).map_err(|e| format!("client: {e}"))?;
        self.client_cgroup
            .add_process(client.pid())
            .map_err(|e| format!("client cgroup: {e}"))?;
        Ok(client)
    }
}

// === child processes of the suite's own binary ===

/// Child role (`agent` or `sim`).
pub const ROLE_ENV: &str = "WARMPATH_E2E_POD_ROLE";
/// The role's flags (JSON array of strings).
pub const ARGS_ENV: &str = "WARMPATH_E2E_POD_ARGS";
/// cgroup v2 directory the child moves itself into before anything else.
pub const CGROUP_ENV: &str = "WARMPATH_E2E_POD_CGROUP";
/// The line a child prints once it serves.
const READY: &str = "WARMPATH_E2E_POD_READY";
/// Longest a child may take to start.
const START: Duration = Duration::from_secs(30);

/// A child (the suite's binary, run as an agent or simulator inside a namespace); killed and
/// reaped on drop.
#[derive(Debug)]
pub struct PodProcess {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PodProcess {
    /// Starts the suite's `pod_child` entry point as `role` with `args` inside `ns` (and in
    /// `cgroup` when given), with `env` added; waits for its ready line.
    pub fn start(
        ns: &Netns,
        cgroup: Option<&std::path::Path>,
        role: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = ns.command(&exe.to_string_lossy());
        cmd.args([
            "--exact",
            "pod_child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("NO_COLOR", "1")
        .env(ROLE_ENV, role)
        .env(
            ARGS_ENV,
            serde_json::to_string(args).map_err(|e| e.to_string())?,
        )
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if let Some(dir) = cgroup {
            cmd.env(CGROUP_ENV, dir);
        }
        let mut child = cmd.spawn().map_err(|e| format!("spawn {role}: {e}"))?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let pipe = child.stderr.take().ok_or("stderr was piped")?;
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let stdout = child.stdout.take().ok_or("stdout was piped")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let process = Self { child, stderr };
        let deadline = Instant::now() + START;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(READY) => return Ok(process),
                Ok(_) => {}
                Err(_) => {
                    return Err(format!(
                        "{role} did not start within {START:?}; stderr:\n{}",
                        process.stderr()
                    ));
                }
            }
        }
    }

    /// SIGKILLs the child and reaps it (what a crashed agent looks like to the kernel).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Everything the child wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().clone()
    }

    /// Waits up to `timeout` for a stderr line containing every one of `needles`.
    pub fn wait_for_log(&self, needles: &[&str], timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self
                .stderr()
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return Ok(line.to_string());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no log line with {needles:?} within {timeout:?}; stderr:\n{}",
                    self.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The child side, called from the suite's ignored `pod_child` test: join the cgroup, run the
/// role until killed. Does nothing when [`ROLE_ENV`] is unset.
pub fn child_main() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    if let Ok(dir) = std::env::var(CGROUP_ENV) {
        let procs = std::path::Path::new(&dir).join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string())
            .unwrap_or_else(|e| panic!("join {}: {e}", procs.display()));
    }
    let json = std::env::var(ARGS_ENV).expect("the parent set the arguments");
    let args: Vec<String> = serde_json::from_str(&json).expect("the parent wrote a JSON array");
    warmpath_agent::telemetry::init_tracing();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        match role.as_str() {
            "agent" => agent(args).await,
            "sim" => sim(args).await,
            other => panic!("unknown role {other}"),
        }
    });
}

async fn agent(args: Vec<String>) {
    use clap::Parser as _;
    let args = warmpath_agent::args::AgentArgs::try_parse_from(
        std::iter::once("agent".to_string()).chain(args),
    )
    .unwrap_or_else(|e| panic!("agent flags: {e}"));
    let _routing = warmpath_agent::agent::start_routing(&args)
        .await
        .unwrap_or_else(|e| panic!("routing: {e}"));
    let _intercept = warmpath_agent::agent::start_interception(&args, Some(&_routing))
        .unwrap_or_else(|e| panic!("interception: {e}"));
    println!("{READY}");
    std::future::pending::<()>().await;
}

async fn sim(args: Vec<String>) {
    let _fleet =
        crate::sim::Fleet::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    println!("{READY}");
    std::future::pending::<()>().await;
}

// === clients and probes ===

/// A client script for a pod: for each stdin line "HOST PORT", one completion over a fresh
/// connection; prints one JSON line `{"status", "pod"}` (`pod`: the agent's
/// `x-warmpath-pod`, null when no agent answered) or `{"error"}`.
pub const COMPLETION_CLIENT: &str = r#"
import http.client, json, sys
for line in sys.stdin:
    host, port = line.split()
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=10)
        c.connect()
        body = json.dumps({"model": "sim-llama", "prompt": "a shared prefix " * 8, "max_tokens": 2})
        c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        print(json.dumps({"status": r.status, "pod": r.getheader("x-warmpath-pod")}), flush=True)
        c.close()
    except OSError as e:
        print(json.dumps({"error": str(e)}), flush=True)
"#;

const SCRAPE: &str = r#"
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
print(sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
          if l.startswith("vllm:request_success_total")))
"#;

/// Requests the simulator at `sim` (`IP:PORT`) has served, scraped from namespace `ns`.
pub fn served(ns: &Netns, sim: &str) -> Result<f64, String> {
    let out = ns
        .command("python3")
        .args(["-c", SCRAPE, &format!("http://{sim}/metrics")])
        .output()
        .map_err(|e| format!("scrape {sim}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scrape {sim}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("scrape {sim}: {e}"))
}

// === several clients, each in its own pod and cgroup (bpf_failopen.rs, bpf_steer.rs) ===

impl Bed {
    /// A child cgroup `name` of the bed's parent (where the programs attach). Declare it
    /// before the processes put in it, so they are gone before it is removed.
    pub fn cgroup(&self, name: &str) -> Result<ChildCgroup, String> {
        ChildCgroup::create(self.parent.path(), name).map_err(|e| format!("cgroup {name}: {e}"))
    }

    /// The Python `script` with `args` run in pod `pod`'s namespace and moved into `cgroup`.
    pub fn client_in(
        &self,
        pod: usize,
        cgroup: &ChildCgroup,
        script: &str,
        args: &[&str],
    ) -> Result<OwnedChild, String> {
        let mut cmd = self.node.pods[pod].ns.command("python3");
        cmd.args(["-c", script]).args(args);
        let client = OwnedChild::spawn(cmd).map_err(|e| format!("client in pod {pod}: {e}"))?;
        cgroup
            .add_process(client.pid())
            .map_err(|e| format!("client cgroup: {e}"))?;
        Ok(client)
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of the eBPF heartbeat and of Python's
/// `time.monotonic_ns()`, so a test can compare its instants with a client's.
pub fn monotonic_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable");
    u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap_or(0)
}

const GET_JSON: &str = r#"
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
"#;

/// The JSON at `url`, fetched from namespace `ns` (e.g. the agent's `/status`).
pub fn get_json(ns: &Netns, url: &str) -> Result<serde_json::Value, String> {
    let out = ns
        .command("python3")
        .args(["-c", GET_JSON, url])
        .output()
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "GET {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("GET {url}: {e}"))
}

/// A load client for a pod. Its first argument is a client id; its prompts are a long
/// prefix of its own (about 30 blocks of 16 tokens) and a short varying question. Commands
/// on stdin, one per line:
///
/// - `run HOST PORT N`: N completions one after another, each on a fresh connection;
/// - `loop HOST PORT N`: the same until `stop` is read, N are done or 60 s have passed;
/// - `keep HOST PORT N`: N completions on the client's one keep-alive connection, opened by
///   the first `keep` and kept open across commands (a failed request drops it).
///
/// One JSON line per completion: `{"t": CLOCK_MONOTONIC ns before connect(), "status",
/// "pod": x-warmpath-pod or null, "cached": usage.prompt_tokens_details.cached_tokens}`, or
/// `{"t", "error", "stage": "connect" | "request"}`; then `{"done": count}` after each
/// command.
pub const LOAD_CLIENT: &str = r#"
import http.client, json, sys, threading, queue, time
cid = sys.argv[1]
prefix = f"client {cid} keeps its own context: " + " ".join(f"w{cid}n{j}" for j in range(150))
commands, stop = queue.Queue(), threading.Event()
def read():
    for line in sys.stdin:
        if line.strip() == "stop":
            stop.set()
        else:
            commands.put(line.split())
    commands.put(None)
threading.Thread(target=read, daemon=True).start()
def one(k, conn, host, port):
    t = time.monotonic_ns()
    stage = "connect"
    try:
        c = conn or http.client.HTTPConnection(host, int(port), timeout=10)
        if conn is None:
            c.connect()
        stage = "request"
        body = json.dumps({"model": "sim-llama", "prompt": f"{prefix} question {k}", "max_tokens": 2})
        c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        cached = None
        if r.status == 200:
            usage = json.loads(data).get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        print(json.dumps({"t": t, "status": r.status, "pod": r.getheader("x-warmpath-pod"), "cached": cached}), flush=True)
        return c
    except (OSError, http.client.HTTPException) as e:
        print(json.dumps({"t": t, "error": str(e), "errno": getattr(e, "errno", None), "stage": stage}), flush=True)
        return None
k, kept = 0, None
while True:
    cmd = commands.get()
    if cmd is None:
        break
    verb, host, port, n = cmd[0], cmd[1], cmd[2], int(cmd[3])
    stop.clear()
    end = time.monotonic() + 60
    done = 0
    while done < n and not (verb == "loop" and (stop.is_set() or time.monotonic() > end)):
        k += 1
        if verb == "keep":
            kept = one(k, kept, host, port)
        else:
            c = one(k, None, host, port)
            if c is not None:
                c.close()
        done += 1
    print(json.dumps({"done": done}), flush=True)
"#;

// === Prometheus scrapes and byte-counting clients (bpf_counters.rs) ===

const SCRAPE_SERIES: &str = r#"
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
name, labels = sys.argv[2], sys.argv[3:]
print(sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
          if (l.startswith(name + "{") or l.startswith(name + " ")) and all(x in l for x in labels)))
"#;

/// The sum of the Prometheus samples of `name` at `url` whose line contains every one of
/// `labels` (e.g. `tenant="default"`), scraped from namespace `ns`.
pub fn scrape_series(ns: &Netns, url: &str, name: &str, labels: &[&str]) -> Result<f64, String> {
    let out = ns
        .command("python3")
        .args(["-c", SCRAPE_SERIES, url, name])
        .args(labels)
        .output()
        .map_err(|e| format!("scrape {url}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scrape {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("scrape {url}: {e}"))
}

/// A client script for a pod: for each stdin line "HOST PORT", one completion over a fresh
/// raw TCP connection (`Connection: close`); prints one JSON line `{"status", "sent",
/// "received", "pod"}` with the exact bytes it wrote and read (HTTP head and body), or
/// `{"error"}`. "HOST PORT open" asks for a keep-alive answer and leaves that connection open
/// (it answers before closing anything) until the next line, which closes it first.
pub const BYTES_CLIENT: &str = r#"
import json, socket, sys
BODY = json.dumps({"model": "sim-llama", "prompt": "count these bytes " * 16, "max_tokens": 4}).encode()
held = None
for line in sys.stdin:
    if held is not None:
        held.close()
        held = None
    host, port, *mode = line.split()
    keep = mode == ["open"]
    try:
        s = socket.create_connection((host, int(port)), timeout=10)
        req = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n"
               + ("" if keep else "Connection: close\r\n") + "\r\n").encode() + BODY
        s.sendall(req)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        fields = dict(l.split(b":", 1) for l in head.split(b"\r\n")[1:] if b":" in l)
        fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
        length = int(fields.get(b"content-length", b"-1"))
        while length < 0 or len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
            got += chunk
        if keep:
            held = s
        else:
            s.close()
        status = int(head.split(b" ", 2)[1])
        pod = fields.get(b"x-warmpath-pod")
        print(json.dumps({"status": status, "sent": len(req), "received": len(got),
                          "pod": pod.decode() if pod else None}), flush=True)
    except (OSError, ValueError, IndexError) as e:
        print(json.dumps({"error": str(e)}), flush=True)
"#;
