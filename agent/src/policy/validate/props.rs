//! Property test: every generated valid `RoutePolicy` and `Tenant` is accepted, and each one
//! mutated to be invalid in one field is rejected with that field's path. The generators
//! build valid values by construction (the rules of docs/policy.md, written here again), and
//! each mutation carries the path it breaks: neither comes from the validator.

use std::collections::{BTreeMap, BTreeSet};

use proptest::{collection, option, prelude::*, sample::select};

use super::validate;
use crate::policy::resources::*;

const SCORERS: &[&str] = &[
    "prefix", "queue", "kvUsage", "lora", "session", "inFlight", "history", "stall",
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
        (modes, option::of(any::<bool>())),
    )
        .prop_map(
            |(
                (preset, weights, tokens, session),
                (retries, timeouts, failure_mode, split),
                (mode, explain),
            )| {
                let mut weights: BTreeMap<String, f64> = weights
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                if preset == Some(Preset::RoundRobin) {
                    weights.clear();
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

/// One way to make a valid policy invalid in one field.
#[derive(Debug, Clone, Copy)]
enum RouteMutation {
    NegativeWeight(usize),
    NanWeight(usize),
    UnknownScorer,
    TwoTargets,
    NoTarget,
    ServicePortZero,
    BadPoolName,
    EmptySelector,
    BadLabelKey,
    BadHeaderName,
    HopByHopHeader,
    DuplicateHeader,
    PathWithoutSlash,
    BothPathKinds,
    DuplicateMatch,
    RetriesTooMany,
    TimeoutZero,
    TimeoutTooLong,
    SplitAllZero,
    SplitWeightTooLarge,
    SplitWayEmpty,
    HuggingfaceNoDir,
    BadSessionCookie,
    UppercaseName,
    WhitespaceModel,
}

const ROUTE_MUTATIONS: &[RouteMutation] = {
    use RouteMutation::*;
    &[
        NegativeWeight(0),
        NegativeWeight(5),
        NanWeight(2),
        UnknownScorer,
        TwoTargets,
        NoTarget,
        ServicePortZero,
        BadPoolName,
        EmptySelector,
        BadLabelKey,
        BadHeaderName,
        HopByHopHeader,
        DuplicateHeader,
        PathWithoutSlash,
        BothPathKinds,
        DuplicateMatch,
        RetriesTooMany,
        TimeoutZero,
        TimeoutTooLong,
        SplitAllZero,
        SplitWeightTooLarge,
        SplitWayEmpty,
        HuggingfaceNoDir,
        BadSessionCookie,
        UppercaseName,
        WhitespaceModel,
    ]
};

/// A match entry no generated one equals (its header name is not generated).
fn probe_match() -> Match {
    Match {
        headers: vec![HeaderMatch {
            name: "x-mutation-probe".into(),
            value: "1".into(),
        }],
        ..Match::default()
    }
}

impl RouteMutation {
    /// Breaks `p` and returns the path of the field broken.
    fn apply(self, p: &mut RoutePolicy) -> String {
        use RouteMutation::*;
        let s = &mut p.spec;
        let needs_request_path = matches!(
            self,
            BadHeaderName
                | HopByHopHeader
                | DuplicateHeader
                | PathWithoutSlash
                | BothPathKinds
                | DuplicateMatch
                | RetriesTooMany
                | TimeoutZero
                | TimeoutTooLong
                | SplitAllZero
                | SplitWeightTooLarge
                | SplitWayEmpty
                | HuggingfaceNoDir
                | BadSessionCookie
                | WhitespaceModel
        );
        if needs_request_path && s.action.mode == Some(DataPathMode::Steer) {
            // A steered policy is valid as a proxied one; these fields exist only there.
            s.action.mode = Some(DataPathMode::Proxy);
        }
        // Weights are broken under a preset that takes any weights with any token source.
        let weights_ok = !matches!(s.action.preset, Some(Preset::RoundRobin))
            && !s
                .action
                .tokens
                .as_ref()
                .is_some_and(|t| t.source == TokenSourceKind::Approximate);
        match self {
            NegativeWeight(i) | NanWeight(i) => {
                if !weights_ok {
                    s.action.preset = Some(Preset::Approximate);
                }
                let name = SCORERS[i % SCORERS.len()];
                // Replace whatever weight names the same scorer.
                s.action.weights.retain(|k, _| k != name);
                let w = if matches!(self, NanWeight(_)) {
                    f64::NAN
                } else {
                    -0.5
                };
                s.action.weights.insert(name.into(), w);
                format!("spec.action.weights.{name}")
            }
            UnknownScorer => {
                if !weights_ok {
                    s.action.preset = Some(Preset::Approximate);
                }
                s.action.weights.insert("speed".into(), 1.0);
                "spec.action.weights.speed".into()
            }
            TwoTargets => {
                if s.target_ref.service.is_some() {
                    s.target_ref.pool = Some(PoolRef {
                        group: "inference.networking.k8s.io".into(),
                        kind: "InferencePool".into(),
                        name: "extra".into(),
                    });
                } else {
                    s.target_ref.service = Some(ServiceRef {
                        name: "extra".into(),
                        port: 80,
                    });
                }
                "spec.targetRef".into()
            }
            NoTarget => {
                s.target_ref.pool = None;
                s.target_ref.service = None;
                s.target_ref.selector = None;
                "spec.targetRef".into()
            }
            ServicePortZero => {
                s.target_ref = TargetRef {
                    service: Some(ServiceRef {
                        name: "llm".into(),
                        port: 0,
                    }),
                    models: std::mem::take(&mut s.target_ref.models),
                    ..TargetRef::default()
                };
                "spec.targetRef.service.port".into()
            }
            BadPoolName => {
                s.target_ref = TargetRef {
                    pool: Some(PoolRef {
                        group: "inference.networking.k8s.io".into(),
                        kind: "InferencePool".into(),
                        name: "Chat_Pool".into(),
                    }),
                    models: std::mem::take(&mut s.target_ref.models),
                    ..TargetRef::default()
                };
                "spec.targetRef.pool.name".into()
            }
            EmptySelector | BadLabelKey => {
                let mut match_labels = BTreeMap::new();
                let path = if matches!(self, BadLabelKey) {
                    match_labels.insert("bad key!".to_string(), "x".to_string());
                    "spec.targetRef.selector.matchLabels.bad key!"
                } else {
                    "spec.targetRef.selector.matchLabels"
                };
                s.target_ref = TargetRef {
                    selector: Some(LabelSelector { match_labels }),
                    models: std::mem::take(&mut s.target_ref.models),
                    ..TargetRef::default()
                };
                path.into()
            }
            BadHeaderName | HopByHopHeader | DuplicateHeader => {
                let mut m = probe_match();
                let name = match self {
                    BadHeaderName => "x bad",
                    HopByHopHeader => "Keep-Alive",
                    _ => "X-Mutation-Probe",
                };
                m.headers.push(HeaderMatch {
                    name: name.into(),
                    value: "2".into(),
                });
                s.matches.push(m);
                format!("spec.matches[{}].headers[1].name", s.matches.len() - 1)
            }
            PathWithoutSlash | BothPathKinds => {
                let mut m = probe_match();
                m.path = Some(if matches!(self, PathWithoutSlash) {
                    PathMatch {
                        prefix: Some("v1".into()),
                        exact: None,
                    }
                } else {
                    PathMatch {
                        prefix: Some("/v1".into()),
                        exact: Some("/v1".into()),
                    }
                });
                s.matches.push(m);
                let at = format!("spec.matches[{}].path", s.matches.len() - 1);
                if matches!(self, PathWithoutSlash) {
                    format!("{at}.prefix")
                } else {
                    at
                }
            }
            DuplicateMatch => {
                let mut copy = s.matches.first().cloned().unwrap_or_else(probe_match);
                if s.matches.is_empty() {
                    s.matches.push(copy.clone());
                }
                // The same conditions in another order.
                copy.models.reverse();
                copy.headers.reverse();
                copy.tenants.reverse();
                s.matches.push(copy);
                format!("spec.matches[{}]", s.matches.len() - 1)
            }
            RetriesTooMany => {
                s.action.retries = Some(17);
                "spec.action.retries".into()
            }
            TimeoutZero | TimeoutTooLong => {
                let ms = if matches!(self, TimeoutZero) {
                    0
                } else {
                    3_600_001
                };
                s.action
                    .timeouts
                    .get_or_insert_with(Timeouts::default)
                    .upstream_idle_ms = Some(ms);
                "spec.action.timeouts.upstreamIdleMs".into()
            }
            SplitAllZero => {
                if s.action.split.is_empty() {
                    s.action.split.push(SplitTarget {
                        pool: Some("main".into()),
                        model: None,
                        weight: 0,
                    });
                }
                for w in &mut s.action.split {
                    w.weight = 0;
                }
                "spec.action.split".into()
            }
            SplitWeightTooLarge | SplitWayEmpty => {
                if s.action.split.len() >= super::MAX_SPLIT {
                    s.action.split.pop();
                }
                let empty = matches!(self, SplitWayEmpty);
                s.action.split.push(SplitTarget {
                    pool: (!empty).then(|| "mutation-probe-pool".into()),
                    model: None,
                    weight: if empty { 1 } else { 10_001 },
                });
                let at = format!("spec.action.split[{}]", s.action.split.len() - 1);
                if empty { at } else { format!("{at}.weight") }
            }
            HuggingfaceNoDir => {
                s.action.tokens = Some(TokenSpec {
                    source: TokenSourceKind::Huggingface,
                    dir: None,
                });
                "spec.action.tokens.dir".into()
            }
            BadSessionCookie => {
                s.action
                    .session
                    .get_or_insert_with(SessionSpec::default)
                    .cookie = Some("sid=1".into());
                "spec.action.session.cookie".into()
            }
            UppercaseName => {
                p.metadata.name = Some("Canary".into());
                "metadata.name".into()
            }
            WhitespaceModel => {
                s.target_ref.models.push("llama 3".into());
                format!("spec.targetRef.models[{}]", s.target_ref.models.len() - 1)
            }
        }
    }
}

/// One way to make a valid tenant invalid in one field.
#[derive(Debug, Clone, Copy)]
enum TenantMutation {
    RateWithoutUnit,
    RateUnknownUnit,
    NegativeRate,
    ZeroRate,
    BadCidr,
    HostBits,
    DuplicateCidr,
    BadHeaderSource,
    PriorityTooHigh,
    WeightZero,
    BurstTooLong,
    NoConcurrentStreams,
    BadServiceAccount,
    BadNamespace,
    ReservedName,
    UppercaseName,
    Namespaced,
}

const TENANT_MUTATIONS: &[TenantMutation] = {
    use TenantMutation::*;
    &[
        RateWithoutUnit,
        RateUnknownUnit,
        NegativeRate,
        ZeroRate,
        BadCidr,
        HostBits,
        DuplicateCidr,
        BadHeaderSource,
        PriorityTooHigh,
        WeightZero,
        BurstTooLong,
        NoConcurrentStreams,
        BadServiceAccount,
        BadNamespace,
        ReservedName,
        UppercaseName,
        Namespaced,
    ]
};

impl TenantMutation {
    /// Breaks `t` and returns the path of the field broken.
    fn apply(self, t: &mut Tenant) -> String {
        use TenantMutation::*;
        let s = &mut t.spec;
        let id = &mut s.identity;
        match self {
            RateWithoutUnit | RateUnknownUnit | NegativeRate | ZeroRate => {
                let rate = match self {
                    RateWithoutUnit => "100",
                    RateUnknownUnit => "100/day",
                    NegativeRate => "-5/s",
                    _ => "0/s",
                };
                s.quotas.get_or_insert_with(Quotas::default).prompt_tokens = Some(rate.into());
                "spec.quotas.promptTokens".into()
            }
            BadCidr | HostBits | DuplicateCidr => {
                let cidr = match self {
                    BadCidr => "10.0.0.0/40".to_string(),
                    HostBits => "10.1.2.3/16".to_string(),
                    _ => {
                        if id.cidrs.is_empty() {
                            id.cidrs.push("192.0.2.0/24".into());
                        }
                        id.cidrs[0].clone()
                    }
                };
                id.cidrs.push(cidr);
                format!("spec.identity.cidrs[{}]", id.cidrs.len() - 1)
            }
            BadHeaderSource => {
                id.header_sources.insert(0, "gateway.local".into());
                "spec.identity.headerSources[0]".into()
            }
            PriorityTooHigh => {
                s.priority = 1001;
                "spec.priority".into()
            }
            WeightZero => {
                s.weight = 0;
                "spec.weight".into()
            }
            BurstTooLong => {
                s.quotas.get_or_insert_with(Quotas::default).burst_seconds = Some(60.5);
                "spec.quotas.burstSeconds".into()
            }
            NoConcurrentStreams => {
                s.quotas
                    .get_or_insert_with(Quotas::default)
                    .concurrent_streams = Some(0);
                "spec.quotas.concurrentStreams".into()
            }
            BadServiceAccount => {
                id.service_accounts.push("runner".into());
                format!(
                    "spec.identity.serviceAccounts[{}]",
                    id.service_accounts.len() - 1
                )
            }
            BadNamespace => {
                id.namespaces.push("Team_A".into());
                format!("spec.identity.namespaces[{}]", id.namespaces.len() - 1)
            }
            ReservedName | UppercaseName => {
                let name = if matches!(self, ReservedName) {
                    "other"
                } else {
                    "Team-A"
                };
                t.metadata.name = Some(name.into());
                "metadata.name".into()
            }
            Namespaced => {
                t.metadata.namespace = Some("ml".into());
                "metadata.namespace".into()
            }
        }
    }
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
