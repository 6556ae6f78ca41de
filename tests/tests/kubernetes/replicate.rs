//! Which pools an agent replicates, on Kubernetes: the file's `cluster:` section with
//! `replicate: []` next to an agent with the default (docs/cluster.md).

use warmpath_e2e::{
    agent_process::AgentProcess,
    fake_kube::FakeKube,
    sim::{get_json, wait_for},
};

use super::{
    CONVERGE, Dir, MODEL, NS, Pods, agent_with, complete, free_port, inference_pool, members,
    source_of,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_replicating_no_pool_holds_no_copy_of_discovered_pods() {
    // Pod 0 on node-a (A's). D replicates it (the default); C, from its file's `cluster:`
    // section (node id: the Kubernetes node name), replicates no pool.
    let pods = Pods::start(1).await;
    let fake = FakeKube::start().await.unwrap();
    let dir = Dir::new("replicate");
    fake.apply(inference_pool(pods.port)).unwrap();
    fake.apply(pods.pod(0, "node-a", true)).unwrap();
    let seed = free_port(true);
    let flags = |node: &str, gossip: u16| -> Vec<String> {
        let grpc = format!("127.0.0.1:{}", free_port(false));
        let (gossip, seed) = (format!("127.0.0.1:{gossip}"), format!("127.0.0.1:{seed}"));
        [
            "--cluster-id",
            "k8s",
            "--node-id",
            node,
            "--gossip-interval-ms",
            "100",
        ]
        .into_iter()
        .map(String::from)
        .chain(["--gossip-listen".into(), gossip, "--seed".into(), seed])
        .chain(["--grpc-listen".into(), grpc])
        .collect()
    };
    let start = |node: &str, flags: &[String]| {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        agent_with(&fake, &dir, node, "", &flags)
    };
    let a = start("node-a", &flags("node-a", seed));
    let d = start("node-d", &flags("node-d", free_port(true)));
    let section = format!(
        "cluster: {{id: k8s, gossipListen: 127.0.0.1:{}, seeds: [127.0.0.1:{seed}], grpcListen: 127.0.0.1:{}, gossipIntervalMs: 100, replicate: []}}",
        free_port(true),
        free_port(false)
    );
    let c = start_with_section(&fake, &dir, "node-c", &section);
    let http = reqwest::Client::new();
    let p0 = pods.authority(0);
    wait_for("pod 0 replicated on D from node-a", CONVERGE, || async {
        let s = get_json(&http, &format!("http://{}/status", d.admin)).await;
        let theirs = source_of(&s, &p0);
        (theirs["owner"] == "node-a" && theirs["state"] == "healthy").then_some(())
    })
    .await;
    c.wait_for_log(&["joined the cluster", "node=node-c"], CONVERGE)
        .await;
    // C routes to the pod (discovered, serving) with no source for it: nothing replicated.
    wait_for("pod 0 serving on C", CONVERGE, || async {
        members(&http, &c)
            .await
            .contains(&(p0.clone(), "serving".to_string()))
            .then_some(())
    })
    .await;
    let s = get_json(&http, &format!("http://{}/status", c.admin)).await;
    assert!(source_of(&s, &p0).is_null(), "no copy on C: {s}");
    assert_eq!(s["index_entries"], 0);
    let (status, pod, _) = complete(&http, &c, &"replicate prompt ".repeat(40)).await;
    assert_eq!((status, pod.as_deref()), (200, Some(p0.as_str())));
    drop(a);
}

/// An agent process on `node` as [`agent_with`] makes it, with `section` (one line, a
/// top-level section of the file) added.
fn start_with_section(fake: &FakeKube, dir: &Dir, node: &str, section: &str) -> AgentProcess {
    let kubeconfig = dir.file("kubeconfig");
    fake.kubeconfig(std::path::Path::new(&kubeconfig)).unwrap();
    let config = dir.file(&format!("agent-{node}.yaml"));
    std::fs::write(
        &config,
        format!(
            "version: 1\nlisten: 127.0.0.1:0\nadmin: 127.0.0.1:0\nproxy: {{explain: true}}\n\
             kubernetes: {{enabled: true, nodeName: {node}}}\n{section}\n\
             pools:\n  - name: chat\n    model: {MODEL}\n    inferencePool: {{namespace: {NS}, name: chat}}\n"
        ),
    )
    .unwrap();
    AgentProcess::start(
        &["--config", config.as_str()],
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("POD_NAMESPACE", "warmpath"),
            ("RUST_LOG", "info"),
        ],
    )
    .unwrap_or_else(|e| panic!("agent on {node} did not start: {e:?}"))
}
