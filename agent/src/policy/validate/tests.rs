//! Table-driven tests of every check: exact paths, values, and the key words of each
//! message. Each case is written as the YAML an operator would write.

use super::*;
use crate::policy::documents;

/// The resources of a YAML text (the test's own input: it must parse).
fn read(text: &str) -> Vec<Resource> {
    documents::parse("test.yaml", text).expect("test input parses")
}

/// A RoutePolicy `ml/p` with this `spec` (YAML, indented by two).
fn policy(spec: &str) -> String {
    format!(
        "apiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {{name: p, namespace: ml}}\nspec:\n{spec}"
    )
}

/// A Tenant `t` with this `spec`.
fn tenant(spec: &str) -> String {
    format!("apiVersion: warmpath.dev/v1alpha1\nkind: Tenant\nmetadata: {{name: t}}\nspec:\n{spec}")
}

/// An error expected: (path, value, a word of the message).
type Want<'a> = (&'a str, &'a str, &'a str);
/// A case: the YAML changed, and the errors it must have.
type Case<'a> = (&'a str, &'a [Want<'a>]);

const POOL: &str = "  targetRef: {pool: {name: chat}}\n";

/// Checks that the one resource of `text` has exactly the errors `want`: (path, value,
/// a word of the message), in order.
fn expect(text: &str, want: &[Want]) {
    let rs = read(text);
    assert_eq!(rs.len(), 1, "one resource per case");
    let got = validate(&rs[0]);
    let show = || got.iter().map(|e| format!("\n  {e}")).collect::<String>();
    assert_eq!(got.len(), want.len(), "for\n{text}\ngot:{}", show());
    for (e, (path, value, word)) in got.iter().zip(want) {
        assert_eq!(e.path, *path, "for\n{text}\ngot:{}", show());
        assert_eq!(e.value, *value, "for\n{text}\ngot:{}", show());
        assert!(e.message.contains(word), "`{word}` not in: {e}");
    }
}

#[test]
fn valid_policies_and_tenants_have_no_errors() {
    for text in [
        policy(POOL),
        policy("  targetRef: {service: {name: llm, port: 8000}, models: [a, b]}\n"),
        policy(
            "  targetRef: {selector: {matchLabels: {app.kubernetes.io/name: vllm, tier: ''}}}\n",
        ),
        policy(&format!(
            "{POOL}  matches:\n    - {{models: [m], path: {{prefix: /v1}}, headers: [{{name: X-Team, value: a b}}], tenants: [team-a, default]}}\n    - {{path: {{exact: /v1/completions}}}}\n"
        )),
        policy(&format!(
            "{POOL}  action: {{preset: approximate, tokens: {{source: approximate}}, retries: 16, timeouts: {{upstreamHeadMs: 1, upstreamIdleMs: 3600000}}}}\n"
        )),
        policy(&format!(
            "{POOL}  action: {{preset: least-loaded, tokens: {{source: approximate}}}}\n"
        )),
        policy(&format!(
            "{POOL}  action: {{weights: {{prefix: 0}}, tokens: {{source: approximate}}}}\n"
        )),
        policy(&format!(
            "{POOL}  action: {{preset: precise, weights: {{prefix: 0, kv_usage: 2}}, tokens: {{source: approximate}}}}\n"
        )),
        policy(&format!(
            "{POOL}  action: {{preset: round-robin, tokens: {{source: approximate}}}}\n"
        )),
        policy(&format!(
            "{POOL}  action: {{tokens: {{source: huggingface, dir: /models/x}}}}\n"
        )),
        policy(&format!(
            "{POOL}  action: {{split: [{{model: a, weight: 0}}, {{pool: other, weight: 10000}}, {{pool: other, model: a, weight: 1}}]}}\n"
        )),
        policy(&format!(
            "{POOL}  action: {{mode: steer, preset: least-loaded, weights: {{queue: 2}}, failureMode: failClosed, explain: false}}\n"
        )),
        policy(&format!(
            "{POOL}  action: {{session: {{header: X-Session, cookie: sid_2}}}}\n"
        )),
        tenant(
            "  identity: {cidrs: [10.0.0.0/8, 10.0.0.5, 'fd00::/8'], headerSources: [127.0.0.9/32]}\n",
        ),
        tenant(
            "  identity: {namespaces: [a, b], serviceAccounts: [a/runner.v2], podLabels: {matchLabels: {app: x}}}\n",
        ),
        tenant(
            "  priority: -1000\n  weight: 1000\n  quotas: {requests: 1/s, promptTokens: 2.5/min, outputTokens: 3600/h, concurrentStreams: 1, burstSeconds: 0.05}\n",
        ),
        tenant(
            "  priority: 1000\n  weight: 1\n  quotas: {burstSeconds: 60}\n  cacheIsolation: isolated\n",
        ),
    ] {
        expect(&text, &[]);
    }
}

