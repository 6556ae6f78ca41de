//! Fail-open that keeps affinity under a steady load, with the table the agent computed;
//! adoption of pinned state; `--cleanup` (issue #20, tests 3 and 5; docs/ebpf.md).
//!
//! Root only. Node and five pods (`tests/src/pods.rs`): pods 0-2 are clients, each in its own
//! cgroup, each with a long prompt prefix of its own; pods 3 and 4 run simulators A and B,
//! the agent's endpoints; pod 5 runs simulator C, which answers on the VIP 10.96.0.10 (the
//! clients route the VIP to it: the stand-in for kube-proxy's choice when nothing rewrites
//! the connect) and is no endpoint of the agent, so a connect left untouched is told apart
//! from one failed open to an affinity pod. The agent routes
//! precisely (both simulators publish KV events), learns which pod served each client and
//! writes the affinity table itself — the test writes no entry.
//!
//! 1. Alive: every client's requests are proxied; the agent's `/status` shows an affinity
//!    entry per client.
//! 2. All three clients loop on new connections; the agent is SIGKILLed under that load. No
//!    connect fails; only connections the agent's listener had already taken may be cut (a
//!    request inside the dead agent, or a handshake in its listener's queue, which the
//!    kernel resets with the listener and Python can report from `connect()`); every request
//!    started after the kill is answered, and once the heartbeat is stale straight by a pod
//!    with a prefix hit.
//! 3. Each client alone: its connects all go to a pod that served it before the kill (the
//!    simulators' request counters), with prefix hits.
//! 4. A restarted agent adopts the pins (the first agent's links gone), proxies the same
//!    client processes again (explain headers) and shows the adopted entries; `--cleanup`
//!    leaves no pinned file and none of the links attached.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use serde_json::Value;
use warmpath_e2e::{
    gate,
    pods::{Bed, LOAD_CLIENT, Node, PodProcess, get_json, monotonic_ns},
    process::OwnedChild,
};

const WAIT: Duration = Duration::from_secs(20);
const VIP_IP: &str = "10.96.0.10";
const VIP: &str = "10.96.0.10:8000";
const LISTEN_PORT: u16 = 8080;
const SIM_PORT: u16 = 8000;
const EVENTS_PORT: u16 = 5557;
const CLIENTS: usize = 3;
/// Pods of the two simulators.
const POD_A: usize = 3;
const POD_B: usize = 4;
/// The pod behind the VIP when nothing rewrites.
const POD_VIP: usize = 5;
/// Requests per client while the agent is alive, before the load.
const WARM: usize = 6;
/// Bound on each client's loop across the kill (it also stops after 60 s or when told).
const LOOP_MAX: usize = 3000;
/// Requests each client makes after the heartbeat went stale, in the loop ...
const STALE_IN_LOOP: usize = 5;
/// ... and alone, counted at the simulators.
const ALONE: usize = 6;
/// The heartbeat is stale 1 s after the last one the agent wrote; a margin for the clocks'
/// reading.
const STALE_AFTER_NS: u64 = 1_100_000_000;

#[test]
#[ignore = "entry point of the pod child processes (tests/src/pods.rs)"]
fn pod_child() {
    warmpath_e2e::pods::child_main();
}

fn served(node: &Node, sim: &str) -> f64 {
    warmpath_e2e::pods::served(&node.ns, sim).unwrap()
}

/// Lines of one command until its `done` line.
fn until_done(client: &OwnedChild) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let line = client.next_line(WAIT).expect("the client answered");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v.get("done").is_some() {
            return out;
        }
        out.push(v);
    }
}

fn run(client: &mut OwnedChild, n: usize) -> Vec<Value> {
    client
        .send_line(&format!("run {VIP_IP} {SIM_PORT} {n}"))
        .unwrap();
    until_done(client)
}

/// Linux's ECONNRESET: the peer reset a connection past SYN-SENT (a reset in SYN-SENT is
/// ECONNREFUSED, 111; a timeout has no errno in Python's `socket.timeout`).
const ECONNRESET: u64 = 104;

/// Whether a client's failed attempt was a connection the peer reset, as opposed to one
/// refused (no listener) or timed out.
fn is_reset(attempt: &Value) -> bool {
    attempt["errno"].as_u64() == Some(ECONNRESET)
}

