//! Steer mode (issue #20, test 4; docs/ebpf.md): connects to a steered VIP go straight to a
//! pod chosen in the kernel, without the agent's hop, and new connects follow a new table.
//!
//! Root only. Node and three pods (`tests/src/pods.rs`): pod 0 is the client, pods 1 and 2
//! run simulators A and B. The agent steers the VIP to its two endpoints. Direct answers
//! carry no `x-warmpath-pod` (the agent adds it to what it proxies) and the agent logs no
//! intercepted connection; the simulators' own counters show who served.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use warmpath_agent::ebpf::{FailOpen, cgroup_id};
use warmpath_e2e::{
    gate,
    pods::{Bed, COMPLETION_CLIENT, Node, PodProcess, served},
    process::OwnedChild,
};

const WAIT: Duration = Duration::from_secs(15);
const VIP: &str = "10.96.0.20:8000";
const SIM_PORT: u16 = 8000;
const REQUESTS: usize = 10;

#[test]
#[ignore = "entry point of the pod child processes (tests/src/pods.rs)"]
fn pod_child() {
    warmpath_e2e::pods::child_main();
}

fn ask(client: &mut OwnedChild) -> serde_json::Value {
    client.send_line("10.96.0.20 8000").unwrap();
    serde_json::from_str(&client.next_line(WAIT).expect("the client answered")).unwrap()
}

#[test]
fn steered_connects_go_straight_to_a_pod_and_follow_the_table() {
    if !gate::bpf_available("steered_connects_go_straight_to_a_pod_and_follow_the_table") {
        return;
    }
    let tag = format!("ws{}", std::process::id() % 100_000);
    let bed = Bed::create(&tag, "steer", 3).unwrap();
    let node = &bed.node;
    let sims: Vec<String> = (1..=2)
        .map(|i| format!("{}:{SIM_PORT}", node.pods[i].ip4))
        .collect();
    let _sims: Vec<PodProcess> = (1..=2)
        .map(|i| bed.sim(i, &node.pods[i].ip4.to_string(), SIM_PORT).unwrap())
        .collect();
    let args: Vec<String> = [
        "--listen",
        "0.0.0.0:8080",
        "--admin",
        "127.0.0.1:9090",
        "--endpoint",
        &format!("http://{}", sims[0]),
        "--endpoint",
        &format!("http://{}", sims[1]),
        "--explain",
        "--redirect",
        &format!("{VIP}={}:8080", Node::IP4),
        "--steer",
        VIP,
    ]
    .map(String::from)
    .to_vec();
    let agent = bed
        .agent(
            &args,
            "info,warmpath_agent::proxy::listener=debug",
            &["steering in the kernel", "interception attached"],
            WAIT,
        )
        .unwrap();

    let mut client = bed.client(COMPLETION_CLIENT).unwrap();

    let count = |i: usize| served(&node.ns, &sims[i]).unwrap();
    let (a0, b0) = (count(0), count(1));
    for _ in 0..REQUESTS {
        let answer = ask(&mut client);
        assert_eq!(answer["status"], 200, "{answer}");
        assert!(
            answer["pod"].is_null(),
            "straight to a pod, not proxied: {answer}"
        );
    }
    assert_eq!(count(0) - a0 + count(1) - b0, REQUESTS as f64);
    assert!(
        !agent.stderr().contains("intercepted connection"),
        "the agent accepted none of them"
    );

    // Re-steer: this client's connects now go to B only (the table an agent computes; the
    // test writes it through the pinned map).
    let vip: std::net::SocketAddr = VIP.parse().unwrap();
    let mut table = FailOpen::open_pinned(&bed.pins.path).unwrap();
    let id = cgroup_id(bed.client_cgroup.path()).unwrap();
    table
        .set_affinity(id, vip, &[sims[1].parse().unwrap()])
        .unwrap();
    let (a1, b1) = (count(0), count(1));
    for _ in 0..REQUESTS {
        let answer = ask(&mut client);
        assert_eq!(answer["status"], 200, "{answer}");
        assert!(answer["pod"].is_null(), "{answer}");
    }
    assert_eq!(count(1) - b1, REQUESTS as f64, "all moved to B");
    assert_eq!(count(0) - a1, 0.0);
    assert!(!agent.stderr().contains("intercepted connection"));

    drop(client);
    drop(agent);
    gate::announce(&format!(
        "bpf: steer: {REQUESTS} connects to {VIP} straight to {} / {} (A {} B {}), none accepted by the agent; after re-steering all {REQUESTS} to {}",
        sims[0],
        sims[1],
        a1 - a0,
        b1 - b0,
        sims[1]
    ));
}
