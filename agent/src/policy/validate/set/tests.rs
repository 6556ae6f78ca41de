//! The set rules: keys given twice, policies with one target and the same matches, tenants
//! claiming one source.

use super::{validate_set, validate_set_indexed};
use crate::policy::{documents, resources::Resource};

/// The resources of a YAML text (the test's own input: it must parse).
fn read(text: &str) -> Vec<Resource> {
    documents::parse("test.yaml", text).expect("test input parses")
}

/// (key, path, word) of every set error.
fn set_errors(text: &str) -> Vec<(String, String, String)> {
    validate_set(&read(text))
        .into_iter()
        .map(|(k, e)| (k, e.path, e.message))
        .collect()
}

fn expect_set(text: &str, want: &[(&str, &str, &str)]) {
    let got = set_errors(text);
    assert_eq!(got.len(), want.len(), "got {got:?}");
    for ((k, p, m), (key, path, word)) in got.iter().zip(want) {
        assert_eq!((k.as_str(), p.as_str()), (*key, *path), "got {got:?}");
        assert!(m.contains(word), "`{word}` not in {m}");
    }
}

fn named_policy(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
    )
}

fn named_tenant(name: &str, identity: &str) -> String {
    format!(
        "---\napiVersion: warmpath.dev/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\nspec: {{identity: {identity}}}\n"
    )
}

#[test]
fn a_key_given_twice_is_rejected_the_second_time() {
    let p = "{targetRef: {pool: {name: a}}}";
    let text = [
        named_policy("default", "x", p),
        named_tenant("x", "{}"),
        // No namespace is the default namespace: the same key.
        "---\napiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {name: x}\nspec: {targetRef: {pool: {name: b}}}\n".into(),
        named_tenant("x", "{cidrs: [10.0.0.0/8]}"),
    ]
    .concat();
    expect_set(
        &text,
        &[
            (
                "default/x",
                "metadata.name",
                "RoutePolicy default/x is given twice",
            ),
            (
                "x",
                "metadata.name",
                "Tenant x is given twice: the one read first (object 2)",
            ),
        ],
    );
    let idx: Vec<usize> = validate_set_indexed(&read(&text))
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    assert_eq!(idx, vec![2, 3]);
}

#[test]
fn policies_with_one_target_and_the_same_matches_conflict() {
    let a = "{targetRef: {pool: {name: chat}, models: [m, n]}, matches: [{headers: [{name: X-A, value: '1'}], models: [b, a]}, {path: {prefix: /v1}}]}";
    // The same target and matches in another order and header case, other actions.
    let b = "{targetRef: {pool: {name: chat}, models: [n, m]}, matches: [{path: {prefix: /v1}}, {models: [a, b], headers: [{name: x-a, value: '1'}]}], action: {preset: least-loaded}}";
    // The later name is rejected, whatever the order of the input.
    let text = [
        named_policy("ml", "zeta", b),
        named_policy("ml", "alpha", a),
    ]
    .concat();
    expect_set(
        &text,
        &[("ml/zeta", "spec.matches", "RoutePolicy ml/alpha")],
    );
    // A third like them is rejected too, naming the first by name.
    let text = [
        named_policy("ml", "zeta", b),
        named_policy("ml", "alpha", a),
        named_policy("ml", "beta", a),
    ]
    .concat();
    expect_set(
        &text,
        &[
            ("ml/zeta", "spec.matches", "ml/alpha"),
            ("ml/beta", "spec.matches", "ml/alpha"),
        ],
    );
    // Without matches both apply to every request of the pool.
    let bare = "{targetRef: {service: {name: s, port: 80}}}";
    let text = [named_policy("ml", "b", bare), named_policy("ml", "a", bare)].concat();
    expect_set(&text, &[("ml/b", "spec.matches", "ml/a")]);
    // One entry without conditions is the same as no matches.
    let empty_entry = "{targetRef: {service: {name: s, port: 80}}, matches: [{}]}";
    let text = [
        named_policy("ml", "b", empty_entry),
        named_policy("ml", "a", bare),
    ]
    .concat();
    expect_set(&text, &[("ml/b", "spec.matches", "ml/a")]);
    // Other namespace, other target models, one more match, other pool: no conflict.
    for other in [
        named_policy("team", "zeta", b),
        named_policy("ml", "zeta", &b.replace("[n, m]", "[n]")),
        named_policy("ml", "zeta", &b.replace("[{path", "[{tenants: [t]}, {path")),
        named_policy("ml", "zeta", &b.replace("name: chat", "name: chat2")),
    ] {
        let text = [named_policy("ml", "alpha", a), other].concat();
        expect_set(&text, &[]);
    }
}

#[test]
fn tenants_claiming_one_source_conflict() {
    // The same network written two ways; the later name is rejected at its entry.
    let text = [
        named_tenant("team-b", "{cidrs: [10.9.0.0/16, 10.0.0.5]}"),
        named_tenant("team-a", "{cidrs: [10.0.0.5/32]}"),
    ]
    .concat();
    expect_set(
        &text,
        &[(
            "team-b",
            "spec.identity.cidrs[1]",
            "also claimed by Tenant team-a",
        )],
    );
    // Nested networks of different lengths: the longest prefix wins, no conflict.
    let text = [
        named_tenant("a", "{cidrs: [10.0.0.0/8]}"),
        named_tenant("b", "{cidrs: [10.1.0.0/16]}"),
    ]
    .concat();
    expect_set(&text, &[]);
    // Namespaces and service accounts likewise; a rejected tenant claims nothing, so `c`
    // keeps what only the rejected `b` also claimed.
    let text = [
        named_tenant("a", "{namespaces: [ml], serviceAccounts: [ml/runner]}"),
        named_tenant("b", "{namespaces: [ml, web], serviceAccounts: [ml/runner]}"),
        named_tenant("c", "{namespaces: [web]}"),
    ]
    .concat();
    expect_set(
        &text,
        &[
            ("b", "spec.identity.namespaces[0]", "Tenant a"),
            ("b", "spec.identity.serviceAccounts[0]", "Tenant a"),
        ],
    );
}
