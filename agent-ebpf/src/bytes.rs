//! `cgroup_skb/egress` and `cgroup_skb/ingress`: per-cgroup byte counts of the sockets the
//! connect programs rewrote.
//!
//! A packet counts when its socket has an origin in its storage (ORIG_DST: only rewritten
//! connects have one — proxied, steered or failed open to a pod), under the cgroup that made
//! the connect. Every other packet costs a look at its socket's storage and is not counted. Both programs always allow
//! the packet (return 1): counting can never drop traffic.

use aya_ebpf::{macros::cgroup_skb, programs::SkBuffContext};

use crate::{cgroup_stats, origin};

/// Let the packet through (the only verdict these programs give).
const ALLOW: i32 = 1;

#[cgroup_skb(egress)]
pub fn bytes_egress(ctx: SkBuffContext) -> i32 {
    count_bytes(&ctx, true);
    ALLOW
}

#[cgroup_skb(ingress)]
pub fn bytes_ingress(ctx: SkBuffContext) -> i32 {
    count_bytes(&ctx, false);
    ALLOW
}

#[inline(always)]
fn count_bytes(ctx: &SkBuffContext, sent: bool) {
    let Some(origin) = origin::of_skb(ctx) else {
        return;
    };
    let Some(stats) = cgroup_stats(origin.cgroup_id) else {
        return;
    };
    let len = u64::from(ctx.len());
    // SAFETY: this CPU's slot of a per-CPU map; no other writer while the program runs.
    unsafe {
        if sent {
            (*stats).bytes_sent += len;
        } else {
            (*stats).bytes_received += len;
        }
    }
}
