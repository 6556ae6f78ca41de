//! Per-cgroup kernel counters (issue #20; docs/ebpf.md `WARMPATH_CGROUP_STATS`,
//! docs/telemetry.md `warmpath.kernel.*`): connects by mode and the TCP bytes of connections
//! sent to a pod, counted in the kernel per client cgroup and exported per tenant.
//!
//! Root only. Node and two pods (`tests/src/pods.rs`): pod 0 is the client in its own cgroup,
//! pod 1 runs a simulator. The client sends [`REQUESTS`] completions through the VIP, each on
//! a fresh connection, and reports the exact bytes it wrote and read. The pinned map then
//! holds exactly that many connects for the client's cgroup in the mode under test; for
//! steered connections the bytes the client wrote and read, each connection's FIN at most
//! adding one (TCP counts it in the sequence space), and for proxied ones no bytes (the agent
//! carries those: its per-tenant series count their requests and tokens); the agent's `/metrics`
//! shows the same connects for the client's tenant: the one whose `tenants.cgroups` selects
//! its cgroup (proxy test, from a config file), or the default tenant when none does (steer
//! test, flags only).
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use warmpath_agent::ebpf::{CgroupStats, cgroup_id, pinned_cgroup_stats};
use warmpath_e2e::{
    gate,
    pods::{BYTES_CLIENT, Bed, Node, scrape_series},
    process::OwnedChild,
};

const WAIT: Duration = Duration::from_secs(15);
const SIM_PORT: u16 = 8000;
const REQUESTS: u64 = 5;
const ADMIN: &str = "http://127.0.0.1:9090/metrics";

#[test]
#[ignore = "entry point of the pod child processes (tests/src/pods.rs)"]
fn pod_child() {
    warmpath_e2e::pods::child_main();
}

/// What the client measured over all its requests.
#[derive(Debug, Default)]
struct Sent {
    sent: u64,
    received: u64,
    proxied: u64,
}

fn run_client(client: &mut OwnedChild, vip: &str) -> Sent {
    let (host, port) = vip.rsplit_once(':').unwrap();
    let mut total = Sent::default();
    for _ in 0..REQUESTS {
        client.send_line(&format!("{host} {port}")).unwrap();
        let line = client.next_line(WAIT).expect("the client answered");
        let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(answer["status"], 200, "{answer}");
        total.sent += answer["sent"].as_u64().unwrap();
        total.received += answer["received"].as_u64().unwrap();
        total.proxied += u64::from(!answer["pod"].is_null());
    }
    total
}

fn stats_of(bed: &Bed, id: u64) -> CgroupStats {
    pinned_cgroup_stats(&bed.pins.path)
        .unwrap()
        .into_iter()
        .find(|(c, _)| *c == id)
        .map(|(_, s)| s)
        .unwrap_or_default()
}

