//! `sk_msg` + SOCKHASH acceleration of node-local hops (issue #20; docs/ebpf.md "sk_msg
//! acceleration"): `warmpath agent --sk-msg`.
//!
//! Root only. Node and two pods (`tests/src/pods.rs`): pod 0 is the client in its own cgroup,
//! pod 1 runs a simulator; the agent (one dual-stack listener, so IPv4 clients reach it as
//! IPv4-mapped addresses) runs in the node namespace in its own cgroup, both under the cgroup
//! the programs attach to. Every request is made twice: once by a process of the node
//! namespace outside the intercepted cgroups, straight to the agent's listener (plain TCP:
//! the reference), and once from the pod through each VIP (IPv4 and IPv6), where both sockets
//! of the hop are in the SOCKHASH. Non-streamed and SSE answers, short and ~13 KB prompts,
//! must be the same event for event (ids and timestamps aside), and the agent's pinned
//! counters must show both ends of every VIP connection added and messages redirected. A
//! second agent without the flag, adopting the same pins, adds no socket.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use warmpath_agent::ebpf::{Counters, pinned_counters};
use warmpath_e2e::{
    gate,
    pods::{Bed, Node},
    process::OwnedChild,
};

const WAIT: Duration = Duration::from_secs(20);
const VIP4: &str = "10.96.0.10:8000";
const VIP6: &str = "[fd00:96::10]:8000";
const LISTEN_PORT: u16 = 8080;
const SIM_PORT: u16 = 8000;

#[test]
#[ignore = "entry point of the pod child processes (tests/src/pods.rs)"]
fn pod_child() {
    warmpath_e2e::pods::child_main();
}

/// For each line "HOST PORT STREAM REPEAT": one completion over a fresh connection of a prompt
/// of REPEAT sentences, streamed when STREAM is 1; prints one JSON line: the status and the
/// answer as parsed JSON without its `id`, `created` and cached-token count (a non-streamed
/// body, or every SSE event in order, `[DONE]` included), and the events that were not
/// `data: ...` lines.
const CLIENT: &str = r#"
import http.client, json, sys
def norm(o):
    o.pop("id", None); o.pop("created", None)
    u = o.get("usage") or {}
    u.pop("prompt_tokens_details", None)
    return o
for line in sys.stdin:
    host, port, stream, repeat = line.split()
    stream = stream == "1"
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=20)
        body = {"model": "sim-llama", "max_tokens": 48, "ignore_eos": True, "stream": stream,
                "prompt": "the quick brown fox jumps over the lazy dog " * int(repeat)}
        if stream:
            body["stream_options"] = {"include_usage": True}
        c.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        r = c.getresponse()
        raw = r.read().decode()
        c.close()
        if not stream:
            print(json.dumps({"status": r.status, "answer": norm(json.loads(raw))}), flush=True)
            continue
        events, bad = [], []
        for e in raw.split("\n\n"):
            if not e:
                continue
            if not e.startswith("data: "):
                bad.append(e); continue
            data = e[len("data: "):]
            events.append(data if data == "[DONE]" else norm(json.loads(data)))
        print(json.dumps({"status": r.status, "answer": events, "malformed": bad, "tail": raw[-14:]}), flush=True)
    except Exception as e:
        print(json.dumps({"error": repr(e)}), flush=True)
"#;

fn ask(client: &mut OwnedChild, addr: &str, stream: bool, repeat: u32) -> serde_json::Value {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    client
        .send_line(&format!("{host} {port} {} {repeat}", u8::from(stream)))
        .unwrap();
    let line = client.next_line(WAIT).expect("the client answered");
    let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(answer["status"], 200, "{addr}: {answer}");
    answer
}

fn counters(bed: &Bed) -> Counters {
    pinned_counters(&bed.pins.path).unwrap()
}

fn agent_args(sim_addr: &str, sk_msg: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "--listen",
        &format!("[::]:{LISTEN_PORT}"),
        "--admin",
        "127.0.0.1:9090",
        "--endpoint",
        &format!("http://{sim_addr}"),
        "--redirect",
        &format!("{VIP4}={}:{LISTEN_PORT}", Node::IP4),
        "--redirect",
        &format!("{VIP6}=[{}]:{LISTEN_PORT}", Node::IP6),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if sk_msg {
        args.push("--sk-msg".into());
    }
    args
}

