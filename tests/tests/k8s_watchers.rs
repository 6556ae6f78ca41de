//! The agent's Kubernetes watchers (`warmpath_agent::k8s::start`, a library call, no agent
//! process) against the fake API server (`warmpath_e2e::fake_kube`) through the real kube
//! client: pods added, becoming Ready, terminating and deleted change the published
//! membership; an `InferencePool`'s selector change moves it; a Service's VIPs appear;
//! dropped watches, compaction and both forms of `410 Gone` converge with no lost event.

#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use warmpath_agent::{
    config::{Config, Environment, parse_in},
    discovery::{Desired, EndpointSpec},
    k8s::{self, InterceptedService, Watchers},
};
use warmpath_e2e::fake_kube::{Expiry, FakeKube, INFERENCE_POOLS, PODS, SERVICES};

/// Longest wait for one change to show; the watchers see one in milliseconds.
const WAIT: Duration = Duration::from_secs(20);

/// The agent's configuration: `pools` (YAML list items) and `intercept` entries, this agent
/// on node-a.
fn config(pools: &str, intercept: &str) -> Config {
    let text = format!(
        "version: 1\npools:\n{pools}kubernetes:\n  enabled: true\n  nodeName: node-a\n  intercept: [{intercept}]\n"
    );
    let none = |_: &str| None;
    let no_file = |_: &str| false;
    parse_in(
        &text,
        "test.yaml",
        &Environment {
            var: &none,
            file_exists: &no_file,
        },
    )
    .unwrap()
}

const SELECTOR_POOL: &str = "- name: llama\n  model: m\n  selector: {namespace: ml, matchLabels: {app: vllm}, port: 8000}\n";
const INFERENCE_POOL: &str =
    "- name: llama\n  model: m\n  inferencePool: {namespace: ml, name: llama}\n";

async fn start(fake: &FakeKube, config: &Config) -> Watchers {
    let client = fake.client().await.unwrap();
    let w = k8s::start(client, config.kubernetes.as_ref().unwrap(), &config.pools)
        .await
        .unwrap();
    tokio::time::timeout(WAIT, w.synced())
        .await
        .expect("the watchers' first lists");
    w
}

fn pod(name: &str, ip: &str, app: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "ml", "labels": {"app": app},
            "annotations": {"warmpath.dev/kv-events": "tcp://*:5557"},
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {
            "phase": "Running", "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

fn inference_pool(app: &str, port: u16) -> Value {
    json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {"name": "epp", "portNumber": 9002},
        },
    })
}

/// What pool `llama` holds: (authority, routable) per endpoint; `None`: not published.
fn members(d: &Desired) -> Option<Vec<(String, bool)>> {
    d.get("llama").map(|eps| {
        eps.iter()
            .map(|e| (e.authority.clone(), e.routable))
            .collect()
    })
}

/// Waits until pool `llama` holds exactly `want`.
async fn wait_members(rx: &mut watch::Receiver<Desired>, want: &[(&str, bool)]) -> Desired {
    let want: Vec<(String, bool)> = want.iter().map(|(a, r)| (a.to_string(), *r)).collect();
    let found = tokio::time::timeout(WAIT, rx.wait_for(|d| members(d).as_ref() == Some(&want)))
        .await
        .map(|d| d.unwrap().clone());
    found.unwrap_or_else(|_| {
        panic!(
            "pool llama never held {want:?}; it holds {:?}",
            members(&rx.borrow())
        )
    })
}

