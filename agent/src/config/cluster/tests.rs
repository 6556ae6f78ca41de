use clap::Parser as _;

use super::*;
use crate::{
    args::AgentArgs,
    config::{Config, FLAGS, parse_in},
};

fn loopback() -> ClusterConfig {
    ClusterConfig {
        id: "c".into(),
        node_id: "n1".into(),
        gossip_listen: "127.0.0.1:7400".parse().expect("addr"),
        gossip_advertise: "127.0.0.1:7400".parse().expect("addr"),
        seeds: vec![],
        key_file: None,
        grpc_listen: "127.0.0.1:7401".parse().expect("addr"),
        grpc_advertise: Some("127.0.0.1:7401".parse().expect("addr")),
        gossip_interval: Duration::from_secs(1),
        remote_endpoints: vec!["127.0.0.1:8001".into()],
        replicate: Replicate::Routed,
        derived: Derived::default(),
    }
}

/// Two pools: `chat` with one subscribed and one remote endpoint, `batch` with one remote.
const POOLS: &str = "version: 1\npools:\n\
- name: chat\n  model: m\n  endpoints:\n  - {url: http://127.0.0.1:8100, kvEvents: tcp://127.0.0.1:5557}\n  - {url: http://127.0.0.1:8101}\n\
- name: batch\n  model: n\n  endpoints:\n  - {url: http://127.0.0.1:8200}\n";

fn parse_with(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let var = |k: &str| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    parse_in(
        text,
        "f.yaml",
        &Environment {
            var: &var,
            file_exists: &|_| false,
        },
    )
}

fn error(text: &str) -> String {
    parse_with(text, &[]).unwrap_err().to_string()
}

fn with_cluster(section: &str) -> String {
    format!("{POOLS}cluster:\n{section}")
}

#[test]
fn a_key_is_required_off_loopback_and_advertised_addresses_must_be_reachable() {
    assert!(loopback().validate(FLAGS).is_ok());
    let mut c = loopback();
    c.gossip_listen = "0.0.0.0:7400".parse().expect("addr");
    let err = c.validate("cfg.yaml").expect_err("no key off loopback");
    assert!(
        err.to_string()
            .starts_with("cfg.yaml: cluster.keyFile: required"),
        "{err}"
    );
    let err = c.validate(FLAGS).expect_err("no key off loopback");
    assert!(
        err.to_string().contains("--cluster-key-file: required"),
        "{err}"
    );
    c.key_file = Some("/run/secrets/key".into());
    assert!(c.validate(FLAGS).is_ok());
    c.grpc_advertise = Some("0.0.0.0:7401".parse().expect("addr"));
    let err = c.validate("cfg.yaml").expect_err("unreachable");
    assert!(err.to_string().contains("cluster.grpcAdvertise"), "{err}");
    let mut c = loopback();
    c.node_id = "has space".into();
    assert!(c.validate(FLAGS).is_err());
}

#[test]
fn the_file_section_parses_with_its_defaults() {
    let c = parse_with(
        &with_cluster(
            "  id: prod\n  nodeId: node-a\n  gossipListen: 127.0.0.1:7500\n  seeds: [127.0.0.2:7500, warmpath-gossip.warmpath.svc.cluster.local:7400]\n  grpcListen: 127.0.0.1:7501\n  grpcAdvertise: 127.0.0.1:7501\n  gossipIntervalMs: 250\n  remoteEndpoints: [http://127.0.0.1:8101, http://127.0.0.1:8200]\n  replicate: [chat]\n",
        ),
        &[],
    )
    .unwrap();
    let cluster = c.cluster.expect("a cluster section");
    assert_eq!(
        cluster,
        ClusterConfig {
            id: "prod".into(),
            node_id: "node-a".into(),
            gossip_listen: "127.0.0.1:7500".parse().unwrap(),
            gossip_advertise: "127.0.0.1:7500".parse().unwrap(),
            seeds: vec![
                "127.0.0.2:7500".into(),
                "warmpath-gossip.warmpath.svc.cluster.local:7400".into()
            ],
            key_file: None,
            grpc_listen: "127.0.0.1:7501".parse().unwrap(),
            grpc_advertise: Some("127.0.0.1:7501".parse().unwrap()),
            gossip_interval: Duration::from_millis(250),
            remote_endpoints: vec!["127.0.0.1:8101".into(), "127.0.0.1:8200".into()],
            replicate: Replicate::Pools(vec!["chat".into()]),
            derived: Derived {
                gossip: true,
                grpc: false,
                host: None,
            },
        }
    );
    assert!(cluster.replicated_remote("chat", "127.0.0.1:8101"));
    assert!(!cluster.replicated_remote("batch", "127.0.0.1:8200"));
    assert!(!cluster.replicated_remote("chat", "127.0.0.1:8100"));
    // Only the id: every pool replicated, the production ports (so a key is needed).
    let e = error(&with_cluster("  id: prod\n  nodeId: n\n"));
    assert!(
        e.contains("f.yaml: cluster.gossipAdvertise: 0.0.0.0:7400: peers need"),
        "{e}"
    );
    let c = parse_with(
        &with_cluster(
            "  id: prod\n  nodeId: n\n  gossipListen: 127.0.0.1:7400\n  grpcListen: 127.0.0.1:0\n",
        ),
        &[],
    )
    .unwrap()
    .cluster
    .unwrap();
    assert_eq!(c.replicate, Replicate::Routed);
    assert_eq!(c.gossip_interval, Duration::from_millis(500));
    assert_eq!(c.grpc_advertise, None);
    assert!(c.replicates("batch") && c.replicates("anything"));
    // No cluster section: alone.
    assert!(parse_with(POOLS, &[]).unwrap().cluster.is_none());
}

