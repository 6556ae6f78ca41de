//! The kernel's own accounting of the programs' run time (`BPF_ENABLE_STATS`): how often each
//! program ran and the nanoseconds it spent, for `bench ebpf`'s in-kernel cost per connect.
//!
//! The kernel counts only while stats are enabled (this process holds a [`RunTimeStats`], or
//! `kernel.bpf_stats_enabled` is 1) and only the program body: the time between the two clock
//! reads around each run, not the hook's own work around it (the cgroup's program array walk,
//! the sockaddr copy, the syscall). Enabling it costs every BPF program on the machine two
//! clock reads per run while it lasts.

use std::os::fd::OwnedFd;

use aya::Ebpf;

use super::Error;

/// Run-time statistics on for as long as this value lives.
#[derive(Debug)]
pub struct RunTimeStats {
    _fd: OwnedFd,
}

impl RunTimeStats {
    /// Turns run-time stats on (Linux >= 5.8; root or CAP_SYS_ADMIN).
    pub fn enable() -> Result<Self, Error> {
        aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map(|fd| Self { _fd: fd })
            .map_err(|e| Error::Stats(e.to_string()))
    }
}

/// One loaded program's totals since it was loaded (counted only while stats were on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramRuns {
    /// The program's name in the object (`connect4_proxy`, `sock_ops`, ...).
    pub name: &'static str,
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// The totals of each of `names` that is loaded in `bpf` (others are left out).
pub(super) fn runs(bpf: &Ebpf, names: &[&'static str]) -> Result<Vec<ProgramRuns>, Error> {
    let mut out = Vec::with_capacity(names.len());
    for &name in names {
        let Some(program) = bpf.program(name) else {
            continue;
        };
        let info = match program.info() {
            Ok(info) => info,
            Err(aya::programs::ProgramError::NotLoaded) => continue,
            Err(source) => return Err(Error::Program { name, source }),
        };
        out.push(ProgramRuns {
            name,
            run_count: info.run_count(),
            run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
        });
    }
    Ok(out)
}
