//! RoutePolicy and Tenant objects from the Kubernetes API (the fake API server of
//! `warmpath_e2e::fake_kube`, driven through the real kube client): two agents' policy
//! watchers against one server. A valid policy is accepted with its generation, an invalid
//! update is rejected with the validation message while the last good version keeps
//! serving, exactly one agent writes statuses, and a relist writes nothing. Client identity:
//! this node's pods resolve to the Tenant whose selectors claim them.
//!
//! Every step awaits a condition (bounded by [`WAIT`]); nothing sleeps.

use std::{sync::Arc, time::Duration};

use serde_json::{Value, json};
use warmpath_agent::{
    http::Headers,
    k8s::{identity, policies, status},
    policy::{
        active::ActivePolicy,
        compiled::{PoolBase, RequestFacts},
    },
    routing::{Policy, RoutePolicy as Weights},
    telemetry::{Telemetry, TelemetryConfig},
    tenant::TenantPolicy,
};
use warmpath_e2e::fake_kube::{Expiry, FakeKube, PODS, ROUTE_POLICIES, TENANTS};

/// Longest wait for one condition.
const WAIT: Duration = Duration::from_secs(20);

fn route_policy(retries: u32) -> Value {
    json!({
        "apiVersion": "warmpath.dev/v1alpha1",
        "kind": "RoutePolicy",
        "metadata": {"name": "chat", "namespace": "ml"},
        "spec": {"targetRef": {"pool": {"name": "chat"}}, "action": {"retries": retries}},
    })
}

fn tenant(name: &str, identity: Value) -> Value {
    json!({
        "apiVersion": "warmpath.dev/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name},
        "spec": {"priority": 5, "identity": identity},
    })
}

struct Agent {
    active: Arc<ActivePolicy>,
    policies: policies::PoliciesHandle,
    _telemetry: Telemetry,
}

async fn agent(fake: &FakeKube, node: &str) -> Agent {
    agent_in(fake, node, Vec::new()).await
}

/// An agent watching RoutePolicies in `namespaces` (empty: all).
async fn agent_in(fake: &FakeKube, node: &str, namespaces: Vec<String>) -> Agent {
    let active = Arc::new(ActivePolicy::new(TenantPolicy::default()));
    active.add_pool(PoolBase {
        name: "chat".into(),
        model: "llama".into(),
        targets: Default::default(),
        policy: Weights::from(Policy::Precise),
    });
    let telemetry = Telemetry::new(&TelemetryConfig::default()).expect("telemetry");
    let client = fake.client().await.expect("a client of the fake");
    let settings = status::Settings {
        holder: node.into(),
        namespace: "warmpath".into(),
        timing: status::LeaseTiming::default(),
    };
    let policies = policies::spawn(
        client,
        active.clone(),
        namespaces,
        Some(settings),
        telemetry.meter(),
    );
    tokio::time::timeout(WAIT, policies.synced())
        .await
        .expect("the policies list within the wait");
    Agent {
        active,
        policies,
        _telemetry: telemetry,
    }
}

impl Agent {
    fn status(&self) -> &status::StatusHandle {
        self.policies.status().expect("status writes are on")
    }

    /// The action source a request to the chat pool gets (`ns/name@generation`).
    fn serving(&self) -> String {
        let headers = Headers::default();
        let facts = RequestFacts {
            model: Some("llama"),
            path: "/v1/chat/completions",
            headers: &headers,
            tenant: "default",
        };
        let chosen = self.active.current().choose(0, &facts, || None);
        format!(
            "{} retries={:?}",
            chosen.action.source, chosen.action.retries
        )
    }
}

/// Waits until `f` holds, polling on every status round of either agent.
async fn wait_until(agents: &[&Agent], what: &str, mut f: impl FnMut() -> bool) {
    let mut rounds: Vec<_> = agents
        .iter()
        .flat_map(|a| [a.status().rounds(), a.policies.rounds()])
        .collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        let changed = futures::future::select_all(rounds.iter_mut().map(|r| Box::pin(r.changed())));
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            panic!("not within {WAIT:?}: {what}");
        }
    }
}

