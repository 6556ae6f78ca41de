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

#[tokio::test]
async fn malformed_requests_answer_status_objects() {
    let (fake, _) = start().await;
    fake.apply(pod("a", "p", "vllm", "n1")).expect("apply");
    let http = reqwest::Client::new();
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(2 << 20));
    let json_patch = "application/json-patch+json";
    let merge = "application/merge-patch+json";
    let cases: Vec<(&str, &str, &str, String, u16)> = vec![
        ("GET", "/api/v1/pods?limit=many", "", String::new(), 400),
        (
            "GET",
            "/api/v1/pods?labelSelector=app+in+vllm",
            "",
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/pods?labelSelector=a+b%3Dc",
            "",
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/pods?continue=1%2Fa%2Fp&resourceVersion=1",
            "",
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/pods?resourceVersionMatch=Exact",
            "",
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/pods?resourceVersion=99&resourceVersionMatch=Exact",
            "",
            String::new(),
            504,
        ),
        (
            "GET",
            "/api/v1/pods?resourceVersion=x",
            "",
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/pods?continue=garbage",
            "",
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/pods?watch=true&resourceVersion=x",
            "",
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/pods?watch=true&timeoutSeconds=-1",
            "",
            String::new(),
            400,
        ),
        (
            "GET",
            "/api/v1/pods?watch=true&sendInitialEvents=true",
            "",
            String::new(),
            400,
        ),
        ("GET", "/api/v1/widgets", "", String::new(), 404),
        (
            "GET",
            "/apis/warmpath.dev/v1alpha1/namespaces/a/tenants",
            "",
            String::new(),
            404,
        ),
        ("GET", "/api/v1/pods/p", "", String::new(), 404),
        (
            "GET",
            "/api/v1/namespaces/a/pods/p/log",
            "",
            String::new(),
            404,
        ),
        ("GET", "/nowhere", "", String::new(), 404),
        (
            "DELETE",
            "/api/v1/namespaces/a/pods",
            "",
            String::new(),
            405,
        ),
        (
            "POST",
            "/api/v1/namespaces/a/pods",
            merge,
            "[1, 2]".into(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/a/pods",
            merge,
            "{not json".into(),
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/a/pods",
            merge,
            r#"{"metadata": {"name": "Bad_Name"}}"#.into(),
            422,
        ),
        (
            "POST",
            "/api/v1/namespaces/a/pods",
            merge,
            r#"{"metadata": {"name": "q", "namespace": "b"}}"#.into(),
            400,
        ),
        ("POST", "/api/v1/namespaces/a/pods", merge, big, 413),
        (
            "PUT",
            "/api/v1/namespaces/a/pods/p",
            merge,
            r#"{"metadata": {"name": "other"}}"#.into(),
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p",
            "text/plain",
            "{}".into(),
            415,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p",
            merge,
            "7".into(),
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p",
            json_patch,
            r#"[{"op": "replace", "path": "", "value": 5}]"#.into(),
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p",
            json_patch,
            r#"[{"op": "test", "path": "/spec/nodeName", "value": "n9"}]"#.into(),
            422,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p",
            json_patch,
            r#"{"op": "add"}"#.into(),
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p",
            merge,
            r#"{"metadata": {"resourceVersion": "0"}}"#.into(),
            409,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p",
            "application/apply-patch+yaml",
            "{}".into(),
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p?fieldManager=t",
            "application/apply-patch+yaml",
            "key: [unclosed".into(),
            400,
        ),
    ];
    for (method, path, content_type, body, code) in cases {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut req = http
            .request(method.clone(), format!("{}{path}", fake.url()))
            .bearer_auth(fake.token())
            .body(body);
        if !content_type.is_empty() {
            req = req.header("content-type", content_type);
        }
        let resp = req.send().await.expect("an answer");
        let got = resp.status().as_u16();
        let status: Value = resp.json().await.expect("a JSON body");
        assert_eq!(
            (got, &status["kind"], &status["code"]),
            (code, &json!("Status"), &json!(code)),
            "{method} {path}: {status}"
        );
    }
    // The object is untouched and the fake still serves.
    let stored = fake.get(&PODS, Some("a"), "p").expect("still there");
    assert_eq!(stored["metadata"]["resourceVersion"], json!("1"));
    assert_eq!(fake.objects(&PODS).len(), 1);
}
