//! The configuration file's parsing and validation tests.

use super::*;

const EXAMPLE: &str = include_str!("../../../../examples/two-pools.yaml");

#[test]
fn the_example_parses() {
    let c = parse(EXAMPLE, "two-pools.yaml").unwrap();
    assert_eq!(c.pools.len(), 2);
    assert_eq!(
        c.pools[0].endpoints[0].metrics_url,
        "http://127.0.0.1:8100/metrics"
    );
    assert_eq!(c.pools[1].tokens, TokenSourceConfig::Engine);
    assert_eq!(c.pools[1].policy.weights.kv_usage, 0.5);
    assert_eq!(c.listen.len(), 1);
}

fn error(text: &str) -> String {
    parse(text, "f.yaml").unwrap_err().to_string()
}

#[test]
fn errors_name_the_field() {
    let base =
        "version: 1\npools:\n- name: p\n  model: m\n  endpoints:\n  - url: http://127.0.0.1:1\n";
    assert!(parse(base, "f").is_ok());
    let e = error(&base.replace(
        "url: http://127.0.0.1:1",
        "url: http://127.0.0.1:1\n    kvEvent: tcp://x:1",
    ));
    assert!(
        e.contains("pools[0].endpoints[0]") && e.contains("kvEvent"),
        "{e}"
    );
    let e = error(&base.replace("http://127.0.0.1:1", "127.0.0.1:1"));
    assert!(
        e.contains("pools[0].endpoints[0].url") && e.contains("http://host:port"),
        "{e}"
    );
    let e = error(&base.replace("model: m", "model: m\n  blockSize: 0"));
    assert!(e.contains("pools[0].blockSize"), "{e}");
    let e = error(&base.replace(
        "model: m",
        "model: m\n  policy: {preset: precise, weights: {magic: 1}}",
    ));
    assert!(
        e.contains("pools[0].policy.weights.magic") && e.contains("unknown scorer"),
        "{e}"
    );
    let e = error(&base.replace(
        "model: m",
        "model: m\n  policy: {preset: least-loaded, weights: {kvRoom: 1}}",
    ));
    assert!(
        e.contains("pools[0].policy.weights.kvRoom") && e.contains("precise and approximate"),
        "{e}"
    );
    let e = error(&base.replace(
        "model: m",
        "model: m\n  policy: {preset: session, weights: {evict: 2}}",
    ));
    assert!(
        e.contains("pools[0].policy.weights.evict") && e.contains("the evict charge"),
        "{e}"
    );
    let e = error(&base.replace(
        "model: m",
        "model: m\n  policy: {preset: session, coldYieldMs: 100}",
    ));
    assert!(
        e.contains("pools[0].policy.coldYieldMs") && e.contains("precise and approximate"),
        "{e}"
    );
    let e = error(&base.replace("model: m", "model: m\n  policy: {coldYieldMs: 10001}"));
    assert!(
        e.contains("pools[0].policy.coldYieldMs") && e.contains("at most 10000 ms"),
        "{e}"
    );
    let e = error(&base.replace("model: m", "model: m\n  policy: {preset: fastest}"));
    assert!(e.contains("pools[0].policy.preset"), "{e}");
    let e = error(&base.replace("model: m", "model: m\n  tokens: {source: approximate}"));
    assert!(
        e.contains("pools[0].tokens.source") && e.contains("approximate"),
        "{e}"
    );
    let e = error(&base.replace("version: 1", "version: 2"));
    assert!(e.contains("version"), "{e}");
    let e = error(&format!(
        "{base}tenants:\n  cidrs: {{team-a: [300.1.1.1/8]}}\n"
    ));
    assert!(e.contains("tenants.cidrs.team-a[0]"), "{e}");
    let e = error(&format!(
        "{base}tenants:\n  cgroups: {{team-a: [team-a.slice]}}\n"
    ));
    assert!(
        e.contains("tenants.cgroups.team-a[0]") && e.contains("absolute"),
        "{e}"
    );
    let e = error(&format!(
        "{base}tenants:\n  cgroups: {{\"a b\": [/sys/fs/cgroup/x]}}\n"
    ));
    assert!(e.contains("tenants.cgroups.a b"), "{e}");
    let c = parse(
        &format!("{base}tenants:\n  cgroups: {{team-a: [/nonexistent/warmpath]}}\n"),
        "f",
    )
    .unwrap();
    // Listed but absent: accepted, claims nothing until it exists.
    assert_eq!(c.tenants.tenant_of_cgroup(1), None);
    assert!(c.tenants.cgroups.is_some());
    let e = error(&format!("{base}proxy: {{workers: 0}}\n"));
    assert!(e.contains("proxy.workers") && e.contains("1 to 256"), "{e}");
    assert_eq!(
        parse(&format!("{base}proxy: {{workers: 3}}\n"), "f")
            .unwrap()
            .workers,
        3
    );
    let e = error(&format!("{base}proxy: {{maxConcurrent: many}}\n"));
    assert!(
        e.contains("proxy.maxConcurrent: invalid type") && e.matches("maxConcurrent").count() == 1,
        "{e}"
    );
    let e = error(&format!("{base}proxy: {{maxPromptBytes: 0}}\n"));
    assert!(
        e.contains("proxy.maxPromptBytes") && e.contains("body limit"),
        "{e}"
    );
    let e = error(&format!("{base}proxy: {{queueTimeoutMs: 0}}\n"));
    assert!(e.contains("proxy.queueTimeoutMs"), "{e}");
    let l = parse(
        &format!("{base}proxy: {{maxConcurrent: 4, maxQueued: 0, readTimeoutMs: 250}}\n"),
        "f",
    )
    .unwrap()
    .limits;
    assert_eq!((l.max_concurrent, l.max_queued), (4, 0));
    assert_eq!(l.read_timeout, Duration::from_millis(250));
    assert_eq!(l.max_prompt_bytes, super::super::DEFAULT_MAX_PROMPT_BYTES);
    let e = error("version: 1\npools: []\n");
    assert!(e.contains("pools: at least one"), "{e}");
    let e = error(&format!(
        "{base}- name: p\n  model: n\n  endpoints: [{{url: http://127.0.0.1:2}}]\n"
    ));
    assert!(e.contains("pools[1].name") && e.contains("twice"), "{e}");
    assert!(error("version: [").contains("f.yaml"));
}

