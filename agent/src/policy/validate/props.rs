//! Property test: every generated valid `RoutePolicy` and `Tenant` is accepted, and each one
//! mutated to be invalid in one field is rejected with that field's path. The generators
//! build valid values by construction (the rules of docs/policy.md, written here again), and
//! each mutation carries the path it breaks: neither comes from the validator.

use std::collections::{BTreeMap, BTreeSet};

use proptest::{collection, option, prelude::*, sample::select};

use super::validate;

mod mutations;

use crate::policy::resources::*;
use mutations::{ROUTE_MUTATIONS, TENANT_MUTATIONS};

const SCORERS: &[&str] = &[
    "prefix", "queue", "kvUsage", "lora", "session", "inFlight", "history", "stall", "kvRoom",
    "evict",
];

fn dns_label() -> impl Strategy<Value = String> {
    "[a-z]([a-z0-9-]{0,14}[a-z0-9])?"
}

fn model() -> impl Strategy<Value = String> {
    "[a-z0-9][a-zA-Z0-9._:/-]{0,20}"
}

fn models() -> impl Strategy<Value = Vec<String>> {
    collection::btree_set(model(), 0..4).prop_map(|s| s.into_iter().collect())
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    let key = "([a-z]{1,6}\\.[a-z]{2,4}/)?[a-zA-Z0-9]([a-zA-Z0-9._-]{0,10}[a-zA-Z0-9])?";
    let value = "([a-zA-Z0-9]([a-zA-Z0-9._-]{0,10}[a-zA-Z0-9])?)?";
    collection::btree_map(key, value, 1..4)
}

fn target() -> impl Strategy<Value = TargetRef> {
    let pool = (dns_label(), any::<bool>()).prop_map(|(name, x)| PoolRef {
        group: if x {
            "inference.networking.x-k8s.io"
        } else {
            "inference.networking.k8s.io"
        }
        .into(),
        kind: "InferencePool".into(),
        name,
    });
    let service = (dns_label(), 1..=u16::MAX).prop_map(|(name, port)| ServiceRef { name, port });
    let which = prop_oneof![
        pool.prop_map(|p| (Some(p), None, None)),
        service.prop_map(|s| (None, Some(s), None)),
        labels().prop_map(|match_labels| (None, None, Some(LabelSelector { match_labels }))),
    ];
    (which, models()).prop_map(|((pool, service, selector), models)| TargetRef {
        pool,
        service,
        selector,
        models,
    })
}

fn path_match() -> impl Strategy<Value = PathMatch> {
    ("/[a-z0-9/_.-]{0,20}", any::<bool>()).prop_map(|(p, exact)| PathMatch {
        exact: exact.then(|| p.clone()),
        prefix: (!exact).then_some(p),
    })
}

fn one_match() -> impl Strategy<Value = Match> {
    let headers = collection::btree_map("x-[a-z]{1,8}", "[a-zA-Z0-9 ._-]{0,12}", 0..3);
    let tenants = collection::btree_set("[a-z0-9][a-zA-Z0-9._:/-]{0,12}", 0..3);
    (models(), option::of(path_match()), headers, tenants).prop_map(
        |(models, path, headers, tenants)| Match {
            models,
            path,
            headers: headers
                .into_iter()
                .map(|(name, value)| HeaderMatch { name, value })
                .collect(),
            tenants: tenants.into_iter().collect(),
        },
    )
}

fn matches() -> impl Strategy<Value = Vec<Match>> {
    // Each condition list is sorted and unique, so entries are the same conditions exactly
    // when they are equal.
    collection::vec(one_match(), 0..4).prop_map(|list| {
        let mut out: Vec<Match> = Vec::new();
        for m in list {
            if !out.contains(&m) {
                out.push(m);
            }
        }
        out
    })
}

fn preset() -> impl Strategy<Value = Preset> {
    select(vec![
        Preset::Precise,
        Preset::Approximate,
        Preset::RoundRobin,
        Preset::LeastLoaded,
        Preset::Session,
    ])
}

fn split() -> impl Strategy<Value = Vec<SplitTarget>> {
    let way = (option::of(dns_label()), option::of(model()), 0..=10_000u32);
    collection::vec(way, 0..5).prop_map(|ways| {
        let mut out: Vec<SplitTarget> = Vec::new();
        for (pool, model, weight) in ways {
            let (pool, model) = match (pool, model) {
                (None, None) => (Some("main".to_string()), None),
                other => other,
            };
            if !out.iter().any(|w| w.pool == pool && w.model == model) {
                out.push(SplitTarget {
                    pool,
                    model,
                    weight,
                });
            }
        }
        if let Some(first) = out.first_mut() {
            first.weight = first.weight.max(1);
        }
        out
    })
}

