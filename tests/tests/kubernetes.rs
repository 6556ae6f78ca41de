//! The agent on Kubernetes, end to end (docs/install.md): agent processes whose API server is
//! the fake in `tests/src/fake_kube` — reached through `KUBECONFIG` by the real `kube` client
//! — in front of simulator engines that play the pods (each on an address of its own,
//! 127.0.0.2, 127.0.0.3, ..., on one port, as pods of one Deployment are).
//!
//! What changes routing: a pod added (not Ready: not routed), becoming Ready (routed once its
//! metrics answer), terminating (no new requests) and deleted (gone); watches dropped and
//! expired (410) lose no event; a RoutePolicy update changes how requests are scored and gets
//! a status condition, an invalid one is refused in its status while the last good version
//! serves; of two agents exactly one writes statuses; a Service named in
//! `kubernetes.intercept` is intercepted in the kernel while it exists (root only).
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::{path::PathBuf, time::Duration};

use serde_json::{Value, json};
use warmpath_e2e::{
    agent_process::AgentProcess,
    fake_kube::{FakeKube, PODS, ROUTE_POLICIES, SERVICES},
    sim::{Fleet, get_json, wait_for},
};

/// Entry point of the agent child processes (agent_process.rs).
#[test]
#[ignore = "entry point of the agent child process (agent_process.rs)"]
fn agent_process() {
    warmpath_e2e::agent_process::child_main();
}

#[path = "kubernetes/replicate.rs"]
mod replicate;

/// Longest any awaited change may take (watch, debounce, apply, first scrape).
const CONVERGE: Duration = Duration::from_secs(20);
const NS: &str = "ml";
const MODEL: &str = "sim-llama";

/// A temporary directory (kubeconfig, agent configuration), removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("warmpath-k8s-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    fn file(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Simulator engines on 127.0.0.2.. sharing one serving port, as a Deployment's pods do.
struct Pods {
    fleets: Vec<Fleet>,
    port: u16,
}

impl Pods {
    async fn start(n: usize) -> Self {
        let mut fleets = Vec::new();
        let mut port = 0u16;
        for i in 0..n {
            let host = format!("127.0.0.{}", i + 2);
            let p = port.to_string();
            let fleet = Fleet::start(&[
                "--host",
                &host,
                "--port",
                &p,
                "--profile",
                "tiny",
                "--kv-events-port",
                "0",
            ])
            .await;
            port = fleet.engines[0].http.port();
            fleets.push(fleet);
        }
        Self { fleets, port }
    }

    fn ip(&self, i: usize) -> String {
        self.fleets[i].engines[0].http.ip().to_string()
    }

    fn authority(&self, i: usize) -> String {
        format!("{}:{}", self.ip(i), self.port)
    }

    /// Pod `i` as the API server shows it.
    fn pod(&self, i: usize, node: &str, ready: bool) -> Value {
        let events = self.fleets[i].events(0);
        let events_port = events.rsplit(':').next().unwrap().to_string();
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("vllm-{i}"), "namespace": NS, "labels": {"app": "vllm"},
                "annotations": {"warmpath.dev/kv-events": events_port}},
            "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
            "status": {"phase": "Running", "podIP": self.ip(i), "podIPs": [{"ip": self.ip(i)}],
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        })
    }
}

fn inference_pool(port: u16) -> Value {
    json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "chat", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": port}],
            "endpointPickerRef": {"name": "warmpath", "port": {"number": 9002}}},
    })
}

/// An agent process on `node`, configured for the `chat` pool of the InferencePool.
fn agent(fake: &FakeKube, dir: &Dir, node: &str) -> AgentProcess {
    agent_with(fake, dir, node, "", &[])
}

