//! The cluster across processes (docs/cluster.md): four agents, each in its own process and
//! subscribed only to the two simulator pods of its "node", sharing one index over real UDP
//! gossip and gRPC on loopback; a partition of two from two and its heal (`partition`, root);
//! which pools an agent replicates, from configuration files (`replicate`).

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{Value, json};
use warmpath_e2e::{
    agent_process::AgentProcess,
    scratch::{free_tcp_port, free_udp_port},
    sim::{Fleet, get_json, metric, metrics_text, sample, wait_for},
};

#[path = "cluster/partition.rs"]
mod partition;
#[path = "cluster/replicate.rs"]
mod replicate;

#[test]
#[ignore = "entry point of the agent child process (agent_process.rs)"]
fn agent_process() {
    warmpath_e2e::agent_process::child_main();
}

const AGENTS: usize = 4;
const PODS_PER_AGENT: usize = 2;
/// Gossip every 100 ms: a stopped agent is declared dead in about 1.5 s.
const GOSSIP_MS: &str = "100";
const LIMIT: Duration = Duration::from_secs(60);

/// A directory of key files (one per test: `tag`), removed on drop (even when the test
/// fails). The directory is 0755 and the files 0644 whatever the umask, so that agents
/// under other uids (`partition`) can read these test-only keys.
struct Keys(PathBuf);

impl Keys {
    fn new(tag: &str) -> Self {
        Self::at(
            std::env::temp_dir().join(format!("warmpath-cluster-{}-{tag}", std::process::id())),
        )
    }

    fn at(dir: PathBuf) -> Self {
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Self(dir)
    }