#[tokio::test]
async fn a_pods_life_changes_membership() {
    let fake = FakeKube::start().await.unwrap();
    fake.apply(pod("a", "10.0.0.1", "vllm", true)).unwrap();
    fake.apply(pod("other-app", "10.0.0.9", "web", true))
        .unwrap();
    let w = start(&fake, &config(SELECTOR_POOL, "")).await;
    let mut rx = w.members.clone();
    let d = wait_members(&mut rx, &[("10.0.0.1:8000", true)]).await;
    assert_eq!(
        d["llama"][0],
        EndpointSpec {
            authority: "10.0.0.1:8000".into(),
            metrics_url: "http://10.0.0.1:8000/metrics".into(),
            kv_events: Some("tcp://10.0.0.1:5557".into()),
            kv_replay: None,
            kv_topic: String::new(),
            dp_rank: None,
            local: true,
            routable: true,
            origin: "ml/a".into(),
        }
    );
    // Added, not ready yet: an endpoint taking no requests.
    fake.apply(pod("b", "10.0.0.2", "vllm", false)).unwrap();
    wait_members(
        &mut rx,
        &[("10.0.0.1:8000", true), ("10.0.0.2:8000", false)],
    )
    .await;
    // Ready: routable.
    fake.apply(pod("b", "10.0.0.2", "vllm", true)).unwrap();
    wait_members(&mut rx, &[("10.0.0.1:8000", true), ("10.0.0.2:8000", true)]).await;
    // Terminating: drained, still listed.
    fake.start_deletion(&PODS, Some("ml"), "b").unwrap();
    wait_members(
        &mut rx,
        &[("10.0.0.1:8000", true), ("10.0.0.2:8000", false)],
    )
    .await;
    // Deleted: gone.
    fake.delete(&PODS, Some("ml"), "b").unwrap();
    wait_members(&mut rx, &[("10.0.0.1:8000", true)]).await;
    // Its labels changed away from the selector: gone too.
    fake.apply(pod("a", "10.0.0.1", "web", true)).unwrap();
    wait_members(&mut rx, &[]).await;
    let s = w.snapshot();
    assert!(s.pods.lists >= 1 && s.pods.restarts == 0, "{s:?}");
}

#[tokio::test]
async fn membership_follows_the_inference_pool() {
    let fake = FakeKube::start().await.unwrap();
    fake.apply(pod("v1-a", "10.0.1.1", "v1", true)).unwrap();
    fake.apply(pod("v2-a", "10.0.2.1", "v2", true)).unwrap();
    // No InferencePool yet: the pool is published empty, and that counts as synced.
    let w = start(&fake, &config(INFERENCE_POOL, "")).await;
    let mut rx = w.members.clone();
    wait_members(&mut rx, &[]).await;
    fake.apply(inference_pool("v1", 8000)).unwrap();
    wait_members(&mut rx, &[("10.0.1.1:8000", true)]).await;
    // The selector and port change: the pods watcher restarts on the new selection.
    fake.apply(inference_pool("v2", 9000)).unwrap();
    wait_members(&mut rx, &[("10.0.2.1:9000", true)]).await;
    assert!(w.snapshot().pods.restarts >= 1, "{:?}", w.snapshot());
    // An unusable InferencePool (no target port): no endpoints.
    let mut broken = inference_pool("v2", 9000);
    broken["spec"]["targetPorts"] = json!([]);
    fake.apply(broken).unwrap();
    wait_members(&mut rx, &[]).await;
    fake.apply(inference_pool("v1", 8000)).unwrap();
    wait_members(&mut rx, &[("10.0.1.1:8000", true)]).await;
    fake.delete(&INFERENCE_POOLS, Some("ml"), "llama").unwrap();
    wait_members(&mut rx, &[]).await;
    assert!(w.snapshot().inference_pools.lists >= 1);
}

/// The `ml/llama` entry of the intercepted Services, once it satisfies `pred`.
async fn wait_service(
    rx: &mut watch::Receiver<Vec<InterceptedService>>,
    what: &str,
    pred: impl Fn(&InterceptedService) -> bool,
) -> InterceptedService {
    let found = tokio::time::timeout(
        WAIT,
        rx.wait_for(|l| l.iter().any(|s| s.name == "llama" && pred(s))),
    )
    .await
    .map(|l| {
        l.unwrap()
            .iter()
            .find(|s| s.name == "llama")
            .unwrap()
            .clone()
    });
    found.unwrap_or_else(|_| panic!("never {what}: {:?}", rx.borrow()))
}

