//! What a policy's `targetRef` names a pool by ([`PoolTargets`]), and the note a steer policy
//! that does not decide its pool's connections gets.

use std::collections::BTreeMap;

use super::{Condition, DataPathMode, Rule, RuleKey};

/// What a `RoutePolicy`'s `targetRef` can name a pool by (docs/policy.md "Targets").
/// Off-cluster: the file's `pools[].name`, `labels` and `services`. On Kubernetes also the
/// `InferencePool` the pool follows, the labels every one of its pods carries (its
/// `selector`), and the Services `kubernetes.intercept` sends to it — each in its namespace,
/// so a policy names them from that namespace only.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolTargets {
    /// Labels a `selector` target matches: the file's `pools[].labels`, and on Kubernetes
    /// the pool's own `selector.matchLabels` (every member carries them).
    pub labels: BTreeMap<String, String>,
    /// The namespace of the pool's pods (Kubernetes); a selector target must be in it.
    pub namespace: Option<String>,
    /// The `InferencePool` (namespace, name) the pool follows: a `pool` target names it
    /// instead of the file's pool name.
    pub inference_pool: Option<(String, String)>,
    /// Services a `service` target matches: (namespace, name, port); no namespace (the
    /// file's `pools[].services`) matches a policy in any namespace.
    pub services: Vec<(Option<String>, String, u16)>,
}

impl PoolTargets {
    /// Whether `targetRef.pool` named `name` from `namespace` is this pool (called `own`).
    pub(super) fn is_pool(&self, own: &str, namespace: &str, name: &str) -> bool {
        match &self.inference_pool {
            Some((ns, ip)) => ns == namespace && ip == name,
            None => own == name,
        }
    }

    pub(super) fn has_service(&self, namespace: &str, name: &str, port: u16) -> bool {
        self.services.iter().any(|(ns, n, p)| {
            n == name && *p == port && ns.as_deref().is_none_or(|ns| ns == namespace)
        })
    }

    pub(super) fn selected_by(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        !labels.is_empty()
            && self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && labels.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// A steer policy that does not decide its pool's connections (another policy that does not
/// steer ranks above it) says so in its `ResolvedRefs` message.
pub(super) fn note_shadowed_steer(
    pool: &str,
    rules: &[(RuleKey, Rule)],
    resolved: &mut [(&'static str, String, Condition)],
) {
    let Some((first, decider)) = rules.first() else {
        return;
    };
    if decider.unconditional() && decider.action.mode == DataPathMode::Steer {
        return;
    }
    for (key, rule) in &rules[1..] {
        if rule.action.mode != DataPathMode::Steer || key.name == first.name {
            continue;
        }
        let name = &key.name.0;
        if let Some((_, _, c)) = resolved
            .iter_mut()
            .find(|(kind, k, _)| *kind == "RoutePolicy" && k == name)
        {
            c.message.push_str(&format!(
                "; pool {pool}: connections proxied, not steered ({} takes precedence)",
                first.name.0
            ));
        }
    }
}
