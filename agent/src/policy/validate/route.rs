//! A `RoutePolicy`'s own checks: target, matches, action, and what `mode: steer` excludes.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Errors, MAX_MATCHES, MAX_RETRIES, MAX_SPLIT, MAX_SPLIT_WEIGHT, MAX_TIMEOUT_MS, names,
    names_once,
};
use crate::{
    policy::resources::{
        Action, DataPathMode, HeaderMatch, Match, PathMatch, Preset, RoutePolicy, RoutePolicySpec,
        SessionSpec, SplitTarget, TargetRef, TokenSourceKind, TokenSpec,
    },
    routing::{Policy, Weights},
};

/// The API groups of the Gateway API Inference Extension's `InferencePool` (stable, then
/// the experimental one earlier releases used).
const POOL_GROUPS: &[&str] = &[
    "inference.networking.k8s.io",
    "inference.networking.x-k8s.io",
];
/// The only kind a pool reference may name.
const POOL_KIND: &str = "InferencePool";
/// Longest path condition.
const MAX_PATH: usize = 2048;

pub(super) fn check(p: &RoutePolicy, e: &mut Errors) {
    let name = p.metadata.name.as_deref().unwrap_or("");
    e.check("metadata.name", name, names::dns_subdomain(name));
    if let Some(ns) = &p.metadata.namespace {
        e.check("metadata.namespace", ns, names::dns_label(ns));
    }
    target(&p.spec.target_ref, e);
    matches(&p.spec.matches, e);
    action(&p.spec.action, e);
    if p.spec.action.mode == Some(DataPathMode::Steer) {
        steer(&p.spec, e);
    }
}