#[test]
fn the_cluster_concurrency_is_agent_wide_with_one_pool_or_per_pool() {
    let one = "version: 1\npools:\n- name: p\n  model: m\n  endpoints:\n  - url: http://127.0.0.1:1\nproxy: {maxConcurrent: 4, clusterMaxConcurrent: 8}\n";
    assert_eq!(parse(one, "f").unwrap().limits.cluster_max_concurrent, 8);
    let two = one.replace(
        "proxy:",
        "- name: q\n  model: n\n  endpoints: [{url: http://127.0.0.1:2}]\nproxy:",
    );
    let e = error(&two);
    assert!(
        e.contains("proxy.clusterMaxConcurrent") && e.contains("with 2 pools"),
        "{e}"
    );
    let off = two.replace(", clusterMaxConcurrent: 8", "");
    assert!(parse(&off, "f").is_ok());
    // Per pool instead: each pool its own.
    let per_pool = off
        .replace("model: m\n", "model: m\n  clusterMaxConcurrent: 8\n")
        .replace("model: n\n", "model: n\n  clusterMaxConcurrent: 2\n");
    let c = parse(&per_pool, "f").unwrap();
    let caps: Vec<usize> = c.pools.iter().map(|p| p.cluster_max_concurrent).collect();
    assert_eq!(caps, [8, 2]);
    let e = error(&per_pool.replace("name: q", "name: q@x"));
    assert!(
        e.contains("pools[1].clusterMaxConcurrent") && e.contains("`@`"),
        "{e}"
    );
    let e = error(&per_pool.replace("maxConcurrent: 4", "maxConcurrent: 0"));
    assert!(
        e.contains("pools[0].clusterMaxConcurrent") && e.contains("admission on"),
        "{e}"
    );
    // One pool with both: two gates would stack on its requests.
    let both = one.replace("model: m\n", "model: m\n  clusterMaxConcurrent: 8\n");
    let e = error(&both);
    assert!(
        e.contains("pools[0].clusterMaxConcurrent") && e.contains("not both"),
        "{e}"
    );
}