#[test]
fn names() {
    let long = "a".repeat(254);
    for (name, ns, want) in [
        (
            "Canary",
            "ml",
            ("metadata.name", "Canary", "DNS-1123 subdomain"),
        ),
        ("a_b", "ml", ("metadata.name", "a_b", "lowercase")),
        ("-a", "ml", ("metadata.name", "-a", "start and end")),
        ("a..b", "ml", ("metadata.name", "a..b", "empty part")),
        (
            long.as_str(),
            "ml",
            ("metadata.name", long.as_str(), "at most 253"),
        ),
        ("p", "ML", ("metadata.namespace", "ML", "DNS-1123 label")),
        ("p", "a.b", ("metadata.namespace", "a.b", "DNS-1123 label")),
    ] {
        let text = format!(
            "apiVersion: warmpath.dev/v1alpha1\nkind: RoutePolicy\nmetadata: {{name: '{name}', namespace: '{ns}'}}\nspec:\n{POOL}"
        );
        expect(&text, &[want]);
    }
    let long = "a".repeat(65);
    for (name, want) in [
        ("Team", ("metadata.name", "Team", "DNS-1123")),
        ("team_a", ("metadata.name", "team_a", "DNS-1123")),
        ("team:a", ("metadata.name", "team:a", "DNS-1123")),
        ("other", ("metadata.name", "other", "reserved")),
        (long.as_str(), ("metadata.name", long.as_str(), "1 to 64")),
    ] {
        let text = format!(
            "apiVersion: warmpath.dev/v1alpha1\nkind: Tenant\nmetadata: {{name: '{name}'}}\nspec: {{}}\n"
        );
        expect(&text, &[want]);
    }
    let text = "apiVersion: warmpath.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t, namespace: ml}\nspec: {}\n";
    expect(text, &[("metadata.namespace", "ml", "cluster-scoped")]);
}

#[test]
fn target_ref() {
    let cases: &[Case] = &[
        ("targetRef: {}", &[("spec.targetRef", "", "none of pool")]),
        (
            "targetRef: {pool: {name: a}, service: {name: b, port: 80}}",
            &[("spec.targetRef", "pool, service", "exactly one")],
        ),
        (
            "targetRef: {pool: {name: a}, service: {name: b, port: 80}, selector: {matchLabels: {a: b}}}",
            &[("spec.targetRef", "pool, service, selector", "exactly one")],
        ),
        (
            "targetRef: {pool: {name: Chat}}",
            &[("spec.targetRef.pool.name", "Chat", "DNS-1123 label")],
        ),
        (
            "targetRef: {pool: {name: ''}}",
            &[("spec.targetRef.pool.name", "", "empty")],
        ),
        (
            "targetRef: {pool: {name: a, group: example.com}}",
            &[(
                "spec.targetRef.pool.group",
                "example.com",
                "inference.networking.k8s.io",
            )],
        ),
        (
            "targetRef: {pool: {name: a, kind: Service}}",
            &[("spec.targetRef.pool.kind", "Service", "InferencePool")],
        ),
        (
            "targetRef: {service: {name: a, port: 0}}",
            &[("spec.targetRef.service.port", "0", "1-65535")],
        ),
        (
            "targetRef: {service: {name: a.b, port: 80}}",
            &[("spec.targetRef.service.name", "a.b", "DNS-1123 label")],
        ),
        (
            "targetRef: {selector: {matchLabels: {}}}",
            &[("spec.targetRef.selector.matchLabels", "", "no labels")],
        ),
        (
            "targetRef: {selector: {}}",
            &[("spec.targetRef.selector.matchLabels", "", "no labels")],
        ),
        (
            "targetRef: {selector: {matchLabels: {'bad key': x}}}",
            &[(
                "spec.targetRef.selector.matchLabels.bad key",
                "bad key",
                "label key name",
            )],
        ),
        (
            "targetRef: {selector: {matchLabels: {Example.com/app: x}}}",
            &[(
                "spec.targetRef.selector.matchLabels.Example.com/app",
                "Example.com/app",
                "prefix",
            )],
        ),
        (
            "targetRef: {selector: {matchLabels: {app: -x}}}",
            &[(
                "spec.targetRef.selector.matchLabels.app",
                "-x",
                "label value",
            )],
        ),
        (
            "targetRef: {pool: {name: a}, models: ['a b', '', m, m]}",
            &[
                ("spec.targetRef.models[0]", "a b", "whitespace"),
                ("spec.targetRef.models[1]", "", "empty"),
                (
                    "spec.targetRef.models[3]",
                    "m",
                    "twice (also spec.targetRef.models[2])",
                ),
            ],
        ),
    ];
    for (spec, want) in cases {
        expect(&policy(&format!("  {spec}\n")), want);
    }
}

