//! docs/policy.md's field tables, generated from the CRDs' OpenAPI schemas ([`super::crds`]):
//! one row per field with its path, type, default or "required", and its doc comment from
//! resources.rs. A test keeps the text between the `<!-- fields:begin -->` and
//! `<!-- fields:end -->` markers of docs/policy.md equal to [`field_tables`];
//! `warmpath crds --docs docs/policy.md` rewrites it.

use std::fmt::Write as _;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

/// The line before the generated tables.
pub const BEGIN: &str = "<!-- fields:begin -->";
/// The line after them.
pub const END: &str = "<!-- fields:end -->";

/// A table per kind (its `spec`), then one for `status` (the same for both kinds).
pub fn field_tables() -> String {
    let crds = super::crds::crds();
    let mut out = String::new();
    for crd in &crds {
        let Some(root) = root(crd) else { continue };
        let Some(spec) = root.properties.as_ref().and_then(|p| p.get("spec")) else {
            continue;
        };
        let scope = if crd.spec.scope == "Namespaced" {
            "namespaced"
        } else {
            "cluster-scoped"
        };
        let _ = writeln!(
            out,
            "### {} (`{}/{}`, {scope}, short name `{}`)\n",
            crd.spec.names.kind,
            crd.spec.group,
            crd.spec.versions.first().map_or("", |v| v.name.as_str()),
            crd.spec
                .names
                .short_names
                .iter()
                .flatten()
                .next()
                .map_or("", String::as_str),
        );
        table(&mut out, "spec", spec);
    }
    if let Some(status) = crds
        .first()
        .and_then(root)
        .and_then(|r| r.properties.as_ref())
        .and_then(|p| p.get("status"))
    {
        out.push_str("### Status (both kinds; written by the agent)\n\n");
        table(&mut out, "status", status);
    }
    out
}

/// Replaces the text between the markers of `doc` with `tables`; `None` when the markers
/// are missing or out of order.
pub fn splice(doc: &str, tables: &str) -> Option<String> {
    let (head, rest) = doc.split_once(BEGIN)?;
    let (_, tail) = rest.split_once(END)?;
    Some(format!("{head}{BEGIN}\n{tables}{END}{tail}"))
}

/// The text between the markers of `doc` (what [`splice`] replaces).
pub fn between_markers(doc: &str) -> Option<&str> {
    let (_, rest) = doc.split_once(BEGIN)?;
    let (inner, _) = rest.split_once(END)?;
    Some(inner.strip_prefix('\n').unwrap_or(inner))
}

fn root(crd: &CustomResourceDefinition) -> Option<&JSONSchemaProps> {
    crd.spec
        .versions
        .first()?
        .schema
        .as_ref()?
        .open_api_v3_schema
        .as_ref()
}

fn table(out: &mut String, path: &str, node: &JSONSchemaProps) {
    out.push_str("| Field | Type | Default | Description |\n|---|---|---|---|\n");
    rows(out, path, node);
    out.push('\n');
}

/// One row per property below `node` (depth first, in name order), each followed by its
/// own fields.
fn rows(out: &mut String, path: &str, node: &JSONSchemaProps) {
    let required = node.required.as_deref().unwrap_or_default();
    for (name, field) in node.properties.iter().flatten() {
        let at = format!("{path}.{name}");
        let default = if required.contains(name) {
            "required".to_string()
        } else {
            field
                .default
                .as_ref()
                .map_or_else(|| "-".to_string(), |d| format!("`{}`", compact(&d.0)))
        };
        let _ = writeln!(
            out,
            "| `{at}` | {} | {default} | {} |",
            type_of(field),
            cell(field.description.as_deref().unwrap_or(""))
        );
        // An array's elements and a map's values are described under `path[]` / `path.*`.
        match (&field.items, &field.additional_properties) {
            (Some(JSONSchemaPropsOrArray::Schema(items)), _) => {
                rows(out, &format!("{at}[]"), items);
            }
            (_, Some(JSONSchemaPropsOrBool::Schema(values))) => {
                rows(out, &format!("{at}.*"), values);
            }
            _ => rows(out, &at, field),
        }
    }
}

/// `string`, `integer (int32)`, `one of precise, ...`, `[]object`, `map[string]number`.
fn type_of(node: &JSONSchemaProps) -> String {
    let base = node.type_.as_deref().unwrap_or("any");
    if let Some(values) = node.enum_.as_ref().filter(|v| !v.is_empty()) {
        let values: Vec<String> = values
            .iter()
            .map(|v| format!("`{}`", compact(&v.0)))
            .collect();
        return format!("one of {}", values.join(", "));
    }
    match (base, &node.items, &node.additional_properties) {
        ("array", Some(JSONSchemaPropsOrArray::Schema(items)), _) => {
            format!("[]{}", type_of(items))
        }
        ("object", _, Some(JSONSchemaPropsOrBool::Schema(values))) => {
            format!("map[string]{}", type_of(values))
        }
        ("integer", ..) => {
            let bounds = match (node.minimum, node.maximum) {
                (_, Some(max)) => format!(", <= {max}"),
                _ => String::new(),
            };
            match node.format.as_deref() {
                Some(f) => format!("integer ({f}{bounds})"),
                None => "integer".into(),
            }
        }
        _ => base.to_string(),
    }
}