#[test]
fn on_kubernetes_the_node_name_and_pod_ip_are_the_defaults() {
    let text = format!(
        "{POOLS}kubernetes: {{enabled: true}}\ncluster:\n  id: prod\n  seeds: [warmpath-gossip.warmpath.svc.cluster.local:7400]\n  keyFile: /etc/warmpath/cluster/key\n"
    );
    let vars = [("NODE_NAME", "node-7"), ("POD_IP", "10.1.2.3")];
    let c = parse_with(&text, &vars).unwrap().cluster.unwrap();
    assert_eq!(c.node_id, "node-7");
    assert_eq!(c.gossip_listen, "0.0.0.0:7400".parse().unwrap());
    assert_eq!(c.gossip_advertise, "10.1.2.3:7400".parse().unwrap());
    assert_eq!(c.grpc_advertise, Some("10.1.2.3:7401".parse().unwrap()));
    assert_eq!(c.key_file, Some("/etc/warmpath/cluster/key".into()));
    // On Kubernetes without a node name: the host name, and still the pod's address.
    let c = parse_with(&text, &vars[1..]).unwrap().cluster.unwrap();
    assert_eq!(Some(c.node_id), host_name());
    assert_eq!(c.gossip_advertise, "10.1.2.3:7400".parse().unwrap());
    // Off Kubernetes the variables mean nothing: the advertised address must be given.
    let off = text.replace("enabled: true", "enabled: false");
    let e = parse_with(&off, &vars).unwrap_err().to_string();
    assert!(e.contains("cluster.gossipAdvertise"), "{e}");
}

#[test]
fn errors_name_the_field() {
    let ok = "  id: c\n  nodeId: n\n  gossipListen: 127.0.0.1:7400\n  grpcListen: 127.0.0.1:7401\n";
    assert!(parse_with(&with_cluster(ok), &[]).is_ok());
    let cases = [
        (
            "  replicate: [chat, embed]\n",
            "cluster.replicate[1]: no pool is named `embed` (pools: chat, batch)",
        ),
        (
            "  replicate: [chat, chat]\n",
            "cluster.replicate[1]: pool `chat` is listed twice",
        ),
        (
            "  remoteEndpoints: [http://127.0.0.1:8101, http://127.0.0.1:9999]\n",
            "cluster.remoteEndpoints[1]: 127.0.0.1:9999 is not an endpoint of any pool",
        ),
        (
            "  remoteEndpoints: [http://127.0.0.1:8100]\n",
            "cluster.remoteEndpoints[0]: 127.0.0.1:8100 has `kvEvents`",
        ),
        (
            "  remoteEndpoints: [127.0.0.1:8101]\n",
            "cluster.remoteEndpoints[0]: `127.0.0.1:8101`: expected http://host:port",
        ),
        (
            "  seeds: [127.0.0.1:7400, 'no port']\n",
            "cluster.seeds[1]: `no port`: expected host:port",
        ),
        ("  seeds: ['host:0']\n", "cluster.seeds[0]"),
        (
            "  gossipIntervalMs: 5\n",
            "cluster.gossipIntervalMs: at least 10 ms",
        ),
        (
            "  gossipIntervalMs: 60001\n",
            "cluster.gossipIntervalMs: at most 60000 ms",
        ),
        (
            "  gossipIntervalMs: 18446744073709551615\n",
            "cluster.gossipIntervalMs: at most 60000 ms",
        ),
        (
            "  gossipAdvertise: 0.0.0.0:7400\n",
            "cluster.gossipAdvertise",
        ),
        ("  keyFile: [a]\n", "cluster.keyFile: invalid type"),
        ("  replicas: [chat]\n", "cluster: unknown field `replicas`"),
    ];
    for (extra, expected) in cases {
        let e = error(&with_cluster(&format!("{ok}{extra}")));
        assert!(e.contains(expected), "{extra:?}: {e}");
    }
    let e = error(&with_cluster("  id: 'has space'\n  nodeId: n\n"));
    assert!(e.contains("cluster.id"), "{e}");
    let e = error(&with_cluster("  nodeId: n\n"));
    assert!(e.contains("cluster: missing field `id`"), "{e}");
}

