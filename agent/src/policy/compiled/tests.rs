//! Matching and precedence, table-driven: each row is a request and the policy that must
//! win (by name), written from the rules in docs/policy.md, not from the code.

use super::*;
use crate::policy::documents;

fn pools() -> Vec<PoolBase> {
    let base =
        |name: &str, model: &str, labels: &[(&str, &str)], services: &[(&str, u16)]| PoolBase {
            name: name.into(),
            model: model.into(),
            targets: PoolTargets {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                services: services
                    .iter()
                    .map(|(n, p)| (None, n.to_string(), *p))
                    .collect(),
                ..PoolTargets::default()
            },
            policy: routing::RoutePolicy::from(Policy::Precise),
        };
    vec![
        base(
            "chat",
            "llama",
            &[("tier", "gpu"), ("team", "ml")],
            &[("llama-svc", 8000)],
        ),
        base("chat-v2", "llama-v2", &[("tier", "gpu")], &[]),
        base("code", "coder", &[("tier", "cpu")], &[]),
    ]
}

const POLICIES: &str = r#"
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: by-selector, namespace: ml}
spec:
  targetRef: {selector: {matchLabels: {tier: gpu}}}
  action: {preset: least-loaded}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: pool-default, namespace: ml}
spec:
  targetRef: {pool: {name: chat}}
  action: {preset: precise}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: premium-header, namespace: ml}
spec:
  targetRef: {pool: {name: chat}}
  matches:
  - headers: [{name: x-tier, value: premium}]
  action: {preset: session, failureMode: failClosed}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: team-b-chat, namespace: ml}
spec:
  targetRef: {pool: {name: chat}}
  matches:
  - tenants: [team-b]
    path: {prefix: /v1/chat}
  action: {preset: round-robin}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: exact-completions, namespace: ml}
spec:
  targetRef: {pool: {name: chat}}
  matches:
  - path: {exact: /v1/completions}
  action: {weights: {queue: 3}}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: aaa-same-as-pool-default, namespace: ml}
spec:
  targetRef: {service: {name: llama-svc, port: 8000}}
  action: {preset: approximate}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: aa-lora-only, namespace: ml}
spec:
  targetRef: {pool: {name: chat}, models: [llama-lora]}
  action: {preset: least-loaded}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: model-match, namespace: ml}
spec:
  targetRef: {pool: {name: chat}}
  matches:
  - models: [llama-sql]
  action: {preset: round-robin}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: missing-pool, namespace: ml}
spec:
  targetRef: {pool: {name: nope}}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: canary, namespace: ml}
spec:
  targetRef: {pool: {name: code}}
  action:
    split:
    - {weight: 3}
    - {pool: chat-v2, model: llama-v2, weight: 1}
"#;

fn set() -> PolicySet {
    let resources = documents::parse("test.yaml", POLICIES).unwrap();
    let identity = TenantPolicy::default();
    let mut tokenizers = |_: &str| -> Result<Tokens, String> { Err("none here".into()) };
    compile(
        CompileInput {
            pools: &pools(),
            identity: &identity,
            tokenizers: &mut tokenizers,
            builtin: &|| Tokens::Approximate,
            workloads: None,
        },
        &resources,
        7,
    )
}

