//! `sock_ops`: when a proxy-mode connection (one rewritten to the agent listener) is
//! established on the client side, copy its origin from RECENT (stored there by connect4/6
//! under the socket's cookie) to the connection's 4-tuple in CONNS, the key the agent has on
//! accept and getpeername has later (the agent removes the entry when it closes the
//! connection); with sk_msg acceleration on, add both ends of such a hop to SOCKHASH
//! (`skmsg.rs`). Only connections whose peer is an agent listener (LISTENERS) go that way;
//! steered and failed-open connections reach pods, get no CONNS entry, and have their bytes
//! counted from here on (`bytes.rs`).
//!
//! The client handles the SYN-ACK (this callback) before it sends the ACK that completes the
//! agent's accept, so the entry is there when the agent looks — and when the agent's accepted
//! socket is established (PASSIVE_ESTABLISHED, on that ACK), which is how its end is
//! recognised.

use aya_ebpf::{
    bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_HDR_OPT_LEN_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_TCP_CLOSE,
    },
    helpers::generated::bpf_get_socket_cookie,
    macros::sock_ops,
    programs::SockOpsContext,
};
use warmpath_common::{Counter, FourTuple};

use crate::{
    CONNS, bytes, count,
    hop::{accelerating, add, is_listener, sock_key, to_agent},
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
    } else if op == BPF_SOCK_OPS_HDR_OPT_LEN_CB || op == BPF_SOCK_OPS_STATE_CB {
        // Asked for by `bytes::follow` only, on connections sent to a pod. No option space is
        // reserved: the segment goes out as it was.
        if let Some(slot) = origin::tracked(ctx) {
            if op == BPF_SOCK_OPS_STATE_CB && ctx.arg(1) == BPF_TCP_CLOSE {
                bytes::close(ctx, slot);
            } else {
                bytes::count(ctx, slot);
            }
        }
        Ok(OK)
    } else {
        Ok(OK)
    }
}

/// The client's end of a proxy-mode hop: record the 4-tuple; with acceleration on, add the
/// client's socket.
#[inline(always)]
fn active(ctx: &SockOpsContext) -> Result<u32, u32> {
    let Some(key) = sock_key!(ctx.ops) else {
        return Ok(OK);
    };
    if !is_listener(&key.remote) {
        // A connect sent to a pod (steered or failed open) has its origin in its storage:
        // count its bytes from now on.
        if let Some(slot) = origin::tracked(ctx) {
            bytes::follow(ctx, slot);
        }
        return Ok(OK);
    }
    // SAFETY: the helper reads the cookie of the context's socket (connect4/6 created it).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.ops.cast()) };
    let tuple = FourTuple {
        client: key.local,
        server: key.remote,
    };
    // The origin connect4/6 stored for this very socket: in RECENT, else (its slot was taken)
    // in the socket's storage, which is then cleared (CONNS holds it from here on). Its peer
    // is where connect4/6 sent it, the VIP's listener: no SERVICES lookup needed.
    let origin = match origin::take_recent(cookie) {
        Some(origin) => origin,
        None => match origin::tracked(ctx) {
            Some(slot) => {
                let origin = slot.origin;
                slot.origin.vip.family = 0;
                origin
            }
            None => {
                // A connect made to the listener directly (no VIP): an entry these addresses
                // left (a connection the agent never accepted) must not be taken for its own.
                match CONNS.remove(&tuple) {
                    Ok(()) | Err(_) => {}
                }
                return Ok(OK);
            }
        },
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
