//! Shared harness for warmpath's end-to-end suites: privilege gates, child processes that
//! clean up after themselves, simulator fleets, and waiting on conditions instead of sleeping.

pub mod agent;
pub mod agent_process;
pub mod bench_cli;
pub mod fake_kube;
pub mod gate;
pub mod index;
pub mod isolated;
pub mod otlp;
pub mod pki;
pub mod pods;
pub mod process;
pub mod raw_http;
pub mod scratch;
pub mod sim;