#[test]
fn matches() {
    let cases: &[Case] = &[
        (
            "[{path: {exact: /a, prefix: /b}}]",
            &[("spec.matches[0].path", "exact, prefix", "exactly one")],
        ),
        ("[{path: {}}]", &[("spec.matches[0].path", "", "neither")]),
        (
            "[{}, {path: {prefix: v1}}]",
            &[("spec.matches[1].path.prefix", "v1", "start with '/'")],
        ),
        (
            "[{path: {exact: '/v1?x=1'}}]",
            &[("spec.matches[0].path.exact", "/v1?x=1", "query")],
        ),
        (
            "[{path: {exact: '/a b'}}]",
            &[("spec.matches[0].path.exact", "/a b", "visible ASCII")],
        ),
        (
            "[{headers: [{name: 'bad header', value: x}]}]",
            &[(
                "spec.matches[0].headers[0].name",
                "bad header",
                "not an HTTP header name",
            )],
        ),
        (
            "[{headers: [{name: ':path', value: /x}]}]",
            &[("spec.matches[0].headers[0].name", ":path", "pseudo-header")],
        ),
        (
            "[{headers: [{name: Connection, value: close}, {name: Transfer-Encoding, value: chunked}]}]",
            &[
                (
                    "spec.matches[0].headers[0].name",
                    "Connection",
                    "hop-by-hop",
                ),
                (
                    "spec.matches[0].headers[1].name",
                    "Transfer-Encoding",
                    "hop-by-hop",
                ),
            ],
        ),
        (
            "[{headers: [{name: X-A, value: '1'}, {name: x-b, value: '2'}, {name: x-a, value: '3'}]}]",
            &[(
                "spec.matches[0].headers[2].name",
                "x-a",
                "also spec.matches[0].headers[0].name: two conditions on one header conflict",
            )],
        ),
        (
            "[{headers: [{name: x-a, value: \"a\\x01\"}]}]",
            &[(
                "spec.matches[0].headers[0].value",
                "a\u{1}",
                "control characters",
            )],
        ),
        (
            "[{tenants: ['bad tenant', a, a]}]",
            &[
                ("spec.matches[0].tenants[0]", "bad tenant", "tenant name"),
                ("spec.matches[0].tenants[2]", "a", "twice"),
            ],
        ),
        (
            "[{models: [m, n, m]}]",
            &[(
                "spec.matches[0].models[2]",
                "m",
                "twice (also spec.matches[0].models[0])",
            )],
        ),
        (
            "[{models: [a, b], headers: [{name: X-A, value: '1'}, {name: x-b, value: '2'}]}, {path: {prefix: /}}, {headers: [{name: x-b, value: '2'}, {name: x-a, value: '1'}], models: [b, a]}]",
            &[("spec.matches[2]", "", "identical to spec.matches[0]")],
        ),
        (
            "[{}, {}]",
            &[("spec.matches[1]", "", "identical to spec.matches[0]")],
        ),
    ];
    for (list, want) in cases {
        expect(&policy(&format!("{POOL}  matches: {list}\n")), want);
    }
    // Header values differing only in case are different conditions.
    expect(
        &policy(&format!(
            "{POOL}  matches: [{{headers: [{{name: x, value: A}}]}}, {{headers: [{{name: x, value: a}}]}}]\n"
        )),
        &[],
    );
    let many = vec!["{}"; MAX_MATCHES + 1].join(", ");
    expect(
        &policy(&format!("{POOL}  matches: [{many}]\n")),
        &[("spec.matches", "65", "at most 64")],
    );
}

