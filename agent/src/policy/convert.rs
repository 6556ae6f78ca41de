//! The version-1 configuration file's pools and tenants as resources: one model for both
//! (docs/policy.md, "Conversion from the v1 config file"). [`from_config`] is what the
//! agent compiles as the lowest-precedence policies; `warmpath policy convert FILE` prints
//! the same resources as YAML.
//!
//! - Each pool becomes a `RoutePolicy` named after it, targeting it
//!   (`targetRef.pool.name`), with no matches (every request to the pool) and every action
//!   field the file sets, explicitly: `preset`, `weights` and `coldYieldMs` (only those
//!   that differ from the preset's), `tokens`, `session`, and the agent-wide `proxy.retries`,
//!   `proxy.upstreamHeadTimeoutMs` / `upstreamIdleTimeoutMs` and `proxy.explain`, which apply
//!   to every pool.
//! - Each tenant of `tenants.cidrs` becomes a `Tenant` with those `identity.cidrs`. The
//!   file's `tenants.trustHeaderFrom` trusts its sources to name *any* tenant in the header;
//!   a `Tenant`'s `identity.headerSources` trusts them for that tenant only, so every
//!   converted tenant gets the whole `trustHeaderFrom` list.
//!
//! Not expressible as resources, so they stay settings of the file (or flags), which the
//! agent keeps applying: a pool's definition (`model`, `blockSize`, `endpoints`,
//! `upstreamProtocol`, `labels`, `services`: on Kubernetes an `InferencePool` and its
//! pods); `tenants.order`, `tenants.header`, `tenants.default` and `tenants.maxTenants`
//! (agent-wide identity settings); `tenants.cgroups` (a node's cgroup directories: on
//! Kubernetes a `Tenant`'s workload selectors resolve the client's cgroup instead); tenants that only a trusted header names (the file
//! accepts any name from a trusted source; there is no list to convert); and everything
//! outside `pools` and `tenants` (listeners, admin, proxy limits, telemetry, cluster).

use std::{io::Write, path::PathBuf};

use serde_json::Value;

use super::resources::{
    Action, Identity, PoolRef, Preset, Resource, RoutePolicy, RoutePolicySpec, SessionSpec,
    TargetRef, Tenant, TenantSpec, Timeouts, TokenSourceKind, TokenSpec,
};
use crate::{
    config::{Config, ConfigError, PoolConfig, TokenSourceConfig},
    routing::Policy,
};

/// The configuration's pools and tenants as resources: the pools' `RoutePolicy`s in the
/// configuration's order, then the `Tenant`s by name.
pub fn from_config(c: &Config) -> Vec<Resource> {
    let mut out: Vec<Resource> = c
        .pools
        .iter()
        .map(|p| Resource::RoutePolicy(pool_policy(c, p)))
        .collect();
    out.extend(tenants(c).into_iter().map(Resource::Tenant));
    out
}

fn pool_policy(c: &Config, p: &PoolConfig) -> RoutePolicy {
    let tokens = match &p.tokens {
        TokenSourceConfig::Builtin => (TokenSourceKind::Builtin, None),
        TokenSourceConfig::HuggingFace(dir) => (
            TokenSourceKind::Huggingface,
            Some(dir.to_string_lossy().into_owned()),
        ),
        TokenSourceConfig::Engine => (TokenSourceKind::Engine, None),
        TokenSourceConfig::Approximate => (TokenSourceKind::Approximate, None),
    };
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let action = Action {
        preset: Some(preset(p.policy.kind)),
        weights: weight_overrides(p),
        // Only when it differs from the preset's.
        cold_yield_ms: (p.policy.cold_yield != p.policy.kind.cold_yield())
            .then(|| millis(p.policy.cold_yield)),
        tokens: Some(TokenSpec {
            source: tokens.0,
            dir: tokens.1,
        }),
        session: Some(SessionSpec {
            header: Some(p.session.header.as_str().to_string()),
            cookie: p.session.cookie.clone(),
        }),
        retries: Some(u32::try_from(c.retries).unwrap_or(u32::MAX)),
        timeouts: Some(Timeouts {
            upstream_head_ms: Some(millis(c.limits.upstream_head_timeout)),
            upstream_idle_ms: Some(millis(c.limits.upstream_idle_timeout)),
        }),
        explain: Some(c.explain),
        ..Action::default()
    };
    let spec = RoutePolicySpec {
        target_ref: TargetRef {
            pool: Some(PoolRef {
                group: "inference.networking.k8s.io".into(),
                kind: "InferencePool".into(),
                name: p.name.clone(),
            }),
            ..TargetRef::default()
        },
        matches: Vec::new(),
        action,
    };
    RoutePolicy::new(&p.name, spec)
}