#[test]
fn sk_msg_carries_node_local_hops_byte_for_byte() {
    if !gate::bpf_available("sk_msg_carries_node_local_hops_byte_for_byte") {
        return;
    }
    let tag = format!("wk{}", std::process::id() % 100_000);
    // Drop order (reverse of declaration): processes, then the bed (pins, cgroups, netns).
    let bed = Bed::create(&tag, "skmsg", 2).unwrap();
    let node = &bed.node;
    let sim_addr = format!("{}:{SIM_PORT}", node.pods[1].ip4);
    let _sim = bed.sim(1, &node.pods[1].ip4.to_string(), SIM_PORT).unwrap();
    let mut agent = bed
        .agent(
            &agent_args(&sim_addr, true),
            "info",
            &["interception attached", "sk_msg acceleration on"],
            WAIT,
        )
        .unwrap();
    // The reference: the node's own process, not intercepted, over plain TCP to the listener.
    let mut reference = {
        let mut cmd = node.ns.command("python3");
        cmd.args(["-c", CLIENT]);
        OwnedChild::spawn(cmd).unwrap()
    };
    let mut client = bed.client(CLIENT).unwrap();
    let listener = format!("{}:{LISTEN_PORT}", Node::IP4);

    let before = counters(&bed);
    let mut connections = 0u64;
    let mut sse_events = 0usize;
    for (stream, repeat) in [(false, 2), (true, 2), (false, 300), (true, 300)] {
        let want = ask(&mut reference, &listener, stream, repeat);
        if stream {
            assert_eq!(want["answer"].as_array().unwrap().last().unwrap(), "[DONE]");
            sse_events += want["answer"].as_array().unwrap().len();
        }
        for vip in [VIP4, VIP6] {
            let got = ask(&mut client, vip, stream, repeat);
            connections += 1;
            assert_eq!(
                got["answer"], want["answer"],
                "{vip}, stream {stream}, prompt x{repeat}: answers differ"
            );
            if stream {
                assert_eq!(got["malformed"], serde_json::json!([]), "{got}");
                assert_eq!(got["tail"], "data: [DONE]\n\n", "{got}");
            }
        }
    }
    let after = counters(&bed);
    let added = after.sockhash_added - before.sockhash_added;
    let redirected = after.sk_msg_redirected - before.sk_msg_redirected;
    let tcp = after.sk_msg_tcp - before.sk_msg_tcp;
    // Both ends of every VIP connection, nothing else (not the reference's, not the agent's
    // upstream connections).
    assert_eq!(added, 2 * connections, "{after:?}");
    assert_eq!(after.sockhash_failed, 0, "{after:?}");
    assert_eq!(after.sk_msg_mark_failed, 0, "{after:?}");
    // At least every answer went through sk_msg (its request too unless the client wrote
    // before the agent's end was in the map).
    assert!(redirected >= connections, "{after:?}");

    // A restarted agent without the flag adopts the pins and adds no socket.
    agent.kill();
    drop(agent);
    let agent = bed
        .agent(
            &agent_args(&sim_addr, false),
            "info",
            &["interception attached"],
            WAIT,
        )
        .unwrap();
    assert!(
        !agent.stderr().contains("sk_msg acceleration on"),
        "{}",
        agent.stderr()
    );
    let want = ask(&mut reference, &listener, false, 2);
    let got = ask(&mut client, VIP4, false, 2);
    assert_eq!(got["answer"], want["answer"]);
    let off = counters(&bed);
    assert_eq!(off.sockhash_added, after.sockhash_added, "{off:?}");
    assert_eq!(off.sk_msg_redirected, after.sk_msg_redirected, "{off:?}");

    drop(client);
    drop(reference);
    drop(agent);
    gate::announce(&format!(
        "bpf: sk_msg: {connections} VIP connections ({sse_events} SSE events in the reference streams) byte-correct; {added} sockets added, {redirected} messages redirected, {tcp} over TCP; none added without --sk-msg"
    ));
}