fn action() -> impl Strategy<Value = Action> {
    let weights = collection::btree_map(select(SCORERS), 0.0..100.0f64, 0..4);
    let tokens = option::of(select(vec![
        TokenSourceKind::Builtin,
        TokenSourceKind::Huggingface,
        TokenSourceKind::Engine,
        TokenSourceKind::Approximate,
    ]));
    let session = option::of((option::of("x-[a-z]{1,8}"), option::of("[a-zA-Z0-9_]{1,8}")));
    let timeouts = option::of((option::of(1..=3_600_000u64), option::of(1..=3_600_000u64)));
    let modes = option::of(select(vec![DataPathMode::Proxy, DataPathMode::Steer]));
    let failure = option::of(select(vec![FailureMode::FailOpen, FailureMode::FailClosed]));
    (
        (option::of(preset()), weights, tokens, session),
        (option::of(0..=16u32), timeouts, failure, split()),
        (modes, option::of(any::<bool>()), option::of(0..=10_000u64)),
    )
        .prop_map(
            |(
                (preset, weights, tokens, session),
                (retries, timeouts, failure_mode, split),
                (mode, explain, cold_yield_ms),
            )| {
                let mut weights: BTreeMap<String, f64> = weights
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                if preset == Some(Preset::RoundRobin) {
                    weights.clear();
                }
                // The KV room wait and the evict charge are priced only by the presets that
                // rank in seconds.
                if matches!(preset, Some(Preset::LeastLoaded | Preset::Session)) {
                    weights.retain(|k, _| {
                        !matches!(k.as_str(), "kvRoom" | "kv-room" | "kv_room" | "evict")
                    });
                }
                let tokens = tokens.map(|source| TokenSpec {
                    source,
                    dir: (source == TokenSourceKind::Huggingface).then(|| "/models/m".into()),
                });
                // Approximate keys need a policy that does not weigh the KV index's prefixes.
                if tokens
                    .as_ref()
                    .is_some_and(|t| t.source == TokenSourceKind::Approximate)
                    && !matches!(preset, Some(Preset::Approximate | Preset::RoundRobin))
                {
                    weights.insert("prefix".into(), 0.0);
                }
                Action {
                    preset,
                    weights,
                    // Only the presets that know each pod's KV room take a yield.
                    cold_yield_ms: cold_yield_ms.filter(|_| {
                        !matches!(
                            preset,
                            Some(Preset::LeastLoaded | Preset::Session | Preset::RoundRobin)
                        )
                    }),
                    tokens,
                    session: session.map(|(header, cookie)| SessionSpec { header, cookie }),
                    retries,
                    timeouts: timeouts.map(|(upstream_head_ms, upstream_idle_ms)| Timeouts {
                        upstream_head_ms,
                        upstream_idle_ms,
                    }),
                    failure_mode,
                    split,
                    mode,
                    explain,
                }
            },
        )
}

fn route_policy() -> impl Strategy<Value = RoutePolicy> {
    (
        "[a-z]([a-z0-9.-]{0,20}[a-z0-9])?".prop_filter("no empty part between dots", |n| {
            !n.contains("..") && !n.contains(".-") && !n.contains("-.")
        }),
        option::of(dns_label()),
        target(),
        matches(),
        action(),
    )
        .prop_map(
            |(name, namespace, mut target_ref, mut matches, mut action)| {
                if action.mode == Some(DataPathMode::Steer) {
                    // A steered policy has nothing decided per request.
                    matches.clear();
                    target_ref.models.clear();
                    action.split.clear();
                    action.tokens = None;
                    action.session = None;
                    action.retries = None;
                    action.timeouts = None;
                    action.explain = action.explain.filter(|e| !e);
                }
                let mut p = RoutePolicy::new(
                    &name,
                    RoutePolicySpec {
                        target_ref,
                        matches,
                        action,
                    },
                );
                p.metadata.namespace = namespace;
                p
            },
        )
}