fn preset(p: Policy) -> Preset {
    match p {
        Policy::Precise => Preset::Precise,
        Policy::Approximate => Preset::Approximate,
        Policy::RoundRobin => Preset::RoundRobin,
        Policy::LeastLoaded => Preset::LeastLoaded,
        Policy::Session => Preset::Session,
    }
}

/// The pool's weights that differ from its preset's, by their camelCase names.
fn weight_overrides(p: &PoolConfig) -> std::collections::BTreeMap<String, f64> {
    let as_map = |w: &crate::routing::Weights| match serde_json::to_value(w) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let preset = as_map(&p.policy.kind.weights());
    as_map(&p.policy.weights)
        .into_iter()
        .filter(|(name, w)| preset.get(name) != Some(w))
        .filter_map(|(name, w)| w.as_f64().map(|w| (name, w)))
        .collect()
}

fn tenants(c: &Config) -> Vec<Tenant> {
    let t = &c.tenants;
    let mut cidrs: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (net, name) in &t.cidrs {
        cidrs
            .entry(name.as_str())
            .or_default()
            .push(net.to_string());
    }
    cidrs
        .into_iter()
        .map(|(name, nets)| {
            let sources: Vec<String> = t.trusted.iter().map(ToString::to_string).collect();
            Tenant::new(
                name,
                TenantSpec {
                    identity: Identity {
                        cidrs: nets,
                        header_sources: sources,
                        ..Identity::default()
                    },
                    // The file has no weights: every tenant counts the same (the
                    // resource's default).
                    weight: 1,
                    ..TenantSpec::default()
                },
            )
        })
        .collect()
}

// === warmpath policy convert ===

/// `warmpath policy convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// A version-1 configuration file (docs/config.md).
    #[arg(value_name = "CONFIG")]
    pub file: PathBuf,
}

/// Why `warmpath policy convert` failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "the converted resources do not validate (rename what the errors name in the configuration file):\n{}",
        .0.join("\n")
    )]
    Invalid(Vec<String>),
    #[error("writing the resources: {0}")]
    Output(#[from] std::io::Error),
}

/// Reads `args.file` and writes its resources as YAML to `out`, after a comment naming the
/// settings that stay in the file. The resources are validated: names the file accepts but
/// resources do not (a pool or tenant name that is not a DNS name) fail the command, after
/// the YAML is written.
pub fn run(args: &ConvertArgs, out: &mut dyn Write) -> Result<(), Error> {
    let config = crate::config::load(&args.file)?;
    let resources = from_config(&config);
    writeln!(
        out,
        "# Converted from {} by `warmpath policy convert` (docs/policy.md).",
        args.file.display()
    )?;
    writeln!(
        out,
        "# Still read from the file: the pools' definitions (model, blockSize, endpoints, ...),"
    )?;
    writeln!(
        out,
        "# tenants.order, tenants.header, tenants.default, tenants.maxTenants, tenants.cgroups,"
    )?;
    writeln!(out, "# and everything outside `pools` and `tenants`.")?;
    out.write_all(super::documents::to_yaml(&resources).as_bytes())?;
    let mut errors: Vec<String> = resources
        .iter()
        .flat_map(|r| {
            super::validate::validate(r)
                .into_iter()
                .map(move |e| format!("{} {}: {e}", r.kind(), r.key()))
        })
        .collect();
    errors.extend(
        super::validate::validate_set(&resources)
            .into_iter()
            .map(|(key, e)| format!("{key}: {e}")),
    );
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(errors))
    }
}

#[cfg(test)]
mod tests;
