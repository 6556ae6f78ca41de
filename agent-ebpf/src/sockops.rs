//! `sock_ops`: when a rewritten connection is established on the client side, copy its origin
//! from the socket cookie to the connection's 4-tuple, the key the agent has on accept.
//!
//! The client handles the SYN-ACK (this callback) before it sends the ACK that completes the
//! agent's accept, so the entry is there when the agent looks.

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::{BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, bpf_sock_ops},
    helpers::bpf_get_socket_cookie,
    macros::sock_ops,
    programs::SockOpsContext,
};
use warmpath_common::{Counter, Endpoint, FAMILY_V4, FAMILY_V6, FourTuple};

use crate::{CONNS, ORIG_DST, count};

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
/// sock_ops return value: carry on (the callback's verdict is ignored for this op).
const OK: u32 = 1;

#[sock_ops]
pub fn sock_ops(ctx: SockOpsContext) -> u32 {
    match try_sock_ops(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

#[inline(always)]
fn try_sock_ops(ctx: &SockOpsContext) -> Result<u32, u32> {
    if ctx.op() != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        return Ok(OK);
    }
    // SAFETY: the helper only reads the context it is given.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.ops.cast()) };
    // SAFETY: plain Copy value, copied out at once.
    let Some(origin) = (unsafe { ORIG_DST.get(&cookie) }).copied() else {
        return Ok(OK);
    };
    let ops = ctx.ops;
    let family = ctx.family();
    let tuple = if family == AF_INET {
        FourTuple {
            client: endpoint(FAMILY_V4, [ctx.local_ip4(), 0, 0, 0], local_port_be(ctx)),
            server: endpoint(FAMILY_V4, [ctx.remote_ip4(), 0, 0, 0], remote_port_be(ctx)),
        }
    } else if family == AF_INET6 {
        FourTuple {
            client: endpoint(FAMILY_V6, words(ops, true), local_port_be(ctx)),
            server: endpoint(FAMILY_V6, words(ops, false), remote_port_be(ctx)),
        }
    } else {
        return Ok(OK);
    };
    if CONNS.insert(&tuple, &origin, 0).is_ok() {
        count(Counter::TUPLE_RECORDED);
    } else {
        count(Counter::TUPLE_FAILED);
    }
    Ok(OK)
}

#[inline(always)]
fn endpoint(family: u16, addr: [u32; 4], port_be: u16) -> Endpoint {
    Endpoint {
        addr,
        port_be,
        family,
    }
}

/// `local_port` is in host order.
#[inline(always)]
fn local_port_be(ctx: &SockOpsContext) -> u16 {
    (ctx.local_port() as u16).to_be()
}

/// `remote_port` holds the network-order port in its upper 16 bits on little-endian hosts
/// (the kernel shifts `skc_dport` left by 16); older layouts put it in the lower 16.
#[inline(always)]
fn remote_port_be(ctx: &SockOpsContext) -> u16 {
    let raw = ctx.remote_port();
    if raw >> 16 != 0 {
        (raw >> 16) as u16
    } else {
        raw as u16
    }
}

/// The IPv6 address words, each read with one 4-byte load (the only size sock_ops allows).
#[inline(always)]
fn words(ops: *mut bpf_sock_ops, local: bool) -> [u32; 4] {
    // SAFETY: `ops` is the kernel's valid bpf_sock_ops for this call.
    unsafe {
        let a = if local {
            &(*ops).local_ip6
        } else {
            &(*ops).remote_ip6
        };
        [
            read_volatile(&a[0]),
            read_volatile(&a[1]),
            read_volatile(&a[2]),
            read_volatile(&a[3]),
        ]
    }
}
