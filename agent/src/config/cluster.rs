//! The cluster section of the configuration (docs/cluster.md, "Configuration"): how this
//! agent joins the others, and which of its pools' endpoints other agents own.

use std::{net::SocketAddr, path::PathBuf};

use super::ConfigError;

/// Where gossip listens by default (UDP).
pub const DEFAULT_GOSSIP_LISTEN: &str = "0.0.0.0:7400";
/// Where the IndexSync gRPC server listens by default (TCP).
pub const DEFAULT_GRPC_LISTEN: &str = "0.0.0.0:7401";

/// A validated cluster section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    pub id: String,
    pub node_id: String,
    pub gossip_listen: SocketAddr,
    pub gossip_advertise: SocketAddr,
    pub seeds: Vec<String>,
    /// The shared key's file; `None` only when every address is loopback.
    pub key_file: Option<PathBuf>,
    pub grpc_listen: SocketAddr,
    /// `None`: the bound address (which must then be specific).
    pub grpc_advertise: Option<SocketAddr>,
    /// Gossip rounds (shorter: dead agents noticed sooner, more gossip bytes).
    pub gossip_interval: std::time::Duration,
    /// Endpoint authorities (`host:port`) of pods other agents own: replicated, not
    /// subscribed to.
    pub remote_endpoints: Vec<String>,
}

impl ClusterConfig {
    /// What the cluster needs to join with this section; `proxy`: this agent's listener.
    pub fn join(&self, proxy: Option<SocketAddr>) -> crate::cluster::join::Join<'_> {
        crate::cluster::join::Join {
            cluster_id: &self.id,
            node_id: &self.node_id,
            gossip_listen: self.gossip_listen,
            gossip_advertise: self.gossip_advertise,
            seeds: &self.seeds,
            key_file: self.key_file.as_deref(),
            grpc_listen: self.grpc_listen,
            grpc_advertise: self.grpc_advertise,
            gossip_interval: self.gossip_interval,
            proxy,
        }
    }

    /// Checks the section; `file` names where it came from in errors.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        // The field as the file names it, or the flag.
        let flags = file == super::FLAGS;
        let field = |(f, flag): (&str, &str), m: String| {
            ConfigError::field(file, if flags { flag } else { f }, m)
        };
        crate::cluster::facts::check_id("cluster id", &self.id)
            .map_err(|e| field(("cluster.id", "--cluster-id"), e.to_string()))?;
        crate::cluster::facts::check_id("node id", &self.node_id)
            .map_err(|e| field(("cluster.nodeId", "--node-id"), e.to_string()))?;
        let grpc = self.grpc_advertise.unwrap_or(self.grpc_listen);
        for (name, addr, any_port) in [
            (
                ("cluster.gossipAdvertise", "--gossip-advertise"),
                self.gossip_advertise,
                false,
            ),
            (
                ("cluster.grpcAdvertise", "--grpc-advertise"),
                grpc,
                self.grpc_advertise.is_none(),
            ),
        ] {
            if addr.ip().is_unspecified() || (addr.port() == 0 && !any_port) {
                return Err(field(
                    name,
                    format!(
                        "{addr}: peers need a reachable address and port (give the advertise address)"
                    ),
                ));
            }
        }
        let loopback = [
            self.gossip_listen,
            self.gossip_advertise,
            self.grpc_listen,
            grpc,
        ]
        .iter()
        .all(|a| a.ip().is_loopback());
        if self.gossip_interval < std::time::Duration::from_millis(10) {
            return Err(field(
                ("cluster.gossipIntervalMs", "--gossip-interval-ms"),
                "at least 10 ms".into(),
            ));
        }
        if self.key_file.is_none() && !loopback {
            return Err(field(
                ("cluster.keyFile", "--cluster-key-file"),
                "required unless every gossip and gRPC address is loopback: members are told apart from strangers by the shared key".into(),
            ));
        }
        for e in &self.remote_endpoints {
            crate::cluster::facts::check_id("endpoint", e).map_err(|err| {
                field(
                    ("cluster.remoteEndpoints", "--remote-endpoint"),
                    err.to_string(),
                )
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            gossip_interval: std::time::Duration::from_secs(1),
            remote_endpoints: vec!["127.0.0.1:8001".into()],
        }
    }

    #[test]
    fn a_key_is_required_off_loopback_and_advertised_addresses_must_be_reachable() {
        assert!(loopback().validate("flags").is_ok());
        let mut c = loopback();
        c.gossip_listen = "0.0.0.0:7400".parse().expect("addr");
        let err = c.validate("cfg.yaml").expect_err("no key off loopback");
        assert!(
            err.to_string()
                .starts_with("cfg.yaml: cluster.keyFile: required"),
            "{err}"
        );
        let err = c
            .validate(crate::config::FLAGS)
            .expect_err("no key off loopback");
        assert!(
            err.to_string().contains("--cluster-key-file: required"),
            "{err}"
        );
        c.key_file = Some("/run/secrets/key".into());
        assert!(c.validate("flags").is_ok());
        c.grpc_advertise = Some("0.0.0.0:7401".parse().expect("addr"));
        let err = c.validate("cfg.yaml").expect_err("unreachable");
        assert!(err.to_string().contains("cluster.grpcAdvertise"), "{err}");
        let mut c = loopback();
        c.node_id = "has space".into();
        assert!(c.validate("flags").is_err());
    }
}
