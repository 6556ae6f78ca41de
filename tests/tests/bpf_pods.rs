//! Interception from pod network namespaces (issue #20, tests 1 and 2; docs/ebpf.md).
//!
//! Root only. A node namespace with a bridge and two pods (`tests/src/pods.rs`): pod 0 is a
//! client in its own cgroup, pod 1 runs a simulator. The agent runs in the node namespace, in
//! its own cgroup; the interception programs are attached to the parent of both cgroups. The
//! client dials Service VIPs that exist nowhere (10.96.0.10:8000, [fd00:96::10]:8000); only
//! the kernel rewrite to the node's address can reach the agent, which routes the request to
//! the simulator pod. The simulator's own address is intercepted too, so an agent whose
//! upstream connects were rewritten would send its requests to itself.
//!
//! Tenant identity from the client's cgroup (issue #20): a tenant of the agent's file selects
//! pod 0's cgroup (`tenants.cgroups`); requests from it name another tenant in the header,
//! from an address trusted to, and still count as the cgroup's tenant, while a second cgroup
//! in the same pod, and the node's own processes (not intercepted), get the header or CIDR
//! tenant as without interception.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use warmpath_agent::ebpf::{cgroup_id, pinned_conns};
use warmpath_e2e::{
    gate,
    pods::{Bed, Node, get_json},
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
/// with the peer getpeername() reported once connected and again once answered (the agent
/// has accepted and served the connection by then), the status and the pod that served it.
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
        after = c.sock.getpeername()
        print(json.dumps({"peer": [peer[0], peer[1]], "after": [after[0], after[1]],
                          "status": r.status,
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
        assert_eq!(
            answer["after"], answer["peer"],
            "{family}: still the VIP while the agent holds the connection"
        );
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
    // The client closed both connections: the agent closes its ends and removes their origins
    // (the kernel map has no event to await; poll it, bounded).
    let deadline = Instant::now() + WAIT;
    let mut left = pinned_conns(&bed.pins.path).unwrap();
    while left > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = pinned_conns(&bed.pins.path).unwrap();
    }
    assert_eq!(left, 0, "origins of closed connections are removed");

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

/// For each line "HOST PORT TENANT [SOURCE]": one completion over a fresh connection (from
/// address SOURCE when given) claiming tenant TENANT in the header; prints one JSON line with
/// the status and the pod that served it.
const TENANT_CLIENT: &str = r#"
import http.client, json, sys
for line in sys.stdin:
    host, port, tenant, *source = line.split()
    try:
        src = (source[0], 0) if source else None
        c = http.client.HTTPConnection(host, int(port), timeout=10, source_address=src)
        body = json.dumps({"model": "sim-llama", "prompt": "whose request is this", "max_tokens": 2})
        c.request("POST", "/v1/completions", body,
                  {"content-type": "application/json", "x-warmpath-tenant": tenant})
        r = c.getresponse()
        r.read()
        print(json.dumps({"status": r.status, "pod": r.getheader("x-warmpath-pod")}), flush=True)
        c.close()
    except OSError as e:
        print(json.dumps({"error": str(e)}), flush=True)
"#;

/// A file removed on drop (the agent's configuration).
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One request through `client`; its answer must be a 200 from the simulator at `sim`.
fn claim(client: &mut OwnedChild, line: &str, sim: &str) {
    client.send_line(line).unwrap();
    let answer: serde_json::Value =
        serde_json::from_str(&client.next_line(WAIT).expect("the client answered")).unwrap();
    assert_eq!(answer["status"], 200, "{line}: {answer}");
    assert_eq!(answer["pod"], sim, "{line}: {answer}");
}

/// Requests per tenant in the agent's `/status`, once `ok` holds for them (bounded by WAIT).
fn wait_for_tenants(
    node: &Node,
    ok: impl Fn(&std::collections::BTreeMap<String, u64>) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = get_json(&node.ns, "http://127.0.0.1:9090/status").unwrap_or_default();
        let tenants: std::collections::BTreeMap<String, u64> = status["tenants"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["tenant"].as_str()?.to_string(), t["requests"].as_u64()?)))
            .collect();
        if ok(&tenants) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "tenants never as expected: {tenants:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_client_cgroup_names_the_tenant_whatever_the_header_says() {
    if !gate::bpf_available("the_client_cgroup_names_the_tenant_whatever_the_header_says") {
        return;
    }
    let tag = format!("wt{}", std::process::id() % 100_000);
    let bed = Bed::create(&tag, "tenants", 2).unwrap();
    let node = &bed.node;
    // Pod 0's second cgroup: intercepted too, but selected by no tenant.
    let other_cgroup = bed.cgroup("pod-0-other").unwrap();

    let sim_addr = format!("{}:{SIM_PORT}", node.pods[1].ip4);
    let sim = bed.sim(1, &node.pods[1].ip4.to_string(), SIM_PORT).unwrap();
    let listener4 = format!("{}:{LISTEN_PORT}", Node::IP4);
    let pod0 = node.pods[0].ip4;
    // Pod 0's address may name any tenant in the header; 127.0.0.1 is team-host's by CIDR
    // (CIDRs come before the header), other loopback addresses may use the header.
    let config = TempFile(std::env::temp_dir().join(format!("warmpath-{tag}-agent.yaml")));
    std::fs::write(
        &config.0,
        format!(
            "version: 1\nlisten: \"[::]:{LISTEN_PORT}\"\nadmin: 127.0.0.1:9090\nproxy: {{explain: true}}\n\
             pools:\n- name: default\n  model: sim-llama\n  endpoints:\n  - url: http://{sim_addr}\n\
             tenants:\n  cgroups:\n    team-pod: [{}]\n  cidrs:\n    team-host: [127.0.0.1/32]\n  \
             trustHeaderFrom: [{pod0}/32, 127.0.0.0/8]\n",
            bed.client_cgroup.path().display()
        ),
    )
    .unwrap();
    let agent_args: Vec<String> = [
        "--config",
        &config.0.display().to_string(),
        "--redirect",
        &format!("{VIP4}={listener4}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let agent = bed
        .agent(&agent_args, "info", &["interception attached"], WAIT)
        .unwrap();

    let (host, port) = VIP4.rsplit_once(':').unwrap();
    // The selected cgroup claims another tenant from a trusted address: the cgroup decides.
    let mut selected = bed.client(TENANT_CLIENT).unwrap();
    claim(
        &mut selected,
        &format!("{host} {port} team-spoofed"),
        &sim_addr,
    );
    claim(
        &mut selected,
        &format!("{host} {port} team-spoofed"),
        &sim_addr,
    );
    // The same pod from a cgroup no tenant selects: the trusted header, as before.
    let mut unselected = bed.client_in(0, &other_cgroup, TENANT_CLIENT, &[]).unwrap();
    claim(
        &mut unselected,
        &format!("{host} {port} team-header"),
        &sim_addr,
    );
    // The node's own processes, not intercepted, straight to the listener: the CIDR tenant
    // from 127.0.0.1, the header from another loopback address.
    let mut host_client = {
        let mut cmd = node.ns.command("python3");
        cmd.args(["-c", TENANT_CLIENT]);
        OwnedChild::spawn(cmd).unwrap()
    };
    claim(
        &mut host_client,
        &format!("127.0.0.1 {LISTEN_PORT} team-spoofed"),
        &sim_addr,
    );
    claim(
        &mut host_client,
        &format!("127.0.0.1 {LISTEN_PORT} team-loopback 127.0.0.2"),
        &sim_addr,
    );

    let want: std::collections::BTreeMap<String, u64> = [
        ("team-pod", 2),
        ("team-header", 1),
        ("team-host", 1),
        ("team-loopback", 1),
    ]
    .into_iter()
    .map(|(t, n)| (t.to_string(), n))
    .collect();
    let status = wait_for_tenants(node, |t| *t == want);
    // The affinity learner holds both intercepted clients (one per cgroup), not the node's.
    assert_eq!(status["client_affinity"]["clients"], 2, "{status}");

    drop(host_client);
    drop(unselected);
    drop(selected);
    drop(agent);
    drop(sim);
    gate::announce(&format!(
        "bpf: tenant from cgroup {} (team-pod) over a trusted header; header and CIDR tenants unchanged elsewhere",
        bed.client_cgroup.path().display()
    ));
}
