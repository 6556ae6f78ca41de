//! warmpath: a node-local, KV-cache-aware inference router for vLLM.
//!
//! The `warmpath` binary (`cli/`) is a thin command line over this library, the simulator
//! and the benchmarks; the end-to-end suites in `tests/` drive the same modules.
//!
//! One request's path: [`proxy`] (listener -> handler -> forward -> tap -> record) over
//! [`http`] (warmpath's own HTTP/1.1, which knows nothing of the application), with
//! [`tenant`] resolution, [`routing`] scores over a [`pool`]'s endpoints, and [`telemetry`]
//! recording the outcome.

pub mod agent;
pub mod args;
pub mod cluster;
pub mod config;
pub mod discovery;
pub mod ebpf;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod k8s;
pub mod kv_index;
pub mod policy;
pub mod pool;
pub mod proxy;
pub mod routing;
pub mod status;
pub mod telemetry;
pub mod tenant;
pub mod usage;
