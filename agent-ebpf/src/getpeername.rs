//! `cgroup/getpeername4` and `cgroup/getpeername6`: a rewritten socket's peer reads back as the
//! VIP the application dialled, not the agent listener it was sent to.

use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};
use warmpath_common::{Counter, FAMILY_V4, FAMILY_V6};

use crate::{
    connect::{ALLOW, set_user_endpoint},
    count, origin,
};

#[cgroup_sock_addr(getpeername4)]
pub fn getpeername4(ctx: SockAddrContext) -> i32 {
    match try_getpeername::<FAMILY_V4>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

#[cgroup_sock_addr(getpeername6)]
pub fn getpeername6(ctx: SockAddrContext) -> i32 {
    match try_getpeername::<FAMILY_V6>(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

#[inline(always)]
fn try_getpeername<const FAMILY: u16>(ctx: &SockAddrContext) -> Result<i32, i32> {
    let Some(origin) = origin::of_sock_addr(ctx) else {
        return Ok(ALLOW);
    };
    if origin.vip.family != FAMILY {
        return Ok(ALLOW);
    }
    set_user_endpoint::<FAMILY>(ctx, &origin.vip);
    count(Counter::PEERNAME_REWRITTEN);
    Ok(ALLOW)
}