/// A JSON value on one line: strings bare, everything else as JSON.
fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A description as one table cell: lines joined, `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGENERATE: &str = "run `cargo run -p warmpath -- crds --docs docs/policy.md`";

    #[test]
    fn docs_policy_md_holds_the_generated_tables() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/policy.md");
        let doc =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let inner = between_markers(&doc)
            .unwrap_or_else(|| panic!("{}: no {BEGIN} ... {END} markers", path.display()));
        assert!(
            inner == field_tables(),
            "{}: the field tables differ from the schema (resources.rs changed): {REGENERATE}",
            path.display()
        );
    }

    #[test]
    fn rows_carry_path_type_default_and_doc() {
        let t = field_tables();
        for row in [
            // Required, an object.
            "| `spec.targetRef` | object | required | The pool the policy applies to: exactly one of `pool`, `service` or `selector`. |",
            // A default from serde, an enum with the field's own doc.
            "| `spec.targetRef.pool.group` | string | `inference.networking.k8s.io` | Defaults to `inference.networking.k8s.io`. |",
            "| `spec.cacheIsolation` | one of `shared`, `isolated` | `shared` |",
            // Arrays' elements, maps' values.
            "| `spec.matches[].headers[].name` | string | required |",
            "| `spec.action.weights` | map[string]number | - |",
            "| `spec.action.split[].weight` | integer (uint32) | required |",
            "| `spec.targetRef.service.port` | integer (uint16, <= 65535) | required | 1-65535. |",
            "| `spec.weight` | integer (uint32) | `1` |",
            "| `status.conditions[].type` | string | required |",
        ] {
            assert!(t.contains(row), "missing row {row}\n{t}");
        }
        assert!(
            t.contains("### RoutePolicy (`warmpath.dev/v1alpha1`, namespaced, short name `wrp`)")
        );
        assert!(
            t.contains("### Tenant (`warmpath.dev/v1alpha1`, cluster-scoped, short name `wtn`)")
        );
        // The failure mode's row has the field's doc (one line) with the two modes.
        let failure = t
            .lines()
            .find(|l| l.starts_with("| `spec.action.failureMode` |"))
            .expect("a failureMode row");
        assert!(
            failure.contains("`failOpen` routes to any ready pod by load"),
            "{failure}"
        );
    }

    /// The ```yaml blocks of a Markdown text.
    fn yaml_blocks(doc: &str) -> Vec<String> {
        let mut blocks = Vec::new();
        let mut current: Option<String> = None;
        for line in doc.lines() {
            match (&mut current, line.trim_end()) {
                (None, "```yaml") => current = Some(String::new()),
                (Some(_), "```") => blocks.extend(current.take()),
                (Some(block), _) => {
                    block.push_str(line);
                    block.push('\n');
                }
                (None, _) => {}
            }
        }
        blocks
    }

    #[test]
    fn the_worked_examples_are_the_example_files_and_validate() {
        use crate::policy::{documents, validate};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = std::fs::read_to_string(root.join("docs/policy.md")).expect("docs/policy.md");
        let blocks = yaml_blocks(&doc);
        // In the page's order; each block shows (a shortened copy of) one example file.
        let files = [
            "canary-split.yaml",
            "team-quotas.yaml",
            "isolated-tenants.yaml",
            "session-affinity.yaml",
            "lora-pool.yaml",
        ];
        assert_eq!(blocks.len(), files.len(), "yaml blocks in docs/policy.md");
        for (i, (block, file)) in blocks.iter().zip(files).enumerate() {
            let shown = documents::parse(&format!("docs/policy.md block {}", i + 1), block)
                .unwrap_or_else(|e| panic!("{e}"));
            let path = root.join("examples/policies").join(file);
            let text = std::fs::read_to_string(&path).expect("the example file");
            let example = documents::parse(file, &text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(shown, example, "block {} differs from {file}", i + 1);
            for r in &shown {
                assert_eq!(validate::validate(r), vec![], "{file}: {}", r.key());
            }
            assert_eq!(validate::validate_set(&shown), vec![], "{file}");
        }
    }

    #[test]
    fn splice_replaces_only_between_the_markers() {
        let doc = format!("# T\n\nintro\n\n{BEGIN}\nold\n{END}\n\nafter\n");
        let new = splice(&doc, "new\n").expect("markers present");
        assert_eq!(
            new,
            format!("# T\n\nintro\n\n{BEGIN}\nnew\n{END}\n\nafter\n")
        );
        assert_eq!(between_markers(&new), Some("new\n"));
        assert_eq!(splice("no markers", "x"), None);
        assert_eq!(splice(&format!("{END}\n{BEGIN}\n"), "x"), None);
    }
}
