//! Fail-open that keeps affinity, adoption of pinned state, `--cleanup` (issue #20, tests 3
//! and 5; docs/ebpf.md).
//!
//! Root only. Node and three pods (`tests/src/pods.rs`): pod 0 is the client; pod 1 runs
//! simulator A and also answers on the VIP 10.96.0.10 (pod 0 routes the VIP to it: the
//! stand-in for kube-proxy's choice when nothing rewrites the connect); pod 2 runs
//! simulator B. The agent routes to both and pins its state in a test directory. The test
//! writes an affinity entry (pod 0's cgroup, VIP) -> B into the pinned map, SIGKILLs the
//! agent, and checks that no connect fails: until the heartbeat is stale they reach the VIP
//! untouched (the proxy rewrite's link died with the agent), then every one goes to B;
//! without the entry, to the VIP untouched (A); that a restarted agent adopts the pinned maps,
//! replaces the old links and intercepts the same client again; and that cleanup leaves no
//! pinned file and none of the links attached.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use warmpath_agent::ebpf::{FailOpen, cgroup_id};
use warmpath_e2e::{
    gate,
    pods::{Bed, Node},
    process::OwnedChild,
};

const WAIT: Duration = Duration::from_secs(15);
const VIP: &str = "10.96.0.10:8000";
const LISTEN_PORT: u16 = 8080;
const SIM_PORT: u16 = 8000;
/// Requests sent while the agent is dead, after the heartbeat went stale.
const DEAD_REQUESTS: usize = 10;
/// Bound on the connects tried while waiting for the heartbeat to go stale (1 s; each try
/// is a request and a scrape of B's counter).
const STALE_ATTEMPTS: usize = 200;

#[test]
#[ignore = "entry point of the pod child processes (tests/src/pods.rs)"]
fn pod_child() {
    warmpath_e2e::pods::child_main();
}

fn served(node: &Node, sim: &str) -> f64 {
    warmpath_e2e::pods::served(&node.ns, sim).unwrap()
}

