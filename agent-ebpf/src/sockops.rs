//! `sock_ops`: when a rewritten connection is established on the client side, copy its origin
//! from the socket cookie to the connection's 4-tuple, the key the agent has on accept; with
//! sk_msg acceleration on, add both ends of a proxy-mode hop to SOCKHASH (`skmsg.rs`).
//!
//! The client handles the SYN-ACK (this callback) before it sends the ACK that completes the
//! agent's accept, so the entry is there when the agent looks — and when the agent's accepted
//! socket is established (PASSIVE_ESTABLISHED, on that ACK), which is how its end is
//! recognised.

use aya_ebpf::{
    bindings::{BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB},
    helpers::bpf_get_socket_cookie,
    macros::sock_ops,
    programs::SockOpsContext,
};
use warmpath_common::{Counter, FourTuple};

use crate::{
    CONNS, ORIG_DST, count,
    hop::{accelerating, add, sock_key, to_agent},
};

/// sock_ops return value: carry on (the callback's verdict is ignored for these ops).
const OK: u32 = 1;

#[sock_ops]
pub fn sock_ops(ctx: SockOpsContext) -> u32 {
    match try_sock_ops(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

#[inline(always)]
fn try_sock_ops(ctx: &SockOpsContext) -> Result<u32, u32> {
    let op = ctx.op();
    if op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        active(ctx)
    } else if op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB {
        passive(ctx)
    } else {
        Ok(OK)
    }
}

/// The client's end: record the 4-tuple; with acceleration on, add a proxy-mode client socket.
#[inline(always)]
fn active(ctx: &SockOpsContext) -> Result<u32, u32> {
    // SAFETY: the helper only reads the context it is given.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.ops.cast()) };
    // SAFETY: plain Copy value, copied out at once.
    let Some(origin) = (unsafe { ORIG_DST.get(&cookie) }).copied() else {
        return Ok(OK);
    };
    let Some(key) = sock_key!(ctx.ops) else {
        return Ok(OK);
    };
    let tuple = FourTuple {
        client: key.local,
        server: key.remote,
    };
    if CONNS.insert(&tuple, &origin, 0).is_ok() {
        count(Counter::TUPLE_RECORDED);
    } else {
        count(Counter::TUPLE_FAILED);
    }
    if accelerating() && to_agent(&origin, &key.remote) {
        add(ctx.ops, key);
    }
    Ok(OK)
}

/// A server's end (any accepted socket in the cgroup): with acceleration on, add it when it is
/// the agent's end of a proxy-mode hop, i.e. CONNS knows its 4-tuple and its local address is
/// the listener the VIP is rewritten to.
#[inline(always)]
fn passive(ctx: &SockOpsContext) -> Result<u32, u32> {
    if !accelerating() {
        return Ok(OK);
    }
    let Some(key) = sock_key!(ctx.ops) else {
        return Ok(OK);
    };
    let tuple = FourTuple {
        client: key.remote,
        server: key.local,
    };
    // SAFETY: plain Copy value, copied out at once.
    let Some(origin) = (unsafe { CONNS.get(&tuple) }).copied() else {
        return Ok(OK);
    };
    if to_agent(&origin, &key.local) {
        add(ctx.ops, key);
    }
    Ok(OK)
}
