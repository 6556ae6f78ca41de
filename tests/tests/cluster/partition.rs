//! Two agents partitioned from the other two, and healed, with real processes (root: a
//! network namespace of the test's own, `warmpath_e2e::isolated`).
//!
//! Inside the namespace the four agents serve on 127.0.0.2-5 (A, B, C, D) and run under user
//! ids 10001-10004; the eight simulator pods are in the test process, on 127.0.0.1. The cut
//! prohibits every route from A's and B's processes to C's and D's addresses and back, so
//! gossip and IndexSync between the sides stop (new connects and datagrams refused, the
//! established streams stalled) while every agent still reaches every pod and its own
//! side. What must happen: each side declares the other dead and marks its pods unsure
//! (prefix weight 0, routed by load); every request still succeeds; a prefix cached on C's
//! pod meanwhile reaches A only after the heal, when A resyncs and routes it there again.

use std::{net::Ipv4Addr, time::Duration};

use warmpath_e2e::{
    agent_process::AgentProcess,
    gate,
    isolated::{self, Cut, Side},
    sim::{Fleet, wait_for},
};

use super::{
    AGENTS, GOSSIP_MS, Keys, LIMIT, PODS_PER_AGENT, authority, complete, pod_status, prompt, status,
};

/// The entry test the namespace's process runs.
const ENTRY: &str = "partition::partition_in_netns";
/// The whole scenario, start to cleanup, in the namespace.
const BOUND: Duration = Duration::from_secs(300);
/// Gossip and IndexSync ports: every agent has an address of its own.
const GOSSIP_PORT: u16 = 7400;
const GRPC_PORT: u16 = 7401;
/// Agent `k` runs as this uid plus `k`.
const UID: u32 = 10001;

fn addr(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 2 + k as u8)
}

fn uid(k: usize) -> u32 {
    UID + k as u32
}

