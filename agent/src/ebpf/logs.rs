//! Forwarding aya-log records from the eBPF programs into `tracing`.
//!
//! aya-log decodes records with the `log` crate; the tracing subscriber installed by
//! `telemetry::init_tracing` bridges `log` into `tracing`, so BPF records appear with the
//! agent's own logs (target = the program's module path).

#![allow(unsafe_code)] // one audited call: registering the ring buffer's fd with tokio

use aya::Ebpf;
use aya_log::EbpfLogger;
use tokio::io::unix::AsyncFd;

use super::Error;

/// The targets of the programs' records: the modules of `agent-ebpf` that log.
const TARGETS: [&str; 1] = ["warmpath_ebpf::connect"];

/// aya-log's level byte (`AYA_LOG_LEVEL`, set in the object before load) for the most
/// verbose level the installed log filter passes for the programs' targets; 0 when it passes
/// none. The programs then skip records nobody would see: left at aya-log's default (every
/// level), connect4 wrote a debug record per intercepted connect into the ring buffer, for
/// the forwarder to decode and drop.
pub fn level() -> u8 {
    let levels = [
        (log::Level::Trace, aya_log::Level::Trace),
        (log::Level::Debug, aya_log::Level::Debug),
        (log::Level::Info, aya_log::Level::Info),
        (log::Level::Warn, aya_log::Level::Warn),
        (log::Level::Error, aya_log::Level::Error),
    ];
    for (level, byte) in levels {
        let passes = TARGETS.iter().any(|target| {
            let meta = log::Metadata::builder().level(level).target(target).build();
            level <= log::max_level() && log::logger().enabled(&meta)
        });
        if passes {
            return byte as u8;
        }
    }
    0
}

/// Starts draining the programs' log ring buffer on the current tokio runtime.
///
/// Returns `Ok(None)` when the object has no log map (no program logs anything).
pub fn spawn_forwarder(bpf: &mut Ebpf) -> Result<Option<tokio::task::JoinHandle<()>>, Error> {
    let logger = match EbpfLogger::init(bpf) {
        Ok(logger) => logger,
        Err(aya_log::Error::MapNotFound) => return Ok(None),
        Err(err) => return Err(Error::Log(err.to_string())),
    };
    // SAFETY: the EbpfLogger owns the ring buffer's map fd, which stays open and unchanged
    // until the logger (owned by the AsyncFd) is dropped.
    let registered =
        unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) };
    let mut logger = registered.map_err(|err| Error::Io {
        what: "register BPF log ring buffer".into(),
        source: std::io::Error::other(err.to_string()),
    })?;
    Ok(Some(tokio::spawn(async move {
        loop {
            let mut guard = match logger.readable_mut().await {
                Ok(guard) => guard,
                Err(err) => {
                    tracing::warn!(%err, "BPF log forwarding stopped");
                    return;
                }
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    })))
}
