//! vLLM-compatible engine simulator (see docs/sim.md).

pub mod api;
pub mod cli;
pub mod engine;
pub mod events;
pub mod fleet;
