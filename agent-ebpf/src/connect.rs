//! `cgroup/connect4` and `cgroup/connect6`: rewrite connect() to an intercepted VIP:port into
//! the agent listener.
//!
//! For every connect() in the attached cgroup: look the destination up in SERVICES; on a hit
//! from a cgroup that is not excluded, record the original destination and the caller's cgroup
//! (`origin.rs`: under the socket's cookie in RECENT for a hop to the agent, in the socket's
//! own storage, ORIG_DST, for a connect sent to a pod) and rewrite the address. The connect is
//! always allowed (return 1): a miss or an error leaves the application's own destination
//! untouched, so the programs can only fail open.
//!
//! Two programs per family: the proxy rewrite (`connect4_proxy`, linked only while the agent
//! process lives) and the pinned one (`connect4`), which steers, and fails open while the
//! heartbeat is stale: to a pod from the client's affinity entry, else from the VIP's backend
//! set, else to the VIP untouched (docs/ebpf.md).

use core::ptr::{read_volatile, write_volatile};

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use aya_log_ebpf::debug;
use warmpath_common::{
    AffinityKey, BACKENDS_MAX, Backends, Counter, Endpoint, FAMILY_V4, FAMILY_V6,
    HEARTBEAT_FOREVER, HEARTBEAT_STALE_NS, Origin,
};

use crate::{
    AFFINITY, BACKENDS, EXCLUDED, HEARTBEAT, SERVICES, STEER, cgroup_stats, count, origin,
};

/// Allow the connect() to proceed (the only verdict these programs give).
pub const ALLOW: i32 = 1;

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    match try_connect::<FAMILY_V4, false>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

