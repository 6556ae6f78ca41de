//! The fake Kubernetes API server (tests/src/fake_kube) against the real `kube` client:
//! lists with selectors and pages, watchers and reflectors through adds, changes, deletes,
//! dropped watches, compaction (410) and bookmarks, status writes and their recording,
//! errors as `Status` objects.

use std::{fmt::Debug, hash::Hash, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Resource, ResourceExt,
    api::{
        ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
        WatchEvent, WatchParams,
    },
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use warmpath_e2e::{
    fake_kube::{Counters, Expiry, FakeKube, PODS, ROUTE_POLICIES, TENANTS},
    sim::wait_for,
};

#[path = "fake_kube/errors.rs"]
mod errors;

const LIMIT: Duration = Duration::from_secs(20);

fn pod(ns: &str, name: &str, app: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "engine", "image": "vllm"}]},
    })
}

fn route_policy(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "warmpath.dev/v1alpha1", "kind": "RoutePolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"preset": "precise"},
    })
}

fn route_policy_api(client: kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("warmpath.dev", "v1alpha1", "RoutePolicy"),
        "routepolicies",
    );
    Api::namespaced_with(client, ns, &ar)
}

async fn start() -> (FakeKube, kube::Client) {
    let fake = FakeKube::builder()
        .bookmark_interval(Duration::from_millis(50))
        .start()
        .await
        .expect("the fake binds 127.0.0.1:0");
    let client = fake
        .client()
        .await
        .expect("a client from the fake's kubeconfig");
    (fake, client)
}

/// A reflector driven on its own task, aborted on drop.
struct Reflector<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: reflector::Store<K>,
    task: tokio::task::JoinHandle<()>,
}

impl<K: Resource + 'static> Drop for Reflector<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn reflect<K>(api: Api<K>, config: watcher::Config) -> Reflector<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let stream = reflector(writer, watcher(api, config)).default_backoff();
    let task = tokio::spawn(async move {
        stream.for_each(|_| async {}).await;
    });
    Reflector { store, task }
}

/// (namespace, name, resourceVersion) of every object, sorted.
fn identities<'a>(
    objs: impl IntoIterator<Item = (Option<&'a str>, &'a str, Option<&'a str>)>,
) -> Vec<(String, String, String)> {
    let mut ids: Vec<_> = objs
        .into_iter()
        .map(|(ns, name, rv)| {
            (
                ns.unwrap_or_default().to_string(),
                name.to_string(),
                rv.unwrap_or_default().to_string(),
            )
        })
        .collect();
    ids.sort();
    ids
}

fn fake_pods(fake: &FakeKube) -> Vec<(String, String, String)> {
    let objs = fake.objects(&PODS);
    identities(objs.iter().map(|o| {
        (
            o["metadata"]["namespace"].as_str(),
            o["metadata"]["name"].as_str().unwrap_or_default(),
            o["metadata"]["resourceVersion"].as_str(),
        )
    }))
}

fn store_pods(store: &reflector::Store<Pod>) -> Vec<(String, String, String)> {
    let state = store.state();
    identities(state.iter().map(|p| {
        (
            p.metadata.namespace.as_deref(),
            p.metadata.name.as_deref().unwrap_or_default(),
            p.metadata.resource_version.as_deref(),
        )
    }))
}

/// Waits until the reflector holds exactly the fake's pods.
async fn converged(fake: &FakeKube, store: &reflector::Store<Pod>, what: &str) {
    wait_for(what, LIMIT, || async {
        (store_pods(store) == fake_pods(fake)).then_some(())
    })
    .await;
}

async fn counters(fake: &FakeKube, what: &str, pred: impl FnMut(&Counters) -> bool) -> Counters {
    fake.wait_for_counters(&PODS, LIMIT, pred)
        .await
        .unwrap_or_else(|last| panic!("timed out waiting for {what}; pod counters {last:?}"))
}

fn names(list: &kube::api::ObjectList<Pod>) -> Vec<String> {
    list.items.iter().map(|p| p.name_any()).collect()
}

