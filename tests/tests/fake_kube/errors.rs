//! Refusals as `Status` objects: conflicts and missing objects through the kube client,
//! injected failures and the retries and backoff they cause, and malformed requests (sent
//! with reqwest, since kube's client never builds them) that must each get their code and
//! leave the fake serving.

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
    runtime::watcher,
};
use serde_json::{Value, json};
use warmpath_e2e::fake_kube::PODS;

use super::{converged, pod, reflect, start};

fn is_api(err: &kube::Error, code: u16, reason: &str) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code && (reason.is_empty() || s.reason == reason))
}

#[tokio::test]
async fn lease_writes_conflict_and_missing_objects_are_404() {
    let (_fake, client) = start().await;
    let leases: Api<Lease> = Api::namespaced(client, "ns");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "owner"}, "spec": {"holderIdentity": "agent-a"},
    }))
    .expect("a lease");
    let pp = PostParams::default();
    let created = leases.create(&pp, &lease).await.expect("create");
    assert_eq!(created.metadata.namespace.as_deref(), Some("ns"));
    let err = leases.create(&pp, &lease).await.expect_err("exists");
    assert!(is_api(&err, 409, "AlreadyExists"), "{err:?}");

    // Two writers from the same resourceVersion: the second is refused.
    let mut mine = created.clone();
    mine.spec.get_or_insert_default().holder_identity = Some("agent-b".into());
    let won = leases.replace("owner", &pp, &mine).await.expect("replace");
    let mut stale = created;
    stale.spec.get_or_insert_default().holder_identity = Some("agent-c".into());
    let err = leases
        .replace("owner", &pp, &stale)
        .await
        .expect_err("stale rv");
    assert!(is_api(&err, 409, "Conflict"), "{err:?}");
    let now = leases.get("owner").await.expect("get");
    assert_eq!(now.resource_version(), won.resource_version());
    let holder = now.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("agent-b"));

    let err = leases.get("missing").await.expect_err("missing");
    assert!(is_api(&err, 404, "NotFound"), "{err:?}");
    leases
        .delete("owner", &DeleteParams::default())
        .await
        .expect("delete");
    let err = leases
        .delete("owner", &DeleteParams::default())
        .await
        .expect_err("deleted already");
    assert!(is_api(&err, 404, "NotFound"), "{err:?}");
}

#[tokio::test]
async fn injected_failures_are_retried_or_backed_off() {
    let (fake, client) = start().await;
    let pods: Api<Pod> = Api::all(client);
    fake.fail_next(2, 500);
    for _ in 0..2 {
        let err = pods
            .list(&ListParams::default())
            .await
            .expect_err("injected");
        assert!(is_api(&err, 500, "InternalError"), "{err:?}");
    }
    pods.list(&ListParams::default())
        .await
        .expect("served again");
    // kube's client retries a 429 itself (its default retry policy).
    fake.fail_next(1, 429);
    pods.list(&ListParams::default())
        .await
        .expect("retried after Retry-After");
    assert_eq!(fake.counters(&PODS).injected_failures, 3);

    // A watcher through injected failures backs off and still converges.
    fake.apply(pod("ns", "a", "vllm", "n1")).expect("apply");
    fake.fail_next(3, 500);
    let r = reflect(pods, watcher::Config::default());
    converged(&fake, &r.store, "the state after three failed requests").await;
    assert_eq!(fake.counters(&PODS).injected_failures, 6);

    let url = fake.url().parse().expect("the fake's URL");
    let anonymous = kube::Client::try_from(kube::Config::new(url)).expect("client");
    let err = Api::<Pod>::all(anonymous)
        .list(&ListParams::default())
        .await
        .expect_err("no token");
    assert!(is_api(&err, 401, "Unauthorized"), "{err:?}");
}

const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