/// A network without host bits, written as a CIDR or (a host) as an address.
fn net() -> impl Strategy<Value = String> {
    let v4 = (any::<u32>(), 0..=32u8).prop_map(|(a, len)| {
        let n = ipnet::Ipv4Net::new(a.into(), len)
            .expect("prefix <= 32")
            .trunc();
        if len == 32 {
            n.addr().to_string()
        } else {
            n.to_string()
        }
    });
    let v6 = (0xfc00..=0xfdffu16, any::<u64>(), 8..=128u8).prop_map(|(hi, lo, len)| {
        let addr = std::net::Ipv6Addr::new(hi, 0, 0, 0, 0, 0, (lo >> 16) as u16, lo as u16);
        ipnet::Ipv6Net::new(addr, len)
            .expect("prefix <= 128")
            .trunc()
            .to_string()
    });
    prop_oneof![v4, v6]
}

fn nets() -> impl Strategy<Value = Vec<String>> {
    collection::vec(net(), 0..4).prop_map(|list| {
        let mut out: Vec<String> = Vec::new();
        let mut seen = BTreeSet::new();
        for s in list {
            let n = crate::tenant::parse_net(&s).expect("generated nets parse");
            if seen.insert(n) {
                out.push(s);
            }
        }
        out
    })
}

fn rate() -> impl Strategy<Value = String> {
    (
        1..1_000_000u32,
        option::of(0..100u32),
        select(vec!["s", "min", "h"]),
    )
        .prop_map(|(n, frac, unit)| match frac {
            Some(f) => format!("{n}.{f:02}/{unit}"),
            None => format!("{n}/{unit}"),
        })
}

fn tenant() -> impl Strategy<Value = Tenant> {
    let name = "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?".prop_filter("reserved", |n| n != "other");
    let identity = (
        collection::btree_set(dns_label(), 0..3),
        collection::btree_set((dns_label(), dns_label()), 0..3),
        option::of(labels()),
        nets(),
        nets(),
    )
        .prop_map(
            |(namespaces, accounts, pod_labels, cidrs, header_sources)| Identity {
                namespaces: namespaces.into_iter().collect(),
                service_accounts: accounts
                    .into_iter()
                    .map(|(n, s)| format!("{n}/{s}"))
                    .collect(),
                pod_labels: pod_labels.map(|match_labels| LabelSelector { match_labels }),
                cidrs,
                header_sources,
            },
        );
    let quotas = option::of((
        option::of(rate()),
        option::of(rate()),
        option::of(rate()),
        option::of(1..=100_000u32),
        option::of(5..=6000u32),
    ))
    .prop_map(|q| {
        q.map(
            |(requests, prompt_tokens, output_tokens, concurrent_streams, burst)| Quotas {
                requests,
                prompt_tokens,
                output_tokens,
                concurrent_streams,
                burst_seconds: burst.map(|hundredths| f64::from(hundredths) / 100.0),
            },
        )
    });
    (
        name,
        identity,
        -1000..=1000i32,
        1..=1000u32,
        quotas,
        any::<bool>(),
    )
        .prop_map(|(name, identity, priority, weight, quotas, isolated)| {
            Tenant::new(
                &name,
                TenantSpec {
                    identity,
                    priority,
                    weight,
                    quotas,
                    cache_isolation: if isolated {
                        CacheIsolation::Isolated
                    } else {
                        CacheIsolation::Shared
                    },
                },
            )
        })
}

/// Every error of `r` is at `path`, and there is one.
fn rejected_at(r: &Resource, path: &str) -> Result<(), TestCaseError> {
    let errors = validate(r);
    prop_assert!(!errors.is_empty(), "accepted after breaking {path}: {r:?}");
    for e in &errors {
        prop_assert_eq!(&e.path, path, "{} (all: {:?})", e, errors);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn generated_policies_are_accepted_and_each_mutation_rejected_at_its_path(
        p in route_policy(),
        m in select(ROUTE_MUTATIONS),
    ) {
        let valid = Resource::RoutePolicy(p.clone());
        prop_assert_eq!(validate(&valid), vec![], "{:?}", valid);
        let mut broken = p;
        let path = m.apply(&mut broken);
        rejected_at(&Resource::RoutePolicy(broken), &path)?;
    }

    #[test]
    fn generated_tenants_are_accepted_and_each_mutation_rejected_at_its_path(
        t in tenant(),
        m in select(TENANT_MUTATIONS),
    ) {
        let valid = Resource::Tenant(t.clone());
        prop_assert_eq!(validate(&valid), vec![], "{:?}", valid);
        let mut broken = t;
        let path = m.apply(&mut broken);
        rejected_at(&Resource::Tenant(broken), &path)?;
    }
}