#[test]
fn the_most_specific_policy_wins() {
    let set = set();
    let mut premium = http::HeaderMap::new();
    premium.insert("x-tier", "premium".parse().unwrap());
    let premium = Headers::Map(premium);
    let none = Headers::default();
    // (pool, model, path, headers, tenant) -> winning source
    type Row<'a> = (
        usize,
        Option<&'a str>,
        &'a str,
        &'a Headers,
        &'a str,
        &'a str,
    );
    let rows: &[Row<'_>] = &[
        // Pool and Service references tie on target kind and specificity: the name decides
        // (aaa-same-as-pool-default < pool-default).
        (
            0,
            Some("llama"),
            "/v1/chat/completions",
            &none,
            "team-a",
            "ml/aaa-same-as-pool-default",
        ),
        // One condition beats none, whatever the names.
        (
            0,
            Some("llama"),
            "/v1/chat/completions",
            &premium,
            "team-a",
            "ml/premium-header",
        ),
        // Two condition kinds beat one.
        (
            0,
            Some("llama"),
            "/v1/chat/completions",
            &premium,
            "team-b",
            "ml/team-b-chat",
        ),
        // A prefix matches whole segments only.
        (
            0,
            Some("llama"),
            "/v1/chatter",
            &none,
            "team-b",
            "ml/aaa-same-as-pool-default",
        ),
        // Exact path (one kind) vs header (one kind): exact path is more specific.
        (
            0,
            Some("llama"),
            "/v1/completions",
            &premium,
            "team-a",
            "ml/exact-completions",
        ),
        // targetRef.models filters: a policy naming a model applies to that model only
        // (and adds no specificity: the name decides against the other unconditional ones).
        (
            0,
            Some("llama-lora"),
            "/v1/chat/completions",
            &none,
            "team-a",
            "ml/aa-lora-only",
        ),
        // A model condition in matches is one condition kind: it beats none...
        (
            0,
            Some("llama-sql"),
            "/v1/chat/completions",
            &none,
            "team-a",
            "ml/model-match",
        ),
        // ...and ties with a header condition on kinds, which then wins on header count.
        (
            0,
            Some("llama-sql"),
            "/v1/chat/completions",
            &premium,
            "team-a",
            "ml/premium-header",
        ),
        // A request without a model matches no model condition and no model target.
        (
            0,
            None,
            "/v1/chat/completions",
            &none,
            "team-a",
            "ml/aaa-same-as-pool-default",
        ),
        // A selector target loses to references, but applies where nothing else does.
        (
            1,
            Some("llama-v2"),
            "/v1/completions",
            &none,
            "team-a",
            "ml/by-selector",
        ),
        // No policy for the pool: its configuration.
        (
            2,
            Some("coder"),
            "/v1/completions",
            &none,
            "team-a",
            "ml/canary",
        ),
    ];
    for (i, (pool, model, path, headers, tenant, want)) in rows.iter().enumerate() {
        let facts = RequestFacts {
            model: *model,
            path,
            headers,
            tenant,
        };
        let got = set.action(*pool, &facts);
        assert_eq!(&*got.source, *want, "row {i}");
    }
    assert_eq!(set.generation, 7);
}

#[test]
fn actions_refine_the_pool_configuration() {
    let set = set();
    let none = Headers::default();
    let f = |path| RequestFacts {
        model: Some("llama"),
        path,
        headers: &none,
        tenant: "t",
    };
    let exact = set.action(0, &f("/v1/completions"));
    // Weights without a preset refine the pool's own preset (precise here).
    let policy = exact.policy.expect("weights were set");
    assert_eq!(policy.kind, Policy::Precise);
    assert_eq!(policy.weights.queue, 3.0);
    assert_eq!(policy.weights.prefix, 1.0);
    assert!(
        exact.retries.is_none() && exact.explain.is_none(),
        "unset: configuration's"
    );
    let mut premium = http::HeaderMap::new();
    premium.insert("x-tier", "premium".parse().unwrap());
    let h = Headers::Map(premium);
    let p = set.action(
        0,
        &RequestFacts {
            headers: &h,
            ..f("/v1/chat/completions")
        },
    );
    assert_eq!(p.failure, FailureMode::FailClosed);
    assert_eq!(p.policy.unwrap().kind, Policy::Session);
}

#[test]
fn unresolved_targets_do_not_apply_and_say_why() {
    let set = set();
    let missing = set
        .resolved
        .iter()
        .find(|(_, k, _)| k == "ml/missing-pool")
        .expect("reported");
    assert_eq!(missing.2.status, "False");
    assert_eq!(missing.2.reason, "PoolNotFound");
    let sel = set
        .resolved
        .iter()
        .find(|(_, k, _)| k == "ml/by-selector")
        .unwrap();
    assert_eq!(sel.2.status, "True");
    assert!(sel.2.message.contains("chat, chat-v2"), "{}", sel.2.message);
}