#[tokio::test]
async fn lists_filter_by_labels_fields_and_namespace_and_page() {
    let (fake, client) = start().await;
    for (ns, name, app, node) in [
        ("a", "p1", "vllm", "n1"),
        ("a", "p2", "vllm", "n2"),
        ("a", "p3", "web", "n1"),
        ("b", "p4", "vllm", "n1"),
        ("b", "p5", "sglang", "n2"),
    ] {
        fake.apply(pod(ns, name, app, node)).expect("apply");
    }
    let all: Api<Pod> = Api::all(client.clone());
    let list = all
        .list(&ListParams::default().labels("app=vllm"))
        .await
        .expect("list");
    assert_eq!(names(&list), ["p1", "p2", "p4"]);
    assert_eq!(list.metadata.resource_version.as_deref(), Some("5"));

    let set = kube::core::Selector::from_iter([kube::core::Expression::In(
        "app".into(),
        ["sglang".to_string(), "web".to_string()].into(),
    )]);
    let list = all
        .list(&ListParams::default().labels_from(&set))
        .await
        .expect("set-based");
    assert_eq!(names(&list), ["p3", "p5"]);
    let list = all
        .list(&ListParams::default().labels("app notin (vllm),app"))
        .await
        .expect("notin");
    assert_eq!(names(&list), ["p3", "p5"]);
    let list = all
        .list(&ListParams::default().labels("!app"))
        .await
        .expect("not exists");
    assert!(list.items.is_empty());

    let list = all
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .expect("fields");
    assert_eq!(names(&list), ["p1", "p3", "p4"]);
    let in_a: Api<Pod> = Api::namespaced(client.clone(), "a");
    let list = in_a
        .list(&ListParams::default().fields("spec.nodeName=n1,metadata.name!=p1"))
        .await
        .expect("fields");
    assert_eq!(names(&list), ["p3"]);

    let err = all
        .list(&ListParams::default().fields("spec.image=vllm"))
        .await
        .expect_err("unsupported field");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 400),
        "{err:?}"
    );

    // Pages of two: three requests, every pod once, the first page's resourceVersion kept.
    let mut lp = ListParams::default().limit(2);
    let mut seen = Vec::new();
    loop {
        let page = all.list(&lp).await.expect("page");
        assert_eq!(page.metadata.resource_version.as_deref(), Some("5"));
        seen.extend(names(&page));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(seen, ["p1", "p2", "p3", "p4", "p5"]);
    assert_eq!(fake.counters(&PODS).lists, 9);
}

#[tokio::test]
async fn watcher_sees_add_modify_delete_in_order() {
    let (fake, client) = start().await;
    fake.apply(pod("ns", "before", "vllm", "n1"))
        .expect("apply");
    let api: Api<Pod> = Api::namespaced(client, "ns");
    let mut events = watcher(api, watcher::Config::default()).boxed();
    let mut init = Vec::new();
    loop {
        match events
            .try_next()
            .await
            .expect("watcher")
            .expect("stream open")
        {
            watcher::Event::Init => {}
            watcher::Event::InitApply(p) => init.push(p.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?} during the initial list"),
        }
    }
    assert_eq!(init, ["before"]);
    // The watch opens at the next poll, from the list's resourceVersion: these replay.

    fake.apply(pod("ns", "p", "vllm", "n1")).expect("add");
    fake.apply(pod("ns", "p", "vllm-v2", "n1")).expect("modify");
    fake.apply(pod("other", "elsewhere", "vllm", "n1"))
        .expect("another namespace");
    fake.delete(&PODS, Some("ns"), "p").expect("delete");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match tokio::time::timeout(LIMIT, events.try_next()).await {
            Ok(Ok(Some(watcher::Event::Apply(p)))) => {
                seen.push(("apply", p.labels()["app"].clone(), p.resource_version()))
            }
            Ok(Ok(Some(watcher::Event::Delete(p)))) => {
                seen.push(("delete", p.labels()["app"].clone(), p.resource_version()))
            }
            other => panic!("expected a watch event, got {other:?}"),
        }
    }
    let rv = |n: u64| Some(n.to_string());
    assert_eq!(
        seen,
        [
            ("apply", "vllm".to_string(), rv(2)),
            ("apply", "vllm-v2".to_string(), rv(3)),
            ("delete", "vllm-v2".to_string(), rv(5)),
        ]
    );
    assert_eq!(fake.counters(&PODS).lists, 1);
}

