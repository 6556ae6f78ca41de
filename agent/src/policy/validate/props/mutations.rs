//! Mutations: each makes a valid resource invalid in exactly one field and names that
//! field's path.

use std::collections::BTreeMap;

use super::SCORERS;
use crate::policy::resources::*;

/// One way to make a valid policy invalid in one field.
#[derive(Debug, Clone, Copy)]
pub(super) enum RouteMutation {
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

pub(super) const ROUTE_MUTATIONS: &[RouteMutation] = {
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
    pub(super) fn apply(self, p: &mut RoutePolicy) -> String {
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
                if s.action.split.len() >= crate::policy::validate::MAX_SPLIT {
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
pub(super) enum TenantMutation {
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

pub(super) const TENANT_MUTATIONS: &[TenantMutation] = {
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
    pub(super) fn apply(self, t: &mut Tenant) -> String {
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