#[test]
fn splits_give_each_way_its_share_and_keep_sessions_together() {
    let set = set();
    let none = Headers::default();
    let facts = RequestFacts {
        model: Some("coder"),
        path: "/v1/completions",
        headers: &none,
        tenant: "t",
    };
    let mut to_v2 = 0;
    for _ in 0..400 {
        let c = set.choose(2, &facts, || None);
        if c.pool == 1 {
            assert_eq!(c.model.as_deref(), Some("llama-v2"));
            // The target pool's own policies decide: the selector policy applies there.
            assert_eq!(&*c.action.source, "ml/canary > ml/by-selector");
            to_v2 += 1;
        } else {
            assert_eq!(c.pool, 2);
            assert!(c.model.is_none());
        }
    }
    // Weights 3:1, exactly per cycle of 4.
    assert_eq!(to_v2, 100);
    // Interleaved, not 300 then 100: within the first 8 requests both ways appear.
    let first: Vec<usize> = (0..8)
        .map(|_| set.choose(2, &facts, || None).pool)
        .collect();
    assert!(first.contains(&1) && first.contains(&2), "{first:?}");
    // One session key, one way, every time.
    let way = set.choose(2, &facts, || Some("session-42".into())).pool;
    for _ in 0..50 {
        assert_eq!(
            set.choose(2, &facts, || Some("session-42".into())).pool,
            way
        );
    }
}

#[test]
fn tenants_compile_with_identity_and_rules() {
    let text = r#"
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: team-a}
spec:
  identity: {cidrs: [127.0.0.2/32], headerSources: [127.0.0.9/32]}
  priority: 5
  weight: 3
  cacheIsolation: isolated
  quotas: {promptTokens: 1200/min, concurrentStreams: 4}
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: k8s-only}
spec:
  identity: {namespaces: [ml]}
"#;
    let set = compile_text(&pools(), text);
    let a = set.tenant(&Arc::from("team-a"));
    assert_eq!((a.priority, a.weight, a.isolated), (5, 3, true));
    let q = a.quotas.expect("quota");
    assert_eq!(q.prompt_tokens_per_s, Some(20.0));
    assert_eq!(q.concurrent_streams, Some(4));
    let unlisted = set.tenant(&Arc::from("someone"));
    assert_eq!(
        (unlisted.priority, unlisted.weight, unlisted.isolated),
        (0, 1, false)
    );
    assert!(unlisted.quotas.is_none());
    // Identity: the CIDR names team-a; the header is believed only from its source.
    let none = Headers::default();
    let (t, _) = set
        .identity
        .resolve(Some("127.0.0.2".parse().unwrap()), &none);
    assert_eq!(&*t, "team-a");
    let mut h = http::HeaderMap::new();
    h.insert(crate::tenant::DEFAULT_HEADER, "team-a".parse().unwrap());
    let h = Headers::Map(h);
    assert_eq!(
        &*set
            .identity
            .resolve(Some("127.0.0.9".parse().unwrap()), &h)
            .0,
        "team-a"
    );
    assert_eq!(
        &*set
            .identity
            .resolve(Some("127.0.0.8".parse().unwrap()), &h)
            .0,
        "default"
    );
    let k8s = set
        .resolved
        .iter()
        .find(|(_, k, _)| k == "k8s-only")
        .unwrap();
    assert_eq!(k8s.2.reason, "WorkloadSelectorsInactive");
}

fn compile_text(pools: &[PoolBase], text: &str) -> PolicySet {
    let resources = documents::parse("t.yaml", text).unwrap();
    let identity = TenantPolicy::default();
    let mut tokenizers = |_: &str| -> Result<Tokens, String> { Err("none".into()) };
    compile(
        CompileInput {
            pools,
            identity: &identity,
            tokenizers: &mut tokenizers,
            builtin: &|| Tokens::Approximate,
            workloads: None,
        },
        &resources,
        1,
    )
}