    fn write(&self, name: &str, secret: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, secret).expect("key file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        path
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn agent_args(fleet: &Fleet, k: usize, ports: &[(u16, u16)], key: &Path) -> Vec<String> {
    let gossip: Vec<u16> = ports.iter().map(|p| p.0).collect();
    let mut args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--explain",
        "--workers",
        "1",
        "--cluster-id",
        "e2e",
        "--gossip-interval-ms",
        GOSSIP_MS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(["--node-id".into(), format!("agent-{k}")]);
    args.extend(["--gossip-listen".into(), format!("127.0.0.1:{}", gossip[k])]);
    args.extend(["--seed".into(), format!("127.0.0.1:{}", gossip[0])]);
    args.extend(["--grpc-listen".into(), format!("127.0.0.1:{}", ports[k].1)]);
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

fn start(args: &[String]) -> AgentProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    AgentProcess::start(&args, &[]).unwrap_or_else(|e| panic!("agent did not start: {e:?}"))
}

/// Pod `p`'s entry in an agent's `/status`.
fn pod_status(status: &Value, authority: &str) -> Value {
    status["pods"]
        .as_array()
        .and_then(|pods| {
            pods.iter()
                .find(|p| p["index"]["pod"].as_str() == Some(authority))
        })
        .map_or(Value::Null, |p| p["index"].clone())
}

async fn status(client: &reqwest::Client, agent: &AgentProcess) -> Value {
    get_json(client, &format!("http://{}/status", agent.admin)).await
}

/// Waits until `agent`'s slot in the cluster's order is `want`.
async fn wait_slot(client: &reqwest::Client, agent: &AgentProcess, want: u64) {
    let what = format!("the agent at {} in slot {want}", agent.admin);
    wait_for(&what, LIMIT, || async {
        (status(client, agent).await["stagger_slot"].as_u64() == Some(want)).then_some(())
    })
    .await;
}

fn authority(fleet: &Fleet, p: usize) -> String {
    fleet.engines[p].http.to_string()
}

/// Waits until `agent` sees pod `p` owned by `owner` in `state`.
async fn wait_pod(
    client: &reqwest::Client,
    agent: &AgentProcess,
    fleet: &Fleet,
    p: usize,
    owner: &str,
    state: &str,
) -> Value {
    let pod = authority(fleet, p);
    wait_for(
        &format!("pod {pod} {state} from {owner}"),
        LIMIT,
        || async {
            let s = pod_status(&status(client, agent).await, &pod);
            (s["owner"].as_str() == Some(owner) && s["state"].as_str() == Some(state)).then_some(s)
        },
    )
    .await
}

async fn complete(client: &reqwest::Client, base: &str, prompt: &str) -> (u16, String, u64) {
    complete_model(client, base, "sim-llama", prompt).await
}

/// A completion of `model` at `base`: its status, the pod that answered and the prefix
/// blocks matched there (the explain headers).
async fn complete_model(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    prompt: &str,
) -> (u16, String, u64) {
    let body = json!({"model": model, "prompt": prompt, "max_tokens": 2});
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("the agent answers");
    let code = r.status().as_u16();
    let header = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let pod = header("x-warmpath-pod");
    let blocks = header("x-warmpath-prefix-blocks").parse().unwrap_or(0);
    (code, pod, blocks)
}

fn prompt(topic: usize, question: usize) -> String {
    let shared: String = (0..40)
        .map(|i| format!("shared document {topic} paragraph {i} with several words. "))
        .collect();
    format!("{shared} Question {question}?")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_agents_share_one_index_survive_a_restart_and_refuse_strangers() {
    let fleet = Fleet::tiny(8, &["--kv-replay-port", "0"]).await;
    let keys = Keys::new("four");
    let key = keys.write("key", "e2e-cluster-key-of-at-least-32-bytes\n");
    // (gossip UDP, IndexSync TCP) per agent, the stranger's last.
    let ports: Vec<(u16, u16)> = (0..=AGENTS)
        .map(|_| (free_udp_port(), free_tcp_port()))
        .collect();
    let args: Vec<Vec<String>> = (0..AGENTS)
        .map(|k| agent_args(&fleet, k, &ports, &key))
        .collect();
    let a = start(&args[0]);
    let b = start(&args[1]);
    let mut c = Some(start(&args[2]));
    let d = start(&args[3]);
    let a = &a;
    let client = reqwest::Client::new();
    // Each agent's slot in the cluster's order (staggered cold decisions, docs/routing.md step
    // 4): its place among the live members' node ids, agent-0 to agent-3.
    for (want, agent) in [a, &b, c.as_ref().expect("started"), &d]
        .into_iter()
        .enumerate()
    {
        wait_slot(&client, agent, want as u64).await;
    }

    // Agent A (0) replicates every other agent's two pods, each from its owner.
    for p in PODS_PER_AGENT..AGENTS * PODS_PER_AGENT {
        let owner = format!("agent-{}", p / PODS_PER_AGENT);
        wait_pod(&client, a, &fleet, p, &owner, "healthy").await;
    }

    // A prefix cached on one of agent C's pods (2: pods 4 and 5), straight at the engine:
    // only C hears of it (its own subscription), and A learns it from C.
    let pod_c = 4;
    let (code, _, _) = complete(&client, &fleet.url(pod_c), &prompt(1, 0)).await;
    assert_eq!(code, 200);
    let started = std::time::Instant::now();
    let authority_c = authority(&fleet, pod_c);
    wait_for("A's replica of C's pod holds the prefix", LIMIT, || async {
        let s = pod_status(&status(&client, a).await, &authority_c);
        (s["entries"].as_u64().unwrap_or(0) > 0).then_some(())
    })
    .await;
    eprintln!(
        "engine's event -> A's replica (through C, polled by /status): {:?}",
        started.elapsed()
    );
    // A measured that lag itself, from the stamps the delta carried (docs/cluster.md, "Lag"):
    // the owner's apply and the engine's own time of the batch, on A's /metrics.
    let a_admin = format!("http://{}", a.admin);
    // Recorded just after the delta is applied (which /status shows first): waited for.
    for family in [
        "warmpath_cluster_delta_lag_seconds",
        "warmpath_cluster_event_lag_seconds",
    ] {
        let sum = wait_for(&format!("a sample of {family}"), LIMIT, || async {
            let text = metrics_text(&client, &a_admin).await;
            let count = sample(&text, &format!("{family}_count"))?;
            let sum = sample(&text, &format!("{family}_sum"))?;
            (count >= 1.0).then_some(sum)
        })
        .await;
        assert!(
            (0.0..LIMIT.as_secs_f64()).contains(&sum),
            "{family}: {sum} s in all"
        );
    }
    let base_a = format!("http://{}", a.listen);
    let (code, pod, blocks) = complete(&client, &base_a, &prompt(1, 1)).await;
    assert_eq!(code, 200);
    assert_eq!(
        pod, authority_c,
        "A routes the prefix to the pod on C's node that holds it"
    );
    assert!(blocks > 0, "with the prefix matched ({blocks} blocks)");

    // C stops: its pods turn unsure on A (prefix weight 0), and A still serves everything.
    drop(c.take());
    for p in [4, 5] {
        wait_pod(&client, a, &fleet, p, "agent-2", "unsure").await;
    }
    // D moves up to C's slot once C has left the live members; A and B keep theirs.
    wait_slot(&client, &d, 2).await;
    let d_admin = format!("http://{}", d.admin);
    assert_eq!(
        metric(&client, &d_admin, "warmpath_stagger_slot").await,
        2.0
    );
    assert_eq!(status(&client, &b).await["stagger_slot"], 1);
    // The prefix A sent to C's pod before still goes there: by A's routing history, its
    // index copy being untrusted (docs/routing.md, the history fallback).
    let (code, pod, blocks) = complete(&client, &base_a, &prompt(1, 2)).await;
    assert_eq!((code, pod.as_str()), (200, authority_c.as_str()));
    assert!(blocks > 0, "matched by history ({blocks} blocks)");
    for q in 0..10 {
        let (code, _, _) = complete(&client, &base_a, &prompt(2, q)).await;
        assert_eq!(code, 200, "request {q} while C is down");
    }

    // C comes back (a new incarnation): A resyncs its pods from it.
    c = Some(start(&args[2]));
    for p in [4, 5] {
        wait_pod(&client, a, &fleet, p, "agent-2", "healthy").await;
    }
    // The new C subscribes afresh (a quiet engine replays nothing older, as for one agent:
    // docs/index.md), so what its pods cache from now on is what A learns from it.
    let pod_c2 = 5;
    let authority_c2 = authority(&fleet, pod_c2);
    let (code, _, _) = complete(&client, &fleet.url(pod_c2), &prompt(3, 0)).await;
    assert_eq!(code, 200);
    wait_for(
        "A's replica of the new C's pod holds the prefix",
        LIMIT,
        || async {
            let s = pod_status(&status(&client, a).await, &authority_c2);
            (s["entries"].as_u64().unwrap_or(0) > 0).then_some(())
        },
    )
    .await;
    let (code, pod, blocks) = complete(&client, &base_a, &prompt(3, 1)).await;
    assert_eq!(code, 200);
    assert_eq!(pod, authority_c2, "A follows the restarted C's pod");
    assert!(blocks > 0);

    // A stranger with another key: its datagrams are rejected and logged, it owns nothing.
    let wrong = keys.write("wrong", "not-the-e2e-cluster-key-but-32-bytes-long\n");
    let mut stranger_args = agent_args(&fleet, 3, &ports, &wrong);
    let mut set = |flag: &str, value: String| {
        let at = stranger_args
            .iter()
            .position(|a| a == flag)
            .expect("flag given");
        stranger_args[at + 1] = value;
    };
    set("--node-id", "stranger".into());
    set("--gossip-listen", format!("127.0.0.1:{}", ports[AGENTS].0));
    set("--grpc-listen", format!("127.0.0.1:{}", ports[AGENTS].1));
    let _stranger = start(&stranger_args);
    a.wait_for_log(&["gossip datagram rejected"], LIMIT).await;
    let admin_a = format!("http://{}", a.admin);
    let rejected = metric(
        &client,
        &admin_a,
        "warmpath_cluster_rejected_datagrams_total",
    )
    .await;
    assert!(rejected > 0.0, "counted on /metrics: {rejected}");
    let s = status(&client, a).await;
    let owners: Vec<&str> = s["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .filter_map(|p| p["index"]["owner"].as_str())
        .collect();
    assert!(!owners.contains(&"stranger"), "{owners:?}");

    // A stream with another key's token: refused (and logged), nothing replicated.
    let wrong_key = warmpath_agent::cluster::auth::ClusterKey::from_file(&wrong, "e2e")
        .expect("a valid key file");
    let copy_index =
        std::sync::Arc::new(warmpath_agent::kv_index::KvIndex::new(Default::default()));
    let copy = copy_index.add_remote_source(warmpath_agent::kv_index::SourceInfo {
        pod: authority(&fleet, 0),
        rank: None,
    });
    let (_placements, rx) = tokio::sync::mpsc::channel(1);
    let stream = tokio::spawn(warmpath_agent::cluster::sync::client::replicate(
        warmpath_agent::cluster::sync::client::Upstream {
            peer: "agent-0".into(),
            grpc: ([127, 0, 0, 1], ports[0].1).into(),
            pods: vec![(authority(&fleet, 0), copy)],
        },
        copy_index.clone(),
        Some(wrong_key.grpc_token().to_string()),
        rx,
    ));
    a.wait_for_log(&["IndexSync stream refused"], LIMIT).await;
    let refused = metric(&client, &admin_a, "warmpath_cluster_rejected_streams_total").await;
    assert!(refused >= 1.0, "counted on /metrics: {refused}");
    let counters = &status(&client, a).await["cluster"]["counters"];
    assert!(
        counters["rejected_streams"].as_u64() >= Some(1),
        "{counters}"
    );
    stream.abort();
    assert!(!copy_index.trusted(copy));
    assert_eq!(copy_index.len(), 0);
    drop(c);
}
