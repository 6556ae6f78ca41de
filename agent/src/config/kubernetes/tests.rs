use super::*;
use crate::config::parse_in;

const POOL: &str = "version: 1\npools:\n- name: llama\n  model: m\n";

fn env_of<'a>(
    vars: &'a [(&'a str, &'a str)],
    token: bool,
) -> (
    impl Fn(&str) -> Option<String> + 'a,
    impl Fn(&str) -> bool + 'a,
) {
    (
        move |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        },
        move |p: &str| token && p == SERVICE_ACCOUNT_TOKEN,
    )
}

fn parse_with(text: &str, vars: &[(&str, &str)], token: bool) -> Result<Config, ConfigError> {
    let (var, file_exists) = env_of(vars, token);
    parse_in(
        text,
        "f.yaml",
        &Environment {
            var: &var,
            file_exists: &file_exists,
        },
    )
}

fn error(text: &str) -> String {
    parse_with(text, &[], false).unwrap_err().to_string()
}

#[test]
fn the_documented_section_parses() {
    let text = format!(
        "{POOL}  inferencePool: {{namespace: ml, name: llama}}\n\
         - name: sel\n  model: n\n  selector: {{namespace: ml, matchLabels: {{app: vllm-llama}}, port: 8000}}\n\
         kubernetes:\n  enabled: true\n  nodeName: node-a\n  namespaces: [ml]\n  statusWrites: false\n  identity: cluster\n  intercept:\n  - {{namespace: ml, name: llama, port: 8000, pool: llama}}\n"
    );
    let c = parse_with(&text, &[], false).unwrap();
    let k = c.kubernetes.clone().unwrap();
    assert_eq!(
        k,
        KubernetesConfig {
            enabled: true,
            node_name: Some("node-a".into()),
            namespaces: vec!["ml".into()],
            status_writes: false,
            identity: IdentityScope::Cluster,
            intercept: vec![InterceptConfig {
                namespace: "ml".into(),
                name: "llama".into(),
                port: 8000,
                pool: "llama".into(),
            }],
        }
    );
    assert!(c.kubernetes_enabled().is_some());
    assert_eq!(
        c.pools[0].members,
        Some(PoolMembers::InferencePool {
            namespace: "ml".into(),
            name: "llama".into()
        })
    );
    assert!(c.pools[0].endpoints.is_empty());
    assert_eq!(
        c.pools[1].members,
        Some(PoolMembers::Selector {
            namespace: "ml".into(),
            match_labels: [("app".to_string(), "vllm-llama".to_string())].into(),
            port: 8000,
        })
    );
}

