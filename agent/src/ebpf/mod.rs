//! The kernel data path: loading warmpath's eBPF object, attaching it, and typed access to its
//! maps.
//!
//! The object is embedded at build time (`build.rs`, feature `bpf`); a binary built without it
//! reports [`Error::NotEmbedded`] instead of looking for files at run time.

mod bpffs;
mod cgroup;
mod counters;
mod layout;
mod logs;
mod origins;
mod pinned;
mod redirector;
mod stats;

pub use bpffs::{DEFAULT_BPFFS, ensure_bpffs, is_bpffs};
pub use cgroup::{ChildCgroup, cgroup_id, cgroup2_root, find_cgroup2_mount, own_cgroup};
pub use counters::{Counters, pinned_counters};
pub use layout::{LAYOUTS, Layout, Replaced, replace_mismatched, wanted as wanted_layout};
pub use origins::{Held, Intercepted, Origins, intercepted, intercepting};
pub use pinned::{Cleaned, FailOpen, cleanup, default_dir as default_pin_dir};
pub use redirector::{Reconciled, Redirector, pinned_cgroup_stats, pinned_conns};
pub use stats::{ProgramRuns, RunTimeStats};
pub use warmpath_common::{CgroupStats, Endpoint};

/// The compiled eBPF object, when this binary was built with the `bpf` feature.
#[cfg(feature = "bpf")]
pub const OBJECT: Option<&[u8]> = Some(aya::include_bytes_aligned!(concat!(
    env!("OUT_DIR"),
    "/warmpath-ebpf"
)));
/// The compiled eBPF object, when this binary was built with the `bpf` feature.
#[cfg(not(feature = "bpf"))]
pub const OBJECT: Option<&[u8]> = None;

/// Everything that can go wrong on the kernel data path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("this warmpath binary was built without its eBPF object (feature `bpf` off)")]
    NotEmbedded,
    #[error("no cgroup v2 hierarchy is mounted (none listed in /proc/self/mounts)")]
    NoCgroup2,
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program `{name}`: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("eBPF map `{name}`: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("cannot redirect {vip} to {target}: a connect() keeps its address family")]
    Family {
        vip: std::net::SocketAddr,
        target: std::net::SocketAddr,
    },
    #[error("eBPF object lacks `{0}`; agent and object are out of sync")]
    Missing(&'static str),
    #[error("pinning: {0}")]
    Pin(String),
    #[error("fail-open backends: {0}")]
    Backends(String),
    #[error("BPF run-time statistics: {0}")]
    Stats(String),
    #[error("BPF log forwarding: {0}")]
    Log(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why the kernel data path cannot run here, or `None` if it can.
///
/// Checked before loading so that callers (the agent, the BPF tests) can say exactly what is
/// missing instead of surfacing a raw `EPERM` from the verifier.
pub fn unavailable_reason() -> Option<String> {
    if OBJECT.is_none() {
        return Some(Error::NotEmbedded.to_string());
    }
    if !nix::unistd::geteuid().is_root() {
        return Some(format!(
            "loading eBPF programs needs root (CAP_BPF + CAP_NET_ADMIN); running as uid {}",
            nix::unistd::geteuid()
        ));
    }
    if let Err(err) = cgroup2_root() {
        return Some(err.to_string());
    }
    None
}