fn ask(client: &mut OwnedChild) -> serde_json::Value {
    client.send_line("10.96.0.10 8000").unwrap();
    serde_json::from_str(&client.next_line(WAIT).expect("the client answered")).unwrap()
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

#[test]
fn dead_agent_fails_open_to_affinity_pods_and_a_new_agent_adopts_the_pins() {
    if !gate::bpf_available(
        "dead_agent_fails_open_to_affinity_pods_and_a_new_agent_adopts_the_pins",
    ) {
        return;
    }
    let tag = format!("wf{}", std::process::id() % 100_000);
    let bed = Bed::create(&tag, "failopen", 3).unwrap();
    let (node, pins) = (&bed.node, &bed.pins);
    // Pod 1 answers on the VIP too; pod 0 reaches it there when nothing rewrites.
    node.pods[1]
        .ns
        .ip(&["addr", "add", "10.96.0.10/32", "dev", "lo"])
        .unwrap();
    node.pods[0]
        .ns
        .ip(&[
            "route",
            "add",
            "10.96.0.10/32",
            "via",
            &node.pods[1].ip4.to_string(),
        ])
        .unwrap();
    let sim_a = format!("{}:{SIM_PORT}", node.pods[1].ip4);
    let sim_b = format!("{}:{SIM_PORT}", node.pods[2].ip4);
    let _a = bed.sim(1, "0.0.0.0", SIM_PORT).unwrap();
    let _b = bed.sim(2, &node.pods[2].ip4.to_string(), SIM_PORT).unwrap();

    let agent_args: Vec<String> = [
        "--listen",
        &format!("0.0.0.0:{LISTEN_PORT}"),
        "--admin",
        "127.0.0.1:9090",
        "--endpoint",
        &format!("http://{sim_a}"),
        "--endpoint",
        &format!("http://{sim_b}"),
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

    let mut client = bed.client(warmpath_e2e::pods::COMPLETION_CLIENT).unwrap();
    let client_id = cgroup_id(bed.client_cgroup.path()).unwrap();

    // Alive: through the agent (it names the pod it chose).
    let answer = ask(&mut client);
    assert_eq!(answer["status"], 200, "{answer}");
    assert!(answer["pod"].is_string(), "proxied: {answer}");
    let first_links = pinned_link_ids(&pins.path);
    assert_eq!(
        first_links.len(),
        5,
        "connect4/6, getpeername4/6, sock_ops pinned"
    );

    // What the agent would have learned: this client's prefixes live on B.
    let vip: std::net::SocketAddr = VIP.parse().unwrap();
    let mut failopen = FailOpen::open_pinned(&pins.path).unwrap();
    failopen
        .set_affinity(client_id, vip, &[sim_b.parse().unwrap()])
        .unwrap();
    let (a0, b0) = (served(node, &sim_a), served(node, &sim_b));

    agent.kill();
    let killed = Instant::now();
    // The proxy rewrite died with the agent. Until the heartbeat is stale (<= 1 s) connects
    // reach the VIP untouched (A); then the affinity pod (B). None may fail.
    let mut untouched = 0;
    let mut attempts = 0;
    loop {
        attempts += 1;
        assert!(
            attempts <= STALE_ATTEMPTS,
            "never failed open to the affinity pod"
        );
        let answer = ask(&mut client);
        assert_eq!(
            answer["status"], 200,
            "agent dead, connect {attempts}: {answer}"
        );
        assert!(answer["pod"].is_null(), "straight to a pod: {answer}");
        if served(node, &sim_b) > b0 {
            break;
        }
        untouched += 1;
    }
    let window = killed.elapsed();
    assert_eq!(
        served(node, &sim_a) - a0,
        untouched as f64,
        "the window went to the VIP"
    );
    let (a1, b1) = (served(node, &sim_a), served(node, &sim_b));
    for _ in 0..DEAD_REQUESTS {
        let answer = ask(&mut client);
        assert_eq!(answer["status"], 200, "agent dead: {answer}");
        assert!(answer["pod"].is_null(), "agent dead: {answer}");
    }
    // Test 3: once the heartbeat is stale every connection goes to the affinity pod.
    assert_eq!(served(node, &sim_b) - b1, DEAD_REQUESTS as f64);
    assert_eq!(served(node, &sim_a) - a1, 0.0);
    let a0 = served(node, &sim_a);

    // No entry: the VIP untouched (pod 1 answers it).
    failopen.remove_affinity(client_id, vip).unwrap();
    let answer = ask(&mut client);
    assert_eq!(answer["status"], 200, "{answer}");
    assert!(answer["pod"].is_null(), "{answer}");
    assert_eq!(served(node, &sim_a) - a0, 1.0);

    // Test 5: a new agent adopts the pins, replaces the old links, and intercepts the same
    // client again (the client was not restarted).
    let agent2 = start_agent();
    let answer = ask(&mut client);
    assert_eq!(answer["status"], 200, "{answer}");
    assert!(answer["pod"].is_string(), "proxied again: {answer}");
    let second_links = pinned_link_ids(&pins.path);
    assert_eq!(second_links.len(), 5);
    assert!(second_links.iter().all(|id| !first_links.contains(id)));
    let loaded: Vec<u32> = aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|l| l.id())
        .collect();
    assert!(
        first_links.iter().all(|id| !loaded.contains(id)),
        "the first agent's links are detached"
    );

    // `warmpath agent --cleanup`: nothing pinned, none of the links left.
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
    let loaded: Vec<u32> = aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|l| l.id())
        .collect();
    assert!(second_links.iter().all(|id| !loaded.contains(id)));
    let answer = ask(&mut client);
    assert_eq!(
        answer["status"], 200,
        "after cleanup, the VIP untouched: {answer}"
    );
    assert!(answer["pod"].is_null());

    drop(client);
    gate::announce(&format!(
        "bpf: agent SIGKILLed: 0 of {attempts} connects failed; {untouched} in the {window:?} before the heartbeat went stale reached the VIP untouched ({sim_a}), then {} to the affinity pod {sim_b}, none to {sim_a}; untouched VIP without an entry; restart adopted the pins; cleanup left nothing",
        DEAD_REQUESTS + 1
    ));
}