#[test]
fn weights_and_tokens() {
    let cases: &[Case] = &[
        (
            "{weights: {inFlight: -1}}",
            &[("spec.action.weights.inFlight", "-1", "finite number >= 0")],
        ),
        (
            "{weights: {queue: .nan, prefix: .inf}}",
            &[
                ("spec.action.weights.prefix", "inf", "finite"),
                ("spec.action.weights.queue", "NaN", "finite"),
            ],
        ),
        (
            "{weights: {fast: 1}}",
            &[("spec.action.weights.fast", "1", "unknown scorer `fast`")],
        ),
        (
            "{weights: {kvUsage: 1, kv-usage: 2}}",
            &[(
                "spec.action.weights.kvUsage",
                "1",
                "same scorer as weights.kv-usage",
            )],
        ),
        (
            "{preset: round-robin, weights: {prefix: 1, queue: 0}}",
            &[("spec.action.weights", "prefix, queue", "round-robin")],
        ),
        (
            "{preset: least-loaded, weights: {kvRoom: 1, queue: 1}}",
            &[(
                "spec.action.weights.kvRoom",
                "1",
                "priced only by presets precise and approximate",
            )],
        ),
        (
            "{preset: session, weights: {evict: 0.5}}",
            &[(
                "spec.action.weights.evict",
                "0.5",
                "the evict charge is priced only by presets precise and approximate",
            )],
        ),
        (
            "{preset: least-loaded, coldYieldMs: 250}",
            &[(
                "spec.action.coldYieldMs",
                "250",
                "only presets precise and approximate know each pod's KV room",
            )],
        ),
        (
            "{coldYieldMs: 60000}",
            &[("spec.action.coldYieldMs", "60000", "at most 10000 ms")],
        ),
        (
            "{tokens: {source: huggingface}}",
            &[(
                "spec.action.tokens.dir",
                "",
                "needs the tokenizer directory",
            )],
        ),
        (
            "{tokens: {source: huggingface, dir: ' '}}",
            &[("spec.action.tokens.dir", " ", "empty")],
        ),
        (
            "{tokens: {source: builtin, dir: /m}}",
            &[("spec.action.tokens.dir", "/m", "only source huggingface")],
        ),
        (
            "{preset: precise, tokens: {source: approximate}}",
            &[(
                "spec.action.tokens.source",
                "approximate",
                "never match the KV event index",
            )],
        ),
        (
            "{preset: session, weights: {prefix: 1}, tokens: {source: approximate}}",
            &[(
                "spec.action.tokens.source",
                "approximate",
                "weights.prefix to 0",
            )],
        ),
        (
            "{tokens: {source: approximate}}",
            &[(
                "spec.action.tokens.source",
                "approximate",
                "the pool's preset applies",
            )],
        ),
    ];
    for (action, want) in cases {
        expect(&policy(&format!("{POOL}  action: {action}\n")), want);
    }
}