fn target(t: &TargetRef, e: &mut Errors) {
    let set: Vec<&str> = [
        ("pool", t.pool.is_some()),
        ("service", t.service.is_some()),
        ("selector", t.selector.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    match set.len() {
        0 => e.push(
            "spec.targetRef",
            "",
            "none of pool, service or selector is set: exactly one says what the policy applies to",
        ),
        1 => {}
        _ => e.push(
            "spec.targetRef",
            set.join(", "),
            "exactly one of pool, service or selector may be set",
        ),
    }
    if let Some(pool) = &t.pool {
        e.check(
            "spec.targetRef.pool.name",
            &pool.name,
            names::dns_label(&pool.name),
        );
        if !POOL_GROUPS.contains(&pool.group.as_str()) {
            e.push(
                "spec.targetRef.pool.group",
                &pool.group,
                format!(
                    "expected {} (Gateway API Inference Extension)",
                    POOL_GROUPS.join(" or ")
                ),
            );
        }
        if pool.kind != POOL_KIND {
            e.push(
                "spec.targetRef.pool.kind",
                &pool.kind,
                format!("only {POOL_KIND} can be referenced"),
            );
        }
    }
    if let Some(s) = &t.service {
        e.check(
            "spec.targetRef.service.name",
            &s.name,
            names::dns_label(&s.name),
        );
        if s.port == 0 {
            e.push("spec.targetRef.service.port", s.port, "must be 1-65535");
        }
    }
    if let Some(sel) = &t.selector {
        super::selector(e, "spec.targetRef.selector", &sel.match_labels);
    }
    names_once(e, "spec.targetRef.models", &t.models, names::model_name);
}

fn matches(list: &[Match], e: &mut Errors) {
    if e.too_many("spec.matches", list.len(), MAX_MATCHES) {
        return;
    }
    let mut seen: Vec<NormalMatch> = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = format!("spec.matches[{i}]");
        names_once(e, &format!("{at}.models"), &m.models, names::model_name);
        if let Some(p) = &m.path {
            path_match(e, &at, p);
        }
        headers(e, &at, &m.headers);
        names_once(e, &format!("{at}.tenants"), &m.tenants, names::tenant_ref);
        let normal = NormalMatch::of(m);
        if let Some(first) = seen.iter().position(|x| *x == normal) {
            e.push(
                at,
                "",
                format!("identical to spec.matches[{first}] (the same conditions): remove one"),
            );
        }
        seen.push(normal);
    }
}

fn path_match(e: &mut Errors, at: &str, p: &PathMatch) {
    let url_path = |s: &str| {
        if !s.starts_with('/') {
            Err("must start with '/'".to_string())
        } else if s.len() > MAX_PATH {
            Err(format!("{} bytes: at most {MAX_PATH}", s.len()))
        } else if !s.bytes().all(|b| b.is_ascii_graphic()) {
            Err("must be visible ASCII without spaces (percent-encode the rest)".into())
        } else if s.contains(['?', '#']) {
            Err("a path has no query or fragment: '?' and '#' never match".into())
        } else {
            Ok(())
        }
    };
    match (&p.exact, &p.prefix) {
        (Some(_), Some(_)) => e.push(
            format!("{at}.path"),
            "exact, prefix",
            "exactly one of exact or prefix may be set",
        ),
        (None, None) => e.push(
            format!("{at}.path"),
            "",
            "neither exact nor prefix is set: exactly one is needed",
        ),
        (Some(x), None) => e.check(format!("{at}.path.exact"), x, url_path(x)),
        (None, Some(x)) => e.check(format!("{at}.path.prefix"), x, url_path(x)),
    }
}

fn headers(e: &mut Errors, at: &str, list: &[HeaderMatch]) {
    let path = format!("{at}.headers");
    if e.too_many(&path, list.len(), super::MAX_CONDITIONS) {
        return;
    }
    let mut seen: Vec<(usize, String)> = Vec::with_capacity(list.len());
    for (j, h) in list.iter().enumerate() {
        let name_at = format!("{path}[{j}].name");
        match names::header_name(&h.name) {
            Ok(lower) => {
                if let Some((first, _)) = seen.iter().find(|(_, n)| *n == lower) {
                    e.push(
                        name_at,
                        &h.name,
                        format!(
                            "also {path}[{first}].name: two conditions on one header conflict (for either of two values, write two match entries)"
                        ),
                    );
                }
                seen.push((j, lower));
            }
            Err(why) => e.push(name_at, &h.name, why),
        }
        e.check(
            format!("{path}[{j}].value"),
            &h.value,
            names::header_value(&h.value),
        );
    }
}

fn action(a: &Action, e: &mut Errors) {
    weights(a, e);
    if let Some(ms) = a.cold_yield_ms {
        // Against the preset the action names; the pool's own is checked when it compiles.
        let kind = a.preset.map_or(Policy::Precise, Policy::from);
        if let Err(why) = crate::routing::cold_yield::check(kind, ms) {
            e.push("spec.action.coldYieldMs", ms, why);
        }
    }
    if let Some(t) = &a.tokens {
        tokens(a, t, e);
    }
    if let Some(r) = a.retries
        && r > MAX_RETRIES
    {
        e.push(
            "spec.action.retries",
            r,
            format!("must be 0 to {MAX_RETRIES}"),
        );
    }
    if let Some(t) = &a.timeouts {
        for (key, ms) in [
            ("upstreamHeadMs", t.upstream_head_ms),
            ("upstreamIdleMs", t.upstream_idle_ms),
        ] {
            if let Some(ms) = ms
                && !(1..=MAX_TIMEOUT_MS).contains(&ms)
            {
                e.push(
                    format!("spec.action.timeouts.{key}"),
                    ms,
                    format!("must be 1 to {MAX_TIMEOUT_MS} (1 ms to 1 hour)"),
                );
            }
        }
    }
    split(&a.split, e);
    if let Some(s) = &a.session {
        session(s, e);
    }
}

/// The scorer `name` names, as weights with only that scorer at 1 (`None`: no scorer).
fn scorer_of(name: &str) -> Option<Weights> {
    let mut unit = Policy::RoundRobin.weights();
    unit.set(name, 1.0).ok().map(|()| unit)
}

fn weights(a: &Action, e: &mut Errors) {
    if a.preset == Some(Preset::RoundRobin) && !a.weights.is_empty() {
        let keys: Vec<&str> = a.weights.keys().map(String::as_str).collect();
        e.push(
            "spec.action.weights",
            keys.join(", "),
            "preset round-robin rotates over pods and uses no scorer weights: remove them or choose another preset",
        );
    }
    if matches!(a.preset, Some(Preset::LeastLoaded | Preset::Session)) {
        for (name, &value) in &a.weights {
            let priced = (value > 0.0)
                .then(|| scorer_of(name))
                .flatten()
                .and_then(|unit| unit.priced_in_seconds());
            if let Some((_, what)) = priced {
                e.push(
                    format!("spec.action.weights.{name}"),
                    value,
                    format!("{what} is priced only by presets precise and approximate (in seconds, from each pod's KV room; this preset ranks by requests): remove it or choose one of those"),
                );
            }
        }
    }
    let mut seen: Vec<(&str, Weights)> = Vec::with_capacity(a.weights.len());
    for (name, &value) in &a.weights {
        let at = format!("spec.action.weights.{name}");
        // The same check the pool configuration's weights get.
        if let Err(why) = Policy::RoundRobin.weights().set(name, value) {
            e.push(at, value, why);
            continue;
        }
        let Some(unit) = scorer_of(name) else {
            continue;
        };
        if let Some((first, _)) = seen.iter().find(|(_, u)| *u == unit) {
            e.push(
                at,
                value,
                format!("names the same scorer as weights.{first}: give it once"),
            );
        }
        seen.push((name, unit));
    }
}

/// The prefix weight the action itself determines: `weights.prefix` (any spelling), else
/// the preset's; `None` when it sets neither (the pool's preset then applies).
fn prefix_weight(a: &Action) -> Option<f64> {
    a.weights
        .iter()
        .find(|(name, _)| scorer_of(name).is_some_and(|u| u.prefix == 1.0))
        .map(|(_, &w)| w)
        .or_else(|| a.preset.map(|p| Policy::from(p).weights().prefix))
}

fn tokens(a: &Action, t: &TokenSpec, e: &mut Errors) {
    match (t.source, &t.dir) {
        (TokenSourceKind::Huggingface, None) => e.push(
            "spec.action.tokens.dir",
            "",
            "source huggingface needs the tokenizer directory (tokenizer.json, tokenizer_config.json)",
        ),
        (TokenSourceKind::Huggingface, Some(d)) if d.trim().is_empty() => {
            e.push("spec.action.tokens.dir", d, "must not be empty");
        }
        (TokenSourceKind::Huggingface, Some(_)) | (_, None) => {}
        (_, Some(d)) => e.push(
            "spec.action.tokens.dir",
            d,
            "only source huggingface takes a directory",
        ),
    }
    if t.source == TokenSourceKind::Approximate
        && a.preset != Some(Preset::Approximate)
        && prefix_weight(a) != Some(0.0)
    {
        let unknown = if a.preset.is_none() && prefix_weight(a).is_none() {
            " (with neither, the pool's preset applies, and it may weigh prefixes)"
        } else {
            ""
        };
        e.push(
            "spec.action.tokens.source",
            "approximate",
            format!(
                "approximate keys never match the KV event index: use preset approximate (routing history) or set weights.prefix to 0{unknown}"
            ),
        );
    }
}

fn split(ways: &[SplitTarget], e: &mut Errors) {
    if ways.is_empty() {
        return;
    }
    if e.too_many("spec.action.split", ways.len(), MAX_SPLIT) {
        return;
    }
    if ways.iter().all(|w| w.weight == 0) {
        e.push(
            "spec.action.split",
            "",
            "every way has weight 0: no request could take any (remove the split to route as usual)",
        );
    }
    for (i, w) in ways.iter().enumerate() {
        let at = format!("spec.action.split[{i}]");
        if w.weight > MAX_SPLIT_WEIGHT {
            e.push(
                format!("{at}.weight"),
                w.weight,
                format!("must be 0 to {MAX_SPLIT_WEIGHT}"),
            );
        }
        if let Some(p) = &w.pool {
            e.check(format!("{at}.pool"), p, names::dns_label(p));
        }
        if let Some(m) = &w.model {
            e.check(format!("{at}.model"), m, names::model_name(m));
        }
        if w.pool.is_none() && w.model.is_none() {
            e.push(
                at,
                "",
                "names neither a pool nor a model: say where this share goes (its own pool or model, to keep it where it is)",
            );
        } else if let Some(first) = ways[..i]
            .iter()
            .position(|x| x.pool == w.pool && x.model == w.model)
        {
            e.push(
                at,
                "",
                format!(
                    "the same pool and model as spec.action.split[{first}]: give one way with the weights added"
                ),
            );
        }
    }
}

fn session(s: &SessionSpec, e: &mut Errors) {
    if let Some(h) = &s.header {
        e.check("spec.action.session.header", h, names::header_name(h));
    }
    if let Some(c) = &s.cookie {
        e.check("spec.action.session.cookie", c, names::cookie_name(c));
    }
}

/// What a steered policy cannot have: everything decided per request.
fn steer(spec: &RoutePolicySpec, e: &mut Errors) {
    let a = &spec.action;
    let per_request = [
        ("spec.matches", !spec.matches.is_empty(), "matches"),
        (
            "spec.targetRef.models",
            !spec.target_ref.models.is_empty(),
            "a model condition",
        ),
        ("spec.action.split", !a.split.is_empty(), "a traffic split"),
        ("spec.action.tokens", a.tokens.is_some(), "a token source"),
        ("spec.action.session", a.session.is_some(), "a session key"),
        ("spec.action.retries", a.retries.is_some(), "retries"),
        (
            "spec.action.timeouts",
            a.timeouts.is_some(),
            "engine timeouts",
        ),
        (
            "spec.action.explain",
            a.explain == Some(true),
            "explain headers",
        ),
    ];
    for (path, set, what) in per_request {
        if set {
            e.push(
                path,
                "",
                format!(
                    "mode steer routes whole connections in the kernel, before any request is read: {what} cannot apply (use mode proxy)"
                ),
            );
        }
    }
}

// === impl NormalMatch ===

/// A match entry with order and header-name case made irrelevant: two entries are the
/// same conditions exactly when their normal forms are equal.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct NormalMatch {
    models: BTreeSet<String>,
    path: (Option<String>, Option<String>),
    headers: BTreeSet<(String, String)>,
    tenants: BTreeSet<String>,
}

impl NormalMatch {
    pub(super) fn of(m: &Match) -> Self {
        Self {
            models: m.models.iter().cloned().collect(),
            path: m
                .path
                .as_ref()
                .map_or((None, None), |p| (p.exact.clone(), p.prefix.clone())),
            headers: m
                .headers
                .iter()
                .map(|h| (h.name.to_ascii_lowercase(), h.value.clone()))
                .collect(),
            tenants: m.tenants.iter().cloned().collect(),
        }
    }
}

/// What a policy applies to, with the order of models made irrelevant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct NormalTarget {
    pool: Option<(String, String, String)>,
    service: Option<(String, u16)>,
    selector: Option<BTreeMap<String, String>>,
    models: BTreeSet<String>,
}

impl NormalTarget {
    pub(super) fn of(t: &TargetRef) -> Self {
        Self {
            pool: t
                .pool
                .as_ref()
                .map(|p| (p.group.clone(), p.kind.clone(), p.name.clone())),
            service: t.service.as_ref().map(|s| (s.name.clone(), s.port)),
            selector: t.selector.as_ref().map(|s| s.match_labels.clone()),
            models: t.models.iter().cloned().collect(),
        }
    }
}