#[tokio::test]
async fn a_dropped_watch_resumes_without_losing_events() {
    let (fake, client) = start().await;
    for name in ["a", "b", "c"] {
        fake.apply(pod("ns", name, "vllm", "n1")).expect("apply");
    }
    let r = reflect(Api::<Pod>::all(client), watcher::Config::default());
    converged(&fake, &r.store, "the initial list").await;
    counters(&fake, "the first watch", |c| c.open_watches == 1).await;

    // Changes the open stream holds back, then lose that stream mid-way.
    fake.pause_watches();
    fake.apply(pod("ns", "d", "vllm", "n1")).expect("add");
    fake.apply(pod("ns", "a", "vllm", "n2")).expect("modify");
    fake.delete(&PODS, Some("ns"), "c").expect("delete");
    fake.drop_watches();
    fake.resume_watches();

    let after = counters(&fake, "a second watch", |c| {
        c.watches >= 2 && c.open_watches == 1
    })
    .await;
    converged(&fake, &r.store, "the changes made while the watch was down").await;
    assert_eq!(
        after.lists, 1,
        "resumed from its resourceVersion, no relist: {after:?}"
    );
    assert_eq!(after.expired, 0);
}

#[tokio::test]
async fn compaction_makes_the_watcher_relist_and_converge() {
    let (fake, client) = start().await;
    fake.apply(pod("ns", "a", "vllm", "n1")).expect("apply");
    let r = reflect(Api::<Pod>::all(client), watcher::Config::default());
    converged(&fake, &r.store, "the initial list").await;
    counters(&fake, "the first watch", |c| c.open_watches == 1).await;

    // Changes the stream never delivers, then their history compacted away.
    fake.pause_watches();
    fake.apply(pod("ns", "b", "vllm", "n1")).expect("add");
    fake.delete(&PODS, Some("ns"), "a").expect("delete");
    fake.compact();
    fake.drop_watches();
    fake.resume_watches();
    let after = counters(&fake, "a relist after 410", |c| c.lists >= 2).await;
    assert!(after.expired >= 1, "{after:?}");
    converged(&fake, &r.store, "the state after the relist").await;
    assert_eq!(store_pods(&r.store).len(), 1);

    // Without a pause: whether or not the change reached the client, its next watch is
    // expired, since compaction moves the resourceVersion on.
    counters(&fake, "the watch after the relist", |c| c.open_watches == 1).await;
    fake.apply(pod("ns", "c", "vllm", "n1")).expect("add");
    fake.compact();
    fake.drop_watches();
    counters(&fake, "a second relist", |c| c.lists >= 3).await;
    converged(&fake, &r.store, "the state after the second relist").await;

    // An open watch ended with 410 by the server.
    counters(&fake, "the watch after the second relist", |c| {
        c.open_watches == 1
    })
    .await;
    fake.expire_watches();
    fake.apply(pod("ns", "d", "vllm", "n1")).expect("add");
    counters(&fake, "a third relist", |c| c.lists >= 4).await;
    converged(&fake, &r.store, "the state after the third relist").await;
    assert_eq!(store_pods(&r.store).len(), 3);
}

#[tokio::test]
async fn an_expired_watch_is_410_in_either_form() {
    let fake = FakeKube::builder().history(2).start().await.expect("start");
    let client = fake.client().await.expect("client");
    for app in ["v1", "v2", "v3", "v4"] {
        fake.apply(pod("ns", "a", app, "n1")).expect("apply");
    }
    let api: Api<Pod> = Api::all(client);
    // The history holds rv 3 and 4: from 2 is still whole, from 1 is not.
    let mut ok = api
        .watch(&WatchParams::default().timeout(5), "2")
        .await
        .expect("watch")
        .boxed();
    match ok.try_next().await.expect("event") {
        Some(WatchEvent::Modified(p)) => assert_eq!(p.resource_version().as_deref(), Some("3")),
        other => panic!("expected MODIFIED at 3, got {other:?}"),
    }
    let mut gone = api
        .watch(&WatchParams::default().timeout(5), "1")
        .await
        .expect("200 then ERROR")
        .boxed();
    match gone.try_next().await.expect("event") {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected an ERROR event, got {other:?}"),
    }
    fake.set_expiry(Expiry::Http410);
    let err = api
        .watch(&WatchParams::default(), "1")
        .await
        .err()
        .expect("HTTP 410");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"),
        "{err:?}"
    );
    assert_eq!(fake.counters(&PODS).expired, 2);
}