fn status_of<'a>(set: &'a PolicySet, key: &str) -> &'a Condition {
    &set.resolved
        .iter()
        .find(|(_, k, _)| k == key)
        .unwrap_or_else(|| panic!("{key} reported"))
        .2
}

#[test]
fn a_pool_is_steered_only_by_the_policy_that_decides_all_its_requests() {
    let text = r#"
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: steer-chat, namespace: ml}
spec:
  targetRef: {pool: {name: chat}}
  action: {mode: steer}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: steer-gpu, namespace: ml}
spec:
  targetRef: {selector: {matchLabels: {tier: gpu}}}
  action: {mode: steer}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: premium-v2, namespace: ml}
spec:
  targetRef: {pool: {name: chat-v2}}
  matches:
  - headers: [{name: x-tier, value: premium}]
  action: {preset: session}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: proxy-code, namespace: ml}
spec:
  targetRef: {pool: {name: code}}
  action: {preset: least-loaded}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: steer-cpu, namespace: ml}
spec:
  targetRef: {selector: {matchLabels: {tier: cpu}}}
  action: {mode: steer}
"#;
    let set = compile_text(&pools(), text);
    // chat: its own steer policy ranks first (a pool reference before the selector).
    assert_eq!(set.connection_mode(0), DataPathMode::Steer);
    // chat-v2: the selector says steer, but a policy with conditions ranks above it, so the
    // agent must see each request: proxied, and the steer policy says why.
    assert_eq!(set.connection_mode(1), DataPathMode::Proxy);
    let gpu = status_of(&set, "ml/steer-gpu");
    assert_eq!(gpu.status, "True");
    assert!(
        gpu.message
            .contains("pool chat-v2: connections proxied, not steered (ml/premium-v2"),
        "{}",
        gpu.message
    );
    assert!(!gpu.message.contains("pool chat:"), "{}", gpu.message);
    // code: an unconditional policy that does not steer (a pool reference) ranks above the
    // selector's steer policy: proxied, and the steer policy says why.
    assert_eq!(set.connection_mode(2), DataPathMode::Proxy);
    let cpu = status_of(&set, "ml/steer-cpu");
    assert!(
        cpu.message
            .contains("pool code: connections proxied, not steered (ml/proxy-code"),
        "{}",
        cpu.message
    );
    // A pool no set knows: proxy.
    assert_eq!(set.connection_mode(9), DataPathMode::Proxy);
    // Without any policy, every pool is proxied.
    let none = compile_text(&pools(), "");
    assert_eq!(none.connection_mode(0), DataPathMode::Proxy);
}

