//! `sock_ops`: when a proxy-mode connection (one rewritten to the agent listener) is
//! established on the client side, copy its origin from the socket's storage to the
//! connection's 4-tuple, the key the agent has on accept (and removes once read); with sk_msg
//! acceleration on, add both ends of such a hop to SOCKHASH (`skmsg.rs`). Steered and
//! failed-open connections reach pods, which look nothing up: they get no CONNS entry.
//!
//! The client handles the SYN-ACK (this callback) before it sends the ACK that completes the
//! agent's accept, so the entry is there when the agent looks — and when the agent's accepted
//! socket is established (PASSIVE_ESTABLISHED, on that ACK), which is how its end is
//! recognised.

use aya_ebpf::{
    bindings::{BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB},
    macros::sock_ops,
    programs::SockOpsContext,
};
use warmpath_common::{Counter, FourTuple};

use crate::{
    CONNS, count,
    hop::{accelerating, add, sock_key, to_agent},
    origin,
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

/// The client's end of a proxy-mode hop: record the 4-tuple; with acceleration on, add the
/// client's socket.
#[inline(always)]
fn active(ctx: &SockOpsContext) -> Result<u32, u32> {
    let Some(origin) = origin::of_sock_ops(ctx) else {
        return Ok(OK);
    };
    let Some(key) = sock_key!(ctx.ops) else {
        return Ok(OK);
    };
    if !to_agent(&origin, &key.remote) {
        return Ok(OK);
    }
    let tuple = FourTuple {
        client: key.local,
        server: key.remote,
    };
    if CONNS.insert(&tuple, &origin, 0).is_ok() {
        count(Counter::TUPLE_RECORDED);
    } else {
        count(Counter::TUPLE_FAILED);
    }
    if accelerating() {
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