#[tokio::test]
async fn bookmarks_carry_the_latest_resource_version() {
    let (fake, client) = start().await;
    fake.apply(pod("ns", "a", "vllm", "n1")).expect("apply");
    fake.apply(pod("other", "b", "web", "n1")).expect("apply");
    let api: Api<Pod> = Api::namespaced(client, "ns");
    let wp = WatchParams::default().labels("app=vllm").timeout(10);
    let mut stream = api.watch(&wp, "1").await.expect("watch").boxed();
    // b is filtered out, yet the bookmark moves past it.
    match tokio::time::timeout(LIMIT, stream.try_next()).await {
        Ok(Ok(Some(WatchEvent::Bookmark(b)))) => assert_eq!(b.metadata.resource_version, "2"),
        other => panic!("expected a BOOKMARK, got {other:?}"),
    }
    let wp = WatchParams::default().disable_bookmarks().timeout(1);
    let events: Vec<_> = api
        .watch(&wp, "2")
        .await
        .expect("watch")
        .try_collect()
        .await
        .expect("events");
    assert!(
        events.is_empty(),
        "no bookmark unless asked, stream ended at timeoutSeconds: {events:?}"
    );
}

#[tokio::test]
async fn status_writes_are_recorded_with_their_field_manager() {
    let (fake, client) = start().await;
    fake.apply(route_policy("ns", "rp")).expect("apply");
    let api = route_policy_api(client, "ns");
    let condition = json!({"type": "Accepted", "status": "True", "observedGeneration": 1});
    let merge = json!({"status": {"conditions": [condition]}, "spec": {"preset": "ignored"}});
    api.patch_status(
        "rp",
        &PatchParams {
            field_manager: Some("agent-a".into()),
            ..Default::default()
        },
        &Patch::Merge(&merge),
    )
    .await
    .expect("merge patch of status");
    let apply = json!({"apiVersion": "warmpath.dev/v1alpha1", "kind": "RoutePolicy",
        "metadata": {"name": "rp"}, "status": {"conditions": [condition], "observed": true}});
    api.patch_status(
        "rp",
        &PatchParams::apply("agent-b").force(),
        &Patch::Apply(&apply),
    )
    .await
    .expect("server-side apply of status");

    let writes = fake.status_writes(&ROUTE_POLICIES, Some("ns"), "rp");
    let who: Vec<_> = writes
        .iter()
        .map(|w| (w.method.as_str(), w.field_manager.as_deref(), w.code))
        .collect();
    assert_eq!(
        who,
        [
            ("PATCH", Some("agent-a"), 200),
            ("PATCH", Some("agent-b"), 200)
        ]
    );
    assert_eq!(
        writes[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        writes[1].content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!(writes[1].body["status"]["observed"], json!(true));

    let stored = fake.get(&ROUTE_POLICIES, Some("ns"), "rp").expect("stored");
    assert_eq!(
        stored["spec"]["preset"],
        json!("precise"),
        "a status write leaves spec alone"
    );
    assert_eq!(stored["status"]["conditions"][0]["type"], json!("Accepted"));
    assert_eq!(
        stored["metadata"]["generation"],
        json!(1),
        "status writes keep the generation"
    );
}

#[tokio::test]
async fn generation_counts_spec_changes_and_no_op_writes_change_nothing() {
    let (fake, client) = start().await;
    let mut rp = route_policy("ns", "rp");
    rp["status"] = json!({"conditions": [{"type": "Accepted", "status": "True"}]});
    let stored = fake.apply(rp).expect("apply");
    assert_eq!(stored["metadata"]["generation"], json!(1));
    let api = route_policy_api(client, "ns");

    // A spec change bumps the generation; a status sent with it is ignored.
    let spec = json!({"spec": {"preset": "session"}, "status": {"conditions": []}});
    let updated = api
        .patch("rp", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .expect("spec patch");
    assert_eq!(updated.metadata.generation, Some(2));
    assert_eq!(
        updated.data["status"]["conditions"][0]["type"],
        json!("Accepted")
    );
    // A write that changes nothing records no event and keeps the resourceVersion.
    let again = api
        .patch("rp", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .expect("same patch");
    assert_eq!(again.resource_version(), updated.resource_version());
    assert_eq!(fake.resource_version(), 2);

    // A status replace from a stale resourceVersion is refused; from the current one it
    // lands without touching the generation.
    let mut stale = serde_json::to_value(&updated).expect("serialize");
    stale["metadata"]["resourceVersion"] = json!("1");
    stale["status"] = json!({"conditions": []});
    let body: DynamicObject = serde_json::from_value(stale.clone()).expect("an object");
    let err = api
        .replace_status("rp", &PostParams::default(), &body)
        .await
        .expect_err("stale");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409),
        "{err:?}"
    );
    stale["metadata"]["resourceVersion"] = json!("2");
    let body: DynamicObject = serde_json::from_value(stale).expect("an object");
    let replaced = api
        .replace_status("rp", &PostParams::default(), &body)
        .await
        .expect("current");
    assert_eq!(replaced.data["status"], json!({"conditions": []}));
    assert_eq!(replaced.metadata.generation, Some(2));
    let codes: Vec<u16> = fake.writes().iter().map(|w| w.code).collect();
    assert_eq!(codes, [200, 200, 409, 200]);
}

#[tokio::test]
async fn an_object_leaving_the_selector_leaves_a_filtered_reflector() {
    let (fake, client) = start().await;
    fake.apply(pod("ns", "a", "vllm", "n1")).expect("apply");
    fake.apply(pod("ns", "b", "vllm", "n1")).expect("apply");
    fake.apply(pod("ns", "c", "web", "n1")).expect("apply");
    let r = reflect(
        Api::<Pod>::all(client),
        watcher::Config::default().labels("app=vllm"),
    );
    let names = |store: &reflector::Store<Pod>| {
        let mut n: Vec<String> = store.state().iter().map(|p| p.name_any()).collect();
        n.sort();
        n
    };
    wait_for("a and b", LIMIT, || async {
        (names(&r.store) == ["a", "b"]).then_some(())
    })
    .await;
    counters(&fake, "the watch", |c| c.open_watches == 1).await;
    fake.apply(pod("ns", "a", "web", "n1"))
        .expect("relabel a away");
    fake.apply(pod("ns", "c", "vllm", "n1"))
        .expect("relabel c in");
    wait_for("b and c", LIMIT, || async {
        (names(&r.store) == ["b", "c"]).then_some(())
    })
    .await;
    assert_eq!(fake.counters(&PODS).lists, 1);
}

#[tokio::test]
async fn watcher_pages_and_streaming_lists_converge() {
    let (fake, client) = start().await;
    for i in 0..5 {
        fake.apply(pod("ns", &format!("p{i}"), "vllm", "n1"))
            .expect("apply");
    }
    let paged = reflect(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().page_size(2),
    );
    converged(&fake, &paged.store, "a paged initial list").await;
    assert_eq!(fake.counters(&PODS).lists, 3);
    drop(paged);

    let streamed = reflect(
        Api::<Pod>::all(client),
        watcher::Config::default().streaming_lists(),
    );
    converged(&fake, &streamed.store, "a streaming list").await;
    fake.apply(pod("ns", "p9", "vllm", "n1")).expect("apply");
    converged(&fake, &streamed.store, "a change after the streaming list").await;
    assert_eq!(
        fake.counters(&PODS).lists,
        3,
        "a streaming list lists nothing"
    );
}

#[tokio::test]
async fn a_kubeconfig_file_reaches_the_fake_over_plain_http() {
    let (fake, _) = start().await;
    fake.apply(pod("ns", "a", "vllm", "n1")).expect("apply");
    let path = std::env::temp_dir().join(format!("warmpath-fake-kube-{}.yaml", std::process::id()));
    fake.kubeconfig(&path).expect("write kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path);
    std::fs::remove_file(&path).expect("remove kubeconfig");
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig.expect("parse"), &Default::default())
            .await
            .expect("config");
    assert_eq!(config.default_namespace, "default");
    let client = kube::Client::try_from(config).expect("client");
    let version = client.apiserver_version().await.expect("/version");
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "33")
    );
    let list = Api::<Pod>::namespaced(client, "ns")
        .list(&ListParams::default())
        .await
        .expect("list");
    assert_eq!(names(&list), ["a"]);
}

