//! The index's seam for the cluster's shared load counts (docs/cluster.md, "Shared load"):
//! the proxy reports its requests in flight and prefill queued on a pod, the cluster carries
//! them to every agent that routes to the pod, and each hands its peers' figures back to its
//! proxy. The index only passes them through, as it does placements: it is the one handle
//! both sides hold.

use super::{KvIndex, SourceId};

/// One agent's load on one pod: requests it has in flight there, and the prompt blocks it
/// sent there that are not prefilled yet (up to each request's first byte).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentLoad {
    pub in_flight: u32,
    pub queued_prefill_blocks: u64,
}

/// Where the proxy's own loads go (the cluster, to the pod's owner and its replicas).
pub struct LoadSink(Box<Loaded>);

type Loaded = dyn Fn(SourceId, AgentLoad) + Send + Sync;

/// A peer's load: the pod's source, the peer agent's node id, its load.
type PeerLoaded = dyn Fn(SourceId, &str, AgentLoad) + Send + Sync;

impl LoadSink {
    pub fn new(f: impl Fn(SourceId, AgentLoad) + Send + Sync + 'static) -> Self {
        Self(Box::new(f))
    }
}

/// Where peers' loads go (the proxy): the pod's source, the peer agent, its load.
pub struct PeerLoadSink(Box<PeerLoaded>);

impl PeerLoadSink {
    pub fn new(f: impl Fn(SourceId, &str, AgentLoad) + Send + Sync + 'static) -> Self {
        Self(Box::new(f))
    }
}

impl std::fmt::Debug for LoadSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadSink")
    }
}

impl std::fmt::Debug for PeerLoadSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerLoadSink")
    }
}

impl KvIndex {
    /// Sends every later [`KvIndex::report_load`] to `sink` (once; false if one was set).
    pub fn set_load_sink(&self, sink: LoadSink) -> bool {
        self.loads.set(sink).is_ok()
    }

    /// Whether this agent's loads are shared (a cluster set the sink).
    pub fn shares_loads(&self) -> bool {
        self.loads.get().is_some()
    }

    /// The proxy's load on the pod of `id` changed (or is refreshed).
    pub fn report_load(&self, id: SourceId, load: AgentLoad) {
        if let Some(sink) = self.loads.get() {
            (sink.0)(id, load);
        }
    }

    /// Sends every later [`KvIndex::peer_load`] to `sink` (once; false if one was set).
    pub fn set_peer_load_sink(&self, sink: PeerLoadSink) -> bool {
        self.peer_loads.set(sink).is_ok()
    }

    /// A peer agent's load on the pod of `id`, as the cluster received it.
    pub fn peer_load(&self, id: SourceId, agent: &str, load: AgentLoad) {
        if let Some(sink) = self.peer_loads.get() {
            (sink.0)(id, agent, load);
        }
    }
}