/// [`agent`] with more of the `kubernetes:` section (`extra`, flow style) and more flags.
fn agent_with(fake: &FakeKube, dir: &Dir, node: &str, extra: &str, flags: &[&str]) -> AgentProcess {
    let kubeconfig = dir.file("kubeconfig");
    fake.kubeconfig(std::path::Path::new(&kubeconfig)).unwrap();
    let config = dir.file(&format!("agent-{node}.yaml"));
    std::fs::write(
        &config,
        format!(
            "version: 1\nlisten: 127.0.0.1:0\nadmin: 127.0.0.1:0\nproxy: {{explain: true}}\n\
             kubernetes: {{enabled: true, nodeName: {node}{extra}}}\n\
             pools:\n  - name: chat\n    model: {MODEL}\n    inferencePool: {{namespace: {NS}, name: chat}}\n"
        ),
    )
    .unwrap();
    let mut args = vec!["--config", config.as_str()];
    args.extend_from_slice(flags);
    AgentProcess::start(
        &args,
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("POD_NAMESPACE", "warmpath"),
            ("RUST_LOG", "info"),
        ],
    )
    .unwrap_or_else(|e| panic!("agent on {node} did not start: {e:?}"))
}

/// `authority -> state` of the agent's members, from `/status`.
async fn members(http: &reqwest::Client, agent: &AgentProcess) -> Vec<(String, String)> {
    let status = get_json(http, &format!("http://{}/status", agent.admin)).await;
    let mut out: Vec<(String, String)> = status["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["load"]["endpoint"].as_str().unwrap().to_string(),
                p["load"]["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Waits until the agent's members are exactly `want`.
async fn await_members(
    http: &reqwest::Client,
    agent: &AgentProcess,
    want: &[(String, &str)],
    what: &str,
) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, s)| (a.clone(), s.to_string()))
        .collect();
    wait_for(what, CONVERGE, || async {
        (members(http, agent).await == want).then_some(())
    })
    .await;
}