#[test]
fn on_kubernetes_targets_name_the_inference_pool_services_and_labels_of_their_namespace() {
    // Config pool "chat" follows InferencePool ml/llama-pool; "code" selects app=coder pods
    // in namespace tools and receives the intercepted Service tools/coder:8000.
    let k8s = |name: &str, targets: PoolTargets| PoolBase {
        name: name.into(),
        model: "m".into(),
        targets,
        policy: routing::RoutePolicy::from(Policy::Precise),
    };
    let pools = vec![
        k8s(
            "chat",
            PoolTargets {
                namespace: Some("ml".into()),
                inference_pool: Some(("ml".into(), "llama-pool".into())),
                ..PoolTargets::default()
            },
        ),
        k8s(
            "code",
            PoolTargets {
                namespace: Some("tools".into()),
                labels: [("app".to_string(), "coder".to_string())].into(),
                services: vec![(Some("tools".into()), "coder".into(), 8000)],
                ..PoolTargets::default()
            },
        ),
    ];
    let policy = |ns: &str, name: &str, target: &str| {
        format!(
            "apiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  targetRef: {target}\n---\n"
        )
    };
    let text = [
        policy("ml", "ip", "{pool: {name: llama-pool}}"),
        policy("other", "ip-elsewhere", "{pool: {name: llama-pool}}"),
        policy("ml", "config-name", "{pool: {name: chat}}"),
        policy("tools", "svc", "{service: {name: coder, port: 8000}}"),
        policy(
            "ml",
            "svc-elsewhere",
            "{service: {name: coder, port: 8000}}",
        ),
        policy("tools", "svc-port", "{service: {name: coder, port: 9000}}"),
        policy("tools", "labels", "{selector: {matchLabels: {app: coder}}}"),
        policy(
            "ml",
            "labels-elsewhere",
            "{selector: {matchLabels: {app: coder}}}",
        ),
    ]
    .concat();
    let set = compile_text(&pools, &text);
    // (key, resolves, message fragment)
    let rows = [
        ("ml/ip", true, "pool(s) chat"),
        ("other/ip-elsewhere", false, "selects no pool"),
        ("ml/config-name", false, "selects no pool"),
        ("tools/svc", true, "pool(s) code"),
        ("ml/svc-elsewhere", false, "selects no pool"),
        ("tools/svc-port", false, "selects no pool"),
        ("tools/labels", true, "pool(s) code"),
        ("ml/labels-elsewhere", false, "selects no pool"),
    ];
    for (key, ok, fragment) in rows {
        let c = status_of(&set, key);
        assert_eq!(c.status == "True", ok, "{key}: {c:?}");
        assert!(c.message.contains(fragment), "{key}: {}", c.message);
    }
}

#[test]
fn a_kv_room_weight_on_a_pool_that_ranks_by_requests_is_refused() {
    // The policy names no preset: it inherits the pool's, least-loaded.
    let mut bases = pools();
    bases[2].policy = routing::RoutePolicy::from(Policy::LeastLoaded);
    let doc = "apiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {name: kv, namespace: ml}\nspec:\n  targetRef: {pool: {name: code}}\n  action: {weights: {kvRoom: 1}}\n";
    let set = compile_text(&bases, doc);
    let kv = set
        .resolved
        .iter()
        .find(|(_, k, _)| k == "ml/kv")
        .expect("reported");
    assert_eq!(kv.2.status, "False");
    assert_eq!(kv.2.reason, "Invalid");
    assert!(kv.2.message.contains("kvRoom"), "{}", kv.2.message);
}

#[test]
fn a_cold_yield_refines_the_pools_policy_and_needs_a_preset_that_knows_kv_room() {
    // Pool `code` is precise; `chat-v2` ranks by requests.
    let mut bases = pools();
    bases[1].policy = routing::RoutePolicy::from(Policy::LeastLoaded);
    let doc = "apiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {name: off, namespace: ml}\nspec:\n  targetRef: {pool: {name: code}}\n  action: {coldYieldMs: 0}\n---\napiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {name: blind, namespace: ml}\nspec:\n  targetRef: {pool: {name: chat-v2}}\n  action: {coldYieldMs: 200}\n";
    let set = compile_text(&bases, doc);
    assert_eq!(status_of(&set, "ml/off").status, "True");
    let blind = status_of(&set, "ml/blind");
    assert_eq!(
        (blind.status.as_str(), blind.reason.as_str()),
        ("False", "Invalid")
    );
    assert!(blind.message.contains("coldYieldMs"), "{}", blind.message);
    // The precise pool's policy with the yield off, its weights the pool's.
    let none = Headers::default();
    let facts = RequestFacts {
        model: Some("coder"),
        path: "/v1/completions",
        headers: &none,
        tenant: "t",
    };
    let chosen = set.choose(2, &facts, || None);
    let policy = chosen.action.policy.expect("the action refines the policy");
    assert_eq!(policy.kind, Policy::Precise);
    assert_eq!(policy.cold_yield, std::time::Duration::ZERO);
    assert_eq!(policy.weights, Policy::Precise.weights());
}
