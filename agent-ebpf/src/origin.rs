//! Where a rewritten socket was meant to go ([`Origin`]), kept where its readers find it at
//! the least cost per connect (docs/ebpf.md, "Why a direct-mapped array"):
//!
//! - **A proxy-mode hop** (rewritten to the agent listener): connect4/6_proxy store the origin
//!   under the socket's cookie in `WARMPATH_RECENT`, a direct-mapped array (a plain store, no
//!   allocation); sock_ops copies it to `WARMPATH_CONNS` under the connection's 4-tuple when
//!   the connection is established, where the agent looks it up on accept and getpeername
//!   finds it, until the agent closes the connection and removes it.
//! - **A connect sent to a pod** (steered or failed open): the origin lives in the socket's own
//!   storage (`WARMPATH_ORIG_DST`, `BPF_MAP_TYPE_SK_STORAGE`), for the socket's whole life:
//!   getpeername and the byte counters read it there.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{BPF_SK_STORAGE_GET_F_CREATE, bpf_sock},
    helpers::generated::{bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_sk_storage_get},
    programs::{SockAddrContext, SockOpsContext},
};
use warmpath_common::{FourTuple, Origin, RECENT_CAPACITY, RECENT_HOLD_NS, Recent, Tracked};

use crate::{CONNS, ORIG_DST, RECENT, hop};

/// The map argument the helpers take: the address of the map's definition, which the loader
/// relocates to the map (what aya-ebpf's own `SkStorage` methods pass).
#[inline(always)]
fn map() -> *mut c_void {
    ptr::from_ref(&ORIG_DST).cast_mut().cast()
}

/// The socket's storage slot, created (zeroed) when `create`; null when absent or refused.
#[inline(always)]
fn slot(sk: *mut bpf_sock, create: bool) -> *mut Tracked {
    let flags = if create {
        u64::from(BPF_SK_STORAGE_GET_F_CREATE)
    } else {
        0
    };
    // SAFETY: `sk` is a socket pointer the verifier tracks (checked non-null by every caller
    // where it may be null); the helper only reads or creates the socket's storage.
    unsafe { bpf_sk_storage_get(map(), sk.cast(), ptr::null_mut(), flags) }.cast::<Tracked>()
}

/// Copies the slot's origin out, if there is one.
#[inline(always)]
fn read(slot: *mut Tracked) -> Option<Origin> {
    if slot.is_null() {
        return None;
    }
    // SAFETY: non-null storage of this map: a valid, aligned `Tracked`.
    let origin = unsafe { (*slot).origin };
    // A slot created but never written (cannot happen: connect writes right after creating)
    // reads as family 0, which no lookup matches.
    (origin.vip.family != 0).then_some(origin)
}

/// Records `origin` on a socket connecting to a pod; `false` when the kernel refused the
/// storage. Its byte counts start at 0 (sock_ops sets them on establishment).
#[inline(always)]
pub fn record(ctx: &SockAddrContext, origin: &Origin) -> bool {
    // SAFETY: the kernel hands sock_addr programs a valid context whose `sk` is the socket.
    let sk = unsafe { (*ctx.sock_addr).__bindgen_anon_1.sk };
    let slot = slot(sk, true);
    if slot.is_null() {
        return false;
    }
    // SAFETY: non-null storage of this map, owned by this socket.
    unsafe {
        ptr::write(
            slot,
            Tracked {
                origin: *origin,
                acked: 0,
                received: 0,
            },
        );
    }
    true
}

/// The storage of a sock_ops callback's socket (a connect sent to a pod), to update in
/// place; `None` for every other socket. sock_ops callbacks of one socket run under its
/// lock, so the caller is the slot's only writer.
#[inline(always)]
pub fn tracked(ctx: &SockOpsContext) -> Option<&mut Tracked> {
    // SAFETY: valid context; `sk` may be null (checked).
    let sk = unsafe { (*ctx.ops).__bindgen_anon_2.sk };
    if sk.is_null() {
        return None;
    }
    let slot = slot(sk, false);
    if slot.is_null() {
        return None;
    }
    // SAFETY: non-null storage of this map, alive while its socket is, so for this callback
    // (the borrow of its context).
    let slot = unsafe { &mut *slot };
    (slot.origin.vip.family != 0).then_some(slot)
}

/// The RECENT slot of a socket cookie: its low bits (the capacity is a power of two).
#[inline(always)]
fn recent_slot(cookie: u64) -> u32 {
    (cookie as u32) & (RECENT_CAPACITY - 1)
}

/// Records `origin` of a proxy-mode connect under the connecting socket's cookie, for
/// [`take_recent`] to find once the connection is established; `false` when the slot holds
/// another socket's origin not read yet (the caller keeps this one in socket storage).
#[inline(always)]
pub fn remember(ctx: &SockAddrContext, origin: &Origin) -> bool {
    // SAFETY: the helper reads (creating on first use) the cookie of the context's socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    let Some(slot) = RECENT.get_ptr_mut(recent_slot(cookie)) else {
        return false;
    };
    // SAFETY: the helper takes no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: an in-bounds array slot (the lookup checked the index). Another CPU may write
    // a free slot at the same instant: the later write wins and the earlier connect reaches
    // the agent without its origin (docs/ebpf.md).
    unsafe {
        let held = (*slot).cookie != 0 && now.wrapping_sub((*slot).written_ns) < RECENT_HOLD_NS;
        if held {
            return false;
        }
        ptr::write(
            slot,
            Recent {
                cookie,
                written_ns: now,
                origin: *origin,
            },
        );
    }
    true
}

/// The origin [`remember`]ed for the socket with `cookie`, and its slot freed; `None` when the
/// slot holds another socket's (the connect kept its origin in socket storage, or was made to
/// the listener directly).
#[inline(always)]
pub fn take_recent(cookie: u64) -> Option<Origin> {
    let slot = RECENT.get_ptr_mut(recent_slot(cookie))?;
    // SAFETY: an in-bounds array slot; while it holds this socket's unread origin no connect
    // writes it (see `remember`).
    unsafe {
        // A cookie is never 0, so a free slot never matches.
        if (*slot).cookie != cookie || (*slot).origin.vip.family == 0 {
            return None;
        }
        let origin = (*slot).origin;
        (*slot).cookie = 0;
        Some(origin)
    }
}

/// The origin of the socket a sock_addr program runs on (getpeername): the socket's storage
/// for a connect sent to a pod, else the proxy-mode hop's CONNS entry by its 4-tuple.
#[inline(always)]
pub fn of_sock_addr(ctx: &SockAddrContext) -> Option<Origin> {
    // SAFETY: as in `record`.
    let sk = unsafe { (*ctx.sock_addr).__bindgen_anon_1.sk };
    if let Some(origin) = read(slot(sk, false)) {
        return Some(origin);
    }
    let key = hop::key_of_sock(sk)?;
    let tuple = FourTuple {
        client: key.local,
        server: key.remote,
    };
    // SAFETY: plain Copy value, copied out at once.
    unsafe { CONNS.get(&tuple) }.copied()
}
