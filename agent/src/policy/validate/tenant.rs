//! A `Tenant`'s own checks: name, priority and weight, identity selectors, quotas; and the
//! quota rate syntax the quota engine reads with [`parse_rate`].

use ipnet::IpNet;

use super::{Errors, names, names_once};
use crate::policy::resources::{Identity, Quotas, Tenant};

/// Priorities a tenant may have.
const PRIORITY: std::ops::RangeInclusive<i32> = -1000..=1000;
/// Weights a tenant may have.
const WEIGHT: std::ops::RangeInclusive<u32> = 1..=1000;
/// Seconds of burst a quota may allow.
const BURST_SECONDS: std::ops::RangeInclusive<f64> = 0.05..=60.0;
/// Most networks in one CIDR list (each is a table entry on every agent).
const MAX_NETS: usize = 1024;
/// Longest number in a rate.
const MAX_RATE_DIGITS: usize = 32;

pub(super) fn check(t: &Tenant, e: &mut Errors) {
    let name = t.metadata.name.as_deref().unwrap_or("");
    e.check("metadata.name", name, names::tenant_resource_name(name));
    if let Some(ns) = &t.metadata.namespace {
        e.push(
            "metadata.namespace",
            ns,
            "a Tenant is cluster-scoped: remove the namespace (its name alone is its identity)",
        );
    }
    let s = &t.spec;
    if !PRIORITY.contains(&s.priority) {
        e.push("spec.priority", s.priority, "must be -1000 to 1000");
    }
    if !WEIGHT.contains(&s.weight) {
        e.push("spec.weight", s.weight, "must be 1 to 1000");
    }
    identity(&s.identity, e);
    if let Some(q) = &s.quotas {
        quotas(q, e);
    }
}

fn identity(i: &Identity, e: &mut Errors) {
    names_once(
        e,
        "spec.identity.namespaces",
        &i.namespaces,
        names::dns_label,
    );
    names_once(
        e,
        "spec.identity.serviceAccounts",
        &i.service_accounts,
        service_account,
    );
    if let Some(sel) = &i.pod_labels {
        super::selector(e, "spec.identity.podLabels", &sel.match_labels);
    }
    nets(e, "spec.identity.cidrs", &i.cidrs);
    nets(e, "spec.identity.headerSources", &i.header_sources);
}

/// `namespace/name`: a DNS-1123 label, then a DNS-1123 subdomain.
pub(super) fn service_account(s: &str) -> Result<(), String> {
    let Some((ns, name)) = s.split_once('/') else {
        return Err("expected namespace/name".into());
    };
    names::dns_label(ns).map_err(|why| format!("namespace `{ns}`: {why}"))?;
    names::dns_subdomain(name).map_err(|why| format!("name `{name}`: {why}"))
}

/// A CIDR (or a single address) as the tenant tables read it, without host bits: a
/// network written with them is usually a typo for a narrower or wider one.
pub(super) fn net(s: &str) -> Result<IpNet, String> {
    let n = crate::tenant::parse_net(s)
        .map_err(|_| "expected a CIDR such as 10.0.0.0/8, or an address".to_string())?;
    if n.trunc() != n {
        return Err(format!(
            "has host bits set: the network is {} (write that, or a longer prefix)",
            n.trunc()
        ));
    }
    if let IpNet::V6(v6) = n
        && v6.addr().to_ipv4_mapped().is_some()
        && v6.prefix_len() >= 96
    {
        return Err(
            "an IPv4-mapped IPv6 network never matches: clients are matched as IPv4 (write the IPv4 network)"
                .into(),
        );
    }
    Ok(n)
}

fn nets(e: &mut Errors, path: &str, list: &[String]) {
    if e.too_many(path, list.len(), MAX_NETS) {
        return;
    }
    let mut seen: Vec<(usize, IpNet)> = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match net(s) {
            Ok(n) => {
                if let Some((first, _)) = seen.iter().find(|(_, x)| *x == n) {
                    e.push(at, s, format!("the same network as {path}[{first}]"));
                }
                seen.push((i, n));
            }
            Err(why) => e.push(at, s, why),
        }
    }
}

fn quotas(q: &Quotas, e: &mut Errors) {
    for (key, rate) in [
        ("requests", &q.requests),
        ("promptTokens", &q.prompt_tokens),
        ("outputTokens", &q.output_tokens),
    ] {
        if let Some(rate) = rate {
            e.check(format!("spec.quotas.{key}"), rate, parse_rate(rate));
        }
    }
    if q.concurrent_streams == Some(0) {
        e.push(
            "spec.quotas.concurrentStreams",
            0,
            "must be >= 1 (leave it out for no limit)",
        );
    }
    if let Some(b) = q.burst_seconds
        && !BURST_SECONDS.contains(&b)
    {
        e.push(
            "spec.quotas.burstSeconds",
            b,
            "must be 0.05 to 60 (seconds of the rate spent at once)",
        );
    }
}

/// A quota rate, `N/s`, `N/min` or `N/h` with N a positive decimal (`100/s`, `2.5/min`),
/// in units per second. The message says what is wrong without repeating the input.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let Some((n, unit)) = s.split_once('/') else {
        return Err("no unit: expected N/s, N/min or N/h (such as 100/s)".into());
    };
    let seconds = match unit {
        "s" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown unit `{other}`: expected s, min or h (N/s, N/min, N/h)"
            ));
        }
    };
    if n.starts_with('-') {
        return Err(
            "negative: a rate is a positive number (leave the quota out for no limit)".into(),
        );
    }
    let decimal = match n.split_once('.') {
        Some((int, frac)) => all_digits(int) && all_digits(frac),
        None => all_digits(n),
    };
    if !decimal || n.len() > MAX_RATE_DIGITS {
        return Err(format!(
            "`{n}` is not a decimal number such as 100 or 2.5 (at most {MAX_RATE_DIGITS} characters)"
        ));
    }
    let value: f64 = n
        .parse()
        .map_err(|_| format!("`{n}` is not a decimal number such as 100 or 2.5"))?;
    if value == 0.0 {
        return Err("zero: a rate must be > 0 (leave the quota out for no limit)".into());
    }
    Ok(value / seconds)
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}