#[tokio::test]
async fn an_intercepted_services_vips() {
    let fake = FakeKube::start().await.unwrap();
    let config = config(
        SELECTOR_POOL,
        "{namespace: ml, name: llama, port: 8000, pool: llama}",
    );
    let w = start(&fake, &config).await;
    let mut rx = w.services.clone();
    let s = wait_service(&mut rx, "listed as missing", |s| s.vips.is_empty()).await;
    assert_eq!(s.note.as_deref(), Some("not found"));
    assert_eq!(s.pool, "llama");
    fake.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
            "ports": [{"port": 8000, "targetPort": 8000}],
        },
    }))
    .unwrap();
    let s = wait_service(&mut rx, "given VIPs", |s| !s.vips.is_empty()).await;
    assert_eq!(
        s.vips,
        vec![
            "10.96.0.10:8000".parse().unwrap(),
            "[fd00:96::10]:8000".parse().unwrap()
        ]
    );
    assert_eq!(s.note, None);
    fake.delete(&SERVICES, Some("ml"), "llama").unwrap();
    let s = wait_service(&mut rx, "missing again", |s| s.vips.is_empty()).await;
    assert_eq!(s.note.as_deref(), Some("not found"));
}

/// Changes the cluster while the agent's watch is down: the fake holds events back
/// (`pause_watches`), the agent's watch is dropped and opened again (held back too), the
/// changes are made, then (with `compact`) the history is dropped, and the watch is dropped
/// once more, so the agent watches again from its old version: replayed from the history, or
/// expired (410, answered as `expiry` says) and relisted. Membership converges either way,
/// with every change.
async fn converges_after_lost_watches(expiry: Expiry, compact: bool) {
    let fake = FakeKube::builder().expiry(expiry).start().await.unwrap();
    fake.apply(pod("a", "10.0.0.1", "vllm", true)).unwrap();
    fake.apply(pod("b", "10.0.0.2", "vllm", true)).unwrap();
    let w = start(&fake, &config(SELECTOR_POOL, "")).await;
    let mut rx = w.members.clone();
    wait_members(&mut rx, &[("10.0.0.1:8000", true), ("10.0.0.2:8000", true)]).await;
    let watch_again = |before: u64| {
        let fake = &fake;
        async move {
            fake.wait_for_counters(&PODS, WAIT, |c| c.watches > before)
                .await
                .expect("the agent watches again")
        }
    };
    fake.wait_for_counters(&PODS, WAIT, |c| c.open_watches == 1)
        .await
        .expect("the agent watches after its list");
    fake.pause_watches();
    let before = fake.counters(&PODS);
    fake.drop_watches();
    watch_again(before.watches).await;
    fake.apply(pod("c", "10.0.0.3", "vllm", true)).unwrap();
    fake.delete(&PODS, Some("ml"), "a").unwrap();
    fake.apply(pod("b", "10.0.0.2", "vllm", false)).unwrap();
    if compact {
        fake.compact();
    }
    let held = fake.counters(&PODS);
    fake.drop_watches();
    if compact {
        fake.wait_for_counters(&PODS, WAIT, |c| {
            c.expired > held.expired && c.lists > held.lists
        })
        .await
        .expect("the expired watch makes the agent relist");
    } else {
        watch_again(held.watches).await;
    }
    fake.resume_watches();
    wait_members(
        &mut rx,
        &[("10.0.0.2:8000", false), ("10.0.0.3:8000", true)],
    )
    .await;
    // And live again afterwards.
    fake.apply(pod("d", "10.0.0.4", "vllm", true)).unwrap();
    wait_members(
        &mut rx,
        &[
            ("10.0.0.2:8000", false),
            ("10.0.0.3:8000", true),
            ("10.0.0.4:8000", true),
        ],
    )
    .await;
    let after = fake.counters(&PODS);
    if !compact {
        assert_eq!(
            after.lists, before.lists,
            "replayed, not relisted: {after:?}"
        );
    }
    println!(
        "expiry {expiry:?}, compact {compact}: fake lists {} -> {}, watches {} -> {}, expired {}; agent {:?}",
        before.lists,
        after.lists,
        before.watches,
        after.watches,
        after.expired,
        w.snapshot().pods
    );
}

#[tokio::test]
async fn a_dropped_watch_loses_nothing() {
    converges_after_lost_watches(Expiry::ErrorEvent, false).await;
}

#[tokio::test]
async fn an_expired_watch_relists_error_event() {
    converges_after_lost_watches(Expiry::ErrorEvent, true).await;
}

#[tokio::test]
async fn an_expired_watch_relists_http_410() {
    converges_after_lost_watches(Expiry::Http410, true).await;
}

