//! The policy the data path reads: accepted resources compiled with the agent's own
//! configuration into one immutable [`PolicySet`] — per pool, its rules best first; per
//! tenant, its identity, priority, weight, quotas and cache isolation. A request reads the
//! current set once ([`super::PolicyStore::current`]) and asks it for its tenant and its
//! action; nothing here is written per request except the split cursors.
//!
//! Precedence (docs/policy.md): of the policies whose target selects the request's pool
//! (and names its model, when it names models) and one of whose matches holds, the most
//! specific wins: a pool or Service reference before a selector; then the matched entry's
//! specificity (condition kinds set, exact path before prefix, longer prefix, more
//! headers); then namespace/name in alphabetical order. The pool's configuration (file or
//! flags) is the lowest-precedence policy: unset action fields fall back to it.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use super::quota::QuotaLimits;
use super::resources::{self, Condition, DataPathMode, FailureMode, Resource, RoutePolicy};
use crate::{
    http::Headers,
    routing::{self, Policy, SessionSource},
    tenant::{TenantPolicy, WorkloadSelectors, Workloads},
};

/// Ways of a split at most.
pub const MAX_SPLIT_WAYS: usize = 16;

/// A token source a policy chose (the proxy makes its own token source from it).
#[derive(Debug, Clone)]
pub enum Tokens {
    /// An in-process tokenizer (the built-in one, or a HuggingFace directory's).
    Local(Arc<warmpath_tokenizer::segments::SegmentTokenizer>),
    /// The engine's `POST /tokenize`.
    Engine,
    /// Character chunks (the approximate preset's history only).
    Approximate,
}

/// What the agent's configuration says about one pool: what policies are matched against
/// and refine.
#[derive(Debug, Clone)]
pub struct PoolBase {
    pub name: String,
    pub model: String,
    /// What a policy's `targetRef` names the pool by, besides its name.
    pub targets: PoolTargets,
    /// The pool's configured preset and weights (what `weights` without a `preset` refine).
    pub policy: routing::RoutePolicy,
}

/// What is done with a request: the winning policy's fields; `None` keeps the pool's or
/// the agent's configuration (read at request time, so the configuration is the base).
#[derive(Debug, Clone)]
pub struct Action {
    /// `namespace/name@generation` of the policy (`@generation` when known), or
    /// `pool/<name>` for the pool's own configuration.
    pub source: Arc<str>,
    pub policy: Option<routing::RoutePolicy>,
    pub tokens: Option<Tokens>,
    pub session: Option<SessionSource>,
    pub retries: Option<usize>,
    pub head_timeout: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    pub failure: FailureMode,
    pub split: Option<Arc<Split>>,
    pub mode: DataPathMode,
    pub explain: Option<bool>,
}

impl Action {
    /// The pool's own configuration.
    pub fn base(pool: &str) -> Self {
        Self {
            source: Arc::from(format!("pool/{pool}")),
            policy: None,
            tokens: None,
            session: None,
            retries: None,
            head_timeout: None,
            idle_timeout: None,
            failure: FailureMode::FailOpen,
            split: None,
            mode: DataPathMode::Proxy,
            explain: None,
        }
    }
}

/// A weighted split across pools or model names.
#[derive(Debug)]
pub struct Split {
    pub ways: Vec<Way>,
    total: u64,
    /// Coprime with `total`: successive requests visit every position of a cycle once, so
    /// each way gets exactly its share per cycle, interleaved.
    stride: u64,
    cursor: AtomicU64,
}

/// One way of a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Way {
    /// Index of the pool in the proxy.
    pub pool: usize,
    /// The model name the request is rewritten to.
    pub model: Option<Arc<str>>,
    pub weight: u32,
}

impl Split {
    fn new(ways: Vec<Way>) -> Option<Self> {
        let total: u64 = ways.iter().map(|w| u64::from(w.weight)).sum();
        if total == 0 {
            return None;
        }
        let mut stride = (total * 618 / 1000).max(1);
        while gcd(stride, total) != 1 {
            stride += 1;
        }
        Some(Self {
            ways,
            total,
            stride,
            cursor: AtomicU64::new(0),
        })
    }

