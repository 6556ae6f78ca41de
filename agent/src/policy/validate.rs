//! Checks of resources beyond what their types express: every problem of an object, each
//! with its field path, the value found and why it cannot be used ([`validate`]), and the
//! conflicts between objects of one set ([`validate_set`]).
//!
//! The checks (docs/policy.md, "Validation"):
//!
//! - names: a `RoutePolicy` name is a DNS-1123 subdomain and its namespace a DNS-1123 label;
//!   a `Tenant` name must be both a DNS-1123 subdomain (Kubernetes) and a tenant name (metric
//!   attribute), so the stricter wins: 1-64 of lowercase `a-z 0-9 - .`; `other` is reserved.
//!   A `Tenant` is cluster-scoped: no namespace.
//! - `targetRef`: exactly one of `pool`, `service`, `selector`; names DNS-1123 labels; the
//!   pool an `InferencePool` of `inference.networking.k8s.io` (or `.x-k8s.io`); a service
//!   port 1-65535; a selector with at least one label, keys and values in Kubernetes label
//!   syntax; `models` without whitespace, each once.
//! - `matches` (at most [`MAX_MATCHES`]): a path is exactly one of `exact` or `prefix` and
//!   starts with `/`; header names valid HTTP field names, neither pseudo-headers nor
//!   hop-by-hop, each once per match; header values valid; models and tenants valid, each
//!   once; no two entries identical (same conditions in any order).
//! - `action`: weights name known scorers (`kvUsage`, `kv-usage` and `kv_usage` are one
//!   scorer, named once) with finite values >= 0; no weights with preset `round-robin` (it
//!   uses none); `tokens.dir` given exactly when the source is `huggingface`; `approximate`
//!   tokens only with preset `approximate` or a prefix weight of 0 (the preset's or
//!   `weights.prefix`: the pool's preset is not known here, so one of them must say so);
//!   `retries` 0-16; timeouts 1 ms to 1 hour; a split has at most 16 ways, weights 0-10000
//!   summing to more than 0, each way names a pool or a model, no two ways alike; a session
//!   header is a valid header name and a cookie a valid cookie name.
//! - `mode: steer` routes whole connections in the kernel, before any request is read: it
//!   cannot be combined with anything decided per request — `matches`, `targetRef.models`,
//!   `split`, `tokens`, `session`, `retries`, `timeouts`, `explain: true`. Each is an error.
//! - `Tenant`: priority -1000 to 1000, weight 1-1000; CIDRs and header sources parse, carry
//!   no host bits, each once; service accounts `namespace/name`; namespaces DNS-1123 labels;
//!   pod labels a non-empty selector in label syntax; each quota rate `N/s`, `N/min` or
//!   `N/h` with N a positive decimal ([`parse_rate`]), `concurrentStreams` >= 1,
//!   `burstSeconds` 0.05-60.

mod names;
mod route;
mod set;
mod tenant;

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

pub use set::{validate_set, validate_set_indexed};
pub use tenant::parse_rate;

use std::collections::BTreeMap;

use super::resources::{FieldError, Resource};

/// Most match entries in one policy (each is tried per request).
pub const MAX_MATCHES: usize = 64;
/// Most conditions of one kind (models, headers, tenants) in one match entry or target.
pub const MAX_CONDITIONS: usize = 64;
/// Most ways in one split.
pub const MAX_SPLIT: usize = 16;
/// Most retries a policy may ask for.
pub const MAX_RETRIES: u32 = 16;
/// Longest engine timeout a policy may set, in milliseconds (1 hour).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// Largest weight of one split way.
pub const MAX_SPLIT_WEIGHT: u32 = 10_000;

/// Every problem of one resource, in field order; empty when it can be used. Checks that
/// need the other resources of a set are [`validate_set`]'s.
pub fn validate(r: &Resource) -> Vec<FieldError> {
    let mut e = Errors::default();
    match r {
        Resource::RoutePolicy(p) => route::check(p, &mut e),
        Resource::Tenant(t) => tenant::check(t, &mut e),
    }
    e.0
}

/// The errors found so far.
#[derive(Debug, Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, value: impl ToString, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            value: value.to_string(),
            message: message.into(),
        });
    }

    /// Records `check`'s error, if any, at `path` with `value`.
    fn check<T>(&mut self, path: impl Into<String>, value: &str, check: Result<T, String>) {
        if let Err(why) = check {
            self.push(path, value, why);
        }
    }

    /// More than `max` entries at `path`.
    fn too_many(&mut self, path: &str, len: usize, max: usize) -> bool {
        if len > max {
            self.push(path, len, format!("{len} entries: at most {max}"));
            true
        } else {
            false
        }
    }
}

/// Checks each entry of a list of names with `check` and reports repeats, case-sensitively.
fn names_once(
    e: &mut Errors,
    path: &str,
    list: &[String],
    check: impl Fn(&str) -> Result<(), String>,
) {
    if e.too_many(path, list.len(), MAX_CONDITIONS) {
        return;
    }
    for (i, item) in list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        e.check(&at, item, check(item));
        if let Some(first) = list[..i].iter().position(|x| x == item) {
            e.push(at, item, format!("listed twice (also {path}[{first}])"));
        }
    }
}

/// A label selector's `matchLabels`: at least one label, keys and values in label syntax.
fn selector(e: &mut Errors, path: &str, labels: &BTreeMap<String, String>) {
    let at = format!("{path}.matchLabels");
    if labels.is_empty() {
        e.push(
            at,
            "",
            "no labels: an empty selector would select everything (name at least one label)",
        );
        return;
    }
    if e.too_many(&at, labels.len(), MAX_CONDITIONS) {
        return;
    }
    for (key, value) in labels {
        let label_at = format!("{at}.{key}");
        e.check(&label_at, key, names::label_key(key));
        e.check(label_at, value, names::label_value(value));
    }
}
