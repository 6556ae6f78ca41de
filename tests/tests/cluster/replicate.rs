//! Which pools an agent replicates (`cluster.replicate`), through configuration files: two
//! agents, each owning one pod of pool `chat` and one of pool `batch`; A replicates `chat`
//! only, B every pool (the default).

use std::path::Path;

use warmpath_e2e::{
    agent_process::AgentProcess,
    sim::{Fleet, wait_for},
};

use super::{Keys, LIMIT, complete_model, free_udp_port, pod_status, prompt, status};

/// The `chat` pool's model (the simulator's default) and the `batch` pool's.
const CHAT: &str = "sim-llama";
const BATCH: &str = "sim-batch";

/// Agent `k`'s file: its own pod of each fleet subscribed, the other's remote; `replicate`
/// as given (`None`: the default).
fn config(
    k: usize,
    fleets: [&Fleet; 2],
    gossip: [u16; 2],
    key: &Path,
    replicate: Option<&str>,
) -> String {
    let mut pools = String::new();
    let mut remote = Vec::new();
    for (name, model, fleet) in [("chat", CHAT, fleets[0]), ("batch", BATCH, fleets[1])] {
        pools.push_str(&format!("- name: {name}\n  model: {model}\n  endpoints:\n"));
        for p in 0..2 {
            match p == k {
                true => pools.push_str(&format!(
                    "  - {{url: {}, kvEvents: {}}}\n",
                    fleet.url(p),
                    fleet.events(p)
                )),
                false => {
                    pools.push_str(&format!("  - {{url: {}}}\n", fleet.url(p)));
                    remote.push(fleet.url(p));
                }
            }
        }
    }
    let replicate = replicate.map_or(String::new(), |r| format!("  replicate: {r}\n"));
    format!(
        "version: 1\nlisten: 127.0.0.1:0\nadmin: 127.0.0.1:0\nproxy: {{explain: true, workers: 1}}\npools:\n{pools}\
         cluster:\n  id: e2e-replicate\n  nodeId: agent-{k}\n  gossipListen: 127.0.0.1:{}\n  seeds: [127.0.0.1:{}]\n  \
         keyFile: {}\n  grpcListen: 127.0.0.1:0\n  gossipIntervalMs: 100\n  remoteEndpoints: [{}]\n{replicate}",
        gossip[k],
        gossip[0],
        key.display(),
        remote.join(", ")
    )
}

fn start(path: &Path) -> AgentProcess {
    let path = path.display().to_string();
    AgentProcess::start(&["--config", &path], &[("RUST_LOG", "info")])
        .unwrap_or_else(|e| panic!("agent did not start: {e:?}"))
}

/// The `entries` an agent's `/status` shows for pod `authority` (0 without a source).
async fn entries(client: &reqwest::Client, agent: &AgentProcess, authority: &str) -> u64 {
    pod_status(&status(client, agent).await, authority)["entries"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_holds_nothing_of_a_pool_it_does_not_replicate() {
    let chat = Fleet::tiny(2, &[]).await;
    let batch = Fleet::tiny(2, &["--model", BATCH]).await;
    let keys = Keys::new("replicate");
    let key = keys.write("key", "e2e-cluster-key-of-at-least-32-bytes\n");
    let gossip = [free_udp_port(), free_udp_port()];
    let files: Vec<_> = [Some("[chat]"), None]
        .into_iter()
        .enumerate()
        .map(|(k, replicate)| {
            let text = config(k, [&chat, &batch], gossip, &key, replicate);
            keys.write(&format!("agent-{k}.yaml"), &text)
        })
        .collect();
    let a = start(&files[0]);
    let b = start(&files[1]);
    let client = reqwest::Client::new();
    let (chat_b, batch_b) = (
        chat.engines[1].http.to_string(),
        batch.engines[1].http.to_string(),
    );
    let batch_a = batch.engines[0].http.to_string();

    // A replicates B's chat pod; B replicates both of A's pods (the default).
    for (agent, pod, owner) in [(&a, &chat_b, "agent-1"), (&b, &batch_a, "agent-0")] {
        wait_for(&format!("{pod} healthy from {owner}"), LIMIT, || async {
            let s = pod_status(&status(&client, agent).await, pod);
            (s["owner"].as_str() == Some(owner) && s["state"].as_str() == Some("healthy"))
                .then_some(())
        })
        .await;
    }
    // B's batch pod has no index source on A at all: nothing asked for over IndexSync.
    let s = status(&client, &a).await;
    let pod = s["pods"]
        .as_array()
        .and_then(|pods| {
            pods.iter()
                .find(|p| p["load"]["endpoint"].as_str() == Some(batch_b.as_str()))
        })
        .expect("B's batch pod is an endpoint of A's batch pool")
        .clone();
    assert_eq!(pod["pool"], "batch");
    assert!(pod["index"].is_null(), "no source: {pod}");
    assert_eq!(pod["prefix_weight"], 0);
    a.wait_for_log(&["joined the cluster", "local=2", "remote=1"], LIMIT)
        .await;

    // B's engines store blocks in both pools; B's index holds them, A's only chat's.
    let (code, _, _) = complete_model(&client, &chat.url(1), CHAT, &prompt(1, 0)).await;
    assert_eq!(code, 200);
    let (code, _, _) = complete_model(&client, &batch.url(1), BATCH, &prompt(2, 0)).await;
    assert_eq!(code, 200);
    // Nothing routed through A yet: its whole index is its copy of B's chat pod, equal to
    // B's own (read until the engines' last batches have arrived everywhere: a pod's count
    // can still move by a block when the decode fills one).
    wait_for(
        "A's index = its copy of B's chat pod = B's own",
        LIMIT,
        || async {
            let s = status(&client, &a).await;
            let total = s["index_entries"].as_u64();
            let copy = pod_status(&s, &chat_b)["entries"].as_u64();
            let own = entries(&client, &b, &chat_b).await;
            let stored = entries(&client, &b, &batch_b).await;
            (stored > 0 && own > 0 && copy == Some(own) && total == Some(own)).then_some(())
        },
    )
    .await;

    // A routes chat's prefix to B's pod with it matched, and batch's by load alone.
    let base_a = format!("http://{}", a.listen);
    let (code, pod, blocks) = complete_model(&client, &base_a, CHAT, &prompt(1, 1)).await;
    assert_eq!((code, pod.as_str()), (200, chat_b.as_str()));
    assert!(blocks > 0, "chat's prefix matched on A ({blocks} blocks)");
    let (code, _, blocks) = complete_model(&client, &base_a, BATCH, &prompt(2, 1)).await;
    assert_eq!(code, 200);
    assert_eq!(blocks, 0, "no replica of batch on A: nothing matched");
}
