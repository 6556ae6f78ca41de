//! Where a rewritten socket was meant to go: [`Origin`] kept in the socket's own local storage
//! (`WARMPATH_ORIG_DST`, a `BPF_MAP_TYPE_SK_STORAGE` map), written by connect4/6 and read by
//! sock_ops, getpeername and the byte counters.
//!
//! Socket storage replaced a cookie-keyed LRU hash (docs/ebpf.md, "Why socket storage"): the
//! entry lives and dies with its socket, so there is nothing to evict, no stale entry for a
//! reused cookie, and a read is a pointer walk from the socket instead of a hash lookup —
//! which every packet of every socket in the cgroup pays in the byte counters.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{BPF_SK_STORAGE_GET_F_CREATE, bpf_sock},
    helpers::generated::{bpf_sk_fullsock, bpf_sk_storage_get},
    programs::{SkBuffContext, SockAddrContext, SockOpsContext},
};
use warmpath_common::Origin;

use crate::ORIG_DST;

/// The map argument the helpers take: the address of the map's definition, which the loader
/// relocates to the map (what aya-ebpf's own `SkStorage` methods pass).
#[inline(always)]
fn map() -> *mut c_void {
    ptr::from_ref(&ORIG_DST).cast_mut().cast()
}

/// The socket's storage slot, created (zeroed) when `create`; null when absent or refused.
#[inline(always)]
fn slot(sk: *mut bpf_sock, create: bool) -> *mut Origin {
    let flags = if create {
        u64::from(BPF_SK_STORAGE_GET_F_CREATE)
    } else {
        0
    };
    // SAFETY: `sk` is a socket pointer the verifier tracks (checked non-null by every caller
    // where it may be null); the helper only reads or creates the socket's storage.
    unsafe { bpf_sk_storage_get(map(), sk.cast(), ptr::null_mut(), flags) }.cast::<Origin>()
}

/// Copies the slot's value out, if there is one.
#[inline(always)]
fn read(slot: *mut Origin) -> Option<Origin> {
    if slot.is_null() {
        return None;
    }
    // SAFETY: non-null storage of this map: a valid, aligned `Origin`.
    let origin = unsafe { ptr::read(slot) };
    // A slot created but never written (cannot happen: connect writes right after creating)
    // reads as family 0, which no lookup matches.
    (origin.vip.family != 0).then_some(origin)
}

/// Records `origin` on the connecting socket; `false` when the kernel refused the storage.
#[inline(always)]
pub fn record(ctx: &SockAddrContext, origin: &Origin) -> bool {
    // SAFETY: the kernel hands sock_addr programs a valid context whose `sk` is the socket.
    let sk = unsafe { (*ctx.sock_addr).__bindgen_anon_1.sk };
    let slot = slot(sk, true);
    if slot.is_null() {
        return false;
    }
    // SAFETY: non-null storage of this map, owned by this socket.
    unsafe { ptr::write(slot, *origin) };
    true
}

/// The origin of the socket a sock_addr program runs on (getpeername).
#[inline(always)]
pub fn of_sock_addr(ctx: &SockAddrContext) -> Option<Origin> {
    // SAFETY: as in `record`.
    let sk = unsafe { (*ctx.sock_addr).__bindgen_anon_1.sk };
    read(slot(sk, false))
}

/// The origin of a sock_ops callback's socket.
#[inline(always)]
pub fn of_sock_ops(ctx: &SockOpsContext) -> Option<Origin> {
    // SAFETY: valid context; `sk` may be null (checked).
    let sk = unsafe { (*ctx.ops).__bindgen_anon_2.sk };
    if sk.is_null() {
        return None;
    }
    read(slot(sk, false))
}

/// The origin of a packet's socket (none for a packet without a full socket).
#[inline(always)]
pub fn of_skb(ctx: &SkBuffContext) -> Option<Origin> {
    // SAFETY: valid context; `sk` may be null (checked), and only a full socket has storage.
    let sk = unsafe { (*ctx.skb.skb).__bindgen_anon_2.sk };
    if sk.is_null() {
        return None;
    }
    // SAFETY: `sk` is the packet's non-null socket pointer.
    let full = unsafe { bpf_sk_fullsock(sk) };
    if full.is_null() {
        return None;
    }
    read(slot(full, false))
}
