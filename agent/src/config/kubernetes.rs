//! The `kubernetes:` section of the configuration file and the pools' `inferencePool` /
//! `selector` members (docs/config.md, "Kubernetes"): whether the agent watches the cluster,
//! which namespaces, which Services it intercepts, and where each pool's pods come from.
//!
//! `enabled: auto` is resolved when the file is read: in-cluster (the
//! `KUBERNETES_SERVICE_HOST` variable and a service account token) or a `KUBECONFIG`
//! variable means on. The checks here that need other sections (a pool's namespace among the
//! watched ones, an intercepted Service's pool defined) run from [`super::Config::validate`].

use std::{collections::BTreeMap, fmt};

use serde::{Deserialize, Deserializer, de};

use super::{Config, ConfigError};

/// Where a pod's service account token is mounted (in-cluster detection).
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// The variable the node name comes from when `nodeName` is not set (the chart sets it from
/// the downward API's `spec.nodeName`).
pub const NODE_NAME_VAR: &str = "NODE_NAME";
/// Labels a pool selector or an `InferencePool` may name: upstream's `MaxItems`.
pub const MAX_SELECTOR_LABELS: usize = 64;

/// A validated `kubernetes:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// `auto` resolved: whether the agent talks to the API server at all.
    pub enabled: bool,
    /// This agent's node: its pods are local. `None` (no `nodeName`, no `$NODE_NAME`): no
    /// pod is local.
    pub node_name: Option<String>,
    /// Namespaces watched for pods, Services and policies; empty: all.
    pub namespaces: Vec<String>,
    /// Whether this agent may write status conditions (docs/policy.md).
    pub status_writes: bool,
    /// How client identity is resolved (the identity watcher).
    pub identity: IdentityScope,
    /// Services whose ClusterIP:port the eBPF programs redirect to this agent.
    pub intercept: Vec<InterceptConfig>,
}

impl KubernetesConfig {
    /// Whether objects of `namespace` are watched.
    pub fn watches(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }
}

/// Which pods the identity watcher learns client identities from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityScope {
    /// Pods on this agent's node (its clients are local).
    #[default]
    Node,
    /// Every pod of the watched namespaces.
    Cluster,
}

/// One intercepted Service port and the pool its requests go to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InterceptConfig {
    pub namespace: String,
    pub name: String,
    pub port: u16,
    /// A pool of this file, by name.
    pub pool: String,
}

/// Where a pool's endpoints come from when the cluster provides them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolMembers {
    /// The pods an `InferencePool` (`inference.networking.k8s.io/v1`) selects, on its
    /// target port; followed when the `InferencePool` changes.
    InferencePool { namespace: String, name: String },
    /// The pods of `namespace` carrying every one of `match_labels`, on `port`.
    Selector {
        namespace: String,
        match_labels: BTreeMap<String, String>,
        port: u16,
    },
}

impl PoolMembers {
    /// The namespace its pods live in.
    pub fn namespace(&self) -> &str {
        match self {
            Self::InferencePool { namespace, .. } | Self::Selector { namespace, .. } => namespace,
        }
    }
}

// === the file's shapes ===

/// The section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct KubernetesFile {
    #[serde(default)]
    enabled: Enabled,
    node_name: Option<String>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default = "yes")]
    status_writes: bool,
    #[serde(default)]
    identity: IdentityScope,
    #[serde(default)]
    intercept: Vec<InterceptConfig>,
}

fn yes() -> bool {
    true
}

/// `auto`, `true` or `false`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Enabled {
    #[default]
    Auto,
    Yes,
    No,
}

impl<'de> Deserialize<'de> for Enabled {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Enabled;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("auto, true or false")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Enabled, E> {
                Ok(if b { Enabled::Yes } else { Enabled::No })
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Enabled, E> {
                match s {
                    "auto" => Ok(Enabled::Auto),
                    "true" => Ok(Enabled::Yes),
                    "false" => Ok(Enabled::No),
                    _ => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `pools[].inferencePool`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct InferencePoolFile {
    namespace: String,
    name: String,
}

/// `pools[].selector`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct SelectorFile {
    namespace: String,
    match_labels: BTreeMap<String, String>,
    port: u16,
}

/// What the process environment says, injected so tests do not depend on it.
pub struct Environment<'a> {
    pub var: &'a dyn Fn(&str) -> Option<String>,
    pub file_exists: &'a dyn Fn(&str) -> bool,
}

impl fmt::Debug for Environment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Environment").finish_non_exhaustive()
    }
}

