//! Process-wide tracing set-up.

use tracing_subscriber::EnvFilter;

/// Default filter when `RUST_LOG` is unset.
const DEFAULT_FILTER: &str = "info,zeromq=warn";

/// Installs the fmt subscriber (stderr) and bridges the `log` crate into it, which is how
/// aya-log records from the eBPF programs arrive. Safe to call more than once.
pub fn init_tracing() {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    // A second call (tests) finds a subscriber installed already; that is fine.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