#[test]
fn retries_timeouts_split_session() {
    let ways17 = vec!["{model: m, weight: 1}"; MAX_SPLIT + 1].join(", ");
    let split17 = format!("{{split: [{ways17}]}}");
    let cases: &[Case] = &[
        ("{retries: 17}", &[("spec.action.retries", "17", "0 to 16")]),
        (
            "{timeouts: {upstreamHeadMs: 0, upstreamIdleMs: 3600001}}",
            &[
                ("spec.action.timeouts.upstreamHeadMs", "0", "1 ms to 1 hour"),
                (
                    "spec.action.timeouts.upstreamIdleMs",
                    "3600001",
                    "1 ms to 1 hour",
                ),
            ],
        ),
        (
            "{split: [{model: a, weight: 0}, {model: b, weight: 0}]}",
            &[("spec.action.split", "", "every way has weight 0")],
        ),
        (
            "{split: [{model: a, weight: 10001}]}",
            &[("spec.action.split[0].weight", "10001", "0 to 10000")],
        ),
        (&split17, &[("spec.action.split", "17", "at most 16")]),
        (
            "{split: [{model: a, weight: 1}, {weight: 1}]}",
            &[("spec.action.split[1]", "", "neither a pool nor a model")],
        ),
        (
            "{split: [{pool: p, model: a, weight: 1}, {model: a, weight: 1}, {model: a, pool: p, weight: 2}]}",
            &[(
                "spec.action.split[2]",
                "",
                "same pool and model as spec.action.split[0]",
            )],
        ),
        (
            "{split: [{pool: Bad, weight: 1}, {model: 'a b', weight: 1}]}",
            &[
                ("spec.action.split[0].pool", "Bad", "DNS-1123 label"),
                ("spec.action.split[1].model", "a b", "whitespace"),
            ],
        ),
        (
            "{session: {header: 'bad header', cookie: 'a;b'}}",
            &[
                (
                    "spec.action.session.header",
                    "bad header",
                    "not an HTTP header name",
                ),
                ("spec.action.session.cookie", "a;b", "cookie name"),
            ],
        ),
        (
            "{session: {header: upgrade, cookie: ''}}",
            &[
                ("spec.action.session.header", "upgrade", "hop-by-hop"),
                ("spec.action.session.cookie", "", "empty"),
            ],
        ),
    ];
    for (action, want) in cases {
        expect(&policy(&format!("{POOL}  action: {action}\n")), want);
    }
}

#[test]
fn steer_excludes_everything_decided_per_request() {
    let text = policy(
        "  targetRef: {pool: {name: chat}, models: [m]}\n  matches: [{path: {prefix: /v1}}]\n  action: {mode: steer, split: [{model: m, weight: 1}], tokens: {source: builtin}, session: {}, retries: 1, timeouts: {}, explain: true}\n",
    );
    let want: Vec<Want> = [
        "spec.matches",
        "spec.targetRef.models",
        "spec.action.split",
        "spec.action.tokens",
        "spec.action.session",
        "spec.action.retries",
        "spec.action.timeouts",
        "spec.action.explain",
    ]
    .into_iter()
    .map(|path| (path, "", "mode steer routes whole connections"))
    .collect();
    expect(&text, &want);
}

#[test]
fn every_error_of_an_object_is_reported() {
    expect(
        &policy(
            "  targetRef: {}\n  matches: [{headers: [{name: 'a b', value: x}]}]\n  action: {weights: {inFlight: -1}, retries: 99}\n",
        ),
        &[
            ("spec.targetRef", "", "none of pool"),
            ("spec.matches[0].headers[0].name", "a b", "header name"),
            ("spec.action.weights.inFlight", "-1", ">= 0"),
            ("spec.action.retries", "99", "0 to 16"),
        ],
    );
}