fn args(fleet: &Fleet, k: usize, key: &std::path::Path) -> Vec<String> {
    let ip = addr(k);
    let mut args: Vec<String> = [
        "--explain",
        "--workers",
        "1",
        "--cluster-id",
        "e2e-partition",
        "--gossip-interval-ms",
        GOSSIP_MS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(["--listen".into(), format!("{ip}:0")]);
    args.extend(["--admin".into(), format!("{ip}:0")]);
    args.extend(["--node-id".into(), format!("agent-{k}")]);
    args.extend(["--gossip-listen".into(), format!("{ip}:{GOSSIP_PORT}")]);
    args.extend(["--grpc-listen".into(), format!("{ip}:{GRPC_PORT}")]);
    // Everyone seeds from A, C and D from C too: each side can form on its own.
    args.extend(["--seed".into(), format!("{}:{GOSSIP_PORT}", addr(0))]);
    if k >= 2 {
        args.extend(["--seed".into(), format!("{}:{GOSSIP_PORT}", addr(2))]);
    }
    args.extend(["--cluster-key-file".into(), key.display().to_string()]);
    for p in 0..AGENTS * PODS_PER_AGENT {
        if p / PODS_PER_AGENT == k {
            args.extend(["--endpoint".into(), fleet.url(p)]);
            args.extend(["--kv-events".into(), fleet.events(p)]);
        } else {
            args.extend(["--remote-endpoint".into(), fleet.url(p)]);
        }
    }
    args
}

fn start(fleet: &Fleet, k: usize, key: &std::path::Path, exe: &std::path::Path) -> AgentProcess {
    let args = args(fleet, k, key);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    AgentProcess::start_as(&args, &[], uid(k), exe)
        .unwrap_or_else(|e| panic!("agent {k} did not start: {e:?}"))
}

/// Waits until `agent` sees each of `pods` in `state`, owned by its agent.
async fn wait_pods(
    client: &reqwest::Client,
    agent: &AgentProcess,
    fleet: &Fleet,
    pods: std::ops::Range<usize>,
    state: &str,
) {
    for p in pods {
        let pod = authority(fleet, p);
        let owner = format!("agent-{}", p / PODS_PER_AGENT);
        wait_for(
            &format!("pod {pod} {state} from {owner}"),
            LIMIT,
            || async {
                let s = pod_status(&status(client, agent).await, &pod);
                (s["owner"].as_str() == Some(owner.as_str()) && s["state"].as_str() == Some(state))
                    .then_some(())
            },
        )
        .await;
    }
}

/// Pods `pods`' states on `agent` now.
async fn states(
    client: &reqwest::Client,
    agent: &AgentProcess,
    fleet: &Fleet,
    pods: std::ops::Range<usize>,
) -> Vec<String> {
    let s = status(client, agent).await;
    pods.map(|p| {
        pod_status(&s, &authority(fleet, p))["state"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    })
    .collect()
}

#[test]
fn two_agents_partitioned_from_two_serve_every_request_and_resync_when_healed() {
    if !gate::isolated_available("cluster partition") {
        return;
    }
    match isolated::run(ENTRY, uid(0)..=uid(AGENTS - 1), BOUND) {
        Ok(output) => {
            for line in output.lines().filter(|l| l.starts_with("partition: ")) {
                gate::announce(line);
            }
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
#[ignore = "entry point of the partition test's network namespace (isolated.rs)"]
fn partition_in_netns() {
    if !isolated::entered(ENTRY) {
        return;
    }
    isolated::prepare().expect("the namespace's loopback and rules");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(scenario());
}

async fn scenario() {
    let fleet = Fleet::tiny(8, &["--kv-replay-port", "0"]).await;
    // In the parent's scratch directory, which the agents' uids can read and the parent
    // removes even if this process is killed.
    let dir = isolated::dir().expect("the scratch directory");
    let keys = Keys::at(dir.join("keys"));
    let key = keys.write("key", "e2e-cluster-key-of-at-least-32-bytes\n");
    let exe = isolated::exe().expect("the test binary for the agents' uids");
    let agents: Vec<AgentProcess> = (0..AGENTS).map(|k| start(&fleet, k, &key, &exe)).collect();
    let (a, c) = (&agents[0], &agents[2]);
    let client = reqwest::Client::new();
    let per_side = 2 * PODS_PER_AGENT;
    let all = AGENTS * PODS_PER_AGENT;

    // Everyone replicates everyone else's pods.
    wait_pods(&client, a, &fleet, PODS_PER_AGENT..all, "healthy").await;
    wait_pods(&client, c, &fleet, 0..per_side, "healthy").await;
    wait_pods(
        &client,
        c,
        &fleet,
        per_side + PODS_PER_AGENT..all,
        "healthy",
    )
    .await;

    // The cut: {A, B} (127.0.0.2-3) from {C, D} (127.0.0.4-5), both ways.
    let side = |ks: [usize; 2]| Side {
        uids: uid(ks[0])..=uid(ks[1]),
        addrs: ks.iter().map(|&k| addr(k)).collect(),
    };
    let mut cut = Cut::between(&side([0, 1]), &side([2, 3])).expect("the cut's rules");
    let started = std::time::Instant::now();
    wait_pods(&client, a, &fleet, per_side..all, "unsure").await;
    wait_pods(&client, c, &fleet, 0..per_side, "unsure").await;
    eprintln!(
        "partition: both sides unsure of the other's pods {:?} after the cut",
        started.elapsed()
    );
    // Each side still trusts its own: B's pods on A, D's on C.
    let own_a = states(&client, a, &fleet, PODS_PER_AGENT..per_side).await;
    assert_eq!(own_a, ["healthy", "healthy"], "A still trusts B's pods");
    let own_c = states(&client, c, &fleet, per_side + PODS_PER_AGENT..all).await;
    assert_eq!(own_c, ["healthy", "healthy"], "C still trusts D's pods");

    // A prefix cached on one of C's pods while A cannot hear of it: C holds it, A not.
    let pod_c = per_side;
    let authority_c = authority(&fleet, pod_c);
    let (code, _, _) = complete(&client, &fleet.url(pod_c), &prompt(7, 0)).await;
    assert_eq!(code, 200);
    wait_for("C's own index holds the prefix", LIMIT, || async {
        let s = pod_status(&status(&client, c).await, &authority_c);
        (s["entries"].as_u64().unwrap_or(0) > 0).then_some(())
    })
    .await;
    let s = pod_status(&status(&client, a).await, &authority_c);
    assert_eq!(
        s["entries"].as_u64(),
        Some(0),
        "A holds nothing of C's pod: {s}"
    );
    assert_eq!(s["state"].as_str(), Some("unsure"), "{s}");
    // Every request on both sides succeeds: every pod is reachable, the other side's are
    // routed by load. (Another prefix than C's: the pods these reach cache it too.)
    let (base_a, base_c) = (
        format!("http://{}", a.listen),
        format!("http://{}", c.listen),
    );
    for q in 0..10 {
        for (name, base) in [("A", &base_a), ("C", &base_c)] {
            let (code, _, _) = complete(&client, base, &prompt(8, q)).await;
            assert_eq!(code, 200, "request {q} through {name} during the partition");
        }
    }

    // Healed: both sides trust each other's pods again, and A learns the prefix cached
    // meanwhile from C (a resync) and routes it there.
    cut.heal().expect("the cut's rules deleted");
    let healed = std::time::Instant::now();
    wait_pods(&client, a, &fleet, per_side..all, "healthy").await;
    wait_pods(&client, c, &fleet, 0..per_side, "healthy").await;
    wait_for("A's replica of C's pod holds the prefix", LIMIT, || async {
        let s = pod_status(&status(&client, a).await, &authority_c);
        (s["entries"].as_u64().unwrap_or(0) > 0).then_some(())
    })
    .await;
    eprintln!(
        "partition: healed, A trusts and holds C's pods again {:?} later",
        healed.elapsed()
    );
    let (code, pod, blocks) = complete(&client, &base_a, &prompt(7, 20)).await;
    assert_eq!(code, 200);
    assert_eq!(pod, authority_c, "A routes C's prefix to C's pod again");
    assert!(blocks > 0, "with the prefix matched ({blocks} blocks)");
    drop(agents);
}