/// One completion through the agent: its status and the pod that served it.
async fn complete(
    http: &reqwest::Client,
    agent: &AgentProcess,
    prompt: &str,
) -> (u16, Option<String>, Option<String>) {
    let resp = http
        .post(format!("http://{}/v1/completions", agent.listen))
        .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    let header = |k: &str| {
        resp.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (pod, policy) = (header("x-warmpath-pod"), header("x-warmpath-policy"));
    let status = resp.status().as_u16();
    let _ = resp.bytes().await;
    (status, pod, policy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_join_when_ready_drain_when_terminating_and_leave_when_deleted() {
    let pods = Pods::start(2).await;
    let fake = FakeKube::start().await.unwrap();
    let dir = Dir::new("lifecycle");
    fake.apply(inference_pool(pods.port)).unwrap();
    fake.apply(pods.pod(0, "node-a", false)).unwrap();
    let agent = agent(&fake, &dir, "node-a");
    let http = reqwest::Client::new();
    let (a, b) = (pods.authority(0), pods.authority(1));

    // Listed but not Ready: a member that takes no request.
    await_members(&http, &agent, &[(a.clone(), "unready")], "pod 0 listed").await;
    let (status, _, _) = complete(&http, &agent, "hello").await;
    assert_eq!(status, 503, "no routable pod yet");

    // Ready: routed once its metrics answered.
    fake.apply(pods.pod(0, "node-a", true)).unwrap();
    await_members(&http, &agent, &[(a.clone(), "serving")], "pod 0 ready").await;
    let (status, pod, _) = complete(&http, &agent, "hello").await;
    assert_eq!((status, pod.as_deref()), (200, Some(a.as_str())));
    // Its KV events are subscribed to: the index holds what it cached.
    let status = get_json(&http, &format!("http://{}/status", agent.admin)).await;
    assert!(
        status["pods"][0]["index"].is_object(),
        "a subscribed KV source: {status}"
    );

    // A second pod on another node: both serve.
    fake.apply(pods.pod(1, "node-b", true)).unwrap();
    await_members(
        &http,
        &agent,
        &[(a.clone(), "serving"), (b.clone(), "serving")],
        "pod 1 joined",
    )
    .await;
    let mut served = std::collections::BTreeSet::new();
    for i in 0..12 {
        let (status, pod, _) = complete(&http, &agent, &format!("distinct prompt {i} ")).await;
        assert_eq!(status, 200);
        served.insert(pod.unwrap());
    }
    assert_eq!(served.len(), 2, "both pods take new prompts: {served:?}");

    // Terminating: no new request reaches it.
    fake.start_deletion(&PODS, Some(NS), "vllm-1").unwrap();
    await_members(
        &http,
        &agent,
        &[(a.clone(), "serving"), (b.clone(), "unready")],
        "pod 1 draining",
    )
    .await;
    for i in 0..12 {
        let (status, pod, _) = complete(&http, &agent, &format!("after drain {i} ")).await;
        assert_eq!((status, pod.as_deref()), (200, Some(a.as_str())));
    }

    // Deleted: gone.
    fake.delete(&PODS, Some(NS), "vllm-1").unwrap();
    await_members(&http, &agent, &[(a.clone(), "serving")], "pod 1 deleted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_expired_watches_lose_no_event() {
    let pods = Pods::start(3).await;
    let fake = FakeKube::start().await.unwrap();
    let dir = Dir::new("watches");
    fake.apply(inference_pool(pods.port)).unwrap();
    fake.apply(pods.pod(0, "node-a", true)).unwrap();
    let agent = agent(&fake, &dir, "node-a");
    let http = reqwest::Client::new();
    let (a, b, c) = (pods.authority(0), pods.authority(1), pods.authority(2));
    await_members(&http, &agent, &[(a.clone(), "serving")], "first list").await;

    // Every watch closes abruptly; a pod added meanwhile is still seen.
    let before = fake.counters(&PODS);
    fake.drop_watches();
    fake.apply(pods.pod(1, "node-a", true)).unwrap();
    await_members(
        &http,
        &agent,
        &[(a.clone(), "serving"), (b.clone(), "serving")],
        "pod 1 after a dropped watch",
    )
    .await;
    assert!(fake.counters(&PODS).watches > before.watches, "re-watched");

    // The history the agent would resume from is gone: the next watch answers 410 and the
    // agent lists again, missing neither the deletion nor the addition made meanwhile.
    let before = fake.counters(&PODS);
    fake.delete(&PODS, Some(NS), "vllm-0").unwrap();
    fake.apply(pods.pod(2, "node-a", true)).unwrap();
    fake.compact();
    fake.drop_watches();
    await_members(
        &http,
        &agent,
        &[(b.clone(), "serving"), (c.clone(), "serving")],
        "converged after 410",
    )
    .await;
    // The members may converge from the events the open watches streamed before they were
    // dropped; the relist follows once the re-watch meets the compacted history (410).
    let after = fake
        .wait_for_counters(&PODS, CONVERGE, |c| c.lists > before.lists)
        .await
        .unwrap_or_else(|after| panic!("relisted: {before:?} -> {after:?}"));
    assert!(after.expired > before.expired, "after a 410: {after:?}");
    // The agent counts a list once it has applied it, after the fake counted the request.
    wait_for("the agent counts its relists", CONVERGE, || async {
        let status = get_json(&http, &format!("http://{}/status", agent.admin)).await;
        (status["kubernetes"]["pods"]["lists"].as_u64().unwrap() >= 2).then_some(())
    })
    .await;
    let metrics = http
        .get(format!("http://{}/metrics", agent.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lists = metrics
        .lines()
        .find(|l| l.starts_with("warmpath_kubernetes_lists_total") && l.contains("kind=\"Pod\""))
        .unwrap_or_else(|| panic!("the relists exported: {metrics}"));
    let n: f64 = lists.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 2.0, "{lists}");
}

fn route_policy(preset: &str) -> Value {
    json!({
        "apiVersion": "warmpath.dev/v1alpha1", "kind": "RoutePolicy",
        "metadata": {"name": "chat-routing", "namespace": NS},
        "spec": {"targetRef": {"pool": {"name": "chat"}}, "action": {"preset": preset}},
    })
}

/// The object's `Accepted` condition as the fake holds it.
fn accepted(fake: &FakeKube) -> Option<Value> {
    let obj = fake.get(&ROUTE_POLICIES, Some(NS), "chat-routing")?;
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Accepted")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_update_changes_scoring_and_one_agent_writes_its_status() {
    let pods = Pods::start(2).await;
    let fake = FakeKube::start().await.unwrap();
    let dir = Dir::new("policy");
    fake.apply(inference_pool(pods.port)).unwrap();
    fake.apply(pods.pod(0, "node-a", true)).unwrap();
    fake.apply(pods.pod(1, "node-b", true)).unwrap();
    fake.apply(route_policy("round-robin")).unwrap();
    let agents = [agent(&fake, &dir, "node-a"), agent(&fake, &dir, "node-b")];
    let http = reqwest::Client::new();
    let both = [
        (pods.authority(0), "serving"),
        (pods.authority(1), "serving"),
    ];
    for a in &agents {
        await_members(&http, a, &both, "both pods serving").await;
    }

    // Generation 1 (round robin): the same prompt goes to both pods in turn.
    let cond = wait_for("Accepted=True for generation 1", CONVERGE, || async {
        accepted(&fake).filter(|c| c["status"] == "True" && c["observedGeneration"] == 1)
    })
    .await;
    assert_eq!(cond["reason"], "Accepted", "{cond}");
    let prompt = "A fixed prompt long enough to fill a few KV blocks of the engine. ".repeat(8);
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let (status, pod, policy) = complete(&http, &agents[0], &prompt).await;
        assert_eq!(status, 200);
        assert_eq!(policy.as_deref(), Some("ml/chat-routing@1"));
        served.insert(pod.unwrap());
    }
    assert_eq!(
        served.len(),
        2,
        "round robin spreads one prompt: {served:?}"
    );

    // Generation 2 (precise): the prompt stays where its prefix is cached.
    fake.apply(route_policy("precise")).unwrap();
    wait_for("Accepted=True for generation 2", CONVERGE, || async {
        accepted(&fake).filter(|c| c["status"] == "True" && c["observedGeneration"] == 2)
    })
    .await;
    wait_for("generation 2 serving", CONVERGE, || async {
        let (_, _, policy) = complete(&http, &agents[0], "probe").await;
        (policy.as_deref() == Some("ml/chat-routing@2")).then_some(())
    })
    .await;
    // A prompt neither pod has seen (round robin left the first one on both).
    let fresh = "Another prompt, cached nowhere yet, with blocks of its own to hold. ".repeat(8);
    let (_, first, _) = complete(&http, &agents[0], &fresh).await;
    for _ in 0..6 {
        let (status, pod, _) = complete(&http, &agents[0], &fresh).await;
        assert_eq!(
            (status, &pod),
            (200, &first),
            "precise keeps the prefix's pod"
        );
    }

    // An invalid update: refused in its status, generation 2 keeps serving.
    let mut bad = route_policy("precise");
    bad["spec"]["action"]["weights"] = json!({"prefix": -1.0});
    fake.apply(bad).unwrap();
    let cond = wait_for("Accepted=False for generation 3", CONVERGE, || async {
        accepted(&fake).filter(|c| c["status"] == "False" && c["observedGeneration"] == 3)
    })
    .await;
    assert!(
        cond["message"].as_str().unwrap().contains("weights"),
        "the validation error names the field: {cond}"
    );
    let (status, _, policy) = complete(&http, &agents[0], &prompt).await;
    assert_eq!(
        (status, policy.as_deref()),
        (200, Some("ml/chat-routing@2"))
    );

    // Exactly one of the two agents wrote those statuses.
    let writers: Vec<(bool, u64)> = futures::future::join_all(agents.iter().map(|a| {
        let http = http.clone();
        async move {
            let s = get_json(&http, &format!("http://{}/status", a.admin)).await;
            let w = &s["kubernetes"]["status_writer"];
            (
                w["leader"].as_bool().unwrap(),
                w["writes"].as_u64().unwrap(),
            )
        }
    }))
    .await;
    let leaders: Vec<_> = writers.iter().filter(|(leader, _)| *leader).collect();
    assert_eq!(leaders.len(), 1, "one status Lease holder: {writers:?}");
    assert!(
        writers
            .iter()
            .all(|(leader, writes)| *leader == (*writes > 0)),
        "only the holder writes: {writers:?}"
    );
}

/// The VIP of the `chat` Service (loopback: nothing listens there).
const VIP: &str = "127.77.0.23";
const VIP_PORT: u16 = 8000;

fn service(target_port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "chat", "namespace": NS},
        "spec": {"clusterIP": VIP, "clusterIPs": [VIP], "selector": {"app": "vllm"},
            "ports": [{"port": VIP_PORT, "targetPort": target_port, "protocol": "TCP"}]},
    })
}

/// One completion from the client in the intercepted cgroup to the VIP.
fn ask_vip(client: &mut warmpath_e2e::process::OwnedChild) -> Value {
    client.send_line(&format!("{VIP} {VIP_PORT}")).unwrap();
    let line = client
        .next_line(Duration::from_secs(15))
        .expect("the client answered");
    serde_json::from_str(&line).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_service_is_intercepted_while_it_exists() {
    use warmpath_agent::ebpf::{ChildCgroup, cgroup2_root};
    use warmpath_e2e::{gate, pods::PinDir, process::OwnedChild};
    if !gate::bpf_available("a_watched_service_is_intercepted_while_it_exists") {
        return;
    }
    let pods = Pods::start(1).await;
    let fake = FakeKube::start().await.unwrap();
    let dir = Dir::new("intercept");
    fake.apply(inference_pool(pods.port)).unwrap();
    fake.apply(pods.pod(0, "node-a", true)).unwrap();
    // Drop order (reverse of declaration): client, agent, then pins and the cgroup.
    let tag = format!("k8s{}", std::process::id() % 100_000);
    let cgroup =
        ChildCgroup::create(&cgroup2_root().unwrap(), &format!("warmpath-test-{tag}")).unwrap();
    let pins = PinDir::new(&tag);
    let cgroup_dir = cgroup.path().display().to_string();
    let pin_dir = pins.path.display().to_string();
    let agent = agent_with(
        &fake,
        &dir,
        "node-a",
        &format!(", intercept: [{{namespace: {NS}, name: chat, port: {VIP_PORT}, pool: chat}}]"),
        &["--cgroup", &cgroup_dir, "--pin-dir", &pin_dir],
    );
    let http = reqwest::Client::new();
    await_members(
        &http,
        &agent,
        &[(pods.authority(0), "serving")],
        "the pod serving",
    )
    .await;
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", warmpath_e2e::pods::COMPLETION_CLIENT]);
    let mut client = OwnedChild::spawn(cmd).expect("python3 is installed by .ci/run");
    cgroup.add_process(client.pid()).unwrap();

    // No Service yet: the VIP leads nowhere.
    let answer = ask_vip(&mut client);
    assert!(answer["error"].is_string(), "not intercepted yet: {answer}");

    // The Service appears: its ClusterIP:port is redirected to the agent, which routes.
    fake.apply(service(pods.port)).unwrap();
    let answer = wait_for("the Service intercepted", CONVERGE, || {
        let answer = ask_vip(&mut client);
        async move { (answer["status"] == 200).then_some(answer) }
    })
    .await;
    assert_eq!(answer["pod"], pods.authority(0).as_str(), "{answer}");
    let status = get_json(&http, &format!("http://{}/status", agent.admin)).await;
    assert_eq!(
        status["kubernetes"]["services_intercepted"][0]["vips"][0],
        format!("{VIP}:{VIP_PORT}"),
        "{}",
        status["kubernetes"]
    );

    // Deleted: interception stops.
    fake.delete(&SERVICES, Some(NS), "chat").unwrap();
    wait_for("interception removed", CONVERGE, || {
        let answer = ask_vip(&mut client);
        async move { answer["error"].is_string().then_some(()) }
    })
    .await;
    drop(client);
    drop(agent);
}

/// What a pod's termination does to the agent (`warmpath agent` on SIGTERM, the chart's
/// `terminationGracePeriodSeconds`): new connections refused and `/ready` 503 at once, a
/// stream in flight finishes whole, then the drain ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_finishes_streams_in_flight_and_refuses_new_connections() {
    use futures::StreamExt as _;
    // Decode four times slower than real time: 120 tokens stream for seconds.
    let fleet = Fleet::start(&["--port", "0", "--time-scale", "4"]).await;
    let mut routing = warmpath_e2e::agent::in_front_of(&[fleet.url(0)], &[]).await;
    let (base, admin) = warmpath_e2e::agent::urls(&routing);
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{admin}/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let resp = http
        .post(format!("{base}/v1/completions"))
        .json(
            &json!({"model": MODEL, "prompt": "tell a long story", "max_tokens": 120,
            "stream": true, "ignore_eos": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    let drained = tokio::spawn(async move {
        let left = routing.drain(Duration::from_secs(30)).await;
        (left, routing)
    });
    // New connections are refused (the listener is closed) and readiness fails.
    let refused = wait_for("the listener closed", CONVERGE, || {
        let base = base.clone();
        async move {
            let fresh = reqwest::Client::new();
            fresh
                .get(format!("{base}/v1/models"))
                .send()
                .await
                .is_err()
                .then_some(())
        }
    });
    refused.await;
    let ready = reqwest::Client::new()
        .get(format!("{admin}/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    assert!(!drained.is_finished(), "the drain waits for the stream");
    // The stream in flight finishes whole.
    let mut text = String::from_utf8_lossy(&first).to_string();
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let (left, _routing) = drained.await.unwrap();
    assert_eq!(left, 0, "nothing left in flight");
}

/// A loopback port free now (gossip and gRPC need theirs before they bind), from below the
/// kernel's ephemeral range ([`warmpath_bench::free_port`]).
fn free_port(udp: bool) -> u16 {
    match udp {
        true => warmpath_e2e::scratch::free_udp_port(),
        false => warmpath_e2e::scratch::free_tcp_port(),
    }
}

/// `pod`'s KV source in an agent's `/status`.
fn source_of(status: &Value, pod: &str) -> Value {
    status["pods"]
        .as_array()
        .and_then(|pods| pods.iter().find(|p| p["load"]["endpoint"] == pod))
        .map_or(Value::Null, |p| p["index"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_in_a_cluster_share_the_index_of_discovered_pods() {
    // Pod 0 on node-a, pod 1 on node-b: each agent subscribes to its own node's pod and
    // replicates the other's index from the other agent (docs/cluster.md).
    let pods = Pods::start(2).await;
    let fake = FakeKube::start().await.unwrap();
    let dir = Dir::new("cluster");
    fake.apply(inference_pool(pods.port)).unwrap();
    fake.apply(pods.pod(0, "node-a", true)).unwrap();
    fake.apply(pods.pod(1, "node-b", true)).unwrap();
    let seed = free_port(true);
    let cluster_flags = |node: &str, gossip: u16| -> Vec<String> {
        [
            "--cluster-id".to_string(),
            "k8s".into(),
            "--node-id".into(),
            node.into(),
            "--gossip-interval-ms".into(),
            "100".into(),
            "--gossip-listen".into(),
            format!("127.0.0.1:{gossip}"),
            "--seed".into(),
            format!("127.0.0.1:{seed}"),
            "--grpc-listen".into(),
            format!("127.0.0.1:{}", free_port(false)),
        ]
        .to_vec()
    };
    let (flags_a, flags_b) = (
        cluster_flags("node-a", seed),
        cluster_flags("node-b", free_port(true)),
    );
    let a = agent_with(
        &fake,
        &dir,
        "node-a",
        "",
        &flags_a.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let b = agent_with(
        &fake,
        &dir,
        "node-b",
        "",
        &flags_b.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let http = reqwest::Client::new();
    let (p0, p1) = (pods.authority(0), pods.authority(1));
    for (agent, own, other, owner) in [(&a, &p0, &p1, "node-b"), (&b, &p1, &p0, "node-a")] {
        wait_for(
            &format!("{other} replicated from {owner}"),
            Duration::from_secs(60),
            || async {
                let s = get_json(&http, &format!("http://{}/status", agent.admin)).await;
                let (mine, theirs) = (source_of(&s, own), source_of(&s, other));
                (mine.is_object() && theirs["owner"] == owner && theirs["state"] == "healthy")
                    .then_some(())
            },
        )
        .await;
    }
    // Prompts placed through B are found through A on the same pods: A knows what B's pod
    // cached from B (it does not subscribe to that pod's events).
    let mut placed = Vec::new();
    for i in 0..4 {
        let prompt = format!("cluster prompt {i}: ").repeat(40);
        let (status, pod, _) = complete(&http, &b, &prompt).await;
        assert_eq!(status, 200);
        placed.push((prompt, pod.unwrap()));
    }
    // Both agents' copies of both pods agree (A's of pod 1 came from B, B's of pod 0 from A).
    let entries = |s: &Value, pod: &str| source_of(s, pod)["entries"].as_u64().unwrap();
    wait_for("both copies agree", Duration::from_secs(60), || async {
        let sa = get_json(&http, &format!("http://{}/status", a.admin)).await;
        let sb = get_json(&http, &format!("http://{}/status", b.admin)).await;
        let (a0, a1, b0, b1) = (
            entries(&sa, &p0),
            entries(&sa, &p1),
            entries(&sb, &p0),
            entries(&sb, &p1),
        );
        (a0 == b0 && a1 == b1 && a0 + a1 > 0).then_some(())
    })
    .await;
    for (prompt, pod) in &placed {
        let (status, via_a, _) = complete(&http, &a, prompt).await;
        assert_eq!(
            (status, via_a.as_deref()),
            (200, Some(pod.as_str())),
            "{prompt}"
        );
    }
}

/// A completion sent from `source` (a client pod's address).
async fn complete_from(agent: &AgentProcess, source: &str) -> u16 {
    let client = reqwest::Client::builder()
        .local_address(source.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let resp = client
        .post(format!("http://{}/v1/completions", agent.listen))
        .json(&json!({"model": MODEL, "prompt": "who am i", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_known_by_their_client_pods_namespace() {
    let pods = Pods::start(1).await;
    let fake = FakeKube::start().await.unwrap();
    let dir = Dir::new("identity");
    fake.apply(inference_pool(pods.port)).unwrap();
    fake.apply(pods.pod(0, "node-a", true)).unwrap();
    // A client pod on this node, in namespace `search`, at 127.0.0.9.
    fake.apply(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client", "namespace": "search", "labels": {"app": "client"}},
        "spec": {"nodeName": "node-a", "serviceAccountName": "indexer",
            "containers": [{"name": "c", "image": "client"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.9", "podIPs": [{"ip": "127.0.0.9"}]},
    }))
    .unwrap();
    // Its namespace's tenant may send one request a minute.
    fake.apply(json!({
        "apiVersion": "warmpath.dev/v1alpha1", "kind": "Tenant",
        "metadata": {"name": "team-search"},
        "spec": {"identity": {"namespaces": ["search"]}, "quotas": {"requests": "1/min"}},
    }))
    .unwrap();
    let agent = agent(&fake, &dir, "node-a");
    let http = reqwest::Client::new();
    await_members(&http, &agent, &[(pods.authority(0), "serving")], "serving").await;
    // The first request from the pod is the tenant's one; the next is over its quota. A
    // client that is no pod of `search` (127.0.0.10) is the default tenant's, unlimited.
    assert_eq!(complete_from(&agent, "127.0.0.9").await, 200);
    assert_eq!(complete_from(&agent, "127.0.0.9").await, 429);
    for _ in 0..3 {
        assert_eq!(complete_from(&agent, "127.0.0.10").await, 200);
    }
    let status = get_json(&http, &format!("http://{}/status", agent.admin)).await;
    assert!(
        status["tenants"].to_string().contains("team-search"),
        "{}",
        status["tenants"]
    );
}