impl Environment<'_> {
    /// The real process environment.
    pub fn process() -> Environment<'static> {
        Environment {
            var: &|k| std::env::var(k).ok(),
            file_exists: &|p| std::path::Path::new(p).exists(),
        }
    }

    /// `enabled: auto`: in-cluster (service host and token) or a kubeconfig named.
    pub fn detects_kubernetes(&self) -> bool {
        let set = |k: &str| (self.var)(k).is_some_and(|v| !v.is_empty());
        (set("KUBERNETES_SERVICE_HOST") && (self.file_exists)(SERVICE_ACCOUNT_TOKEN))
            || set("KUBECONFIG")
    }
}

/// The section, checked on its own; `None` when the file has none.
pub(super) fn convert(
    f: Option<KubernetesFile>,
    file: &str,
    env: &Environment<'_>,
) -> Result<Option<KubernetesConfig>, ConfigError> {
    let Some(f) = f else { return Ok(None) };
    let err = |field: String, m: String| ConfigError::field(file, field, m);
    let enabled = match f.enabled {
        Enabled::Auto => env.detects_kubernetes(),
        Enabled::Yes => true,
        Enabled::No => false,
    };
    let node_name = f
        .node_name
        .filter(|n| !n.is_empty())
        .or_else(|| (env.var)(NODE_NAME_VAR).filter(|n| !n.is_empty()));
    if let Some(n) = &node_name {
        check_subdomain(n).map_err(|m| err("kubernetes.nodeName".into(), format!("`{n}`: {m}")))?;
    }
    for (i, ns) in f.namespaces.iter().enumerate() {
        check_label_name(ns).map_err(|m| {
            err(
                format!("kubernetes.namespaces[{i}]"),
                format!("`{ns}`: {m}"),
            )
        })?;
        if f.namespaces[..i].contains(ns) {
            return Err(err(
                format!("kubernetes.namespaces[{i}]"),
                format!("`{ns}` is listed twice"),
            ));
        }
    }
    for (i, s) in f.intercept.iter().enumerate() {
        let at = |field: &str| format!("kubernetes.intercept[{i}].{field}");
        check_label_name(&s.namespace)
            .map_err(|m| err(at("namespace"), format!("`{}`: {m}", s.namespace)))?;
        check_label_name(&s.name).map_err(|m| err(at("name"), format!("`{}`: {m}", s.name)))?;
        if s.port == 0 {
            return Err(err(at("port"), "must be 1 to 65535".into()));
        }
        if let Some(j) = f.intercept[..i]
            .iter()
            .position(|o| (&o.namespace, &o.name, o.port) == (&s.namespace, &s.name, s.port))
        {
            return Err(err(
                at("port"),
                format!(
                    "{}/{} port {} is intercepted twice (also kubernetes.intercept[{j}])",
                    s.namespace, s.name, s.port
                ),
            ));
        }
    }
    Ok(Some(KubernetesConfig {
        enabled,
        node_name,
        namespaces: f.namespaces,
        status_writes: f.status_writes,
        identity: f.identity,
        intercept: f.intercept,
    }))
}

/// A pool's `inferencePool` / `selector`, checked; `at` makes a field path of the pool's.
pub(super) fn members(
    inference_pool: Option<InferencePoolFile>,
    selector: Option<SelectorFile>,
    file: &str,
    at: &dyn Fn(&str) -> String,
) -> Result<Option<PoolMembers>, ConfigError> {
    let err = |field: &str, m: String| ConfigError::field(file, at(field), m);
    match (inference_pool, selector) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(err(
            "selector",
            "give one of `inferencePool` and `selector`, not both".into(),
        )),
        (Some(p), None) => {
            check_label_name(&p.namespace)
                .map_err(|m| err("inferencePool.namespace", format!("`{}`: {m}", p.namespace)))?;
            check_subdomain(&p.name)
                .map_err(|m| err("inferencePool.name", format!("`{}`: {m}", p.name)))?;
            Ok(Some(PoolMembers::InferencePool {
                namespace: p.namespace,
                name: p.name,
            }))
        }
        (None, Some(s)) => {
            check_label_name(&s.namespace)
                .map_err(|m| err("selector.namespace", format!("`{}`: {m}", s.namespace)))?;
            check_match_labels(&s.match_labels).map_err(|(k, m)| {
                err(
                    &if k.is_empty() {
                        "selector.matchLabels".to_string()
                    } else {
                        format!("selector.matchLabels.{k}")
                    },
                    m,
                )
            })?;
            if s.port == 0 {
                return Err(err("selector.port", "must be 1 to 65535".into()));
            }
            Ok(Some(PoolMembers::Selector {
                namespace: s.namespace,
                match_labels: s.match_labels,
                port: s.port,
            }))
        }
    }
}