    /// The way of a request: fixed per session key, else the next in the interleaved cycle.
    pub fn pick(&self, session: Option<&str>) -> &Way {
        let pos = match session {
            Some(key) => xxhash_rust::xxh3::xxh3_64(key.as_bytes()) % self.total,
            None => {
                let n = self.cursor.fetch_add(1, Ordering::Relaxed);
                (n % self.total) * self.stride % self.total
            }
        };
        let mut acc = 0;
        for w in &self.ways {
            acc += u64::from(w.weight);
            if pos < acc {
                return w;
            }
        }
        // Unreachable (pos < total = the sum); the last way is still a valid answer.
        &self.ways[self.ways.len() - 1]
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A tenant as the data path sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantRule {
    pub name: Arc<str>,
    pub priority: i32,
    pub weight: u32,
    /// `None`: no quota.
    pub quotas: Option<QuotaLimits>,
    pub isolated: bool,
}

impl TenantRule {
    fn unlisted(name: Arc<str>) -> Self {
        Self {
            name,
            priority: 0,
            weight: 1,
            quotas: None,
            isolated: false,
        }
    }
}

/// What a request offers the matcher.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The model the request names (`None` on pass-through paths).
    pub model: Option<&'a str>,
    pub path: &'a str,
    pub headers: &'a Headers,
    pub tenant: &'a str,
}

#[derive(Debug, Clone)]
struct Matcher {
    models: Vec<String>,
    path: Option<PathCond>,
    headers: Vec<(http::HeaderName, Vec<u8>)>,
    tenants: Vec<String>,
}

#[derive(Debug, Clone)]
enum PathCond {
    Exact(String),
    Prefix(String),
}

impl Matcher {
    fn from_spec(m: &resources::Match) -> Result<Self, String> {
        let path = match &m.path {
            None => None,
            Some(p) => match (&p.exact, &p.prefix) {
                (Some(e), None) => Some(PathCond::Exact(e.clone())),
                (None, Some(pre)) => Some(PathCond::Prefix(pre.trim_end_matches('/').to_string())),
                _ => return Err("path: exactly one of exact or prefix".into()),
            },
        };
        let headers = m
            .headers
            .iter()
            .map(|h| {
                http::HeaderName::from_bytes(h.name.as_bytes())
                    .map(|n| (n, h.value.as_bytes().to_vec()))
                    .map_err(|_| format!("headers: `{}` is not a header name", h.name))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            models: m.models.clone(),
            path,
            headers,
            tenants: m.tenants.clone(),
        })
    }

    fn always() -> Self {
        Self {
            models: Vec::new(),
            path: None,
            headers: Vec::new(),
            tenants: Vec::new(),
        }
    }

    fn holds(&self, f: &RequestFacts<'_>) -> bool {
        (self.models.is_empty() || f.model.is_some_and(|m| self.models.iter().any(|x| x == m)))
            && self.path.as_ref().is_none_or(|p| match p {
                PathCond::Exact(e) => f.path == e,
                PathCond::Prefix(pre) => {
                    f.path.starts_with(pre.as_str())
                        && matches!(f.path.as_bytes().get(pre.len()), None | Some(b'/'))
                }
            })
            && self
                .headers
                .iter()
                .all(|(n, v)| f.headers.get(n.as_str()) == Some(v.as_slice()))
            && (self.tenants.is_empty() || self.tenants.iter().any(|t| t == f.tenant))
    }

    /// Larger is more specific: condition kinds set, then exact path, longer prefix, more
    /// headers.
    fn specificity(&self) -> (u8, u8, usize, usize) {
        let kinds = u8::from(!self.models.is_empty())
            + u8::from(self.path.is_some())
            + u8::from(!self.headers.is_empty())
            + u8::from(!self.tenants.is_empty());
        let (exact, len) = match &self.path {
            Some(PathCond::Exact(e)) => (1, e.len()),
            Some(PathCond::Prefix(p)) => (0, p.len()),
            None => (0, 0),
        };
        (kinds, exact, len, self.headers.len())
    }
}

/// One (policy, match entry) pair, in precedence order within its pool.
#[derive(Debug, Clone)]
struct Rule {
    target_models: Vec<String>,
    matcher: Matcher,
    action: Arc<Action>,
}

impl Rule {
    /// Holds for every request of its pool.
    fn unconditional(&self) -> bool {
        self.target_models.is_empty() && self.matcher.specificity().0 == 0
    }

