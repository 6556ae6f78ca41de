use std::{collections::BTreeSet, path::PathBuf};

use super::*;

const REGENERATE: &str = "run `cargo run -p warmpath -- crds --out charts/warmpath/crds`";

fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/warmpath/crds")
}

#[test]
fn the_chart_holds_exactly_the_generated_crds() {
    let dir = chart_dir();
    let generated = crd_files();
    for f in &generated {
        let path = dir.join(&f.file_name);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}: {REGENERATE}", path.display()));
        assert!(
            on_disk == f.yaml,
            "{} differs from `warmpath crds` output (the Rust types changed): {REGENERATE}",
            path.display()
        );
    }
    let expected: BTreeSet<String> = generated.iter().map(|f| f.file_name.clone()).collect();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}: {REGENERATE}", dir.display()))
        .map(|e| e.expect("a readable directory entry").file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        present,
        expected,
        "{}: files that `warmpath crds` does not write (a renamed kind?): {REGENERATE}",
        dir.display()
    );
    // The stream is the files, in order, each opened by `---`.
    let stream: String = generated
        .iter()
        .map(|f| format!("---\n{}", f.yaml))
        .collect();
    assert_eq!(crds_yaml(), stream);
}

fn read_back(file: &CrdFile) -> CustomResourceDefinition {
    serde_norway::from_str(&file.yaml)
        .unwrap_or_else(|e| panic!("{} does not read back as a CRD: {e}", file.file_name))
}

#[test]
fn the_crds_read_back_with_their_names_scopes_and_status() {
    let files = crd_files();
    let names: Vec<&str> = files.iter().map(|f| f.file_name.as_str()).collect();
    assert_eq!(
        names,
        [
            "warmpath.dev_routepolicies.yaml",
            "warmpath.dev_tenants.yaml"
        ]
    );
    for (file, (kind, plural, scope, short)) in files.iter().zip([
        ("RoutePolicy", "routepolicies", "Namespaced", "wrp"),
        ("Tenant", "tenants", "Cluster", "wtn"),
    ]) {
        assert!(file.yaml.starts_with(HEADER), "{}", file.file_name);
        let crd = read_back(file);
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.warmpath.dev").as_str())
        );
        let spec = &crd.spec;
        assert_eq!(spec.group, "warmpath.dev");
        assert_eq!(spec.names.kind, kind);
        assert_eq!(spec.names.plural, plural);
        assert_eq!(spec.scope, scope);
        assert_eq!(
            spec.names.short_names.as_deref(),
            Some(&[short.to_string()][..])
        );
        assert_eq!(spec.versions.len(), 1, "{kind}: one version");
        let v = &spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.served && v.storage, "{kind}: v1alpha1 served and stored");
        let status = v.subresources.as_ref().and_then(|s| s.status.as_ref());
        assert!(status.is_some(), "{kind}: status subresource");
        let schema = v
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("a schema");
        assert_eq!(schema.required.as_deref(), Some(&["spec".to_string()][..]));
        let props = schema.properties.as_ref().expect("root properties");
        assert!(props.contains_key("spec") && props.contains_key("status"));
        let status = &props["status"].properties.as_ref().expect("status fields");
        assert!(status.contains_key("conditions") && status.contains_key("observedGeneration"));
        assert!(
            !schema
                .description
                .as_deref()
                .unwrap_or("")
                .contains("Auto-generated"),
            "{kind}: the root description is the spec's doc"
        );
        structural(schema, kind);
    }
}

/// The rules of a structural schema the API server enforces that a schema generator can
/// break: every node typed, no references or definitions, `properties` and
/// `additionalProperties` not both, enum values of the node's type.
fn structural(node: &JSONSchemaProps, at: &str) {
    assert!(node.type_.is_some(), "{at}: no type");
    assert!(
        node.ref_path.is_none() && node.definitions.is_none(),
        "{at}: $ref"
    );
    assert!(
        node.any_of.is_none() && node.one_of.is_none() && node.all_of.is_none(),
        "{at}: a union left unresolved"
    );
    assert!(
        !(node.properties.is_some() && node.additional_properties.is_some()),
        "{at}: properties and additionalProperties"
    );
    if let Some(values) = &node.enum_ {
        let want = node.type_.as_deref();
        for v in values {
            assert!(
                v.0.is_string() && want == Some("string"),
                "{at}: enum value {:?} is not a {want:?}",
                v.0
            );
        }
    }
    for (name, p) in node.properties.iter().flatten() {
        structural(p, &format!("{at}.{name}"));
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = &node.items {
        structural(items, &format!("{at}[]"));
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = &node.additional_properties {
        structural(values, &format!("{at}.*"));
    }
}

fn property<'a>(crd: &'a CustomResourceDefinition, path: &[&str]) -> &'a JSONSchemaProps {
    let mut node = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("a schema");
    for name in path {
        node = node
            .properties
            .as_ref()
            .and_then(|p| p.get(*name))
            .unwrap_or_else(|| panic!("no property {name} in {path:?}"));
    }
    node
}

#[test]
fn optional_enums_keep_their_field_docs_and_no_null_value() {
    let crds = crds();
    let failure = property(&crds[0], &["spec", "action", "failureMode"]);
    // The field's doc comment in resources.rs, not the enum type's.
    assert!(
        failure
            .description
            .as_deref()
            .is_some_and(|d| d.starts_with("When no pod can be scored")),
        "{:?}",
        failure.description
    );
    assert_eq!(failure.nullable, Some(true));
    let preset = property(&crds[0], &["spec", "action", "preset"]);
    let values: Vec<&Value> = preset.enum_.iter().flatten().map(|v| &v.0).collect();
    assert_eq!(
        values,
        [
            "precise",
            "approximate",
            "round-robin",
            "least-loaded",
            "session"
        ]
        .map(|s| Value::String(s.into()))
        .iter()
        .collect::<Vec<_>>()
    );
    let mode = property(&crds[0], &["spec", "action", "mode"]);
    assert!(
        mode.description
            .as_deref()
            .is_some_and(|d| d.starts_with("`proxy`")),
        "{:?}",
        mode.description
    );
    // Non-optional fields were right already and stay so.
    let isolation = property(&crds[1], &["spec", "cacheIsolation"]);
    assert!(
        isolation
            .description
            .as_deref()
            .is_some_and(|d| d.starts_with("`shared`")),
        "{:?}",
        isolation.description
    );
}
