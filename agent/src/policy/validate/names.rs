//! Name syntaxes the resources share: Kubernetes object names and labels, HTTP header and
//! cookie names, tenant names, model names. Each check returns why a name cannot be used.

use crate::tenant;

/// Longest DNS-1123 subdomain (Kubernetes object names).
const MAX_SUBDOMAIN: usize = 253;
/// Longest DNS-1123 label (namespaces, Service names), and a label name or value.
const MAX_LABEL: usize = 63;
/// Longest model name accepted in a policy (vLLM served names are short; this bounds work).
const MAX_MODEL: usize = 256;

/// Headers that describe one connection, not the request: a proxy consumes or rewrites
/// them (RFC 9110 7.6.1), so a policy can neither match nor key on them.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63: namespaces, Service and pool names.
pub fn dns_label(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > MAX_LABEL {
        return Err(format!(
            "{} characters: a DNS-1123 label has at most {MAX_LABEL}",
            s.len()
        ));
    }
    label_chars(s).map_err(|why| format!("not a DNS-1123 label ({why})"))
}

/// DNS-1123 labels joined by `.`, at most 253: Kubernetes object names.
pub fn dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > MAX_SUBDOMAIN {
        return Err(format!(
            "{} characters: a DNS-1123 subdomain has at most {MAX_SUBDOMAIN}",
            s.len()
        ));
    }
    s.split('.')
        .try_for_each(label_chars)
        .map_err(|why| format!("not a DNS-1123 subdomain ({why})"))
}

/// One label's characters: lowercase alphanumerics and `-`, alphanumeric at both ends.
fn label_chars(l: &str) -> Result<(), &'static str> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = l.as_bytes();
    match (bytes.first(), bytes.last()) {
        (None, _) | (_, None) => Err("empty part between dots"),
        _ if !bytes.iter().all(|&b| alnum(b) || b == b'-') => {
            Err("only lowercase a-z, 0-9 and '-' between dots")
        }
        (Some(&a), Some(&z)) if !alnum(a) || !alnum(z) => {
            Err("must start and end with a lowercase letter or digit")
        }
        _ => Ok(()),
    }
}

/// A Kubernetes label key: an optional DNS-1123 subdomain prefix and `/`, then a name of
/// at most 63 characters of alphanumerics, `-`, `_` and `.`, alphanumeric at both ends.
pub fn label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        dns_subdomain(p).map_err(|why| format!("label key prefix `{p}`: {why}"))?;
    }
    if name.is_empty() {
        return Err("label key name must not be empty".into());
    }
    qualified_name(name).map_err(|why| format!("label key name: {why}"))
}

/// A Kubernetes label value: empty, or a name as in [`label_key`] without a prefix.
pub fn label_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    qualified_name(v).map_err(|why| format!("label value: {why}"))
}

fn qualified_name(n: &str) -> Result<(), String> {
    if n.len() > MAX_LABEL {
        return Err(format!("{} characters: at most {MAX_LABEL}", n.len()));
    }
    let bytes = n.as_bytes();
    let ends = bytes.first().zip(bytes.last());
    let ok = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
        && ends.is_some_and(|(a, z)| a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err("expected A-Z a-z 0-9 '-' '_' '.', starting and ending alphanumeric".into())
    }
}

/// A request header a policy can match or key on: a valid HTTP field name, not a pseudo
/// header, not hop-by-hop. Names are case-insensitive; the lowercase form is returned.
pub fn header_name(name: &str) -> Result<String, String> {
    if name.starts_with(':') {
        return Err(
            "a pseudo-header (HTTP/2 request line): match the path or model instead".into(),
        );
    }
    let parsed = http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| "not an HTTP header name (RFC 9110 token characters)".to_string())?;
    let lower = parsed.as_str();
    if HOP_BY_HOP.contains(&lower) {
        return Err(format!(
            "`{lower}` is a hop-by-hop header: it describes the connection, and the proxy consumes it"
        ));
    }
    Ok(lower.to_string())
}

/// A header value a match compares with: visible ASCII, spaces and tabs (no control
/// characters: no request could carry them).
pub fn header_value(value: &str) -> Result<(), String> {
    http::HeaderValue::from_str(value)
        .map(drop)
        .map_err(|_| "not a valid HTTP header value (control characters or non-ASCII)".into())
}

/// A cookie name (RFC 6265 `token`): visible ASCII except separators.
pub fn cookie_name(name: &str) -> Result<(), String> {
    const SEPARATORS: &[u8] = b"()<>@,;:\\\"/[]?={} \t";
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name
        .bytes()
        .all(|b| b.is_ascii_graphic() && !SEPARATORS.contains(&b))
    {
        Ok(())
    } else {
        Err("not a cookie name: visible ASCII without ()<>@,;:\\\"/[]?={} and spaces".into())
    }
}

/// A `Tenant`'s `metadata.name`. It must satisfy both rules that apply to it, so the
/// stricter wins: [`tenant::check_name`] (metric attribute: 1-64 of `A-Za-z0-9._:/-`) and
/// DNS-1123 subdomain (Kubernetes object name). Together: 1-64 characters of lowercase
/// a-z, 0-9, `-` and `.`, alphanumeric at both ends and around each dot. `other` is the
/// series that tenants beyond the telemetry cap are counted in, so no tenant may take it.
pub fn tenant_resource_name(name: &str) -> Result<(), String> {
    if name == crate::telemetry::OTHER_TENANT {
        return Err(format!(
            "`{}` is reserved: tenants beyond the telemetry cap are counted under it",
            crate::telemetry::OTHER_TENANT
        ));
    }
    dns_subdomain(name)?;
    tenant::check_name(name).map_err(|why| format!("{why} (a tenant name is a metric attribute)"))
}

/// A tenant named in a match (a `Tenant`, a tenant of the agent's own file, or the default
/// tenant): the metric-attribute rule.
pub fn tenant_ref(name: &str) -> Result<(), String> {
    tenant::check_name(name)
}

/// A model name (base model or LoRA adapter): non-empty, no whitespace or control
/// characters, at most 256 bytes.
pub fn model_name(m: &str) -> Result<(), String> {
    if m.is_empty() {
        return Err("must not be empty".into());
    }
    if m.len() > MAX_MODEL {
        return Err(format!(
            "{} bytes: a model name has at most {MAX_MODEL}",
            m.len()
        ));
    }
    if m.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains whitespace or control characters: no request could name it".into());
    }
    Ok(())
}
