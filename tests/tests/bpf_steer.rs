//! Steer mode (issue #20, test 4; docs/ebpf.md): connects to a steered VIP go straight to a
//! pod chosen in the kernel from the table the agent computes, without the agent's hop, and
//! new connects move when the agent re-steers.
//!
//! Root only. Node and three pods (`tests/src/pods.rs`): pod 0 is the client (two client
//! processes in its cgroup: one opening a fresh connection per request, one holding a
//! keep-alive connection), pods 1 and 2 run simulators A and B. The agent steers the VIP; its
//! backend set is both pods (equal load). Direct answers carry no `x-warmpath-pod` (the agent
//! adds it to what it proxies) and the agent logs no intercepted connection (its accept
//! counter stays flat); the simulators' own counters show who served. Then the simulator the
//! keep-alive connection is not on is stopped: the agent's scrapes of it fail, it re-steers
//! the VIP to the other pod alone, every new connect goes there, and the keep-alive
//! connection keeps working.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use serde_json::Value;
use warmpath_e2e::{
    gate,
    pods::{Bed, LOAD_CLIENT, Node, get_json, served},
    process::OwnedChild,
};

const WAIT: Duration = Duration::from_secs(15);
const VIP_IP: &str = "10.96.0.20";
const VIP: &str = "10.96.0.20:8000";
const SIM_PORT: u16 = 8000;
const REQUESTS: usize = 10;

#[test]
#[ignore = "entry point of the pod child processes (tests/src/pods.rs)"]
fn pod_child() {
    warmpath_e2e::pods::child_main();
}

/// `verb` (`run` or `keep`) `n` completions to the VIP, each straight to a pod; their lines.
fn ask(client: &mut OwnedChild, verb: &str, n: usize) -> Vec<Value> {
    ask_expecting(client, verb, n, true)
}

/// `verb` `n` completions to the VIP, each answered straight by a pod (`direct`) or through
/// the agent (its `x-warmpath-pod`); their lines.
fn ask_expecting(client: &mut OwnedChild, verb: &str, n: usize, direct: bool) -> Vec<Value> {
    client
        .send_line(&format!("{verb} {VIP_IP} {SIM_PORT} {n}"))
        .unwrap();
    let mut out = Vec::new();
    loop {
        let line = client.next_line(WAIT).expect("the client answered");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v.get("done").is_some() {
            return out;
        }
        assert_eq!(v["status"], 200, "{v}");
        if direct {
            assert!(v["pod"].is_null(), "straight to a pod, not proxied: {v}");
        } else {
            assert!(v["pod"].is_string(), "through the agent: {v}");
        }
        out.push(v);
    }
}