#[tokio::test]
async fn cluster_scoped_tenants_list_watch_and_take_status() {
    let (fake, client) = start().await;
    let tenant = |name: &str| {
        json!({"apiVersion": "warmpath.dev/v1alpha1", "kind": "Tenant",
            "metadata": {"name": name, "namespace": "dropped"}, "spec": {}})
    };
    fake.apply(tenant("team-b")).expect("apply");
    fake.apply(tenant("team-a")).expect("apply");
    let stored = fake.get(&TENANTS, None, "team-a").expect("stored");
    assert_eq!(stored["metadata"].get("namespace"), None, "cluster-scoped");

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("warmpath.dev", "v1alpha1", "Tenant"),
        "tenants",
    );
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let list = api.list(&ListParams::default()).await.expect("list");
    let listed: Vec<String> = list.items.iter().map(|t| t.name_any()).collect();
    assert_eq!(listed, ["team-a", "team-b"]);

    // A watch from "0" starts with every object as ADDED, then follows changes.
    let wp = WatchParams::default().timeout(10);
    let mut stream = api.watch(&wp, "0").await.expect("watch").boxed();
    fake.apply(tenant("team-c")).expect("apply");
    let mut added = Vec::new();
    while added.len() < 3 {
        match tokio::time::timeout(LIMIT, stream.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(t)))) => added.push(t.name_any()),
            Ok(Ok(Some(WatchEvent::Bookmark(_)))) => {}
            other => panic!("expected ADDED, got {other:?}"),
        }
    }
    assert_eq!(added, ["team-a", "team-b", "team-c"]);

    let status = json!({"apiVersion": "warmpath.dev/v1alpha1", "kind": "Tenant",
        "metadata": {"name": "team-a"}, "status": {"conditions": []}});
    api.patch_status(
        "team-a",
        &PatchParams::apply("agent-a"),
        &Patch::Apply(&status),
    )
    .await
    .expect("status");
    let writes = fake.status_writes(&TENANTS, None, "team-a");
    let who: Vec<_> = writes
        .iter()
        .map(|w| (w.namespace.as_deref(), w.field_manager.as_deref()))
        .collect();
    assert_eq!(who, [(None, Some("agent-a"))]);
}