/// The checks across sections: members need Kubernetes on and their namespace watched;
/// intercepted Services name pools of the file.
pub(super) fn validate(config: &Config, file: &str) -> Result<(), ConfigError> {
    let err = |field: String, m: String| Err(ConfigError::field(file, field, m));
    let k8s = config.kubernetes.as_ref().filter(|k| k.enabled);
    for (i, p) in config.pools.iter().enumerate() {
        let Some(m) = &p.members else { continue };
        let field = match m {
            PoolMembers::InferencePool { .. } => "inferencePool",
            PoolMembers::Selector { .. } => "selector",
        };
        if !p.endpoints.is_empty() {
            return err(
                format!("pools[{i}].endpoints"),
                format!("give one of `endpoints` and `{field}`, not both"),
            );
        }
        let Some(k) = k8s else {
            let why = match &config.kubernetes {
                None => "the file has no `kubernetes:` section",
                Some(_) => {
                    "`kubernetes.enabled` is false (or `auto` found neither an in-cluster service account nor KUBECONFIG)"
                }
            };
            return err(
                format!("pools[{i}].{field}"),
                format!("pods come from Kubernetes, but {why}"),
            );
        };
        if !k.watches(m.namespace()) {
            return err(
                format!("pools[{i}].{field}.namespace"),
                format!(
                    "`{}` is not among kubernetes.namespaces ({})",
                    m.namespace(),
                    k.namespaces.join(", ")
                ),
            );
        }
    }
    let Some(k) = &config.kubernetes else {
        return Ok(());
    };
    for (i, s) in k.intercept.iter().enumerate() {
        if !config.pools.iter().any(|p| p.name == s.pool) {
            return err(
                format!("kubernetes.intercept[{i}].pool"),
                format!("`{}` is not a pool of this file", s.pool),
            );
        }
        if !k.watches(&s.namespace) {
            return err(
                format!("kubernetes.intercept[{i}].namespace"),
                format!(
                    "`{}` is not among kubernetes.namespaces ({})",
                    s.namespace,
                    k.namespaces.join(", ")
                ),
            );
        }
    }
    Ok(())
}

// === Kubernetes name syntax ===

/// A DNS-1123 label (namespaces, Service names): 1-63 of `a-z0-9-`, alphanumeric at both
/// ends.
pub fn check_label_name(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    ok.then_some(()).ok_or_else(|| {
        "not a DNS label (1-63 lowercase letters, digits and '-', alphanumeric at both ends)".into()
    })
}

/// A DNS-1123 subdomain (object and node names): up to 253 characters, dot-separated labels.
pub fn check_subdomain(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    ok.then_some(()).ok_or_else(|| {
        "not a DNS subdomain (lowercase letters, digits, '-' and '.', up to 253)".into()
    })
}

/// A label selector's `matchLabels`: 1 to [`MAX_SELECTOR_LABELS`] valid keys and values.
/// The error names the key (`""`: the map itself).
pub fn check_match_labels(labels: &BTreeMap<String, String>) -> Result<(), (String, String)> {
    if labels.is_empty() {
        return Err((
            String::new(),
            "at least one label: an empty selector would pick every pod of the namespace".into(),
        ));
    }
    if labels.len() > MAX_SELECTOR_LABELS {
        return Err((
            String::new(),
            format!("{} labels: at most {MAX_SELECTOR_LABELS}", labels.len()),
        ));
    }
    for (k, v) in labels {
        check_label_key(k).map_err(|m| (k.clone(), format!("key `{k}`: {m}")))?;
        check_label_value(v).map_err(|m| (k.clone(), format!("value `{v}`: {m}")))?;
    }
    Ok(())
}

/// `[prefix/]name`: a DNS subdomain prefix, a name of 1-63 alphanumerics, `-`, `_`, `.`.
pub fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        check_subdomain(p).map_err(|m| format!("prefix: {m}"))?;
    }
    if name.is_empty() {
        return Err("the name part is empty".into());
    }
    check_label_value(name)
}

/// Up to 63 of `A-Za-z0-9-_.`, alphanumeric at both ends (or empty).
pub fn check_label_value(v: &str) -> Result<(), String> {
    let alnum = |c: Option<u8>| c.is_none_or(|b| b.is_ascii_alphanumeric());
    let ok = v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && alnum(v.bytes().next())
        && alnum(v.bytes().last());
    ok.then_some(()).ok_or_else(|| {
        "up to 63 letters, digits, '-', '_' and '.', alphanumeric at both ends".into()
    })
}

#[cfg(test)]
mod tests;
