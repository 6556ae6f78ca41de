//! The KV-cache index: which sources (vLLM pods, or DP ranks of them) hold which prompt
//! prefixes, built from the engines' own KV events. See docs/index.md.
//!
//! keys (router keys) -> wire (decoding) -> tracker (sequence/gap logic) -> index (apply to the
//! store, per source) <- subscriber (ZeroMQ I/O). The router reads `KvIndex::lookup`.

mod engine_map;
mod entry;
mod health;
mod index;
pub mod keys;
mod msgpack;
mod store;
pub mod subscriber;
mod table;
pub mod tracker;
pub mod wire;

pub use health::{HealthState, SourceStatus};
pub use index::{
    AgentLoad, DEFAULT_STALL_AFTER, DELTA_RING, DELTA_RING_KEYS, IndexConfig, KeyDelta, KvIndex,
    LoadSink, PeerLoadSink, PlacementSink, Since, SourceId, SourceInfo, Watermark,
};
pub use keys::{RequestExtras, RouterKey, request_keys};
pub use store::Match;

/// Where a cached block lives; weights per tier are configurable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Tier {
    Gpu = 0,
    Cpu = 1,
    Disk = 2,
    /// Any other medium string (remote stores, LMCache backends, ...).
    Other = 3,
}

impl Tier {
    pub const COUNT: usize = 4;
    pub const ALL: [Tier; 4] = [Tier::Gpu, Tier::Cpu, Tier::Disk, Tier::Other];

    /// vLLM's `medium` string ("GPU", "CPU", ...), case-insensitive.
    pub fn from_medium(medium: &str) -> Self {
        match medium.to_ascii_uppercase().as_str() {
            "GPU" | "CUDA" => Self::Gpu,
            "CPU" => Self::Cpu,
            "DISK" | "LOCAL_DISK" => Self::Disk,
            _ => Self::Other,
        }
    }

    pub(crate) fn from_index(i: u8) -> Self {
        Self::ALL
            .get(usize::from(i))
            .copied()
            .unwrap_or(Self::Other)
    }

    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "GPU",
            Self::Cpu => "CPU",
            Self::Disk => "DISK",
            Self::Other => "OTHER",
        }
    }
}

/// Default tier weights: a CPU hit saves most of a prefill, a remote one less.
pub const DEFAULT_TIER_WEIGHTS: [f64; Tier::COUNT] = [1.0, 0.8, 0.6, 0.5];