    fn holds(&self, f: &RequestFacts<'_>) -> bool {
        (self.target_models.is_empty()
            || f.model
                .is_some_and(|m| self.target_models.iter().any(|x| x == m)))
            && self.matcher.holds(f)
    }
}

#[derive(Debug)]
struct PoolRules {
    rules: Vec<Rule>,
    base: Arc<Action>,
}

/// Everything a request asks of policy, immutable once built.
#[derive(Debug)]
pub struct PolicySet {
    /// Increments with every set published.
    pub generation: u64,
    pools: Vec<PoolRules>,
    pub identity: TenantPolicy,
    tenants: HashMap<Arc<str>, Arc<TenantRule>>,
    /// Per object: the conditions compiling added (ResolvedRefs), by (kind, key).
    pub resolved: Vec<(&'static str, String, Condition)>,
    /// The tenants' workload selectors (what a [`Workloads`] directory is to match).
    pub workload_selectors: Arc<WorkloadSelectors>,
}

/// One request's action, and its pool after a split.
#[derive(Debug, Clone)]
pub struct Chosen {
    pub pool: usize,
    /// The model the request goes out with, when a split rewrote it.
    pub model: Option<Arc<str>>,
    pub action: Arc<Action>,
}

impl PolicySet {
    /// The action for a request to pool `pool`: the first rule that holds (precedence
    /// order), else the pool's configuration; a split of the winner is applied once and the
    /// target pool's own rules (without their splits) then decide, the action then named
    /// `split-source > target-source`. `session` gives the request's session key, asked only when a split needs it.
    pub fn choose(
        &self,
        pool: usize,
        facts: &RequestFacts<'_>,
        session: impl FnOnce() -> Option<String>,
    ) -> Chosen {
        let action = self.action(pool, facts);
        let Some(split) = action.split.clone() else {
            return Chosen {
                pool,
                model: None,
                action,
            };
        };
        let way = split.pick(session().as_deref());
        let model = way.model.clone();
        let facts = RequestFacts {
            model: model.as_deref().or(facts.model),
            ..*facts
        };
        let target = self.action(way.pool, &facts);
        // The target's action, without its split, named after both policies (explain
        // headers: `ns/split > ns/target`), explaining when either says so.
        let mut a = (*target).clone();
        a.split = None;
        if a.source != action.source {
            a.source = Arc::from(format!("{} > {}", action.source, a.source));
        }
        a.explain = a.explain.or(action.explain);
        let action = Arc::new(a);
        Chosen {
            pool: way.pool,
            model,
            action,
        }
    }

    /// How connections to pool `pool`'s intercepted VIPs are carried (docs/ebpf.md "Steer
    /// mode"): `Steer` when the rule that decides every request of the pool says so — the
    /// first in precedence order, holding for any request (a steer policy has no matches and
    /// names no model: validation) — else `Proxy`: a conditional rule ranked above it needs
    /// the agent to see each request.
    pub fn connection_mode(&self, pool: usize) -> DataPathMode {
        self.pools
            .get(pool)
            .and_then(|p| p.rules.first())
            .filter(|r| r.unconditional())
            .map_or(DataPathMode::Proxy, |r| r.action.mode)
    }

    fn action(&self, pool: usize, facts: &RequestFacts<'_>) -> Arc<Action> {
        let Some(p) = self.pools.get(pool) else {
            // A set compiled before the pool was added: its configuration alone.
            return Arc::new(Action::base("?"));
        };
        p.rules
            .iter()
            .find(|r| r.holds(facts))
            .map_or_else(|| p.base.clone(), |r| r.action.clone())
    }

    /// The tenant's rule (an unlisted tenant: priority 0, weight 1, no quota, shared).
    pub fn tenant(&self, name: &Arc<str>) -> Arc<TenantRule> {
        self.tenants
            .get(name)
            .cloned()
            .unwrap_or_else(|| Arc::new(TenantRule::unlisted(name.clone())))
    }

    /// The tenants declared by resources.
    pub fn tenants(&self) -> impl Iterator<Item = &Arc<TenantRule>> {
        self.tenants.values()
    }
}

/// What compiling needs besides the resources.
#[allow(missing_debug_implementations)]
pub struct CompileInput<'a> {
    pub pools: &'a [PoolBase],
    /// The configuration's tenant identity (CIDRs, trusted header sources, default).
    pub identity: &'a TenantPolicy,
    /// Token sources for `huggingface` directories, loaded once per directory.
    pub tokenizers: &'a mut dyn FnMut(&str) -> Result<Tokens, String>,
    /// The built-in tokenizer (loaded only when a policy asks for it).
    pub builtin: &'a dyn Fn() -> Tokens,
    /// On Kubernetes, client pods by address: the tenants' workload selectors are matched
    /// through it, before CIDRs. `None` off-cluster (workload selectors then name nobody).
    pub workloads: Option<&'a Arc<dyn Workloads>>,
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: String::new(),
    }
}