/// The condition `type_` of an object as the fake stores it.
fn condition(obj: &Option<Value>, type_: &str) -> Value {
    obj.as_ref()
        .and_then(|o| o["status"]["conditions"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .find(|c| c["type"] == type_)
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_one_status_writer_and_the_last_good_version_serving() {
    let fake = FakeKube::start().await.expect("fake API server");
    fake.apply(route_policy(2)).expect("policy");
    fake.apply(tenant("team-a", json!({"namespaces": ["ml"]})))
        .expect("tenant");
    let a = agent(&fake, "node-a").await;
    let b = agent(&fake, "node-b").await;
    let policy = || fake.get(&ROUTE_POLICIES, Some("ml"), "chat");
    wait_until(&[&a, &b], "the policy accepted at generation 1", || {
        let p = policy();
        let c = condition(&p, "Accepted");
        c["status"] == "True"
            && c["observedGeneration"] == 1
            && p.as_ref()
                .is_some_and(|p| p["status"]["observedGeneration"] == 1)
            && condition(&p, "ResolvedRefs")["status"] == "True"
    })
    .await;
    let resolved = condition(&policy(), "ResolvedRefs");
    assert_eq!(resolved["reason"], "ResolvedRefs", "{resolved}");
    assert!(
        resolved["message"].as_str().unwrap().contains("chat"),
        "{resolved}"
    );
    wait_until(&[&a, &b], "the tenant accepted", || {
        condition(&fake.get(&TENANTS, None, "team-a"), "Accepted")["status"] == "True"
    })
    .await;
    assert_eq!(a.serving(), "ml/chat@1 retries=Some(2)");
    assert_eq!(b.serving(), "ml/chat@1 retries=Some(2)");

    // An invalid update: rejected with its field path, generation 1 keeps serving.
    fake.apply(route_policy(99)).expect("update");
    wait_until(&[&a, &b], "the update rejected at generation 2", || {
        let c = condition(&policy(), "Accepted");
        c["status"] == "False" && c["observedGeneration"] == 2
    })
    .await;
    let c = condition(&policy(), "Accepted");
    assert_eq!(c["reason"], "Invalid", "{c}");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("spec.action.retries"),
        "{c}"
    );
    assert_eq!(policy().unwrap()["status"]["observedGeneration"], 2);
    assert_eq!(a.serving(), "ml/chat@1 retries=Some(2)");
    assert_eq!(b.serving(), "ml/chat@1 retries=Some(2)");
    let kept = condition(&policy(), "ResolvedRefs");
    assert_eq!(
        kept["observedGeneration"], 1,
        "what serves is generation 1: {kept}"
    );

    // Exactly one agent writes statuses: every status write the fake recorded is its.
    let (leader, follower) = if a.status().is_leader() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(leader.status().is_leader() && !follower.status().is_leader());
    assert_eq!(follower.status().writes(), 0);
    let status_writes = || {
        fake.writes()
            .iter()
            .filter(|w| w.subresource.as_deref() == Some("status"))
            .count() as u64
    };
    // The fake records a write when it answers; the agent counts it when the answer
    // arrives: equal once the last answer is in.
    wait_until(
        &[&a, &b],
        "every recorded status write counted by the leader",
        || status_writes() == leader.status().writes(),
    )
    .await;
    assert!(
        fake.writes()
            .iter()
            .filter(|w| w.subresource.as_deref() == Some("status"))
            .all(|w| w.field_manager.as_deref() == Some(status::FIELD_MANAGER) && w.code == 200)
    );
    // Accepted and ResolvedRefs once each for the policy, its rejection, the tenant: 3.
    assert_eq!(status_writes(), 3, "{:?}", fake.writes());

    // A relist (the watches expired: 410) sees the statuses written and writes nothing.
    let before = status_writes();
    let settled = *leader.policies.rounds().borrow();
    fake.expire_watches();
    wait_until(&[leader], "the leader settled after the relist", || {
        *leader.policies.rounds().borrow() > settled
    })
    .await;
    let evaluated = *leader.status().rounds().borrow();
    wait_until(
        &[leader],
        "the writer went over the objects twice more",
        || *leader.status().rounds().borrow() >= evaluated + 2,
    )
    .await;
    assert_eq!(status_writes(), before, "{:?}", fake.writes());
    assert!(fake.counters(&ROUTE_POLICIES).expired >= 1);
    // Status writes and the relist changed nothing that serves: two reloads in all, the
    // first list and the rejected update.
    for agent in [&a, &b] {
        let c = agent.policies.counts();
        assert_eq!(
            (c.applied, c.unchanged, c.rejected, c.rejected_objects),
            (1, 0, 1, 1),
            "{c:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_watched_namespaces_apply_and_a_deletion_stops_applying() {
    let fake = FakeKube::start().await.expect("fake API server");
    fake.apply(route_policy(2)).expect("policy");
    let mut elsewhere = route_policy(5);
    elsewhere["metadata"]["namespace"] = json!("other");
    elsewhere["metadata"]["name"] = json!("aaa-chat");
    fake.apply(elsewhere).expect("policy");
    let a = agent_in(&fake, "node-a", vec!["ml".into()]).await;
    wait_until(&[&a], "ml/chat accepted", || {
        condition(&fake.get(&ROUTE_POLICIES, Some("ml"), "chat"), "Accepted")["status"] == "True"
    })
    .await;
    assert_eq!(a.serving(), "ml/chat@1 retries=Some(2)");
    let accepted = a.active.accepted().expect("a settled set");
    assert_eq!(
        accepted
            .objects
            .iter()
            .map(|o| (o.key.as_str(), o.file.display().to_string()))
            .collect::<Vec<_>>(),
        [("ml/chat", "kubernetes:ml/chat".to_string())],
        "other/aaa-chat is not watched"
    );
    let unwatched = fake
        .get(&ROUTE_POLICIES, Some("other"), "aaa-chat")
        .unwrap();
    assert!(
        unwatched.get("status").is_none_or(|s| s.is_null()),
        "{unwatched}"
    );
    fake.delete(&ROUTE_POLICIES, Some("ml"), "chat")
        .expect("deleted");
    wait_until(&[&a], "the deletion settled", || {
        a.active.accepted().is_some_and(|s| s.objects.is_empty())
    })
    .await;
    assert_eq!(a.serving(), "pool/chat retries=None");
    assert_eq!(a.policies.counts().rejected, 0);
    assert!(
        a.policies.counts().applied >= 2,
        "{:?}",
        a.policies.counts()
    );
}

/// A watch refused with HTTP 410 (the history compacted while the watch was down) relists,
/// and the change made meanwhile applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_refused_with_410_relists() {
    let fake = FakeKube::builder()
        .expiry(Expiry::Http410)
        .start()
        .await
        .expect("fake API server");
    fake.apply(route_policy(2)).expect("policy");
    let a = agent_in(&fake, "node-a", vec!["ml".into()]).await;
    fake.wait_for_counters(&ROUTE_POLICIES, WAIT, |c| c.open_watches == 1)
        .await
        .expect("watching after the list");
    fake.pause_watches();
    let held = fake.counters(&ROUTE_POLICIES);
    fake.drop_watches();
    fake.apply(route_policy(3)).expect("update");
    fake.compact();
    fake.drop_watches();
    fake.wait_for_counters(&ROUTE_POLICIES, WAIT, |c| {
        c.expired > held.expired && c.lists > held.lists
    })
    .await
    .expect("the refused watch makes the agent relist");
    fake.resume_watches();
    wait_until(&[&a], "the update made while the watch was down", || {
        a.serving() == "ml/chat@2 retries=Some(3)"
    })
    .await;
}

fn pod(name: &str, node: &str, ns: &str, sa: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"nodeName": node, "serviceAccountName": sa, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_nodes_pods_are_identified_as_the_tenants_their_selectors_name() {
    let fake = FakeKube::start().await.expect("fake API server");
    fake.apply(pod("notebook", "node-a", "ml", "default", "10.1.0.1"))
        .expect("pod");
    fake.apply(pod("job", "node-a", "ml", "batch", "10.1.0.2"))
        .expect("pod");
    fake.apply(pod("elsewhere", "node-b", "ml", "default", "10.1.0.3"))
        .expect("pod");
    fake.apply(tenant("ml-team", json!({"namespaces": ["ml"]})))
        .expect("tenant");
    fake.apply(tenant("batch", json!({"serviceAccounts": ["ml/batch"]})))
        .expect("tenant");
    let a = agent(&fake, "node-a").await;
    let (pods, watching) = identity::spawn(
        fake.client().await.unwrap(),
        identity::Scope::Node("node-a".into()),
    );
    tokio::time::timeout(WAIT, watching.synced())
        .await
        .expect("pods listed");
    a.active.set_workloads(pods.clone());
    let tenant_of = |ip: &str| {
        let set = a.active.current();
        set.identity
            .resolve(Some(ip.parse().unwrap()), &Headers::default())
            .0
            .to_string()
    };
    assert_eq!(pods.len(), 2, "only node-a's pods");
    assert_eq!(tenant_of("10.1.0.1"), "ml-team");
    assert_eq!(tenant_of("10.1.0.2"), "batch");
    assert_eq!(tenant_of("10.1.0.3"), "default", "another node's pod");
    // A pod added later is identified without a policy change.
    fake.apply(pod("late", "node-a", "ml", "default", "10.1.0.4"))
        .expect("pod");
    let mut changes = pods.subscribe();
    tokio::time::timeout(
        WAIT,
        changes.wait_for(|_| pods.workload_of("10.1.0.4".parse().unwrap()).is_some()),
    )
    .await
    .expect("the late pod within the wait")
    .expect("the directory lives");
    assert_eq!(tenant_of("10.1.0.4"), "ml-team");
    assert_eq!(fake.counters(&PODS).lists, 1);
}
