//! The cluster section of the configuration (docs/cluster.md, "Configuration"): how this
//! agent joins the others, which of its pools' endpoints other agents own, and which pools
//! it replicates.
//!
//! The file's `cluster:` section ([`ClusterFile`]) is converted on its own, its defaults
//! resolved from the environment (on Kubernetes the node name and `$POD_IP`); the checks
//! that need the pools (a `replicate` name, a remote endpoint) run from
//! [`super::Config::validate`]. The flags (`agent/src/args.rs`) override the file field by
//! field and are checked again after.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::cluster::membership::MAX_GOSSIP_INTERVAL;

use super::{
    ConfigError, PoolConfig, authority_of,
    kubernetes::{Environment, KubernetesConfig},
};

/// Where gossip listens by default (UDP).
pub const DEFAULT_GOSSIP_LISTEN: &str = "0.0.0.0:7400";
/// Where the IndexSync gRPC server listens by default (TCP).
pub const DEFAULT_GRPC_LISTEN: &str = "0.0.0.0:7401";
/// The pod's own address, which the chart sets from the downward API (`status.podIP`): on
/// Kubernetes the advertised addresses default to it with the listen ports.
pub const POD_IP_VAR: &str = "POD_IP";

/// Which pools' remote pods this agent replicates (docs/cluster.md, "Only the pools it
/// routes for"). A remote pod of a pool not replicated has no copy here: no IndexSync
/// stream asks for it and no memory holds it; it is routed by load alone (no prefix match,
/// as an engine without KV events).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Replicate {
    /// Every pool this agent routes for (the default).
    #[default]
    Routed,
    /// These pools only, by name (empty: none).
    Pools(Vec<String>),
}

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
    pub gossip_interval: Duration,
    /// Endpoint authorities (`host:port`) of pods other agents own: replicated, not
    /// subscribed to.
    pub remote_endpoints: Vec<String>,
    /// Which pools' remote pods are replicated.
    pub replicate: Replicate,
    /// Which advertised addresses were derived, not given: a flag that moves a listen
    /// address moves them too.
    pub derived: Derived,
}

/// The advertised addresses nobody gave, and the host they are derived on: the pod's
/// address (`$POD_IP`, on Kubernetes) with the listen port where the listen host is
/// unspecified, else the listen address itself (gossip) or the bound one (gRPC: `None`).
/// Kept with the section so that the same derivation runs again after the command line's
/// flags apply ([`ClusterConfig::derive_advertised`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Derived {
    pub gossip: bool,
    pub grpc: bool,
    /// The pod's address, on Kubernetes.
    pub host: Option<std::net::IpAddr>,
}

/// The file's `cluster:` section as written (docs/config.md, "Cluster").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ClusterFile {
    id: String,
    node_id: Option<String>,
    gossip_listen: Option<SocketAddr>,
    gossip_advertise: Option<SocketAddr>,
    #[serde(default)]
    seeds: Vec<String>,
    key_file: Option<PathBuf>,
    grpc_listen: Option<SocketAddr>,
    grpc_advertise: Option<SocketAddr>,
    gossip_interval_ms: Option<u64>,
    /// `http://host:port` of endpoints of the pools that other agents own.
    #[serde(default)]
    remote_endpoints: Vec<String>,
    /// Pool names; absent: every pool.
    replicate: Option<Vec<String>>,
}

/// This machine's host name (the default node id off Kubernetes).
pub fn host_name() -> Option<String> {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
}