fn agent(flags: &[&str]) -> AgentArgs {
    AgentArgs::try_parse_from(std::iter::once("agent").chain(flags.iter().copied()))
        .expect("flags parse")
}

#[test]
fn flags_override_the_file_field_by_field() {
    let file = parse_with(
        &with_cluster(
            "  id: prod\n  nodeId: node-a\n  gossipListen: 127.0.0.1:7400\n  seeds: [127.0.0.1:7600]\n  grpcListen: 127.0.0.1:7401\n  remoteEndpoints: [http://127.0.0.1:8101]\n  replicate: [chat]\n",
        ),
        &[],
    )
    .unwrap()
    .cluster;
    // No flags: the file's section as it is.
    assert_eq!(agent(&[]).cluster.over(file.clone()).unwrap(), file);
    let c = agent(&[
        "--node-id",
        "node-b",
        "--gossip-listen",
        "127.0.0.2:7400",
        "--seed",
        "127.0.0.3:7400",
        "--replicate",
        "batch",
        "--gossip-interval-ms",
        "100",
    ])
    .cluster
    .over(file.clone())
    .unwrap()
    .unwrap();
    assert_eq!(c.id, "prod", "kept from the file");
    assert_eq!(c.node_id, "node-b");
    assert_eq!(c.gossip_listen, "127.0.0.2:7400".parse().unwrap());
    assert_eq!(
        c.gossip_advertise,
        "127.0.0.2:7400".parse().unwrap(),
        "the defaulted advertise address follows the listen address"
    );
    assert_eq!(c.seeds, vec!["127.0.0.3:7400".to_string()], "replaced");
    assert_eq!(c.grpc_listen, "127.0.0.1:7401".parse().unwrap());
    assert_eq!(c.gossip_interval, Duration::from_millis(100));
    assert_eq!(c.remote_endpoints, vec!["127.0.0.1:8101".to_string()]);
    assert_eq!(c.replicate, Replicate::Pools(vec!["batch".into()]));
    // A flag that breaks the section is refused under its flag's name.
    let e = agent(&["--gossip-listen", "0.0.0.0:7400"])
        .cluster
        .over(file.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("command line: --gossip-advertise"), "{e}");
    let e = agent(&["--gossip-interval-ms", "18446744073709551615"])
        .cluster
        .over(file.clone())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("command line: --gossip-interval-ms: at most 60000 ms"),
        "{e}"
    );
    // Without a section, --cluster-id makes one from the flags alone.
    let c = agent(&[
        "--cluster-id",
        "c",
        "--node-id",
        "n",
        "--gossip-listen",
        "127.0.0.1:7400",
        "--grpc-listen",
        "127.0.0.1:7401",
    ])
    .cluster
    .over(None)
    .unwrap()
    .unwrap();
    assert_eq!(c.gossip_advertise, "127.0.0.1:7400".parse().unwrap());
    assert_eq!(c.replicate, Replicate::Routed);
    let e = agent(&["--replicate", "chat"])
        .cluster
        .over(None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--replicate: needs --cluster-id"), "{e}");
    assert_eq!(agent(&[]).cluster.over(None).unwrap(), None);
}

#[test]
fn the_flag_pool_is_named_default_for_replicate() {
    let base = [
        "--endpoint",
        "http://127.0.0.1:8100",
        "--cluster-id",
        "c",
        "--node-id",
        "n",
        "--gossip-listen",
        "127.0.0.1:7400",
        "--grpc-listen",
        "127.0.0.1:7401",
        "--remote-endpoint",
        "http://127.0.0.1:8101",
    ];
    let mut flags = base.to_vec();
    flags.extend(["--replicate", "default"]);
    let c = agent(&flags).config().unwrap();
    assert!(
        c.cluster
            .unwrap()
            .replicated_remote("default", "127.0.0.1:8101")
    );
    let mut flags = base.to_vec();
    flags.extend(["--replicate", "chat"]);
    let e = agent(&flags).config().unwrap_err().to_string();
    assert!(
        e.contains("--replicate: no pool is named `chat` (pools: default)"),
        "{e}"
    );
}
