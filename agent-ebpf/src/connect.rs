//! `cgroup/connect4` and `cgroup/connect6`: rewrite connect() to an intercepted VIP:port into
//! the agent listener.
//!
//! For every connect() in the attached cgroup: look the destination up in SERVICES; on a hit
//! from a cgroup that is not excluded, record the original destination and the caller's cgroup
//! under the socket's cookie (ORIG_DST) and rewrite the address. The connect is always allowed
//! (return 1): a miss or an error leaves the application's own destination untouched, so the
//! programs can only fail open.

use core::ptr::{read_volatile, write_volatile};

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_socket_cookie},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use aya_log_ebpf::debug;
use warmpath_common::{Counter, Endpoint, FAMILY_V4, FAMILY_V6, Origin};

use crate::{EXCLUDED, ORIG_DST, SERVICES, count};

/// Allow the connect() to proceed (the only verdict these programs give).
pub const ALLOW: i32 = 1;

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    match try_connect(&ctx, FAMILY_V4) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

#[cgroup_sock_addr(connect6)]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    match try_connect(&ctx, FAMILY_V6) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// The destination the application passed, as a map key.
#[inline(always)]
pub fn user_endpoint(ctx: &SockAddrContext, family: u16) -> Endpoint {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel hands cgroup_sock_addr programs a valid bpf_sock_addr; every field
    // is read with one 4-byte load, the access size the verifier allows.
    unsafe {
        let addr = if family == FAMILY_V4 {
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
            family,
        }
    }
}

/// Writes `to` over the application's destination (same family as the program).
#[inline(always)]
pub fn set_user_endpoint(ctx: &SockAddrContext, to: &Endpoint) {
    let sa = ctx.sock_addr;
    // SAFETY: as in `user_endpoint`; writes are 4 bytes wide, as the verifier requires.
    unsafe {
        if to.family == FAMILY_V4 {
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

#[inline(always)]
fn try_connect(ctx: &SockAddrContext, family: u16) -> Result<i32, i32> {
    count(Counter::SEEN);
    let dst = user_endpoint(ctx, family);
    // SAFETY: values are plain Copy data; the target is copied out before any write.
    let Some(target) = (unsafe { SERVICES.get(&dst) }).copied() else {
        return Ok(ALLOW);
    };
    if target.family != family {
        // The loader never writes such an entry; refuse to half-rewrite one.
        return Ok(ALLOW);
    }
    // SAFETY: the helper takes no arguments and only reads the current task.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: read-only lookup of a plain value.
    if unsafe { EXCLUDED.get(&cgroup_id) }.is_some() {
        count(Counter::EXCLUDED);
        return Ok(ALLOW);
    }
    // SAFETY: the helper only reads the context it is given.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    let origin = Origin {
        vip: dst,
        _pad: 0,
        cgroup_id,
    };
    if ORIG_DST.insert(&cookie, &origin, 0).is_err() {
        count(Counter::ORIG_DST_FAILED);
    }
    set_user_endpoint(ctx, &target);
    count(Counter::REDIRECTED);
    debug!(
        ctx,
        "connect: cookie {} cgroup {} redirected", cookie, cgroup_id
    );
    Ok(ALLOW)
}