#[test]
fn auto_follows_the_environment() {
    let text = format!(
        "{POOL}  selector: {{namespace: ml, matchLabels: {{app: a}}, port: 8000}}\nkubernetes: {{}}\n"
    );
    let enabled = |vars: &[(&str, &str)], token| {
        parse_with(&text, vars, token)
            .map(|c| c.kubernetes.unwrap().enabled)
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        enabled(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")], true),
        Ok(true)
    );
    assert_eq!(
        enabled(&[("KUBECONFIG", "/tmp/kubeconfig")], false),
        Ok(true)
    );
    // The host without a token (not in a pod) and an empty KUBECONFIG: off, and the pool
    // that needs the cluster is refused saying why.
    for (vars, token) in [
        (&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")][..], false),
        (&[("KUBECONFIG", "")][..], false),
        (&[][..], true),
    ] {
        let e = enabled(vars, token).unwrap_err();
        assert!(
            e.contains("pools[0].selector") && e.contains("neither an in-cluster"),
            "{e}"
        );
    }
    let off = format!(
        "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{enabled: auto}}\n"
    );
    let c = parse_with(&off, &[], false).unwrap();
    assert_eq!(c.kubernetes.as_ref().map(|k| k.enabled), Some(false));
    assert!(c.kubernetes_enabled().is_none());
}

#[test]
fn the_node_name_defaults_to_the_variable() {
    let text = format!(
        "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{enabled: false}}\n"
    );
    let node = |vars: &[(&str, &str)]| {
        parse_with(&text, vars, false)
            .unwrap()
            .kubernetes
            .unwrap()
            .node_name
    };
    assert_eq!(node(&[("NODE_NAME", "gpu-7")]), Some("gpu-7".into()));
    assert_eq!(node(&[("NODE_NAME", "")]), None);
    assert_eq!(node(&[]), None);
    let named = text.replace("enabled: false", "enabled: false, nodeName: gpu-1");
    let c = parse_with(&named, &[("NODE_NAME", "gpu-7")], false).unwrap();
    assert_eq!(c.kubernetes.unwrap().node_name, Some("gpu-1".into()));
    // Defaults: statusWrites on, identity node, every namespace.
    let c = parse_with(&text, &[], false).unwrap().kubernetes.unwrap();
    assert!(c.status_writes && c.namespaces.is_empty() && c.intercept.is_empty());
    assert_eq!(c.identity, IdentityScope::Node);
}

#[test]
fn errors_name_the_field_and_say_why() {
    let on = "kubernetes: {enabled: true}\n";
    let sel = |s: &str| format!("{POOL}  selector: {s}\n{on}");
    for (text, field, why) in [
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\n  inferencePool: {{namespace: ml, name: p}}\n{on}"
            ),
            "pools[0].endpoints",
            "not both",
        ),
        (
            format!(
                "{POOL}  inferencePool: {{namespace: ml, name: p}}\n  selector: {{namespace: ml, matchLabels: {{a: b}}, port: 1}}\n{on}"
            ),
            "pools[0].selector",
            "not both",
        ),
        (
            format!("{POOL}  endpoints: []\n"),
            "pools[0].endpoints",
            "at least one endpoint",
        ),
        (
            POOL.to_string(),
            "pools[0].endpoints",
            "`inferencePool` or `selector`",
        ),
        (
            format!("{POOL}  inferencePool: {{namespace: ml, name: p}}\n"),
            "pools[0].inferencePool",
            "no `kubernetes:` section",
        ),
        (
            format!("{POOL}  inferencePool: {{namespace: ML, name: p}}\n{on}"),
            "pools[0].inferencePool.namespace",
            "`ML`: not a DNS label",
        ),
        (
            format!("{POOL}  inferencePool: {{namespace: ml, name: p_1}}\n{on}"),
            "pools[0].inferencePool.name",
            "not a DNS subdomain",
        ),
        (
            format!("{POOL}  inferencePool: {{namespace: ml}}\n{on}"),
            "pools[0].inferencePool",
            "missing field `name`",
        ),
        (
            sel("{namespace: ml, matchLabels: {}, port: 8000}"),
            "pools[0].selector.matchLabels",
            "empty selector",
        ),
        (
            sel("{namespace: ml, matchLabels: {app: 'a b'}, port: 8000}"),
            "pools[0].selector.matchLabels.app",
            "value `a b`",
        ),
        (
            sel("{namespace: ml, matchLabels: {'-x': a}, port: 8000}"),
            "pools[0].selector.matchLabels.-x",
            "key `-x`",
        ),
        (
            sel("{namespace: ml, matchLabels: {app: a}, port: 0}"),
            "pools[0].selector.port",
            "1 to 65535",
        ),
        (
            sel("{namespace: ml, matchLabels: {app: a}, port: 70000}"),
            "pools[0].selector.port",
            "invalid value",
        ),
        (
            sel("{namespace: ml, matchLabels: {app: a}}"),
            "pools[0].selector",
            "missing field `port`",
        ),
        (
            format!(
                "{POOL}  selector: {{namespace: ml, matchLabels: {{app: a}}, port: 1}}\nkubernetes: {{enabled: true, namespaces: [serving]}}\n"
            ),
            "pools[0].selector.namespace",
            "`ml` is not among kubernetes.namespaces (serving)",
        ),
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{enabled: maybe}}\n"
            ),
            "kubernetes.enabled",
            "expected auto, true or false",
        ),
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{enabled: true, namespaces: [ml, ml]}}\n"
            ),
            "kubernetes.namespaces[1]",
            "listed twice",
        ),
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{identity: everywhere}}\n"
            ),
            "kubernetes.identity",
            "unknown variant",
        ),
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{nodeName: Node_1}}\n"
            ),
            "kubernetes.nodeName",
            "`Node_1`",
        ),
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{intercept: [{{namespace: ml, name: llama, port: 8000, pool: other}}]}}\n"
            ),
            "kubernetes.intercept[0].pool",
            "`other` is not a pool",
        ),
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{intercept: [{{namespace: ml, name: llama, port: 8000, pool: llama}}, {{namespace: ml, name: llama, port: 8000, pool: llama}}]}}\n"
            ),
            "kubernetes.intercept[1].port",
            "intercepted twice (also kubernetes.intercept[0])",
        ),
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{intercept: [{{namespace: ml, name: llama, port: 0, pool: llama}}]}}\n"
            ),
            "kubernetes.intercept[0].port",
            "1 to 65535",
        ),
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{namespaces: [ml], intercept: [{{namespace: web, name: llama, port: 80, pool: llama}}]}}\n"
            ),
            "kubernetes.intercept[0].namespace",
            "`web` is not among",
        ),
        (
            format!(
                "{POOL}  endpoints: [{{url: http://127.0.0.1:1}}]\nkubernetes: {{intercept: [{{namespace: ml, name: llama, port: 80, pool: llama, vip: x}}]}}\n"
            ),
            "kubernetes.intercept[0].vip",
            "unknown field `vip`",
        ),
    ] {
        let e = error(&text);
        assert!(
            e.starts_with(&format!("f.yaml: {field}: ")) && e.contains(why),
            "want `{field}` / `{why}`, got: {e}"
        );
    }
}

#[test]
fn kubernetes_names() {
    for ok in ["ml", "a", "team-1", &"a".repeat(63)] {
        assert_eq!(check_label_name(ok), Ok(()), "{ok}");
    }
    for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
        assert!(check_label_name(bad).is_err(), "{bad}");
    }
    for ok in ["a.b", "node-1.example.com", "ip-10-0-0-1.ec2.internal"] {
        assert_eq!(check_subdomain(ok), Ok(()), "{ok}");
    }
    for bad in ["", "a..b", ".a", "a.", "A.b", &"a".repeat(254)] {
        assert!(check_subdomain(bad).is_err(), "{bad}");
    }
    for ok in ["app", "app.kubernetes.io/name", "a_b.c-d", "x/Y"] {
        assert_eq!(check_label_key(ok), Ok(()), "{ok}");
    }
    for bad in ["", "a/", "/a", "A_/b", "a/b/c", "_a", &"k".repeat(64)] {
        assert!(check_label_key(bad).is_err(), "{bad}");
    }
    for ok in ["", "v1", "Llama-3.1_8B"] {
        assert_eq!(check_label_value(ok), Ok(()), "{ok}");
    }
    for bad in ["-v", "v.", "a b", "ü", &"v".repeat(64)] {
        assert!(check_label_value(bad).is_err(), "{bad}");
    }
    let many: BTreeMap<String, String> = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    assert!(
        check_match_labels(&many)
            .unwrap_err()
            .1
            .contains("at most 64")
    );
}