#[cgroup_sock_addr(connect6)]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    match try_connect::<FAMILY_V6, false>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// The proxy-mode rewrite, attached with a link only the agent process holds (never pinned):
/// it is gone the instant the agent dies, so no connect is sent to a dead listener.
#[cgroup_sock_addr(connect4)]
pub fn connect4_proxy(ctx: SockAddrContext) -> i32 {
    match try_connect::<FAMILY_V4, true>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// IPv6 twin of [`connect4_proxy`].
#[cgroup_sock_addr(connect6)]
pub fn connect6_proxy(ctx: SockAddrContext) -> i32 {
    match try_connect::<FAMILY_V6, true>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// The destination the application passed, as a map key.
#[inline(always)]
pub fn user_endpoint<const FAMILY: u16>(ctx: &SockAddrContext) -> Endpoint {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel hands cgroup_sock_addr programs a valid bpf_sock_addr; every field
    // is read with one 4-byte load, the access size the verifier allows.
    unsafe {
        let addr = if FAMILY == FAMILY_V4 {
            [read_volatile(&(*sa).user_ip4), 0, 0, 0]
        } else {
            [
                read_volatile(&(*sa).user_ip6[0]),
                read_volatile(&(*sa).user_ip6[1]),
                read_volatile(&(*sa).user_ip6[2]),
                read_volatile(&(*sa).user_ip6[3]),
            ]
        };
        Endpoint {
            addr,
            // Network-order port in the low 16 bits; truncation is the intent.
            port_be: read_volatile(&(*sa).user_port) as u16,
            family: FAMILY,
        }
    }
}

/// Writes `to` over the application's destination. `FAMILY` is the program's (a constant, so
/// the verifier never sees a program touch the other family's fields); the caller checked
/// that `to` has it.
#[inline(always)]
pub fn set_user_endpoint<const FAMILY: u16>(ctx: &SockAddrContext, to: &Endpoint) {
    let sa = ctx.sock_addr;
    // SAFETY: as in `user_endpoint`; writes are 4 bytes wide, as the verifier requires.
    unsafe {
        if FAMILY == FAMILY_V4 {
            write_volatile(&mut (*sa).user_ip4, to.addr[0]);
        } else {
            write_volatile(&mut (*sa).user_ip6[0], to.addr[0]);
            write_volatile(&mut (*sa).user_ip6[1], to.addr[1]);
            write_volatile(&mut (*sa).user_ip6[2], to.addr[2]);
            write_volatile(&mut (*sa).user_ip6[3], to.addr[3]);
        }
        write_volatile(&mut (*sa).user_port, u32::from(to.port_be));
    }
}

/// One decision for both program pairs. `PROXY` (agent-lifetime link): a VIP goes to the
/// agent listener while the heartbeat is fresh, unless steered to a pod that the table has.
/// Not `PROXY` (pinned link): a steered VIP goes to the table's pod while the agent lives; with
/// the heartbeat stale every VIP goes to the table's pod, else untouched. Whichever runs
/// second sees a rewritten address (not a VIP) and does nothing, so the order of the two in
/// the cgroup does not matter. A dead agent whose heartbeat is still fresh has no proxy
/// program left: the connect reaches the VIP untouched.
#[inline(always)]
fn try_connect<const FAMILY: u16, const PROXY: bool>(ctx: &SockAddrContext) -> Result<i32, i32> {
    if !PROXY {
        count(Counter::SEEN);
    }
    let dst = user_endpoint::<FAMILY>(ctx);
    // SAFETY: values are plain Copy data; the target is copied out before any write.
    let Some(listener) = (unsafe { SERVICES.get(&dst) }).copied() else {
        return Ok(ALLOW);
    };
    if listener.family != FAMILY {
        // The loader never writes such an entry; refuse to half-rewrite one.
        return Ok(ALLOW);
    }
    let alive = agent_alive();
    // SAFETY: read-only lookup of a plain value.
    let steer = unsafe { STEER.get(&dst) }.is_some();
    // A proxy-mode connect is the proxy program's alone: the pinned one stops here, before
    // the cgroup and exclusion lookups.
    let proxy_mode = alive && !steer;
    if !PROXY && proxy_mode {
        return Ok(ALLOW);
    }
    // SAFETY: the helper takes no arguments and only reads the current task.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: read-only lookup of a plain value.
    if unsafe { EXCLUDED.get(&cgroup_id) }.is_some() {
        // Counted once, by the program that would have rewritten the connect otherwise.
        if !PROXY || proxy_mode {
            count(Counter::EXCLUDED);
        }
        return Ok(ALLOW);
    }
    let table = if steer || !alive {
        table_pod(cgroup_id, &dst)
    } else {
        None
    };
    let target = if PROXY {
        if !alive || table.is_some() {
            return Ok(ALLOW);
        }
        count_connect(cgroup_id, Mode::Proxy);
        listener
    } else {
        match (alive, table) {
            (true, None) => return Ok(ALLOW),
            (true, Some((pod, _))) => {
                count(Counter::STEERED);
                count_connect(cgroup_id, Mode::Steered);
                pod
            }
            (false, Some((pod, kind))) => {
                count(kind);
                count_connect(cgroup_id, Mode::FailOpen);
                pod
            }
            (false, None) => {
                count(Counter::FAILOPEN_UNTOUCHED);
                count_connect(cgroup_id, Mode::FailOpen);
                return Ok(ALLOW);
            }
        }
    };
    let recorded = Origin {
        vip: dst,
        _pad: 0,
        cgroup_id,
    };
    // A proxy-mode hop's origin goes to the agent (and getpeername) through CONNS, copied
    // there by sock_ops a round trip later: a plain array store carries it until then. A
    // connect to a pod keeps it in the socket's storage for the socket's whole life.
    // (A slot still holding another connect's unread origin: socket storage, read there by
    // sock_ops.)
    let recorded_ok = if PROXY {
        origin::remember(ctx, &recorded) || origin::record(ctx, &recorded)
    } else {
        origin::record(ctx, &recorded)
    };
    if !recorded_ok {
        count(Counter::ORIG_DST_FAILED);
    }
    set_user_endpoint::<FAMILY>(ctx, &target);
    count(Counter::REDIRECTED);
    debug!(ctx, "connect: cgroup {} redirected", cgroup_id);
    Ok(ALLOW)
}

/// How one connect to a VIP was served, for the cgroup's stats.
#[derive(Clone, Copy)]
enum Mode {
    Proxy,
    Steered,
    FailOpen,
}

/// Counts one connect of `cgroup_id` in WARMPATH_CGROUP_STATS.
#[inline(always)]
fn count_connect(cgroup_id: u64, mode: Mode) {
    let Some(stats) = cgroup_stats(cgroup_id) else {
        return;
    };
    // SAFETY: this CPU's slot of a per-CPU map; no other writer while the program runs.
    unsafe {
        match mode {
            Mode::Proxy => (*stats).connects_proxy += 1,
            Mode::Steered => (*stats).connects_steered += 1,
            Mode::FailOpen => (*stats).connects_failopen += 1,
        }
    }
}

/// Whether the agent's heartbeat is fresh (or its links die with it).
#[inline(always)]
fn agent_alive() -> bool {
    let Some(beat) = HEARTBEAT.get(0).copied() else {
        return false;
    };
    if beat == HEARTBEAT_FOREVER {
        return true;
    }
    // SAFETY: the helper takes no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    beat != 0 && now.saturating_sub(beat) < HEARTBEAT_STALE_NS
}

/// A pod from the tables for a connect to `vip`: the client's affinity entry, else the VIP's
/// backend set; with the fail-open counter that names which.
#[inline(always)]
fn table_pod(cgroup_id: u64, vip: &Endpoint) -> Option<(Endpoint, u32)> {
    let key = AffinityKey {
        cgroup_id,
        vip: *vip,
        _pad: 0,
    };
    // SAFETY: plain Copy values, copied out at once.
    if let Some(set) = unsafe { AFFINITY.get(&key) }.copied()
        && let Some(pod) = pick(&set, vip.family)
    {
        return Some((pod, Counter::FAILOPEN_AFFINITY));
    }
    // SAFETY: as above.
    if let Some(set) = unsafe { BACKENDS.get(vip) }.copied()
        && let Some(pod) = pick(&set, vip.family)
    {
        return Some((pod, Counter::FAILOPEN_BACKENDS));
    }
    None
}

/// One of the set's first `len` pods, uniformly; `None` for an empty set or a pod of the
/// wrong family.
#[inline(always)]
fn pick(set: &Backends, family: u16) -> Option<Endpoint> {
    let len = set.len as usize;
    if len == 0 || len > BACKENDS_MAX {
        return None;
    }
    // SAFETY: the helper takes no arguments.
    let random = u64::from(unsafe { bpf_get_prandom_u32() } & 0xffff);
    // Multiply-shift instead of `%`: the verifier can bound the result (< len).
    let i = ((random * len as u64) >> 16) as usize;
    if i >= BACKENDS_MAX {
        return None;
    }
    let pod = *set.pods.get(i)?;
    (pod.family == family).then_some(pod)
}
