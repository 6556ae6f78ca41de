//! warmpath's eBPF programs and the maps they share with the agent.
//!
//! Map names and capacities come from `warmpath-common`; the loader looks maps up by those
//! consts, so a rename here without one there fails the integration test, not production.
#![no_std]
#![no_main]

mod connect4;

use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use warmpath_common::{Ipv4Endpoint, ORIG_DST_CAPACITY, REDIRECTS_CAPACITY};

/// Intercepted VIP:port -> target. Written by the agent, read on every connect().
#[map(name = "WARMPATH_REDIRECTS")]
static REDIRECTS: HashMap<Ipv4Endpoint, Ipv4Endpoint> =
    HashMap::with_max_entries(REDIRECTS_CAPACITY, 0);

/// Socket cookie -> original destination, so the agent can tell which service a redirected
/// connection was meant for.
#[map(name = "WARMPATH_ORIG_DST")]
static ORIG_DST: LruHashMap<u64, Ipv4Endpoint> = LruHashMap::with_max_entries(ORIG_DST_CAPACITY, 0);

/// Counters indexed by `warmpath_common::Counter`.
#[map(name = "WARMPATH_COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(warmpath_common::COUNTERS_LEN, 0);

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
