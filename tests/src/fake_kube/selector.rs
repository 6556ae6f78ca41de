//! Label and field selectors in the API server's query syntax.
//!
//! Labels: comma-separated requirements `k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
//! `k notin (a,b)` — the forms kube's `Selector` prints. A missing label fails `=`/`in`
//! and passes `!=`/`notin`, as in apimachinery. Fields: `path=v`, `path==v`, `path!=v` on
//! the keys the kind supports (unknown keys are refused, as the real server refuses them).

use serde_json::Value;

use super::{resources::ResourceType, status::ApiError};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// A parsed `fieldSelector`: (dotted path, value, equal) triples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, String, bool)>);

/// Splits on commas outside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn set_values(rest: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!("label selector {whole:?}: expected (values)"))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn parse_requirement(part: &str) -> Result<Requirement, ApiError> {
    let bad = || {
        ApiError::bad_request(format!(
            "unable to parse label selector requirement {part:?}"
        ))
    };
    let p = part.trim();
    let key_ok = |k: &str| {
        if valid_key(k) {
            Ok(k.to_string())
        } else {
            Err(bad())
        }
    };
    if let Some(k) = p.strip_prefix('!') {
        return Ok(Requirement::NotExists(key_ok(k.trim())?));
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Ok(Requirement::NotEquals(
            key_ok(k.trim())?,
            v.trim().to_string(),
        ));
    }
    if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
        return Ok(Requirement::Equals(key_ok(k.trim())?, v.trim().to_string()));
    }
    if let Some((k, rest)) = p.split_once(" notin ") {
        return Ok(Requirement::NotIn(
            key_ok(k.trim())?,
            set_values(rest, part)?,
        ));
    }
    if let Some((k, rest)) = p.split_once(" in ") {
        return Ok(Requirement::In(key_ok(k.trim())?, set_values(rest, part)?));
    }
    Ok(Requirement::Exists(key_ok(p)?))
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        split_top_level(s)
            .into_iter()
            .map(parse_requirement)
            .collect::<Result<_, _>>()
            .map(Self)
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
        })
    }
}

impl FieldSelector {
    pub fn parse(s: &str, kind: &ResourceType) -> Result<Self, ApiError> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        s.split(',')
            .map(|part| {
                let (key, value, equal) = if let Some((k, v)) = part.split_once("!=") {
                    (k, v, false)
                } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('='))
                {
                    (k, v, true)
                } else {
                    return Err(ApiError::bad_request(format!(
                        "invalid field selector {part:?}: expected key=value or key!=value"
                    )));
                };
                let key = key.trim();
                if !kind.supports_field(key) {
                    return Err(ApiError::bad_request(format!(
                        "field label not supported for {}: {key}",
                        kind.kind
                    )));
                }
                Ok((key.to_string(), value.trim().to_string(), equal))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, value, equal)| {
            let found = path.split('.').try_fold(obj, |v, seg| v.get(seg));
            // A field the object lacks reads as "", as the server's field sets do.
            let actual = match found {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

/// Both selectors of one list or watch request.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fake_kube::resources::PODS;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels},
               "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_requirements_match_as_apimachinery() {
        let cases = [
            ("app=vllm", json!({"app": "vllm"}), true),
            ("app==vllm", json!({"app": "other"}), false),
            ("app!=vllm", json!({}), true),
            (
                "app in (a, vllm),tier",
                json!({"app": "vllm", "tier": "x"}),
                true,
            ),
            ("app in (a,b)", json!({}), false),
            ("app notin (a,b)", json!({}), true),
            ("app notin (a,b)", json!({"app": "a"}), false),
            ("!canary", json!({"canary": "1"}), false),
            ("tier", json!({}), false),
            ("", json!({}), true),
        ];
        for (sel, labels, want) in cases {
            let parsed = LabelSelector::parse(sel).expect("a valid selector");
            assert_eq!(
                parsed.matches(&pod(labels.clone())),
                want,
                "{sel} on {labels}"
            );
        }
        assert!(LabelSelector::parse("app in a,b").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
    }

    #[test]
    fn field_selectors_use_supported_keys_only() {
        let p = pod(json!({}));
        let sel = FieldSelector::parse("spec.nodeName=n1,metadata.name!=q", &PODS).expect("valid");
        assert!(sel.matches(&p));
        let sel = FieldSelector::parse("metadata.namespace=other", &PODS).expect("valid");
        assert!(!sel.matches(&p));
        let err = FieldSelector::parse("spec.image=x", &PODS).expect_err("unsupported key");
        assert_eq!(err.code, 400);
    }
}