/// (method, path, content type, body, the code it must get), against a fake holding pod
/// `a/p` at resourceVersion 1.
#[rustfmt::skip]
const MALFORMED: &[(&str, &str, &str, &str, u16)] = &[
    ("GET", "/api/v1/pods?limit=many", "", "", 400),
    ("GET", "/api/v1/pods?labelSelector=app+in+vllm", "", "", 400),
    ("GET", "/api/v1/pods?labelSelector=a+b%3Dc", "", "", 400),
    ("GET", "/api/v1/pods?continue=1%2Fa%2Fp&resourceVersion=1", "", "", 400),
    ("GET", "/api/v1/pods?resourceVersionMatch=Exact", "", "", 400),
    ("GET", "/api/v1/pods?resourceVersion=99&resourceVersionMatch=Exact", "", "", 504),
    ("GET", "/api/v1/pods?resourceVersion=x", "", "", 400),
    ("GET", "/api/v1/pods?continue=garbage", "", "", 400),
    ("GET", "/api/v1/pods?watch=true&resourceVersion=x", "", "", 400),
    ("GET", "/api/v1/pods?watch=true&timeoutSeconds=-1", "", "", 400),
    ("GET", "/api/v1/pods?watch=true&resourceVersion=7", "", "", 504),
    ("GET", "/api/v1/pods?watch=true&sendInitialEvents=true", "", "", 400),
    ("GET", "/api/v1/widgets", "", "", 404),
    ("GET", "/apis/warmpath.dev/v1alpha1/namespaces/a/tenants", "", "", 404),
    ("GET", "/api/v1/pods/p", "", "", 404),
    ("GET", "/api/v1/namespaces/a/pods/p/log", "", "", 404),
    ("GET", "/nowhere", "", "", 404),
    ("DELETE", "/api/v1/namespaces/a/pods", "", "", 405),
    ("POST", "/api/v1/namespaces/a/pods", MERGE, "[1, 2]", 400),
    ("POST", "/api/v1/namespaces/a/pods", MERGE, "{not json", 400),
    ("POST", "/api/v1/namespaces/a/pods", MERGE, r#"{"metadata": {"name": "Bad_Name"}}"#, 422),
    ("POST", "/api/v1/namespaces/a/pods", MERGE, r#"{"metadata": {"name": "q", "namespace": "b"}}"#, 400),
    ("PUT", "/api/v1/namespaces/a/pods/p", MERGE, r#"{"metadata": {"name": "other"}}"#, 400),
    ("PATCH", "/api/v1/namespaces/a/pods/p", "text/plain", "{}", 415),
    ("PATCH", "/api/v1/namespaces/a/pods/p", MERGE, "7", 400),
    ("PATCH", "/api/v1/namespaces/a/pods/p", JSON_PATCH, r#"[{"op": "replace", "path": "", "value": 5}]"#, 400),
    ("PATCH", "/api/v1/namespaces/a/pods/p", JSON_PATCH, r#"[{"op": "test", "path": "/spec/nodeName", "value": "n9"}]"#, 422),
    ("PATCH", "/api/v1/namespaces/a/pods/p", JSON_PATCH, r#"{"op": "add"}"#, 400),
    ("PATCH", "/api/v1/namespaces/a/pods/p", MERGE, r#"{"metadata": {"resourceVersion": "0"}}"#, 409),
    ("PATCH", "/api/v1/namespaces/a/pods/p", APPLY, "{}", 400),
    ("PATCH", "/api/v1/namespaces/a/pods/p?fieldManager=t", APPLY, "key: [unclosed", 400),
];

#[tokio::test]
async fn malformed_requests_answer_status_objects() {
    let (fake, _) = start().await;
    fake.apply(pod("a", "p", "vllm", "n1")).expect("apply");
    let http = reqwest::Client::new();
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(2 << 20));
    let oversized = (
        "POST",
        "/api/v1/namespaces/a/pods",
        MERGE,
        big.as_str(),
        413,
    );
    for &(method, path, content_type, body, code) in MALFORMED.iter().chain([&oversized]) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut req = http
            .request(method.clone(), format!("{}{path}", fake.url()))
            .bearer_auth(fake.token())
            .body(body.to_string());
        if !content_type.is_empty() {
            req = req.header("content-type", content_type);
        }
        let resp = req.send().await.expect("an answer");
        let got = resp.status().as_u16();
        let status: Value = resp.json().await.expect("a JSON body");
        let seen = (got, &status["kind"], &status["code"]);
        assert_eq!(
            seen,
            (code, &json!("Status"), &json!(code)),
            "{method} {path}: {status}"
        );
    }
    // The object is untouched and the fake still serves.
    let stored = fake.get(&PODS, Some("a"), "p").expect("still there");
    assert_eq!(stored["metadata"]["resourceVersion"], json!("1"));
    assert_eq!(fake.objects(&PODS).len(), 1);
}

#[tokio::test]
async fn objects_beyond_the_bound_are_refused() {
    let fake = warmpath_e2e::fake_kube::FakeKube::builder()
        .max_objects(2)
        .start()
        .await
        .expect("start");
    fake.apply(pod("a", "p1", "vllm", "n1")).expect("first");
    fake.apply(pod("a", "p2", "vllm", "n1")).expect("second");
    let err = fake.apply(pod("a", "p3", "vllm", "n1")).expect_err("third");
    assert_eq!((err.code, err.reason), (507, "InsufficientStorage"));
    // Replacing a stored object is no new object.
    fake.apply(pod("a", "p1", "web", "n1")).expect("replace");
    let client = fake.client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client, "a");
    let p3: Pod = serde_json::from_value(pod("a", "p3", "vllm", "n1")).expect("a pod");
    let err = pods
        .create(&PostParams::default(), &p3)
        .await
        .expect_err("over HTTP too");
    assert!(is_api(&err, 507, "InsufficientStorage"), "{err:?}");
}