/// Compiles accepted resources over the pools' configuration. Objects whose references do
/// not resolve (no such pool, an unloadable tokenizer) get `ResolvedRefs: False` and do not
/// apply; the rest do.
pub fn compile(input: CompileInput<'_>, resources: &[Resource], generation: u64) -> PolicySet {
    let mut resolved = Vec::new();
    let mut per_pool: Vec<Vec<(RuleKey, Rule)>> = vec![Vec::new(); input.pools.len()];
    let mut tenant_resources = Vec::new();
    let CompileInput {
        pools,
        identity,
        tokenizers,
        builtin,
        workloads,
    } = input;
    for r in resources {
        match r {
            Resource::RoutePolicy(p) => {
                let key = r.key();
                match compile_policy(pools, p, &key, tokenizers, builtin) {
                    Ok(rules) => {
                        let n: std::collections::BTreeSet<usize> =
                            rules.iter().map(|(pool, _, _)| *pool).collect();
                        let names: Vec<&str> = n.iter().map(|&i| pools[i].name.as_str()).collect();
                        resolved.push((
                            "RoutePolicy",
                            key.clone(),
                            condition(
                                "ResolvedRefs",
                                true,
                                "ResolvedRefs",
                                format!("applies to pool(s) {}", names.join(", ")),
                                p.metadata.generation,
                            ),
                        ));
                        for (pool, rk, rule) in rules {
                            per_pool[pool].push((rk, rule));
                        }
                    }
                    Err((reason, message)) => resolved.push((
                        "RoutePolicy",
                        key,
                        condition(
                            "ResolvedRefs",
                            false,
                            reason,
                            message,
                            p.metadata.generation,
                        ),
                    )),
                }
            }
            Resource::Tenant(t) => tenant_resources.push(t),
        }
    }
    let pools_rules = per_pool
        .into_iter()
        .zip(pools)
        .map(|(mut rules, base)| {
            rules.sort_by(|a, b| b.0.cmp(&a.0));
            note_shadowed_steer(&base.name, &rules, &mut resolved);
            PoolRules {
                rules: rules.into_iter().map(|(_, r)| r).collect(),
                base: Arc::new(Action::base(&base.name)),
            }
        })
        .collect();
    let (identity, tenants, selectors) =
        tenants::compile_tenants(identity, &tenant_resources, workloads, &mut resolved);
    PolicySet {
        generation,
        pools: pools_rules,
        identity,
        tenants,
        resolved,
        workload_selectors: Arc::new(selectors),
    }
}

/// Sort key, larger first: target kind, match specificity, then name ascending.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RuleKey {
    target: u8,
    specificity: (u8, u8, usize, usize),
    name: std::cmp::Reverse<String>,
}

type Compiled = Vec<(usize, RuleKey, Rule)>;

fn compile_policy(
    pools: &[PoolBase],
    p: &RoutePolicy,
    key: &str,
    tokenizers: &mut dyn FnMut(&str) -> Result<Tokens, String>,
    builtin: &dyn Fn() -> Tokens,
) -> Result<Compiled, (&'static str, String)> {
    let t = &p.spec.target_ref;
    let namespace = p.metadata.namespace.as_deref().unwrap_or("default");
    let matching = |hit: &dyn Fn(&PoolBase) -> bool| -> Vec<usize> {
        pools
            .iter()
            .enumerate()
            .filter(|(_, b)| hit(b))
            .map(|(i, _)| i)
            .collect()
    };
    let (targets, target_rank): (Vec<usize>, u8) = match (&t.pool, &t.service, &t.selector) {
        (Some(pool), None, None) => (
            matching(&|b| b.targets.is_pool(&b.name, namespace, &pool.name)),
            1,
        ),
        (None, Some(svc), None) => (
            matching(&|b| b.targets.has_service(namespace, &svc.name, svc.port)),
            1,
        ),
        (None, None, Some(sel)) => (
            matching(&|b| b.targets.selected_by(namespace, &sel.match_labels)),
            0,
        ),
        _ => {
            return Err((
                "Invalid",
                "targetRef: exactly one of pool, service or selector".into(),
            ));
        }
    };
    if targets.is_empty() {
        return Err((
            "PoolNotFound",
            "targetRef selects no pool of this agent".into(),
        ));
    }
    let matchers = if p.spec.matches.is_empty() {
        vec![Matcher::always()]
    } else {
        p.spec
            .matches
            .iter()
            .map(Matcher::from_spec)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|m| ("Invalid", m))?
    };
    let mut out = Vec::new();
    for &pool in &targets {
        let source = match p.metadata.generation {
            Some(g) => format!("{key}@{g}"),
            None => key.to_string(),
        };
        let action = Arc::new(refine(
            pools,
            pool,
            &p.spec.action,
            &source,
            tokenizers,
            builtin,
        )?);
        for m in &matchers {
            out.push((
                pool,
                RuleKey {
                    target: target_rank,
                    specificity: m.specificity(),
                    name: std::cmp::Reverse(key.to_string()),
                },
                Rule {
                    target_models: t.models.clone(),
                    matcher: m.clone(),
                    action: action.clone(),
                },
            ));
        }
    }
    Ok(out)
}