/// Waits until the agent's `/metrics` shows `want` for `tenant`'s connects in `mode` (the
/// export reads the kernel every 2 s).
fn wait_for_export(node: &Node, tenant: &str, mode: &str, want: f64) -> f64 {
    let mode = format!("mode=\"{mode}\"");
    let tenant = format!("tenant=\"{tenant}\"");
    let labels = [tenant.as_str(), mode.as_str()];
    let deadline = Instant::now() + WAIT;
    loop {
        let got = scrape_series(
            &node.ns,
            ADMIN,
            "warmpath_kernel_connections_total",
            &labels,
        )
        .unwrap_or(-1.0);
        if got == want || Instant::now() >= deadline {
            return got;
        }
        // Polling another process's export: nothing to await but its next read.
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One more steered request on a connection the client keeps open: its bytes are counted
/// while it is open (the closed connections' FINs do not come into it), exactly what the
/// client wrote and read. The count lands with the segments the client sends (its ACKs), so
/// it is polled, bounded.
fn open_connection_is_counted_as_it_goes(
    bed: &Bed,
    id: u64,
    client: &mut OwnedChild,
    vip: &str,
    before: CgroupStats,
) {
    let (host, port) = vip.rsplit_once(':').unwrap();
    client.send_line(&format!("{host} {port} open")).unwrap();
    let line = client.next_line(WAIT).expect("the client answered");
    let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(answer["status"], 200, "{answer}");
    let want = (
        before.bytes_sent + answer["sent"].as_u64().unwrap(),
        before.bytes_received + answer["received"].as_u64().unwrap(),
    );
    let deadline = Instant::now() + WAIT;
    let mut stats = stats_of(bed, id);
    while (stats.bytes_sent, stats.bytes_received) != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        stats = stats_of(bed, id);
    }
    assert_eq!(
        (stats.bytes_sent, stats.bytes_received),
        want,
        "an open connection's bytes, before its close: {answer}"
    );
    gate::announce(&format!(
        "bpf: counters (steer): an open connection's {} B written and {} B read counted before its close",
        answer["sent"], answer["received"]
    ));
}

/// A file removed on drop.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One bed, agent and client; `steer` adds `--steer VIP`. With `tenant`, the agent runs
/// from a config file whose `tenants.cgroups` gives the client's cgroup to that tenant; else
/// from flags (no tenant selects it).
fn counted(
    tag: &str,
    vip: &str,
    steer: bool,
    tenant: Option<&str>,
) -> (CgroupStats, Sent, f64, f64) {
    let bed = Bed::create(tag, if steer { "cnt-steer" } else { "cnt" }, 2).unwrap();
    let node = &bed.node;
    let sim_addr = format!("{}:{SIM_PORT}", node.pods[1].ip4);
    let _sim = bed.sim(1, &node.pods[1].ip4.to_string(), SIM_PORT).unwrap();
    let config = TempFile(std::env::temp_dir().join(format!("warmpath-{tag}-agent.yaml")));
    let mut args: Vec<String> = match tenant {
        Some(tenant) => {
            std::fs::write(
                &config.0,
                format!(
                    "version: 1\nlisten: \"0.0.0.0:8080\"\nadmin: 127.0.0.1:9090\nproxy: {{explain: true}}\n\
                     pools:\n- name: default\n  model: sim-llama\n  endpoints:\n  - url: http://{sim_addr}\n\
                     tenants:\n  cgroups:\n    {tenant}: [{}]\n",
                    bed.client_cgroup.path().display()
                ),
            )
            .unwrap();
            vec!["--config".into(), config.0.display().to_string()]
        }
        None => [
            "--listen",
            "0.0.0.0:8080",
            "--admin",
            "127.0.0.1:9090",
            "--endpoint",
            &format!("http://{sim_addr}"),
            "--explain",
        ]
        .map(String::from)
        .to_vec(),
    };
    args.extend(["--redirect".into(), format!("{vip}={}:8080", Node::IP4)]);
    if steer {
        args.extend(["--steer".into(), vip.into()]);
    }
    let agent = bed
        .agent(&args, "info", &["interception attached"], WAIT)
        .unwrap();
    let mut client = bed.client(BYTES_CLIENT).unwrap();
    let id = cgroup_id(bed.client_cgroup.path()).unwrap();
    let sent = run_client(&mut client, vip);
    let stats = stats_of(&bed, id);
    let mode = if steer { "steer" } else { "proxy" };
    let exported = wait_for_export(node, tenant.unwrap_or("default"), mode, REQUESTS as f64);
    if steer {
        // The base for the open connection is read after the export wait, not with `stats`:
        // a closed connection's FINs (1 each way) are counted when their segments land, which
        // can be just after the client's answer (CI saw one pair land between the two).
        let before = stats_of(&bed, id);
        open_connection_is_counted_as_it_goes(&bed, id, &mut client, vip, before);
    }
    let unresolved =
        scrape_series(&node.ns, ADMIN, "warmpath_kernel_unresolved_cgroups", &[]).unwrap();
    drop(client);
    drop(agent);
    (stats, sent, exported, unresolved)
}

#[test]
fn proxied_connects_and_their_bytes_are_counted_per_cgroup() {
    if !gate::bpf_available("proxied_connects_and_their_bytes_are_counted_per_cgroup") {
        return;
    }
    let tag = format!("wc{}", std::process::id() % 100_000);
    let (stats, sent, exported, unresolved) =
        counted(&tag, "10.96.0.30:8000", false, Some("team-pod"));
    assert_eq!(
        sent.proxied, REQUESTS,
        "every request went through the agent"
    );
    assert_eq!(stats.connects_proxy, REQUESTS, "{stats:?}");
    assert_eq!(stats.connects_steered, 0, "{stats:?}");
    assert_eq!(stats.connects_failopen, 0, "{stats:?}");
    assert_eq!(
        (stats.bytes_sent, stats.bytes_received),
        (0, 0),
        "a proxied connection's bytes are the agent's to count: {stats:?}"
    );
    assert_eq!(
        exported, REQUESTS as f64,
        "the cgroup's tenant's proxied connects"
    );
    assert_eq!(unresolved, 0.0, "the client's cgroup is its tenant's");
    gate::announce(&format!(
        "bpf: counters (proxy): {} connects, no bytes; /metrics team-pod {exported}",
        stats.connects_proxy
    ));
}

#[test]
fn steered_connects_and_their_bytes_are_counted_per_cgroup() {
    if !gate::bpf_available("steered_connects_and_their_bytes_are_counted_per_cgroup") {
        return;
    }
    let tag = format!("wk{}", std::process::id() % 100_000);
    let (stats, sent, exported, unresolved) = counted(&tag, "10.96.0.31:8000", true, None);
    assert_eq!(sent.proxied, 0, "straight to the pod, not proxied");
    assert_eq!(stats.connects_steered, REQUESTS, "{stats:?}");
    assert_eq!(stats.connects_proxy, 0, "{stats:?}");
    assert_eq!(stats.connects_failopen, 0, "{stats:?}");
    // The client closed each connection before it answered: every byte is counted by then,
    // each FIN (ours acknowledged, the pod's received) at most once more per connection.
    assert!(
        (sent.sent..=sent.sent + REQUESTS).contains(&stats.bytes_sent),
        "{stats:?} vs {sent:?}"
    );
    assert!(
        (sent.received..=sent.received + REQUESTS).contains(&stats.bytes_received),
        "{stats:?} vs {sent:?}"
    );
    assert_eq!(
        exported, REQUESTS as f64,
        "the default tenant's steered connects"
    );
    assert_eq!(
        unresolved, 1.0,
        "the client's cgroup is claimed by no tenant"
    );
    gate::announce(&format!(
        "bpf: counters (steer): {} connects, {} B sent for {} B written, {} B received for {} B read; /metrics default {exported}",
        stats.connects_steered, stats.bytes_sent, sent.sent, stats.bytes_received, sent.received
    ));
}