#[tokio::test]
async fn a_failing_api_server_is_retried_with_backoff() {
    let fake = FakeKube::start().await.unwrap();
    fake.apply(pod("a", "10.0.0.1", "vllm", true)).unwrap();
    fake.fail_next(2, 500);
    let w = start(&fake, &config(SELECTOR_POOL, "")).await;
    wait_members(&mut w.members.clone(), &[("10.0.0.1:8000", true)]).await;
    assert_eq!(fake.counters(&PODS).injected_failures, 2);
    let s = w.snapshot().pods;
    assert_eq!((s.errors, s.lists), (2, 1), "{s:?}");
}

/// Pods in the large list (two of the watcher's 500-object pages).
const MANY: usize = 1_000;

#[tokio::test]
async fn a_large_list_is_published_once_and_an_identical_relist_not_at_all() {
    let fake = FakeKube::start().await.unwrap();
    let ip = |i: usize| format!("10.1.{}.{}", i / 250, i % 250 + 1);
    for i in 0..MANY {
        fake.apply(pod(&format!("p{i}"), &ip(i), "vllm", true))
            .unwrap();
    }
    let started = std::time::Instant::now();
    let w = start(&fake, &config(SELECTOR_POOL, "")).await;
    let synced = started.elapsed();
    assert_eq!(w.members.borrow()["llama"].len(), MANY);
    assert_eq!(
        w.snapshot().members_published,
        1,
        "one publication for the whole list"
    );
    // A relist that finds the same pods changes nothing.
    fake.wait_for_counters(&PODS, WAIT, |c| c.open_watches == 1)
        .await
        .expect("the agent watches after its list");
    let lists = fake.counters(&PODS).lists;
    fake.compact();
    fake.expire_watches();
    fake.wait_for_counters(&PODS, WAIT, |c| c.lists > lists && c.open_watches == 1)
        .await
        .expect("a relist after the expired watch");
    // One change after the relist: exactly one more publication.
    fake.delete(&PODS, Some("ml"), "p0").unwrap();
    let mut rx = w.members.clone();
    tokio::time::timeout(WAIT, rx.wait_for(|d| d["llama"].len() == MANY - 1))
        .await
        .expect("the deletion after the relist")
        .unwrap();
    let s = w.snapshot();
    assert_eq!((s.members_published, s.pods.lists), (2, 2), "{s:?}");
    println!("{MANY} pods: synced in {synced:?}; {s:?}");
}

#[tokio::test]
async fn a_bad_annotation_is_reported_once_per_pod_and_value() {
    let fake = FakeKube::start().await.unwrap();
    let with_events = |value: &str, ready: bool| {
        let mut p = pod("a", "10.0.0.1", "vllm", ready);
        p["metadata"]["annotations"]["warmpath.dev/kv-events"] = json!(value);
        p
    };
    fake.apply(with_events("ipc:///tmp/kv", true)).unwrap();
    let w = start(&fake, &config(SELECTOR_POOL, "")).await;
    let mut rx = w.members.clone();
    let d = wait_members(&mut rx, &[("10.0.0.1:8000", true)]).await;
    // Routed, without events.
    assert_eq!(d["llama"][0].kv_events, None);
    assert_eq!(w.snapshot().bad_annotations, 1);
    // A new version of the pod with the same bad value: not reported again.
    fake.apply(with_events("ipc:///tmp/kv", false)).unwrap();
    wait_members(&mut rx, &[("10.0.0.1:8000", false)]).await;
    assert_eq!(w.snapshot().bad_annotations, 1);
    // Another bad value: reported.
    fake.apply(with_events("tcp://127.0.0.1:5557", true))
        .unwrap();
    wait_members(&mut rx, &[("10.0.0.1:8000", true)]).await;
    assert_eq!(w.snapshot().bad_annotations, 2);
    // Fixed: events, and nothing reported.
    fake.apply(with_events("tcp://*:5557", true)).unwrap();
    let fixed = tokio::time::timeout(
        WAIT,
        rx.wait_for(|d| d["llama"][0].kv_events.as_deref() == Some("tcp://10.0.0.1:5557")),
    )
    .await
    .is_ok();
    assert!(fixed, "the fixed annotation: {:?}", rx.borrow());
    assert_eq!(w.snapshot().bad_annotations, 2);
}
