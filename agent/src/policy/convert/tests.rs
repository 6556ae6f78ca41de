use std::{collections::BTreeMap, path::Path};

use super::*;
use crate::policy::{
    documents,
    resources::{CacheIsolation, Resource},
    validate,
};

const TWO_POOLS: &str = "../examples/two-pools.yaml";

fn example() -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(TWO_POOLS);
    crate::config::load(&path).expect("the example loads")
}

/// A configuration file in a directory of its own, removed when dropped.
struct TempConfig(PathBuf);

impl TempConfig {
    fn new(name: &str, text: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("warmpath-convert-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let path = dir.join("config.yaml");
        std::fs::write(&path, text).expect("the config file is written");
        Self(path)
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn policy(r: &Resource) -> &RoutePolicy {
    match r {
        Resource::RoutePolicy(p) => p,
        Resource::Tenant(t) => panic!("expected a RoutePolicy, got Tenant {:?}", t.metadata.name),
    }
}

fn tenant(r: &Resource) -> &Tenant {
    match r {
        Resource::Tenant(t) => t,
        Resource::RoutePolicy(p) => {
            panic!("expected a Tenant, got RoutePolicy {:?}", p.metadata.name)
        }
    }
}

#[test]
fn the_two_pool_example_becomes_two_policies_and_two_tenants() {
    let r = from_config(&example());
    let keys: Vec<(&str, String)> = r.iter().map(|r| (r.kind(), r.key())).collect();
    assert_eq!(
        keys,
        [
            ("RoutePolicy", "default/chat".to_string()),
            ("RoutePolicy", "default/batch".to_string()),
            ("Tenant", "team-a".to_string()),
            ("Tenant", "team-b".to_string()),
        ]
    );

    // The values are the example file's (and docs/config.md's defaults for the timeouts).
    let chat = &policy(&r[0]).spec;
    assert_eq!(
        chat.target_ref.pool.as_ref().map(|p| p.name.as_str()),
        Some("chat")
    );
    assert_eq!(
        chat.target_ref
            .pool
            .as_ref()
            .map(|p| (p.group.as_str(), p.kind.as_str())),
        Some(("inference.networking.k8s.io", "InferencePool"))
    );
    assert!(chat.matches.is_empty());
    let a = &chat.action;
    assert_eq!(a.preset, Some(Preset::Precise));
    assert!(
        a.weights.is_empty(),
        "precise with no overrides: {:?}",
        a.weights
    );
    assert_eq!(
        a.tokens,
        Some(TokenSpec {
            source: TokenSourceKind::Builtin,
            dir: None
        })
    );
    assert_eq!(
        a.session,
        Some(SessionSpec {
            header: Some("x-session-id".into()),
            cookie: Some("sid".into())
        })
    );
    assert_eq!(a.retries, Some(2));
    assert_eq!(a.explain, Some(true));
    assert_eq!(
        a.timeouts,
        Some(Timeouts {
            upstream_head_ms: Some(600_000),
            upstream_idle_ms: Some(120_000)
        })
    );
    assert!(a.split.is_empty() && a.failure_mode.is_none() && a.mode.is_none());

    let batch = &policy(&r[1]).spec.action;
    assert_eq!(
        batch.weights,
        BTreeMap::from([("kvUsage".to_string(), 0.5)])
    );
    assert_eq!(
        batch.tokens.as_ref().map(|t| t.source),
        Some(TokenSourceKind::Engine)
    );

    let team_a = &tenant(&r[2]).spec;
    assert_eq!(team_a.identity.cidrs, ["127.0.0.2/32"]);
    assert_eq!(team_a.identity.header_sources, ["127.0.0.4/32"]);
    assert_eq!((team_a.priority, team_a.weight), (0, 1));
    assert_eq!(team_a.cache_isolation, CacheIsolation::Shared);
    assert!(team_a.quotas.is_none());
    let team_b = &tenant(&r[3]).spec;
    assert_eq!(team_b.identity.cidrs, ["127.0.0.3/32", "127.0.0.30/32"]);
    assert_eq!(team_b.identity.header_sources, ["127.0.0.4/32"]);
}

#[test]
fn the_conversion_reads_back_and_validates() {
    let r = from_config(&example());
    let yaml = documents::to_yaml(&r);
    assert_eq!(
        documents::parse("converted.yaml", &yaml).expect("parses back"),
        r
    );
    for one in &r {
        assert_eq!(
            validate::validate(one),
            vec![],
            "{} {}",
            one.kind(),
            one.key()
        );
    }
    assert_eq!(validate::validate_set(&r), vec![]);
}

#[test]
fn presets_tokenizers_and_weights_carry_over() {
    let file = TempConfig::new(
        "presets",
        "version: 1
pools:
- name: rr
  model: a
  policy: {preset: round-robin}
  endpoints: [{url: 'http://127.0.0.1:1'}]
- name: hf
  model: b
  tokens: {source: huggingface, dir: /models/llama}
  policy: {preset: session, weights: {inFlight: 3, session: 1000000000}}
  session: {header: x-user}
  endpoints: [{url: 'http://127.0.0.1:2'}]
- name: approx
  model: c
  tokens: {source: approximate}
  policy: {preset: approximate, weights: {stall: 0}, coldYieldMs: 0}
  endpoints: [{url: 'http://127.0.0.1:3'}]
proxy: {retries: 0, explain: false, upstreamHeadTimeoutMs: 5000, upstreamIdleTimeoutMs: 700}
",
    );
    let r = from_config(&crate::config::load(&file.0).expect("loads"));
    assert_eq!(r.len(), 3, "no tenants: no Tenant resources");
    let rr = &policy(&r[0]).spec.action;
    assert_eq!(rr.preset, Some(Preset::RoundRobin));
    assert!(rr.weights.is_empty());
    assert_eq!(rr.cold_yield_ms, None, "round-robin's own: none");
    assert_eq!((rr.retries, rr.explain), (Some(0), Some(false)));
    assert_eq!(
        rr.timeouts,
        Some(Timeouts {
            upstream_head_ms: Some(5000),
            upstream_idle_ms: Some(700)
        })
    );
    let hf = &policy(&r[1]).spec.action;
    assert_eq!(hf.preset, Some(Preset::Session));
    // session's preset weight is 1e9 already: only inFlight differs.
    assert_eq!(hf.weights, BTreeMap::from([("inFlight".to_string(), 3.0)]));
    assert_eq!(
        hf.tokens,
        Some(TokenSpec {
            source: TokenSourceKind::Huggingface,
            dir: Some("/models/llama".into())
        })
    );
    assert_eq!(
        hf.session,
        Some(SessionSpec {
            header: Some("x-user".into()),
            cookie: None
        })
    );
    let approx = &policy(&r[2]).spec.action;
    assert_eq!(approx.preset, Some(Preset::Approximate));
    assert_eq!(approx.weights, BTreeMap::from([("stall".to_string(), 0.0)]));
    // The preset yields 500 ms; the pool turned it off, and the policy says so.
    assert_eq!(approx.cold_yield_ms, Some(0));
    assert_eq!(
        approx.tokens.as_ref().map(|t| t.source),
        Some(TokenSourceKind::Approximate)
    );
    for one in &r {
        assert_eq!(
            validate::validate(one),
            vec![],
            "{} {}",
            one.kind(),
            one.key()
        );
    }
}

#[test]
fn the_command_prints_yaml_that_reads_back() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(TWO_POOLS);
    let mut out = Vec::new();
    run(&ConvertArgs { file: path }, &mut out).expect("the example converts");
    let text = String::from_utf8(out).expect("UTF-8");
    assert!(text.starts_with("# Converted from "), "{text}");
    assert!(text.contains("tenants.order"), "{text}");
    assert_eq!(
        documents::parse("out.yaml", &text).expect("parses back"),
        from_config(&example())
    );
}

#[test]
fn names_resources_cannot_take_fail_the_command_with_their_paths() {
    // `Team_A` is a valid v1 tenant name but not a DNS name.
    let file = TempConfig::new(
        "names",
        "version: 1
pools:
- name: chat
  model: m
  endpoints: [{url: 'http://127.0.0.1:1'}]
tenants:
  cidrs: {Team_A: [127.0.0.2/32]}
",
    );
    let mut out = Vec::new();
    let e = run(
        &ConvertArgs {
            file: file.0.clone(),
        },
        &mut out,
    )
    .expect_err("invalid name");
    let Error::Invalid(errors) = &e else {
        panic!("expected Invalid, got {e}")
    };
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("Tenant Team_A: metadata.name: `Team_A`"),
        "{errors:?}"
    );
    // The YAML is still written, for the user to edit.
    assert!(String::from_utf8_lossy(&out).contains("name: Team_A"));

    let e = run(
        &ConvertArgs {
            file: file.0.with_file_name("missing.yaml"),
        },
        &mut Vec::new(),
    )
    .expect_err("no such file");
    assert!(
        matches!(e, Error::Config(_)) && e.to_string().contains("missing.yaml"),
        "{e}"
    );
}