/// The list at `pointer` of the agent's `/status` `kernel_table`, once `ok` holds for it
/// (bounded by WAIT).
fn wait_for_table(node: &Node, pointer: &str, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let list: Vec<String> = get_json(&node.ns, "http://127.0.0.1:9090/status")
            .ok()
            .and_then(|s| serde_json::from_value(s["kernel_table"].pointer(pointer)?.clone()).ok())
            .unwrap_or_default();
        if ok(&list) {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "kernel_table{pointer} never as expected: {list:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The VIP's backend set, once `ok` holds for it.
fn wait_for_set(node: &Node, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
    wait_for_table(node, &format!("/backends/{VIP}"), ok)
}

/// The VIPs the kernel table steers now, once `ok` holds for them.
fn wait_for_steered(node: &Node, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
    wait_for_table(node, "/steered", ok)
}

#[test]
fn steered_connects_go_straight_to_a_pod_and_move_when_the_agent_re_steers() {
    if !gate::bpf_available(
        "steered_connects_go_straight_to_a_pod_and_move_when_the_agent_re_steers",
    ) {
        return;
    }
    let tag = format!("ws{}", std::process::id() % 100_000);
    let bed = Bed::create(&tag, "steer", 3).unwrap();
    let node = &bed.node;
    let sims: Vec<String> = (1..=2)
        .map(|i| format!("{}:{SIM_PORT}", node.pods[i].ip4))
        .collect();
    let mut running: Vec<Option<_>> = (1..=2)
        .map(|i| Some(bed.sim(i, &node.pods[i].ip4.to_string(), SIM_PORT).unwrap()))
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
    let both = wait_for_set(node, |s| s.len() == 2);
    let mut sorted = both.clone();
    sorted.sort();
    assert_eq!(sorted, sims, "idle pods: each once");

    let mut fresh = bed
        .client_in(0, &bed.client_cgroup, LOAD_CLIENT, &["0"])
        .unwrap();
    let mut kept = bed
        .client_in(0, &bed.client_cgroup, LOAD_CLIENT, &["1"])
        .unwrap();
    let count = |i: usize| served(&node.ns, &sims[i]).unwrap();

    let (a0, b0) = (count(0), count(1));
    ask(&mut fresh, "run", REQUESTS);
    let (a1, b1) = (count(0), count(1));
    assert_eq!(a1 - a0 + b1 - b0, REQUESTS as f64);
    // The keep-alive connection: which pod holds it.
    ask(&mut kept, "keep", 1);
    let on = if count(0) > a1 { 0 } else { 1 };
    let off = 1 - on;
    assert_eq!(count(on) - [a1, b1][on], 1.0);
    assert!(
        !agent.stderr().contains("intercepted connection"),
        "the agent accepted none of them"
    );

    // The other simulator stops: its scrapes fail, the agent re-steers to `on` alone.
    drop(running[off].take());
    let resteered = Instant::now();
    wait_for_set(node, |s| s == std::slice::from_ref(&sims[on]));
    let took = resteered.elapsed();
    let before = count(on);
    ask(&mut fresh, "run", REQUESTS);
    assert_eq!(
        count(on) - before,
        REQUESTS as f64,
        "all moved to {}",
        sims[on]
    );
    // The keep-alive connection to the pod still up keeps working.
    let before = count(on);
    ask(&mut kept, "keep", 3);
    assert_eq!(count(on) - before, 3.0);
    assert!(!agent.stderr().contains("intercepted connection"));

    drop((fresh, kept));
    drop(agent);
    drop(running);
    gate::announce(&format!(
        "bpf: steer: table {both:?}; {REQUESTS} connects straight to the pods (A {} B {}), none accepted by the agent; {} stopped, re-steered to {} in {took:?}, then {REQUESTS} of {REQUESTS} new connects there and the keep-alive connection kept serving",
        a1 - a0,
        b1 - b0,
        sims[off],
        sims[on],
    ));
}

/// A RoutePolicy for the pool `default` with `action.mode: MODE`.
fn mode_policy(mode: &str) -> String {
    format!(
        "apiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {{name: data-path, namespace: ml}}\nspec:\n  targetRef: {{pool: {{name: default}}}}\n  action: {{mode: {mode}}}\n"
    )
}

/// Steer mode from a `RoutePolicy` (no `--steer`), the VIP from the configuration file's
/// `intercept:` (no `--redirect`): `mode: steer` steers the pool's VIP, `mode: proxy` sends
/// new connects through the agent again, and steer once more takes them straight to the
/// pod, each change applied from the policy directory without a restart.
#[test]
fn a_route_policy_turns_steering_on_and_off_without_a_restart() {
    if !gate::bpf_available("a_route_policy_turns_steering_on_and_off_without_a_restart") {
        return;
    }
    let tag = format!("wq{}", std::process::id() % 100_000);
    let bed = Bed::create(&tag, "steerpol", 2).unwrap();
    let node = &bed.node;
    let sim = format!("{}:{SIM_PORT}", node.pods[1].ip4);
    let _running = bed.sim(1, &node.pods[1].ip4.to_string(), SIM_PORT).unwrap();
    let dir = std::env::temp_dir().join(format!("warmpath-steer-policy-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    let write = |mode: &str| {
        let tmp = dir.join("policies/.route.yaml.tmp");
        std::fs::write(&tmp, mode_policy(mode)).unwrap();
        std::fs::rename(&tmp, dir.join("policies/route.yaml")).unwrap();
    };
    write("steer");
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "version: 1\nlisten: 0.0.0.0:8080\nadmin: 127.0.0.1:9090\nproxy: {{explain: true}}\npolicyDir: {}\npools:\n- {{name: default, model: sim-llama, endpoints: [{{url: 'http://{sim}'}}]}}\nintercept:\n- {{vip: '{VIP}', target: '{}:8080'}}\n",
            dir.join("policies").display(),
            Node::IP4
        ),
    )
    .unwrap();
    let args: Vec<String> = vec!["--config".into(), config.display().to_string()];
    let agent = bed
        .agent(
            &args,
            "info,warmpath_agent::proxy::listener=debug",
            &["steering in the kernel", "interception attached"],
            WAIT,
        )
        .unwrap();
    wait_for_set(node, |s| s == std::slice::from_ref(&sim));
    assert_eq!(wait_for_steered(node, |s| !s.is_empty()), vec![VIP]);
    let mut fresh = bed
        .client_in(0, &bed.client_cgroup, LOAD_CLIENT, &["0"])
        .unwrap();
    let accepted = || agent.stderr().matches("intercepted connection").count();
    // The agent's log is read by a thread of its own: a count may lag the answers a moment.
    let accepted_reaches = |n: usize, within: Duration| {
        let deadline = Instant::now() + within;
        while accepted() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        accepted()
    };
    let count = || served(&node.ns, &sim).unwrap();

    let before = count();
    ask(&mut fresh, "run", REQUESTS);
    assert_eq!(count() - before, REQUESTS as f64);
    assert_eq!(accepted(), 0, "steered: the agent accepted none");

    write("proxy");
    let switched = Instant::now();
    wait_for_steered(node, <[String]>::is_empty);
    let to_proxy = switched.elapsed();
    let before = count();
    ask_expecting(&mut fresh, "run", REQUESTS, false);
    assert_eq!(count() - before, REQUESTS as f64);
    assert_eq!(
        accepted_reaches(REQUESTS, WAIT),
        REQUESTS,
        "proxied: each connect accepted by the agent"
    );

    write("steer");
    let switched = Instant::now();
    wait_for_steered(node, |s| s == [VIP]);
    let to_steer = switched.elapsed();
    ask(&mut fresh, "run", REQUESTS);
    // Had one of these connects reached the agent, its line would follow its answer within
    // moments (the ten lines above took far less): a second before counting.
    assert_eq!(
        accepted_reaches(REQUESTS + 1, Duration::from_secs(1)),
        REQUESTS,
        "steered again: no new accept"
    );

    drop(fresh);
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
    gate::announce(&format!(
        "bpf: steer by policy: {REQUESTS} connects straight to {sim}; mode: proxy applied in {to_proxy:?}, {REQUESTS} through the agent; mode: steer again in {to_steer:?}, {REQUESTS} straight again"
    ));
}
