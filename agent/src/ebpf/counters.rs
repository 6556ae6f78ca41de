//! The programs' per-CPU counters (`WARMPATH_COUNTERS`, indices `warmpath_common::Counter`),
//! summed over CPUs: from a loaded [`super::Redirector`] or from the map an agent pinned.

use std::path::Path;

use aya::maps::{Map, MapData, PerCpuArray};
use warmpath_common::{COUNTERS_MAP, Counter};

use super::{Error, pinned};

/// Totals of the programs' per-CPU counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// connect() calls inspected.
    pub seen: u64,
    /// connect() calls rewritten.
    pub redirected: u64,
    /// Rewrites whose original destination could not be saved.
    pub orig_dst_failed: u64,
    /// connect() calls to an intercepted VIP left alone because their cgroup is excluded.
    pub excluded: u64,
    /// Established rewritten connections recorded by 4-tuple.
    pub tuple_recorded: u64,
    /// Established rewritten connections whose 4-tuple could not be recorded.
    pub tuple_failed: u64,
    /// getpeername() answers rewritten back to the VIP.
    pub peername_rewritten: u64,
    /// Connects while the heartbeat was stale sent to an affinity pod / a backend-set pod /
    /// left to the VIP.
    pub failopen_affinity: u64,
    pub failopen_backends: u64,
    pub failopen_untouched: u64,
    /// Connects to a steered VIP sent straight to a pod.
    pub steered: u64,
    /// Sockets of node-local hops added to the SOCKHASH (sk_msg acceleration on) / refused.
    pub sockhash_added: u64,
    pub sockhash_failed: u64,
    /// Messages sk_msg redirected to the peer socket.
    pub sk_msg_redirected: u64,
    /// Messages of accelerated sockets sent over TCP (peer not in the map, or the socket
    /// already on TCP).
    pub sk_msg_tcp: u64,
    /// ... of which the socket could not be marked to stay on TCP.
    pub sk_msg_mark_failed: u64,
}

/// Sums every counter of `map` over CPUs.
pub(super) fn read(map: &PerCpuArray<MapData, u64>) -> Result<Counters, Error> {
    let read = |index: u32| -> Result<u64, Error> {
        let values = map.get(&index, 0).map_err(|source| Error::Map {
            name: COUNTERS_MAP,
            source,
        })?;
        Ok(values.iter().sum())
    };
    Ok(Counters {
        seen: read(Counter::SEEN)?,
        redirected: read(Counter::REDIRECTED)?,
        orig_dst_failed: read(Counter::ORIG_DST_FAILED)?,
        excluded: read(Counter::EXCLUDED)?,
        tuple_recorded: read(Counter::TUPLE_RECORDED)?,
        tuple_failed: read(Counter::TUPLE_FAILED)?,
        peername_rewritten: read(Counter::PEERNAME_REWRITTEN)?,
        failopen_affinity: read(Counter::FAILOPEN_AFFINITY)?,
        failopen_backends: read(Counter::FAILOPEN_BACKENDS)?,
        failopen_untouched: read(Counter::FAILOPEN_UNTOUCHED)?,
        steered: read(Counter::STEERED)?,
        sockhash_added: read(Counter::SOCKHASH_ADDED)?,
        sockhash_failed: read(Counter::SOCKHASH_FAILED)?,
        sk_msg_redirected: read(Counter::SK_MSG_REDIRECTED)?,
        sk_msg_tcp: read(Counter::SK_MSG_TCP)?,
        sk_msg_mark_failed: read(Counter::SK_MSG_MARK_FAILED)?,
    })
}

/// The counters of the agent whose state is pinned under `dir` (another process: tests and
/// `bench ebpf` read a running agent's this way).
pub fn pinned_counters(dir: &Path) -> Result<Counters, Error> {
    let map = |source| Error::Map {
        name: COUNTERS_MAP,
        source,
    };
    let data = MapData::from_pin(pinned::map_path(dir, COUNTERS_MAP)).map_err(map)?;
    let counters = PerCpuArray::try_from(Map::from_map_data(data).map_err(map)?).map_err(map)?;
    read(&counters)
}
