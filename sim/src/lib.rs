//! vLLM-compatible engine simulator (see docs/sim.md).

pub mod text;
pub mod tokenizer;
