//! vLLM-compatible engine simulator (see docs/sim.md).
