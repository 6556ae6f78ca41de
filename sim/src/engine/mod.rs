//! The engine model: KV block pool, scheduler, step timing and the engine task.

pub mod cpu_tier;
mod free_list;
pub mod kv_cache;
pub mod metrics;
pub mod scheduler;
pub mod sequence;
mod task;
pub mod timing;

/// A block's content hash (sha256 digest), as the KV cache and its CPU tier key blocks.
pub type BlockHash = [u8; 32];

pub use task::{
    CachedBlocks, EVENT_QUEUE, EngineConfig, EngineDead, EngineHandle, StepEvents, Vocabulary,
};
