//! The cluster flags over a file's section: an advertised address the section derived (on
//! Kubernetes `$POD_IP` with the listen port) follows a listen port the flags move; one the
//! file or a flag gave stays.

use clap::Parser as _;

use super::AgentArgs;
use crate::config::{ClusterConfig, Environment, parse_in};

const POOLS: &str = "version: 1\npools:\n- name: chat\n  model: m\n  endpoints:\n  - {url: http://127.0.0.1:8100}\n";

/// The `cluster:` section `section` of a file on Kubernetes, with `$POD_IP` 10.1.2.3.
fn on_pod(section: &str) -> ClusterConfig {
    let text = format!(
        "{POOLS}kubernetes: {{enabled: true}}\ncluster:\n  id: prod\n  nodeId: node-7\n  keyFile: /etc/warmpath/cluster/key\n{section}"
    );
    let var = |k: &str| (k == "POD_IP").then(|| "10.1.2.3".to_string());
    parse_in(
        &text,
        "f.yaml",
        &Environment {
            var: &var,
            file_exists: &|_| false,
        },
    )
    .expect("the file parses")
    .cluster
    .expect("a cluster section")
}

fn over(flags: &[&str], file: ClusterConfig) -> ClusterConfig {
    AgentArgs::try_parse_from(std::iter::once("agent").chain(flags.iter().copied()))
        .expect("flags parse")
        .cluster
        .over(Some(file))
        .expect("the section with the flags is valid")
        .expect("a section")
}

#[test]
fn a_derived_advertise_address_follows_an_overridden_listen_port() {
    let file = on_pod("");
    assert_eq!(file.gossip_advertise, "10.1.2.3:7400".parse().unwrap());
    assert_eq!(file.grpc_advertise, Some("10.1.2.3:7401".parse().unwrap()));
    let c = over(
        &[
            "--gossip-listen",
            "0.0.0.0:7500",
            "--grpc-listen",
            "0.0.0.0:7501",
        ],
        file.clone(),
    );
    assert_eq!(c.gossip_listen, "0.0.0.0:7500".parse().unwrap());
    assert_eq!(c.gossip_advertise, "10.1.2.3:7500".parse().unwrap());
    assert_eq!(c.grpc_listen, "0.0.0.0:7501".parse().unwrap());
    assert_eq!(c.grpc_advertise, Some("10.1.2.3:7501".parse().unwrap()));
    // One of the two moved: only its advertised address follows.
    let c = over(&["--grpc-listen", "0.0.0.0:7601"], file.clone());
    assert_eq!(c.gossip_advertise, "10.1.2.3:7400".parse().unwrap());
    assert_eq!(c.grpc_advertise, Some("10.1.2.3:7601".parse().unwrap()));
    // A specific listen host is advertised as it is (gossip), or bound and advertised
    // as bound (gRPC).
    let c = over(
        &[
            "--gossip-listen",
            "10.9.9.9:7700",
            "--grpc-listen",
            "10.9.9.9:7701",
        ],
        file,
    );
    assert_eq!(c.gossip_advertise, "10.9.9.9:7700".parse().unwrap());
    assert_eq!(c.grpc_advertise, None);
}

#[test]
fn an_advertise_address_given_stays_when_the_listen_port_moves() {
    // Given in the file.
    let file = on_pod("  gossipAdvertise: 10.5.5.5:9400\n  grpcAdvertise: 10.5.5.5:9401\n");
    let moved = [
        "--gossip-listen",
        "0.0.0.0:7500",
        "--grpc-listen",
        "0.0.0.0:7501",
    ];
    let c = over(&moved, file);
    assert_eq!(c.gossip_listen, "0.0.0.0:7500".parse().unwrap());
    assert_eq!(c.gossip_advertise, "10.5.5.5:9400".parse().unwrap());
    assert_eq!(c.grpc_advertise, Some("10.5.5.5:9401".parse().unwrap()));
    // Given by a flag, whichever order the flags come in.
    let flags = [
        "--gossip-advertise",
        "10.6.6.6:9500",
        "--grpc-advertise",
        "10.6.6.6:9501",
    ];
    let all: Vec<&str> = flags.iter().chain(&moved).copied().collect();
    let c = over(&all, on_pod(""));
    assert_eq!(c.gossip_advertise, "10.6.6.6:9500".parse().unwrap());
    assert_eq!(c.grpc_advertise, Some("10.6.6.6:9501".parse().unwrap()));
}