#[test]
fn tenant_fields() {
    let cases: &[Case] = &[
        (
            "priority: 1001",
            &[("spec.priority", "1001", "-1000 to 1000")],
        ),
        (
            "priority: -1001",
            &[("spec.priority", "-1001", "-1000 to 1000")],
        ),
        ("weight: 0", &[("spec.weight", "0", "1 to 1000")]),
        ("weight: 1001", &[("spec.weight", "1001", "1 to 1000")]),
        (
            "identity: {cidrs: [10.0.0.0/33, 10.0.0.1/8, 10.1.0.0/16, 10.1.0.0/16, '::ffff:10.0.0.0/104']}",
            &[
                ("spec.identity.cidrs[0]", "10.0.0.0/33", "expected a CIDR"),
                (
                    "spec.identity.cidrs[1]",
                    "10.0.0.1/8",
                    "host bits set: the network is 10.0.0.0/8",
                ),
                (
                    "spec.identity.cidrs[3]",
                    "10.1.0.0/16",
                    "same network as spec.identity.cidrs[2]",
                ),
                (
                    "spec.identity.cidrs[4]",
                    "::ffff:10.0.0.0/104",
                    "IPv4-mapped",
                ),
            ],
        ),
        (
            "identity: {headerSources: [gateway, 10.0.0.9, 10.0.0.9/32]}",
            &[
                (
                    "spec.identity.headerSources[0]",
                    "gateway",
                    "expected a CIDR",
                ),
                (
                    "spec.identity.headerSources[2]",
                    "10.0.0.9/32",
                    "same network",
                ),
            ],
        ),
        (
            "identity: {serviceAccounts: [default, Ns/x, a/B, a/b, a/b]}",
            &[
                (
                    "spec.identity.serviceAccounts[0]",
                    "default",
                    "namespace/name",
                ),
                ("spec.identity.serviceAccounts[1]", "Ns/x", "namespace `Ns`"),
                ("spec.identity.serviceAccounts[2]", "a/B", "name `B`"),
                ("spec.identity.serviceAccounts[4]", "a/b", "twice"),
            ],
        ),
        (
            "identity: {namespaces: [Team, a, a]}",
            &[
                ("spec.identity.namespaces[0]", "Team", "DNS-1123 label"),
                ("spec.identity.namespaces[2]", "a", "twice"),
            ],
        ),
        (
            "identity: {podLabels: {matchLabels: {}}}",
            &[("spec.identity.podLabels.matchLabels", "", "no labels")],
        ),
        (
            "identity: {podLabels: {matchLabels: {a/b/c: x}}}",
            &[(
                "spec.identity.podLabels.matchLabels.a/b/c",
                "a/b/c",
                "label key name",
            )],
        ),
        (
            "quotas: {requests: '100', promptTokens: 100/day, outputTokens: -5/s}",
            &[
                ("spec.quotas.requests", "100", "no unit"),
                ("spec.quotas.promptTokens", "100/day", "unknown unit `day`"),
                ("spec.quotas.outputTokens", "-5/s", "negative"),
            ],
        ),
        (
            "quotas: {requests: 0/s, concurrentStreams: 0, burstSeconds: 0.01}",
            &[
                ("spec.quotas.requests", "0/s", "zero"),
                ("spec.quotas.concurrentStreams", "0", ">= 1"),
                ("spec.quotas.burstSeconds", "0.01", "0.05 to 60"),
            ],
        ),
        (
            "quotas: {burstSeconds: 61}",
            &[("spec.quotas.burstSeconds", "61", "0.05 to 60")],
        ),
        (
            "quotas: {burstSeconds: .nan}",
            &[("spec.quotas.burstSeconds", "NaN", "0.05 to 60")],
        ),
    ];
    for (spec, want) in cases {
        expect(&tenant(&format!("  {spec}\n")), want);
    }
}

#[test]
fn rates_parse_to_per_second() {
    assert_eq!(parse_rate("100/s"), Ok(100.0));
    assert_eq!(parse_rate("120/min"), Ok(2.0));
    assert_eq!(parse_rate("7200/h"), Ok(2.0));
    assert_eq!(parse_rate("2.5/s"), Ok(2.5));
    assert_eq!(parse_rate("0.5/s"), Ok(0.5));
    for (bad, word) in [
        ("100", "no unit"),
        ("100/day", "unknown unit `day`"),
        ("100/S", "unknown unit `S`"),
        ("100/s/s", "unknown unit `s/s`"),
        ("-5/s", "negative"),
        ("0/s", "zero"),
        ("0.0/min", "zero"),
        ("abc/s", "not a decimal"),
        ("1e3/s", "not a decimal"),
        ("inf/s", "not a decimal"),
        ("+5/s", "not a decimal"),
        ("/s", "not a decimal"),
        ("1./s", "not a decimal"),
        (" 1/s", "not a decimal"),
        ("", "no unit"),
    ] {
        let e = parse_rate(bad).expect_err(bad);
        assert!(e.contains(word), "{bad}: {e}");
    }
    let long = format!("{}/s", "9".repeat(40));
    assert!(
        parse_rate(&long)
            .expect_err("too long")
            .contains("at most 32")
    );
}

// === examples ===

/// Every file of examples/policies validates, alone and as one set.
#[test]
fn every_example_validates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/policies exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "examples: {files:?}");
    let mut all = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("example readable");
        let rs =
            documents::parse(&f.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"));
        assert!(!rs.is_empty(), "{} holds no resource", f.display());
        for r in &rs {
            let errors = validate(r);
            assert!(
                errors.is_empty(),
                "{}: {} {}: {errors:?}",
                f.display(),
                r.kind(),
                r.key()
            );
        }
        all.extend(rs);
    }
    assert_eq!(validate_set(&all), vec![]);
    for kind in ["RoutePolicy", "Tenant"] {
        assert!(all.iter().any(|r| r.kind() == kind), "no {kind} example");
    }
}
