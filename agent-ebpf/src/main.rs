//! warmpath's eBPF programs and the maps they share with the agent (docs/ebpf.md).
//!
//! Map names and capacities come from `warmpath-common`; the loader looks maps up by those
//! consts, so a rename here without one there fails the integration test, not production.
#![no_std]
#![no_main]

mod bytes;
mod connect;
mod getpeername;
mod hop;
mod origin;
mod skmsg;
mod sockops;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::SkStorage,
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray, SockHash},
};
use warmpath_common::{
    AFFINITY_CAPACITY, AffinityKey, BACKENDS_CAPACITY, Backends, CGROUP_STATS_CAPACITY,
    CONNS_CAPACITY, CgroupStats, EXCLUDED_CAPACITY, Endpoint, FourTuple, LISTENERS_CAPACITY,
    Origin, RECENT_CAPACITY, Recent, SERVICES_CAPACITY, SK_MSG_TCP_CAPACITY, SOCKHASH_CAPACITY,
    SockKey, Tracked,
};

/// Intercepted VIP:port -> the agent listener. Written by the agent, read on every connect().
#[map(name = "WARMPATH_SERVICES")]
static SERVICES: HashMap<Endpoint, Endpoint> = HashMap::with_max_entries(SERVICES_CAPACITY, 0);

/// A steered or failed-open socket's own storage: where the application meant to connect and
/// from which cgroup (`origin.rs`). A BTF map: the kernel requires BTF for socket storage.
#[btf_map(name = "WARMPATH_ORIG_DST")]
static ORIG_DST: SkStorage<Tracked> = SkStorage::new();

/// Proxy-mode origins in flight, slot `cookie % capacity` (`origin.rs`): written by
/// connect4/6_proxy, read by sock_ops once the connection is established.
#[map(name = "WARMPATH_RECENT")]
static RECENT: Array<Recent> = Array::with_max_entries(RECENT_CAPACITY, 0);

/// Agent listener addresses (every SERVICES value): sock_ops asks only their connections'
/// cookies.
#[map(name = "WARMPATH_LISTENERS")]
static LISTENERS: HashMap<Endpoint, u32> = HashMap::with_max_entries(LISTENERS_CAPACITY, 0);

/// Client-side 4-tuple -> origin of a proxy-mode connection, for the agent's lookup on
/// accept and getpeername (the agent removes it when it closes the connection).
#[map(name = "WARMPATH_CONNS")]
static CONNS: LruHashMap<FourTuple, Origin> = LruHashMap::with_max_entries(CONNS_CAPACITY, 0);

/// cgroup ids whose connects are never rewritten (the agent's own).
#[map(name = "WARMPATH_EXCLUDED")]
static EXCLUDED: HashMap<u64, u32> = HashMap::with_max_entries(EXCLUDED_CAPACITY, 0);

/// The agent's heartbeat (slot 0), `CLOCK_MONOTONIC` ns.
#[map(name = "WARMPATH_HEARTBEAT")]
static HEARTBEAT: Array<u64> = Array::with_max_entries(1, 0);

/// (client cgroup, VIP) -> pods that served the client's prefixes (fail-open).
#[map(name = "WARMPATH_AFFINITY")]
static AFFINITY: LruHashMap<AffinityKey, Backends> =
    LruHashMap::with_max_entries(AFFINITY_CAPACITY, 0);

/// VIP -> pods for clients without an affinity entry (fail-open).
#[map(name = "WARMPATH_BACKENDS")]
static BACKENDS: HashMap<Endpoint, Backends> = HashMap::with_max_entries(BACKENDS_CAPACITY, 0);

/// VIP -> 1 for services in steer mode.
#[map(name = "WARMPATH_STEER")]
static STEER: HashMap<Endpoint, u32> = HashMap::with_max_entries(SERVICES_CAPACITY, 0);

/// Counters indexed by `warmpath_common::Counter`.
#[map(name = "WARMPATH_COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(warmpath_common::COUNTERS_LEN, 0);

/// Client cgroup id -> how its connects to VIPs were served and its rewritten sockets' bytes.
#[map(name = "WARMPATH_CGROUP_STATS")]
static CGROUP_STATS: LruPerCpuHashMap<u64, CgroupStats> =
    LruPerCpuHashMap::with_max_entries(CGROUP_STATS_CAPACITY, 0);

/// Both ends of node-local hops (client socket, agent's accepted socket) by their own
/// addresses, while sk_msg acceleration is on; the sk_msg program is attached to it. Not
/// pinned (the loader pins only the maps it names).
#[map(name = "WARMPATH_SOCKHASH")]
static SOCKHASH: SockHash<SockKey> = SockHash::with_max_entries(SOCKHASH_CAPACITY, 0);

/// Slot 0: 1 while sk_msg acceleration is on (the agent's `--sk-msg`). Not pinned.
#[map(name = "WARMPATH_SK_MSG_ON")]
static SK_MSG_ON: Array<u32> = Array::with_max_entries(1, 0);

/// Sockets that sent over TCP because their peer was not in SOCKHASH yet: they stay on TCP.
#[map(name = "WARMPATH_SK_MSG_TCP")]
static SK_MSG_TCP: LruHashMap<SockKey, u32> = LruHashMap::with_max_entries(SK_MSG_TCP_CAPACITY, 0);

/// This CPU's stats slot for `cgroup_id`, created zeroed on first use; `None` only if the
/// kernel refuses (the count is then lost, the traffic never affected).
#[inline(always)]
fn cgroup_stats(cgroup_id: u64) -> Option<*mut CgroupStats> {
    if let Some(slot) = CGROUP_STATS.get_ptr_mut(cgroup_id) {
        return Some(slot);
    }
    // NOEXIST: another CPU may have created the entry meanwhile; an error here means just that
    // (or the map refused), and the second lookup tells which.
    match CGROUP_STATS.insert(cgroup_id, CgroupStats::default(), u64::from(BPF_NOEXIST)) {
        Ok(()) | Err(_) => {}
    }
    CGROUP_STATS.get_ptr_mut(cgroup_id)
}

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *slot += 1 };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never entered.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
