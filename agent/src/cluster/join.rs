//! Joining from `warmpath agent`: the pods of its pools sorted into the ones it owns and the
//! ones it replicates, and the node started over sealed UDP (plain UDP without a key, which
//! the configuration allows on loopback only).

use std::{net::SocketAddr, path::Path, sync::Arc};

use super::{
    ClusterNode, DEFAULT_PUBLISH_EVERY, LocalPod, NodeSettings, StartError,
    auth::{AuthCounters, ClusterKey, KeyError, SealedUdp},
    membership::{DEFAULT_DEAD_GRACE, MembershipConfig},
    remote::DEFAULT_REMOTE_GRACE,
};
use crate::kv_index::{KvIndex, SourceId, SourceInfo};

/// The pods of this agent's pools, as the cluster sees them.
#[derive(Debug, Default)]
pub struct Pods {
    local: Vec<LocalPod>,
    remote: Vec<(String, SourceId)>,
}

impl Pods {
    /// A pod this agent subscribes to.
    pub fn local(&mut self, id: &str, model: &str, source: SourceId) {
        self.local.push(LocalPod {
            id: id.to_string(),
            model: model.to_string(),
            source,
        });
    }

    /// A pod another agent owns: its (one) source here, replicated.
    pub fn remote(&mut self, index: &KvIndex, id: &str) -> SourceId {
        if let Some((_, s)) = self.remote.iter().find(|(p, _)| p == id) {
            return *s;
        }
        let source = index.add_remote_source(SourceInfo {
            pod: id.to_string(),
            rank: None,
        });
        self.remote.push((id.to_string(), source));
        source
    }
}

/// How this agent joins (the configuration's cluster section, without depending on it).
#[derive(Debug, Clone)]
pub struct Join<'a> {
    pub cluster_id: &'a str,
    pub node_id: &'a str,
    pub gossip_listen: SocketAddr,
    pub gossip_advertise: SocketAddr,
    pub seeds: &'a [String],
    pub key_file: Option<&'a Path>,
    pub grpc_listen: SocketAddr,
    /// `None`: the bound address.
    pub grpc_advertise: Option<SocketAddr>,
    pub gossip_interval: std::time::Duration,
    pub proxy: Option<SocketAddr>,
}

/// Why joining failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Start(#[from] StartError),
}

/// Joins the cluster with production timing.
pub async fn join(j: Join<'_>, index: Arc<KvIndex>, pods: Pods) -> Result<ClusterNode, JoinError> {
    let key = j
        .key_file
        .map(|path| ClusterKey::from_file(path, j.cluster_id).map(Arc::new))
        .transpose()?;
    let counters = Arc::new(AuthCounters::default());
    // Milliseconds since the epoch: a restarted agent is a new member.
    let incarnation = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64);
    let settings = NodeSettings {
        membership: MembershipConfig {
            cluster_id: j.cluster_id.to_string(),
            node_id: j.node_id.to_string(),
            incarnation,
            listen: j.gossip_listen,
            advertise: j.gossip_advertise,
            seeds: j.seeds.to_vec(),
            gossip_interval: j.gossip_interval,
            dead_grace: DEFAULT_DEAD_GRACE,
        },
        grpc_listen: j.grpc_listen,
        grpc_advertise: j.grpc_advertise,
        proxy: j.proxy,
        key: key.clone(),
        counters: counters.clone(),
        publish_every: DEFAULT_PUBLISH_EVERY,
        remote_grace: DEFAULT_REMOTE_GRACE,
    };
    let (local, remote) = (pods.local.len(), pods.remote.len());
    let node = match key {
        Some(key) => {
            let transport = SealedUdp::new(key, counters);
            ClusterNode::start(settings, index, pods.local, pods.remote, &transport).await?
        }
        None => {
            let transport = chitchat::transport::UdpTransport;
            ClusterNode::start(settings, index, pods.local, pods.remote, &transport).await?
        }
    };
    tracing::info!(cluster = %j.cluster_id, node = %j.node_id, gossip = %j.gossip_advertise, grpc = %node.grpc_addr(), local, remote, "joined the cluster");
    Ok(node)
}
