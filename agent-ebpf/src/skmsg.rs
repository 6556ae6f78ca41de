//! `sk_msg` on WARMPATH_SOCKHASH (only with `warmpath agent --sk-msg`): a message sent on one
//! end of a node-local hop (an intercepted client's socket, or the agent's accepted socket)
//! goes straight into the receive queue of the other end, skipping TCP and the veth path.
//!
//! Ordering: the client's socket enters the map when it is established, the agent's when the
//! handshake's last ACK reaches it, so a client that writes at once can find its peer missing.
//! That message goes over TCP (SK_PASS); a later redirected one would then sit in the peer's
//! sk_msg queue, which the kernel reads before the TCP queue — out of order. So the first
//! message that misses marks its socket (WARMPATH_SK_MSG_TCP) and every later one goes over
//! TCP too. Redirected first and TCP later (peer gone) keeps the order: the queue is drained
//! first. Every verdict is SK_PASS: a miss never drops a message.

use aya_ebpf::{bindings::BPF_F_INGRESS, macros::sk_msg, programs::SkMsgContext};
use warmpath_common::Counter;

use crate::{SK_MSG_TCP, SOCKHASH, count, hop::sock_key};

/// Deliver the message (redirected when the helper succeeded, else over TCP).
const PASS: u32 = 1;

#[sk_msg]
pub fn sk_msg_redirect(ctx: SkMsgContext) -> u32 {
    match try_sk_msg(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

#[inline(always)]
fn try_sk_msg(ctx: &SkMsgContext) -> Result<u32, u32> {
    let Some(own) = sock_key!(ctx.msg) else {
        return Ok(PASS);
    };
    // SAFETY: only the entry's presence is read.
    if unsafe { SK_MSG_TCP.get(&own) }.is_some() {
        count(Counter::SK_MSG_TCP);
        return Ok(PASS);
    }
    let mut peer = own.peer();
    if SOCKHASH.redirect_msg(ctx, &mut peer, u64::from(BPF_F_INGRESS)) == i64::from(PASS) {
        count(Counter::SK_MSG_REDIRECTED);
        return Ok(PASS);
    }
    // The peer is not in the map (not yet established on its side, closed, or never added):
    // this message and every later one of this socket go over TCP.
    match SK_MSG_TCP.insert(&own, &1, 0) {
        Ok(()) => count(Counter::SK_MSG_TCP),
        Err(_) => count(Counter::SK_MSG_MARK_FAILED),
    }
    Ok(PASS)
}
