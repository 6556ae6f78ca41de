//! vLLM-compatible engine simulator (see docs/sim.md).

pub mod engine;
pub mod text;
pub mod tokenizer;
