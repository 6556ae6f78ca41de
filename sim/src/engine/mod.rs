//! The engine model: KV block pool, scheduler, step timing and the engine task.

mod free_list;
pub mod kv_cache;
pub mod metrics;
pub mod scheduler;
pub mod sequence;
mod task;
pub mod timing;

pub use task::{EVENT_QUEUE, EngineConfig, EngineDead, EngineHandle, StepEvents, Vocabulary};
