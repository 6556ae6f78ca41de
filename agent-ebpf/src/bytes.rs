//! Per-cgroup byte counts of the connections the connect programs sent to a pod (steered, or
//! failed open while the agent was down): the traffic the agent does not carry. Counted from
//! sock_ops callbacks that only those sockets ask for, so no other packet on the node runs a
//! program for it (a proxy-mode connection's bytes are counted nowhere: the agent's per-tenant
//! series count its requests and tokens) (docs/ebpf.md, "Byte counters").
//!
//! When such a connection is established, [`follow`] turns on two callbacks for that socket
//! alone: one per segment it sends (`BPF_SOCK_OPS_HDR_OPT_LEN_CB`, asked for with
//! `WRITE_HDR_OPT`; it reserves no option space, so the segments are unchanged) and one per
//! TCP state change. A receiving socket sends ACKs and a sending one data, so either way the
//! callbacks follow the connection's progress. Each adds what the socket's `bytes_acked`
//! (sent and acknowledged, plus one for the FIN) and `bytes_received` (received in order)
//! grew by since the last one, kept in the socket's storage beside its origin, to the stats of
//! the cgroup that made the connect. At the close the last bytes are added, the callbacks are
//! turned off and the origin is cleared (the socket may be connected again, elsewhere).
//! Counting can never drop or delay traffic. (The per-received-segment callback,
//! `PARSE_ALL_HDR_OPT`, runs only on TCP's slow path: an open connection's bytes would wait
//! for its close.)

use aya_ebpf::{
    bindings::{BPF_SOCK_OPS_STATE_CB_FLAG, BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG},
    programs::SockOpsContext,
};
use warmpath_common::Tracked;

use crate::cgroup_stats;

/// The callbacks [`follow`] turns on.
const FLAGS: u32 = BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG;

/// Starts counting an established connection's bytes: the baseline is what its handshake
/// already moved (the SYN's sequence number), and the callbacks are on from here (added to
/// whatever another program turned on).
#[inline(always)]
pub fn follow(ctx: &SockOpsContext, slot: &mut Tracked) {
    let (acked, received) = totals(ctx);
    slot.acked = acked;
    slot.received = received;
    // Refused only for a socket that is no full TCP socket, which an established one is.
    let _ = ctx.set_cb_flags((ctx.cb_flags() | FLAGS) as i32);
}

/// Adds what the connection moved since the last call to its cgroup's stats.
#[inline(always)]
pub fn count(ctx: &SockOpsContext, slot: &mut Tracked) {
    let (acked, received) = totals(ctx);
    // A total below its baseline was reset (the socket was disconnected and connected
    // again): all of it is new.
    let sent = if acked >= slot.acked {
        acked - slot.acked
    } else {
        acked
    };
    let got = if received >= slot.received {
        received - slot.received
    } else {
        received
    };
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

/// The connection closed: add its last bytes, turn the callbacks off and forget the origin,
/// so a later connect of the same socket starts afresh.
#[inline(always)]
pub fn close(ctx: &SockOpsContext, slot: &mut Tracked) {
    count(ctx, slot);
    let _ = ctx.set_cb_flags((ctx.cb_flags() & !FLAGS) as i32);
    slot.origin.vip.family = 0;
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
