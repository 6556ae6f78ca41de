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
pub mod contention;
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

/// An error and its causes, `a: b: c` (hyper, tonic and aya put the useful part in the
/// causes: "connection refused", "invalid peer certificate: UnknownIssuer", "Operation not
/// permitted").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}
