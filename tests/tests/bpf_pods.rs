//! Interception from pod network namespaces (issue #20, tests 1 and 2; docs/ebpf.md).
//!
//! Root only. A node namespace with a bridge and two pods (`tests/src/pods.rs`): pod 0 is a
//! client in its own cgroup, pod 1 runs a simulator. The agent runs in the node namespace, in
//! its own cgroup; the interception programs are attached to the parent of both cgroups. The
//! client dials Service VIPs that exist nowhere (10.96.0.10:8000, [fd00:96::10]:8000); only
//! the kernel rewrite to the node's address can reach the agent, which routes the request to
//! the simulator pod. The simulator's own address is intercepted too, so an agent whose
//! upstream connects were rewritten would send its requests to itself.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use warmpath_agent::ebpf::cgroup_id;
use warmpath_e2e::{
    gate,
    pods::{Bed, Node},
    process::OwnedChild,
};

const WAIT: Duration = Duration::from_secs(15);
const VIP4: &str = "10.96.0.10:8000";
const VIP6: &str = "[fd00:96::10]:8000";
/// The agent's one listener (dual stack) in the node namespace.
const LISTEN_PORT: u16 = 8080;
const SIM_PORT: u16 = 8000;

#[test]
#[ignore = "entry point of the pod child processes (tests/src/pods.rs)"]
fn pod_child() {
    warmpath_e2e::pods::child_main();
}

/// For each line "HOST PORT": one completion over a fresh connection; prints one JSON line
/// with the peer getpeername() reported, the status and the pod that served it.
const CLIENT: &str = r#"
import http.client, json, sys
for line in sys.stdin:
    host, port = line.split()
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=10)
        c.connect()
        peer = c.sock.getpeername()
        body = json.dumps({"model": "sim-llama", "prompt": "hello from a pod", "max_tokens": 2})
        c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        print(json.dumps({"peer": [peer[0], peer[1]], "status": r.status,
                          "pod": r.getheader("x-warmpath-pod")}), flush=True)
        c.close()
    except OSError as e:
        print(json.dumps({"error": str(e)}), flush=True)
"#;

fn served(node: &Node, sim: &str) -> f64 {
    warmpath_e2e::pods::served(&node.ns, sim).unwrap()
}

fn ask(client: &mut OwnedChild, vip: &str) -> serde_json::Value {
    let (host, port) = vip.rsplit_once(':').unwrap();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    client.send_line(&format!("{host} {port}")).unwrap();
    let line = client.next_line(WAIT).expect("the client answered");
    serde_json::from_str(&line).unwrap()
}

#[test]
fn pods_reach_the_agent_through_vips_and_it_reaches_the_sim_pod() {
    if !gate::bpf_available("pods_reach_the_agent_through_vips_and_it_reaches_the_sim_pod") {
        return;
    }
    let tag = format!("wp{}", std::process::id() % 100_000);
    // Drop order (reverse of declaration): processes, then the bed (cgroups, namespaces).
    let bed = Bed::create(&tag, "pods", 2).unwrap();
    let node = &bed.node;

    let sim_addr = format!("{}:{SIM_PORT}", node.pods[1].ip4);
    let sim = bed.sim(1, &node.pods[1].ip4.to_string(), SIM_PORT).unwrap();
    let listener4 = format!("{}:{LISTEN_PORT}", Node::IP4);
    let listener6 = format!("[{}]:{LISTEN_PORT}", Node::IP6);
    let agent_args: Vec<String> = [
        "--listen",
        &format!("[::]:{LISTEN_PORT}"),
        "--admin",
        "127.0.0.1:9090",
        "--endpoint",
        &format!("http://{sim_addr}"),
        "--explain",
        "--redirect",
        &format!("{VIP4}={listener4}"),
        "--redirect",
        &format!("{VIP6}={listener6}"),
        // The simulator pod's own address as a Service too: the agent's upstream connects go
        // there and must not be rewritten back to the agent.
        "--redirect",
        &format!("{sim_addr}={listener4}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let agent = bed
        .agent(
            &agent_args,
            "info,warmpath_agent::proxy::listener=debug",
            &["interception attached"],
            WAIT,
        )
        .unwrap();

    let mut client = bed.client(CLIENT).unwrap();
    let client_id = cgroup_id(bed.client_cgroup.path()).unwrap().to_string();

    let before = served(node, &sim_addr);
    for (vip, family) in [(VIP4, "IPv4"), (VIP6, "IPv6")] {
        let answer = ask(&mut client, vip);
        assert_eq!(answer["status"], 200, "{family} via {vip}: {answer}");
        // Test 1: getpeername() shows the VIP; the request was routed to the sim pod.
        let (host, port) = vip.rsplit_once(':').unwrap();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        assert_eq!(answer["peer"][0], host, "{family}: {answer}");
        assert_eq!(answer["peer"][1], port.parse::<u16>().unwrap(), "{family}");
        assert_eq!(answer["pod"], sim_addr.as_str(), "{family}: {answer}");
        // The agent learned the VIP and the client's cgroup for this connection.
        let vip_field = format!("vip={vip}");
        let cgroup_field = format!("cgroup_id={client_id}");
        agent
            .wait_for_log(&["intercepted connection", &vip_field, &cgroup_field], WAIT)
            .unwrap();
    }
    // Test 2: both requests reached the simulator itself: the agent's upstream connections
    // to an intercepted address were left alone (else they would have looped to the agent).
    assert_eq!(served(node, &sim_addr) - before, 2.0);

    // A process in the node namespace outside the intercepted cgroups is not rewritten:
    // nothing routes to the VIP there.
    let outside = node
        .ns
        .command("python3")
        .args([
            "-c",
            "import socket\ntry:\n socket.create_connection(('10.96.0.10', 8000), timeout=2)\n print('connected')\nexcept OSError as e:\n print('refused' if e.errno in (101, 111, 113) else f'other {e}')",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&outside.stdout).trim(), "refused");

    drop(client);
    drop(agent);
    drop(sim);
    gate::announce(&format!(
        "bpf: pod netns {} -> VIPs {VIP4} and {VIP6} -> agent {listener4}/{listener6} (cgroup {client_id}) -> sim pod {sim_addr}",
        node.pods[0].ns.name()
    ));
}
