//! Reading resources from YAML text: one file may hold several documents (`---`), each a
//! `RoutePolicy` or a `Tenant` of `warmpath.dev/v1alpha1`. Errors name the file, the
//! document and the field path (`policies.yaml: document 2 (RoutePolicy team-a/canary):
//! spec.action.weights: ...`).

use serde::Deserialize;

use super::resources::{API_VERSION, Resource, RoutePolicy, Tenant};

/// Largest policy file read (bytes): far above any hand-written policy set.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;
/// Most documents in one file.
pub const MAX_DOCUMENTS: usize = 10_000;

/// A document that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: document {document}{what}: {message}")]
pub struct DocumentError {
    pub file: String,
    /// 1-based.
    pub document: usize,
    /// ` (Kind name)` when known.
    pub what: String,
    /// With the field path first when there is one.
    pub message: String,
}

/// Every resource in `text` (the contents of `file`), in order; empty documents are
/// skipped. One bad document is an error for the whole file: a file is one change.
pub fn parse(file: &str, text: &str) -> Result<Vec<Resource>, DocumentError> {
    let err = |document: usize, what: String, message: String| DocumentError {
        file: file.to_string(),
        document,
        what,
        message,
    };
    if text.len() > MAX_FILE_BYTES {
        return Err(err(
            0,
            String::new(),
            format!(
                "{} bytes: larger than the {MAX_FILE_BYTES}-byte limit for a policy file",
                text.len()
            ),
        ));
    }
    let mut out = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let n = i + 1;
        if n > MAX_DOCUMENTS {
            return Err(err(
                n,
                String::new(),
                format!("more than {MAX_DOCUMENTS} documents in one file"),
            ));
        }
        let value = serde_norway::Value::deserialize(doc)
            .map_err(|e| err(n, String::new(), format!("not YAML: {e}")))?;
        if value.is_null() {
            continue;
        }
        let field = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_string);
        let kind = field("kind");
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string();
        let what = kind
            .as_deref()
            .map_or(String::new(), |k| format!(" ({k} {name})"));
        match field("apiVersion").as_deref() {
            Some(API_VERSION) => {}
            Some(other) => {
                return Err(err(
                    n,
                    what,
                    format!("apiVersion: `{other}`: expected {API_VERSION}"),
                ));
            }
            None => {
                return Err(err(
                    n,
                    what,
                    format!("apiVersion: missing (expected {API_VERSION})"),
                ));
            }
        }
        let resource = match kind.as_deref() {
            Some("RoutePolicy") => typed::<RoutePolicy>(value).map(Resource::RoutePolicy),
            Some("Tenant") => typed::<Tenant>(value).map(Resource::Tenant),
            Some(other) => Err(format!("kind: `{other}`: expected RoutePolicy or Tenant")),
            None => Err("kind: missing (expected RoutePolicy or Tenant)".to_string()),
        }
        .map_err(|message| err(n, what.clone(), message))?;
        if resource
            .metadata()
            .name
            .as_deref()
            .is_none_or(str::is_empty)
        {
            return Err(err(n, what, "metadata.name: missing".into()));
        }
        out.push(resource);
    }
    Ok(out)
}

/// Deserializes one document, naming the field path of the first error.
fn typed<T: serde::de::DeserializeOwned>(value: serde_norway::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." || path.is_empty() {
            inner
        } else {
            format!("{path}: {inner}")
        }
    })
}

/// Resources as YAML documents (the inverse of [`parse`]).
pub fn to_yaml(resources: &[Resource]) -> String {
    let mut out = String::new();
    for r in resources {
        out.push_str("---\n");
        let text = match r {
            Resource::RoutePolicy(p) => serde_norway::to_string(p),
            Resource::Tenant(t) => serde_norway::to_string(t),
        };
        out.push_str(&text.unwrap_or_else(|e| format!("# cannot serialize: {e}\n")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_of_both_kinds_parse_with_paths_in_errors() {
        let text = "
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: team-a}
spec:
  priority: 2
  identity: {cidrs: [127.0.0.2/32]}
---
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: canary, namespace: ml}
spec:
  targetRef: {pool: {name: chat}}
  action: {preset: least-loaded}
";
        let r = parse("p.yaml", text).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].key(), "team-a");
        assert_eq!(r[1].key(), "ml/canary");
        let Resource::RoutePolicy(p) = &r[1] else {
            panic!("second is a policy")
        };
        assert_eq!(
            p.spec.action.preset,
            Some(super::super::resources::Preset::LeastLoaded)
        );
        // The round trip reads back equal.
        assert_eq!(parse("again", &to_yaml(&r)).unwrap(), r);

        let bad = text.replace("preset: least-loaded", "preset: fastest");
        let e = parse("p.yaml", &bad).unwrap_err();
        assert_eq!(e.document, 2);
        assert!(e.message.starts_with("spec.action.preset: "), "{e}");
        assert!(e.to_string().contains("(RoutePolicy canary)"), "{e}");

        let typo = text.replace("priority: 2", "priorty: 2");
        let e = parse("p.yaml", &typo).unwrap_err();
        assert!(
            e.message.contains("spec") && e.message.contains("priorty"),
            "{e}"
        );

        let e = parse(
            "p.yaml",
            "apiVersion: v1\nkind: Tenant\nmetadata: {name: x}\n",
        )
        .unwrap_err();
        assert!(e.message.contains("expected warmpath.dev/v1alpha1"), "{e}");
        let e = parse("p.yaml", "apiVersion: warmpath.dev/v1alpha1\nkind: Pod\n").unwrap_err();
        assert!(e.message.starts_with("kind: `Pod`"), "{e}");
        let e = parse(
            "p.yaml",
            "apiVersion: warmpath.dev/v1alpha1\nkind: Tenant\nspec: {}\n",
        )
        .unwrap_err();
        assert!(e.message.contains("metadata"), "{e}");
        assert!(parse("p.yaml", "{{{").is_err());
        assert_eq!(parse("empty.yaml", "---\n---\n").unwrap(), vec![]);
    }
}
