//! The engine model: KV block pool, scheduler, step timing and the engine task.

pub mod cpu_tier;
mod free_list;
pub mod kv_cache;
pub mod metrics;
pub mod scheduler;
pub mod sequence;
mod task;
pub mod timing;

pub use task::{
    CachedBlocks, EVENT_QUEUE, EngineConfig, EngineDead, EngineHandle, StepEvents, Vocabulary,
};