/// Ids of the links pinned under `dir/links`.
fn pinned_link_ids(dir: &std::path::Path) -> Vec<u32> {
    std::fs::read_dir(dir.join("links"))
        .unwrap()
        .map(|e| {
            let pinned = aya::programs::links::PinnedLink::from_pin(e.unwrap().path()).unwrap();
            let link = aya::programs::links::FdLink::from(pinned);
            link.info().unwrap().id()
        })
        .collect()
}

fn loaded_link_ids() -> Vec<u32> {
    aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|l| l.id())
        .collect()
}

/// The agent's `/status` kernel table counters, once `ok` holds for them (bounded by WAIT).
fn wait_for_table(node: &Node, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let table = get_json(&node.ns, "http://127.0.0.1:9090/status")
            .map(|s| s["kernel_table"].clone())
            .unwrap_or(Value::Null);
        if ok(&table) {
            return table;
        }
        assert!(
            Instant::now() < deadline,
            "kernel table never ready: {table}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads what the clients printed (each command's lines into `lines`, its end into `done`)
/// until `enough` holds for every client still running (bounded by WAIT).
fn pump(
    clients: &[OwnedChild],
    lines: &mut [Vec<Value>],
    done: &mut [bool],
    enough: &dyn Fn(&[Value]) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    while !(0..clients.len()).all(|i| done[i] || enough(&lines[i])) {
        assert!(Instant::now() < deadline, "the load stalled: {lines:?}");
        for (i, client) in clients.iter().enumerate() {
            while let Some(line) = client.next_line(Duration::from_millis(5)) {
                let v: Value = serde_json::from_str(&line).unwrap();
                if v.get("done").is_some() {
                    done[i] = true;
                } else {
                    lines[i].push(v);
                }
            }
        }
    }
}

#[test]
fn dead_agent_fails_open_to_affinity_pods_and_a_new_agent_adopts_the_pins() {
    if !gate::bpf_available(
        "dead_agent_fails_open_to_affinity_pods_and_a_new_agent_adopts_the_pins",
    ) {
        return;
    }
    let tag = format!("wf{}", std::process::id() % 100_000);
    let bed = Bed::create(&tag, "failopen", 6).unwrap();
    let (node, pins) = (&bed.node, &bed.pins);
    // Pod C answers on the VIP; the clients reach it there when nothing rewrites.
    node.pods[POD_VIP]
        .ns
        .ip(&["addr", "add", &format!("{VIP_IP}/32"), "dev", "lo"])
        .unwrap();
    for pod in &node.pods[..CLIENTS] {
        pod.ns
            .ip(&[
                "route",
                "add",
                &format!("{VIP_IP}/32"),
                "via",
                &node.pods[POD_VIP].ip4.to_string(),
            ])
            .unwrap();
    }
    let cgroups = [
        None,
        Some(bed.cgroup("pod-1").unwrap()),
        Some(bed.cgroup("pod-2").unwrap()),
    ];
    let ip = |pod: usize| node.pods[pod].ip4.to_string();
    let (sim_a, sim_b) = (
        format!("{}:{SIM_PORT}", ip(POD_A)),
        format!("{}:{SIM_PORT}", ip(POD_B)),
    );
    let sim = |pod: usize, host: &str| {
        let args = [
            "--host",
            host,
            "--port",
            &SIM_PORT.to_string(),
            "--kv-events-port",
            &EVENTS_PORT.to_string(),
        ]
        .map(String::from);
        PodProcess::start(&node.pods[pod].ns, None, "sim", &args, &[]).unwrap()
    };
    let sim_c = format!("{}:{SIM_PORT}", ip(POD_VIP));
    let _a = sim(POD_A, &ip(POD_A));
    let _b = sim(POD_B, &ip(POD_B));
    let _c = sim(POD_VIP, "0.0.0.0");

    let agent_args: Vec<String> = [
        "--listen",
        &format!("0.0.0.0:{LISTEN_PORT}"),
        "--admin",
        "127.0.0.1:9090",
        "--policy",
        "precise",
        "--endpoint",
        &format!("http://{sim_a}"),
        "--kv-events",
        &format!("tcp://{}:{EVENTS_PORT}", ip(POD_A)),
        "--endpoint",
        &format!("http://{sim_b}"),
        "--kv-events",
        &format!("tcp://{}:{EVENTS_PORT}", ip(POD_B)),
        "--explain",
        "--redirect",
        &format!("{VIP}={}:{LISTEN_PORT}", Node::IP4),
    ]
    .map(String::from)
    .to_vec();
    let start_agent = || {
        bed.agent(&agent_args, "info", &["interception attached"], WAIT)
            .unwrap()
    };
    let mut agent = start_agent();

    let mut clients: Vec<OwnedChild> = (0..CLIENTS)
        .map(|i| {
            let cgroup = cgroups[i].as_ref().unwrap_or(&bed.client_cgroup);
            bed.client_in(i, cgroup, LOAD_CLIENT, &[&i.to_string()])
                .unwrap()
        })
        .collect();

    // 1. Alive: proxied (the agent names the pod); which pods served each client.
    let mut homes: Vec<BTreeSet<String>> = vec![BTreeSet::new(); CLIENTS];
    for (i, client) in clients.iter_mut().enumerate() {
        for line in run(client, WARM) {
            assert_eq!(line["status"], 200, "client {i}: {line}");
            homes[i].insert(line["pod"].as_str().expect("proxied").to_string());
        }
    }
    let first_links = pinned_link_ids(&pins.path);
    assert_eq!(first_links.len(), 5, "connect4/6, getpeername4/6, sock_ops");
    let table = wait_for_table(node, |t| {
        t["affinity_entries"].as_u64() >= Some(CLIENTS as u64)
            && t["backend_sets"].as_u64() >= Some(1)
    });

    // 2. The load, and the kill under it.
    let c_before = served(node, &sim_c);
    for client in &mut clients {
        client
            .send_line(&format!("loop {VIP_IP} {SIM_PORT} {LOOP_MAX}"))
            .unwrap();
    }
    let mut lines: Vec<Vec<Value>> = vec![Vec::new(); CLIENTS];
    let mut done = [false; CLIENTS];
    pump(&clients, &mut lines, &mut done, &|l| l.len() >= 3);
    let signalled = monotonic_ns();
    agent.kill();
    // Reaped: the process and its sockets are gone.
    let killed = monotonic_ns();
    let stale = killed + STALE_AFTER_NS;
    let after_stale = |l: &[Value]| {
        l.iter()
            .filter(|v| v["t"].as_u64().is_some_and(|t| t > stale))
            .count()
            >= STALE_IN_LOOP
    };
    pump(&clients, &mut lines, &mut done, &after_stale);
    for client in &mut clients {
        client.send_line("stop").unwrap();
    }
    pump(&clients, &mut lines, &mut done, &|_| false);
    assert!(done.iter().all(|d| *d), "every loop ended");
    let to_vip = served(node, &sim_c) - c_before;

    let (mut cut, mut cut_exiting, mut cut_queued) = (0, 0, 0);
    let (mut untouched, mut failed_open, mut before) = (0, 0, 0);
    for (i, l) in lines.iter().enumerate() {
        for v in l {
            let t = v["t"].as_u64().unwrap();
            if let Some(err) = v.get("error") {
                // Only a connection the agent's listener had taken before the process was
                // gone may be cut: a request inside the agent, or a handshake the kernel had
                // completed for the listener (the client had its SYN-ACK) that the closing
                // listener reset before Python's connect() read the socket's state. A refused
                // or timed-out connect is a failed connect.
                let queued = v["stage"] == "connect" && is_reset(v);
                assert!(
                    v["stage"] == "request" || queued,
                    "client {i}: a connect failed: {v}"
                );
                // The listener's queue is reset when the process dies: such a connect started
                // within the second before the kill (a loop connect takes milliseconds).
                assert!(
                    !queued || t + 1_000_000_000 >= signalled,
                    "client {i}: a connect reset long before the kill: {v}"
                );
                assert!(
                    t < killed,
                    "client {i}: failed after the agent was gone: {err}"
                );
                cut += 1;
                cut_queued += usize::from(queued);
                if t >= signalled {
                    cut_exiting += 1;
                }
                continue;
            }
            assert_eq!(v["status"], 200, "client {i}: {v}");
            if t < killed {
                if let Some(pod) = v["pod"].as_str() {
                    homes[i].insert(pod.to_string());
                }
                before += 1;
            } else if t > stale {
                assert!(v["pod"].is_null(), "client {i}: agent dead: {v}");
                assert!(
                    v["cached"].as_u64() > Some(0),
                    "client {i}: failed open to a pod without its prefix: {v}"
                );
                failed_open += 1;
            } else {
                // Between the kill and staleness: the VIP untouched, or already failed open.
                untouched += 1;
            }
        }
    }

    assert!(
        to_vip <= f64::from(untouched),
        "only connects made before staleness reached the VIP: {to_vip} > {untouched}"
    );

    // 3. Each client alone: where its connects go, counted at the simulators.
    let mut moved = Vec::new();
    for (i, client) in clients.iter_mut().enumerate() {
        let (a0, b0, c0) = (
            served(node, &sim_a),
            served(node, &sim_b),
            served(node, &sim_c),
        );
        for line in run(client, ALONE) {
            assert_eq!(line["status"], 200, "client {i}: {line}");
            assert!(line["pod"].is_null(), "client {i}: {line}");
            assert!(line["cached"].as_u64() > Some(0), "client {i}: {line}");
        }
        let (a, b) = (served(node, &sim_a) - a0, served(node, &sim_b) - b0);
        assert_eq!(a + b, ALONE as f64, "client {i}");
        assert_eq!(
            served(node, &sim_c),
            c0,
            "client {i}: none to the VIP untouched"
        );
        if a > 0.0 {
            assert!(homes[i].contains(&sim_a), "client {i}: {a} to A, {homes:?}");
        }
        if b > 0.0 {
            assert!(homes[i].contains(&sim_b), "client {i}: {b} to B, {homes:?}");
        }
        moved.push((a, b));
    }

    // 4. A new agent adopts the pins, replaces the old links and intercepts the same client
    // processes again.
    let agent2 = start_agent();
    for (i, client) in clients.iter_mut().enumerate() {
        for line in run(client, 3) {
            assert_eq!(line["status"], 200, "client {i}: {line}");
            assert!(line["pod"].is_string(), "client {i}: proxied again: {line}");
        }
    }
    let adopted = wait_for_table(node, |t| {
        t["affinity_entries"].as_u64() >= Some(CLIENTS as u64)
    });
    let second_links = pinned_link_ids(&pins.path);
    assert_eq!(second_links.len(), 5);
    assert!(second_links.iter().all(|id| !first_links.contains(id)));
    let loaded = loaded_link_ids();
    assert!(
        first_links.iter().all(|id| !loaded.contains(id)),
        "the first agent's links are detached"
    );

    // `warmpath agent --cleanup`: nothing pinned, none of the links left; the VIP untouched.
    drop(agent2);
    let cleanup = <warmpath_agent::args::AgentArgs as clap::Parser>::try_parse_from([
        "agent",
        "--cleanup",
        "--pin-dir",
        &pins.path.display().to_string(),
    ])
    .unwrap();
    warmpath_agent::agent::cleanup(&cleanup).unwrap();
    assert!(!pins.path.exists(), "{} removed", pins.path.display());
    let loaded = loaded_link_ids();
    assert!(second_links.iter().all(|id| !loaded.contains(id)));
    let c0 = served(node, &sim_c);
    let line = run(&mut clients[0], 1).remove(0);
    assert_eq!(
        line["status"], 200,
        "after cleanup, the VIP untouched: {line}"
    );
    assert!(line["pod"].is_null());
    assert_eq!(served(node, &sim_c) - c0, 1.0, "the VIP is pod C");

    drop(clients);
    gate::announce(&format!(
        "bpf: {CLIENTS} clients looping, agent SIGKILLed: 0 connects refused or timed out, {cut} connections the agent had taken cut ({cut_queued} of them reset in its listener's queue at connect, {cut_exiting} started between SIGKILL and the process gone, {:?}); {before} proxied before the kill, {untouched} in the second before the heartbeat went stale ({to_vip} of them to the VIP untouched, pod C), {failed_open} failed open with prefix hits after; alone, each client's connects to the pods that served it (A, B per client: {moved:?}; homes {homes:?}); table before the kill {table}, adopted by the restarted agent {adopted}; restart proxied again; cleanup left nothing",
        Duration::from_nanos(killed - signalled)
    ));
}