/// The section, converted and checked on its own; `kubernetes`: the `kubernetes:` section
/// when it is enabled (its node name is then the default node id, and `$POD_IP` the
/// default advertised host).
pub(super) fn convert(
    f: Option<ClusterFile>,
    file: &str,
    kubernetes: Option<&KubernetesConfig>,
    env: &Environment<'_>,
) -> Result<Option<ClusterConfig>, ConfigError> {
    let Some(f) = f else { return Ok(None) };
    let err = |field: &str, m: String| ConfigError::field(file, format!("cluster.{field}"), m);
    let node_name = kubernetes.and_then(|k| k.node_name.clone());
    let node_id = match f.node_id.or(node_name) {
        Some(n) => n,
        None => host_name().ok_or_else(|| {
            err(
                "nodeId",
                "no host name to default to: give the node id".into(),
            )
        })?,
    };
    let default = |d: &str| d.parse::<SocketAddr>().expect("the default parses");
    let gossip_listen = f
        .gossip_listen
        .unwrap_or_else(|| default(DEFAULT_GOSSIP_LISTEN));
    let grpc_listen = f
        .grpc_listen
        .unwrap_or_else(|| default(DEFAULT_GRPC_LISTEN));
    // On Kubernetes the pod's address (the chart's `$POD_IP`) with the listen ports.
    let pod_ip = kubernetes
        .and_then(|_| (env.var)(POD_IP_VAR))
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
    let remote_endpoints = f
        .remote_endpoints
        .iter()
        .enumerate()
        .map(|(i, url)| {
            authority_of(url).ok_or_else(|| {
                err(
                    &format!("remoteEndpoints[{i}]"),
                    format!("`{url}`: expected http://host:port"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut config = ClusterConfig {
        id: f.id,
        node_id,
        gossip_advertise: f.gossip_advertise.unwrap_or(gossip_listen),
        gossip_listen,
        seeds: f.seeds,
        key_file: f.key_file,
        grpc_advertise: f.grpc_advertise,
        grpc_listen,
        gossip_interval: f
            .gossip_interval_ms
            .map_or(crate::cluster::membership::DEFAULT_GOSSIP_INTERVAL, |ms| {
                Duration::from_millis(ms)
            }),
        remote_endpoints,
        replicate: f.replicate.map_or(Replicate::Routed, Replicate::Pools),
        derived: Derived {
            gossip: f.gossip_advertise.is_none(),
            grpc: f.grpc_advertise.is_none(),
            host: pod_ip,
        },
    };
    config.derive_advertised();
    config.validate(file)?;
    Ok(Some(config))
}

/// The field as the file names it, or the flag.
fn field_name(file: &str, (key, flag): (&str, &str)) -> String {
    if file == super::FLAGS {
        flag.to_string()
    } else {
        format!("cluster.{key}")
    }
}

impl ClusterConfig {
    /// Sets the derived advertised addresses from the listen addresses as they are now
    /// ([`Derived`]); the given ones stay.
    pub fn derive_advertised(&mut self) {
        let host = self.derived.host;
        let on_host = |listen: SocketAddr| match host {
            Some(ip) if listen.ip().is_unspecified() => Some(SocketAddr::new(ip, listen.port())),
            _ => None,
        };
        if self.derived.gossip {
            self.gossip_advertise = on_host(self.gossip_listen).unwrap_or(self.gossip_listen);
        }
        if self.derived.grpc {
            self.grpc_advertise = on_host(self.grpc_listen);
        }
    }

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

    /// Whether the remote pods of pool `pool` (its name) are replicated here.
    pub fn replicates(&self, pool: &str) -> bool {
        match &self.replicate {
            Replicate::Routed => true,
            Replicate::Pools(names) => names.iter().any(|n| n == pool),
        }
    }

    /// Whether `authority` (`host:port`) names a pod another agent owns that this agent
    /// replicates as an endpoint of pool `pool`.
    pub fn replicated_remote(&self, pool: &str, authority: &str) -> bool {
        self.replicates(pool) && self.remote_endpoints.iter().any(|e| e == authority)
    }

    /// Checks the section; `file` names where it came from in errors.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let field = |names, m: String| ConfigError::field(file, field_name(file, names), m);
        crate::cluster::facts::check_id("cluster id", &self.id)
            .map_err(|e| field(("id", "--cluster-id"), e.to_string()))?;
        crate::cluster::facts::check_id("node id", &self.node_id)
            .map_err(|e| field(("nodeId", "--node-id"), e.to_string()))?;
        let grpc = self.grpc_advertise.unwrap_or(self.grpc_listen);
        for (name, addr, any_port) in [
            (
                ("gossipAdvertise", "--gossip-advertise"),
                self.gossip_advertise,
                false,
            ),
            (
                ("grpcAdvertise", "--grpc-advertise"),
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
        for (i, seed) in self.seeds.iter().enumerate() {
            check_seed(seed).map_err(|m| {
                ConfigError::field(
                    file,
                    if file == super::FLAGS {
                        "--seed".to_string()
                    } else {
                        format!("cluster.seeds[{i}]")
                    },
                    m,
                )
            })?;
        }
        let loopback = [
            self.gossip_listen,
            self.gossip_advertise,
            self.grpc_listen,
            grpc,
        ]
        .iter()
        .all(|a| a.ip().is_loopback());
        let interval = ("gossipIntervalMs", "--gossip-interval-ms");
        if self.gossip_interval < Duration::from_millis(10) {
            return Err(field(interval, "at least 10 ms".into()));
        }
        if self.gossip_interval > MAX_GOSSIP_INTERVAL {
            return Err(field(
                interval,
                format!(
                    "at most {} ms (a stopped agent is noticed after 12-15 rounds)",
                    MAX_GOSSIP_INTERVAL.as_millis()
                ),
            ));
        }
        if self.key_file.is_none() && !loopback {
            return Err(field(
                ("keyFile", "--cluster-key-file"),
                "required unless every gossip and gRPC address is loopback: members are told apart from strangers by the shared key".into(),
            ));
        }
        for e in &self.remote_endpoints {
            crate::cluster::facts::check_id("endpoint", e)
                .map_err(|err| field(("remoteEndpoints", "--remote-endpoint"), err.to_string()))?;
        }
        Ok(())
    }

    /// The checks that need the pools: every `replicate` name is a pool (once), and every
    /// remote endpoint is an endpoint of a pool that this agent does not subscribe to.
    pub(super) fn validate_pools(
        &self,
        file: &str,
        pools: &[PoolConfig],
    ) -> Result<(), ConfigError> {
        let flags = file == super::FLAGS;
        let at = |key: &str, flag: &str, i: usize| match flags {
            true => flag.to_string(),
            false => format!("cluster.{key}[{i}]"),
        };
        if let Replicate::Pools(names) = &self.replicate {
            for (i, name) in names.iter().enumerate() {
                let field = at("replicate", "--replicate", i);
                if !pools.iter().any(|p| &p.name == name) {
                    let known: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
                    return Err(ConfigError::field(
                        file,
                        field,
                        format!("no pool is named `{name}` (pools: {})", known.join(", ")),
                    ));
                }
                if names[..i].contains(name) {
                    return Err(ConfigError::field(
                        file,
                        field,
                        format!("pool `{name}` is listed twice"),
                    ));
                }
            }
        }
        for (i, authority) in self.remote_endpoints.iter().enumerate() {
            let field = at("remoteEndpoints", "--remote-endpoint", i);
            let named: Vec<_> = pools
                .iter()
                .flat_map(|p| &p.endpoints)
                .filter(|e| &e.authority == authority)
                .collect();
            if named.is_empty() {
                return Err(ConfigError::field(
                    file,
                    field,
                    format!(
                        "{authority} is not an endpoint of any pool: name it in a pool's `endpoints` too"
                    ),
                ));
            }
            if named.iter().any(|e| e.kv_events.is_some()) {
                return Err(ConfigError::field(
                    file,
                    field,
                    format!(
                        "{authority} has `kvEvents`: this agent subscribes to it, so it is this agent's own pod, not a remote one"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A seed is `host:port` (an address, or a DNS name such as a headless Service's, which
/// chitchat resolves again every minute).
fn check_seed(seed: &str) -> Result<(), String> {
    if seed.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let bad = || format!("`{seed}`: expected host:port (an address or a DNS name)");
    let (host, port) = seed.rsplit_once(':').ok_or_else(bad)?;
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
    match (host_ok, port.parse::<u16>()) {
        (true, Ok(p)) if p > 0 => Ok(()),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests;
