//! warmpath: a node-local, KV-cache-aware inference router for vLLM.
//!
//! The `warmpath` binary (`cli/`) is a thin command line over this library, the simulator
//! and the benchmarks; the end-to-end suites in `tests/` drive the same modules.

pub mod agent;
pub mod args;
pub mod ascii;
pub mod config;
pub mod ebpf;
pub mod headers;
pub mod kv_index;
pub mod pool;
pub mod proxy;
pub mod routing;
pub mod status;
pub mod telemetry;
