//! Per-cgroup byte counts of the connections the connect programs sent to a pod (steered, or
//! failed open while the agent was down): the traffic the agent does not carry. Counted from
//! sock_ops callbacks that only those sockets ask for, so no other packet on the node runs a
//! program for it (docs/ebpf.md, "Byte counters").
//!
//! When such a connection is established, [`follow`] turns on two callbacks for that socket
//! alone: one per received segment (`BPF_SOCK_OPS_PARSE_HDR_OPT_CB`, asked for with
//! `PARSE_ALL_HDR_OPT`) and one per TCP state change. Each adds what the socket's
//! `bytes_acked` (sent and acknowledged, plus one for the FIN) and `bytes_received` (received
//! in order) grew by since the last one, kept in the socket's storage beside its origin, to
//! the stats of the cgroup that made the connect. A segment's callback runs before the segment
//! is processed, so its bytes are counted at the next segment or state change — at the
//! latest when the connection closes. Counting can never drop or delay traffic.

use aya_ebpf::{
    bindings::{BPF_SOCK_OPS_PARSE_ALL_HDR_OPT_CB_FLAG, BPF_SOCK_OPS_STATE_CB_FLAG},
    programs::SockOpsContext,
};
use warmpath_common::Tracked;

use crate::cgroup_stats;

/// Starts counting an established connection's bytes: the baseline is what its handshake
/// already moved (the SYN's sequence number), and the callbacks are on from here.
#[inline(always)]
pub fn follow(ctx: &SockOpsContext, slot: &mut Tracked) {
    let (acked, received) = totals(ctx);
    slot.acked = acked;
    slot.received = received;
    // Refused only for a socket that is no full TCP socket, which an established one is.
    let _ = ctx
        .set_cb_flags((BPF_SOCK_OPS_PARSE_ALL_HDR_OPT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
}

/// Adds what the connection moved since the last call to its cgroup's stats.
#[inline(always)]
pub fn count(ctx: &SockOpsContext, slot: &mut Tracked) {
    let (acked, received) = totals(ctx);
    let sent = acked.wrapping_sub(slot.acked);
    let got = received.wrapping_sub(slot.received);
    if sent == 0 && got == 0 {
        return;
    }
    let Some(stats) = cgroup_stats(slot.origin.cgroup_id) else {
        // The map refused: keep the baseline, so the next call adds these bytes too.
        return;
    };
    slot.acked = acked;
    slot.received = received;
    // SAFETY: this CPU's slot of a per-CPU map; no other writer while the program runs.
    unsafe {
        (*stats).bytes_sent += sent;
        (*stats).bytes_received += got;
    }
}

/// The socket's `bytes_acked` and `bytes_received` (0 for a socket that is no full socket:
/// the kernel's rewrite of these loads checks).
#[inline(always)]
fn totals(ctx: &SockOpsContext) -> (u64, u64) {
    // SAFETY: the kernel's valid bpf_sock_ops; 8-byte loads of two u64 fields.
    unsafe {
        (
            core::ptr::read_volatile(&(*ctx.ops).bytes_acked),
            core::ptr::read_volatile(&(*ctx.ops).bytes_received),
        )
    }
}