/// The pool's base action with the policy's set fields over it.
fn refine(
    pools: &[PoolBase],
    pool: usize,
    a: &resources::Action,
    key: &str,
    tokenizers: &mut dyn FnMut(&str) -> Result<Tokens, String>,
    builtin: &dyn Fn() -> Tokens,
) -> Result<Action, (&'static str, String)> {
    let mut out = Action::base(&pools[pool].name);
    out.source = Arc::from(key);
    let mut policy = pools[pool].policy;
    if let Some(preset) = a.preset {
        policy = routing::RoutePolicy::from(Policy::from(preset));
    }
    for (name, value) in &a.weights {
        policy
            .weights
            .set(name, *value)
            .map_err(|e| ("Invalid", format!("action.weights: {e}")))?;
    }
    if matches!(
        policy.kind,
        routing::Policy::LeastLoaded | routing::Policy::Session
    ) && let Some((name, what)) = policy.weights.priced_in_seconds()
    {
        // Validation refuses it with an explicit preset; here the preset is the pool's.
        return Err((
            "Invalid",
            format!(
                "action.weights.{name}: {what} is priced only by presets precise and approximate (in seconds), and this policy's preset ranks by requests"
            ),
        ));
    }
    if let Some(ms) = a.cold_yield_ms {
        // Validation checks it against the preset the action names; here the preset may be
        // the pool's.
        policy.cold_yield = routing::cold_yield::check(policy.kind, ms)
            .map_err(|e| ("Invalid", format!("action.coldYieldMs: {e}")))?;
    }
    if a.preset.is_some() || !a.weights.is_empty() || a.cold_yield_ms.is_some() {
        out.policy = Some(policy);
    }
    if let Some(t) = &a.tokens {
        out.tokens = Some(match t.source {
            resources::TokenSourceKind::Builtin => builtin(),
            resources::TokenSourceKind::Engine => Tokens::Engine,
            resources::TokenSourceKind::Approximate => Tokens::Approximate,
            resources::TokenSourceKind::Huggingface => {
                let dir = t.dir.as_deref().ok_or((
                    "Invalid",
                    "action.tokens.dir: needed with source huggingface".to_string(),
                ))?;
                tokenizers(dir)
                    .map_err(|e| ("TokenizerNotFound", format!("action.tokens.dir: {e}")))?
            }
        });
    }
    if let Some(s) = &a.session {
        let mut src = SessionSource::default();
        if let Some(h) = &s.header {
            src.header = http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                (
                    "Invalid",
                    format!("action.session.header: `{h}` is not a header name"),
                )
            })?;
        }
        src.cookie = s.cookie.clone();
        out.session = Some(src);
    }
    out.retries = a.retries.map(|r| r as usize);
    if let Some(t) = &a.timeouts {
        out.head_timeout = t.upstream_head_ms.map(Duration::from_millis);
        out.idle_timeout = t.upstream_idle_ms.map(Duration::from_millis);
    }
    if let Some(f) = a.failure_mode {
        out.failure = f;
    }
    if let Some(m) = a.mode {
        out.mode = m;
    }
    out.explain = a.explain;
    if !a.split.is_empty() {
        let mut ways = Vec::new();
        for (i, w) in a.split.iter().take(MAX_SPLIT_WAYS).enumerate() {
            let target = match &w.pool {
                None => pool,
                Some(name) => pools.iter().position(|b| &b.name == name).ok_or((
                    "PoolNotFound",
                    format!("action.split[{i}].pool: no pool `{name}` on this agent"),
                ))?,
            };
            ways.push(Way {
                pool: target,
                model: w.model.as_deref().map(Arc::from),
                weight: w.weight,
            });
        }
        out.split = Split::new(ways).map(Arc::new);
        if out.split.is_none() {
            return Err(("Invalid", "action.split: the weights sum to 0".into()));
        }
    }
    Ok(out)
}

mod targets;
mod tenants;
pub use targets::PoolTargets;
use targets::note_shadowed_steer;

#[cfg(test)]
mod tests;
