//! Table-driven tests of every check: exact paths and the key words of each message.

use super::*;
use crate::policy::documents;

/// The resources of a YAML text (the test's own input: it must parse).
fn read(text: &str) -> Vec<Resource> {
    documents::parse("test.yaml", text).expect("test input parses")
}

/// (path, value) of every error of the one resource in `text`.
fn errors(text: &str) -> Vec<(String, String, String)> {
    let rs = read(text);
    assert_eq!(rs.len(), 1, "one resource per case");
    validate(&rs[0])
        .into_iter()
        .map(|e| (e.path, e.value, e.message))
        .collect()
}

const POLICY: &str = "
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: canary, namespace: ml}
spec:
  targetRef: {pool: {name: chat}}
";

#[test]
fn a_minimal_policy_is_valid() {
    assert_eq!(errors(POLICY), vec![]);
}

#[test]
fn rates_parse_to_per_second() {
    assert_eq!(parse_rate("100/s"), Ok(100.0));
    assert_eq!(parse_rate("120/min"), Ok(2.0));
    assert_eq!(parse_rate("7200/h"), Ok(2.0));
    assert_eq!(parse_rate("2.5/s"), Ok(2.5));
    for (bad, word) in [
        ("100", "no unit"),
        ("100/day", "unknown unit `day`"),
        ("-5/s", "negative"),
        ("0/s", "zero"),
        ("0.0/min", "zero"),
        ("abc/s", "not a decimal"),
        ("1e3/s", "not a decimal"),
        ("inf/s", "not a decimal"),
        ("/s", "not a decimal"),
        ("1./s", "not a decimal"),
        (" 1/s", "not a decimal"),
    ] {
        let e = parse_rate(bad).expect_err(bad);
        assert!(e.contains(word), "{bad}: {e}");
    }
}