#[tokio::test]
async fn start_deletion_marks_a_pod_terminating_once() {
    let (fake, client) = start().await;
    fake.apply(pod("ns", "p", "vllm", "n1")).expect("apply");
    let api: Api<Pod> = Api::namespaced(client, "ns");
    let mut stream = api
        .watch(&WatchParams::default().timeout(10), "1")
        .await
        .expect("watch")
        .boxed();
    let marked = fake.start_deletion(&PODS, Some("ns"), "p").expect("mark");
    let again = fake
        .start_deletion(&PODS, Some("ns"), "p")
        .expect("mark again");
    assert_eq!(again, marked, "terminating already: nothing changes");
    assert_eq!(fake.resource_version(), 2);
    match tokio::time::timeout(LIMIT, stream.try_next()).await {
        Ok(Ok(Some(WatchEvent::Modified(p)))) => {
            assert!(p.metadata.deletion_timestamp.is_some());
            assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    fake.delete(&PODS, Some("ns"), "p").expect("delete");
    match tokio::time::timeout(LIMIT, stream.try_next()).await {
        Ok(Ok(Some(WatchEvent::Deleted(p)))) => {
            assert_eq!(p.resource_version().as_deref(), Some("3"));
        }
        other => panic!("expected DELETED, got {other:?}"),
    }
}
