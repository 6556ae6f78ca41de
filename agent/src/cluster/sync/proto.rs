//! `warmpath.cluster.v1.IndexSync`'s messages, written as prost structs (the proto text is
//! in docs/cluster.md; no `protoc`, no build script). Field numbers are the wire contract:
//! never reuse one.

/// One pod and how far the client's copy has come.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PodWatermark {
    #[prost(string, tag = "1")]
    pub pod: String,
    #[prost(uint64, tag = "2")]
    pub incarnation: u64,
    #[prost(uint64, tag = "3")]
    pub sequence: u64,
}

/// The pods a client wants (only pools it routes for), from its watermarks.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Subscribe {
    #[prost(message, repeated, tag = "1")]
    pub pods: Vec<PodWatermark>,
}

/// Speculative entries an agent just made: `keys` routed to `pod`, held for `ttl_ms`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Placement {
    #[prost(string, tag = "1")]
    pub pod: String,
    #[prost(fixed64, repeated, tag = "2")]
    pub keys: Vec<u64>,
    #[prost(uint32, tag = "3")]
    pub ttl_ms: u32,
    /// When the routing agent made it: unix microseconds of its clock (0: not stamped).
    #[prost(fixed64, tag = "4")]
    pub placed_unix_us: u64,
    /// Relayed by the pod's owner from another subscriber (two hops from the router).
    #[prost(bool, tag = "5")]
    pub relayed: bool,
}

/// One agent's load on a pod (docs/cluster.md, "Shared load"): its requests in flight there
/// and the prompt blocks it sent there not yet prefilled, as of `sent_unix_us`. Sent on each
/// change and refreshed while not zero; the latest one per (pod, agent) stands.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PodLoad {
    #[prost(string, tag = "1")]
    pub pod: String,
    /// The agent's node id.
    #[prost(string, tag = "2")]
    pub agent: String,
    #[prost(uint32, tag = "3")]
    pub in_flight: u32,
    #[prost(uint64, tag = "4")]
    pub queued_prefill_blocks: u64,
}

/// A router key and a tier (0 GPU, 1 CPU, 2 disk, 3 other) or tier bits (snapshots).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct KeyTier {
    #[prost(fixed64, tag = "1")]
    pub key: u64,
    #[prost(uint32, tag = "2")]
    pub tier: u32,
}

/// One applied batch of the owner's events, in router keys.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PodDelta {
    #[prost(string, tag = "1")]
    pub pod: String,
    #[prost(uint64, tag = "2")]
    pub incarnation: u64,
    #[prost(uint64, tag = "3")]
    pub sequence: u64,
    #[prost(bool, tag = "4")]
    pub cleared: bool,
    #[prost(message, repeated, tag = "5")]
    pub stored: Vec<KeyTier>,
    #[prost(message, repeated, tag = "6")]
    pub removed: Vec<KeyTier>,
    /// When the owner applied the batch: unix microseconds of its clock (0: not stamped).
    #[prost(fixed64, tag = "7")]
    pub applied_unix_us: u64,
    /// When the engine published the batch (its `ts`), in unix microseconds (0: unknown).
    #[prost(fixed64, tag = "8")]
    pub event_unix_us: u64,
}

/// Part of a pod's whole state at (incarnation, sequence); `tier` holds tier bits.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct SnapshotChunk {
    #[prost(string, tag = "1")]
    pub pod: String,
    #[prost(uint64, tag = "2")]
    pub incarnation: u64,
    #[prost(uint64, tag = "3")]
    pub sequence: u64,
    #[prost(uint32, tag = "4")]
    pub chunk: u32,
    #[prost(bool, tag = "5")]
    pub last: bool,
    #[prost(message, repeated, tag = "6")]
    pub held: Vec<KeyTier>,
}

/// Client to server.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClientMsg {
    #[prost(oneof = "client_msg::Msg", tags = "1, 2, 3")]
    pub msg: Option<client_msg::Msg>,
}

pub mod client_msg {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Msg {
        #[prost(message, tag = "1")]
        Subscribe(super::Subscribe),
        #[prost(message, tag = "2")]
        Placement(super::Placement),
        #[prost(message, tag = "3")]
        Load(super::PodLoad),
    }
}

/// Server to client.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerMsg {
    #[prost(oneof = "server_msg::Msg", tags = "1, 2, 3, 4")]
    pub msg: Option<server_msg::Msg>,
}

pub mod server_msg {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Msg {
        #[prost(message, tag = "1")]
        Delta(super::PodDelta),
        #[prost(message, tag = "2")]
        Snapshot(super::SnapshotChunk),
        #[prost(message, tag = "3")]
        Placement(super::Placement),
        #[prost(message, tag = "4")]
        Load(super::PodLoad),
    }
}
