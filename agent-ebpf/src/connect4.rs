//! `cgroup/connect4`: rewrite connect() to an intercepted VIP:port into its target.
//!
//! For every IPv4 connect() in the attached cgroup: look the destination up in REDIRECTS; on a
//! hit, record the original destination under the socket's cookie (ORIG_DST) and rewrite
//! `user_ip4`/`user_port`. The connect is always allowed (return 1): a miss or an error leaves
//! the application's own destination untouched, so the program can only fail open.

use aya_ebpf::{
    helpers::bpf_get_socket_cookie, macros::cgroup_sock_addr, programs::SockAddrContext,
};
use aya_log_ebpf::debug;
use warmpath_common::{Counter, Ipv4Endpoint};

use crate::{ORIG_DST, REDIRECTS, count};

/// Allow the connect() to proceed (the only verdict this program gives).
const ALLOW: i32 = 1;

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    match try_connect4(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

#[inline(always)]
fn try_connect4(ctx: &SockAddrContext) -> Result<i32, i32> {
    count(Counter::SEEN);
    // SAFETY: the kernel hands cgroup_sock_addr programs a valid bpf_sock_addr.
    let sa = unsafe { &mut *ctx.sock_addr };
    let dst = Ipv4Endpoint {
        addr_be: sa.user_ip4,
        // Network-order port in the low 16 bits; truncation is the intent.
        port_be: sa.user_port as u16,
        _pad: 0,
    };
    // SAFETY: values are plain Copy data; we copy the target out before any write.
    let Some(target) = (unsafe { REDIRECTS.get(&dst) }).copied() else {
        return Ok(ALLOW);
    };

    // SAFETY: the helper only reads the context it is given.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    if ORIG_DST.insert(&cookie, &dst, 0).is_err() {
        count(Counter::ORIG_DST_FAILED);
    }
    sa.user_ip4 = target.addr_be;
    sa.user_port = u32::from(target.port_be);
    count(Counter::REDIRECTED);
    debug!(ctx, "connect4: cookie {} redirected", cookie);
    Ok(ALLOW)
}
