//! warmpath: a node-local, KV-cache-aware inference router for vLLM.
//!
//! The binary (`src/main.rs`) is a thin CLI over this library; the end-to-end suites in
//! `tests/` drive the same modules.

pub mod agent;
pub mod ascii;
pub mod bench;
pub mod cli;
pub mod config;
pub mod ebpf;
pub mod headers;
pub mod kv_index;
pub mod pool;
pub mod proxy;
pub mod routing;
pub mod status;
pub mod telemetry;
