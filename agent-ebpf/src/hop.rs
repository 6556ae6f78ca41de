//! Node-local hops for `sk_msg` acceleration (docs/ebpf.md, "sk_msg acceleration"): the key
//! both ends of a connection agree on, the on flag, and adding a socket to SOCKHASH. Shared by
//! sock_ops (which adds the two ends) and sk_msg (which redirects between them).

use aya_ebpf::bindings::{BPF_ANY, bpf_sock, bpf_sock_ops};
use warmpath_common::{Counter, Endpoint, FAMILY_V4, FAMILY_V6, Origin, SockKey};

use crate::{LISTENERS, SERVICES, SK_MSG_ON, SK_MSG_TCP, SOCKHASH, count};

pub const AF_INET: u32 = 2;
pub const AF_INET6: u32 = 10;
/// The third word of an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), network order.
const MAPPED: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The [`SockKey`] of the socket behind the context pointer `$ctx`, from the fields both
/// `bpf_sock_ops` and `sk_msg_md` name alike (`family`, `local_ip4`, `remote_ip4`,
/// `local_ip6`, `remote_ip6`, `local_port`, `remote_port`); `None` for a family other than
/// IPv4 and IPv6. Each field is read with one 4-byte load (the only size the verifier allows
/// there), the IPv6 words only for IPv6 sockets.
macro_rules! sock_key {
    ($ctx:expr) => {{
        let c = $ctx;
        // SAFETY: `c` is the kernel's valid context for this call; plain 4-byte loads.
        unsafe {
            use core::ptr::read_volatile as rd;
            let family = rd(&(*c).family);
            let local_port = rd(&(*c).local_port);
            let remote_port = rd(&(*c).remote_port);
            if family == $crate::hop::AF_INET {
                let (l, r) = (rd(&(*c).local_ip4), rd(&(*c).remote_ip4));
                Some($crate::hop::key4(l, r, local_port, remote_port))
            } else if family == $crate::hop::AF_INET6 {
                let (l, r) = (&(*c).local_ip6, &(*c).remote_ip6);
                let l = [rd(&l[0]), rd(&l[1]), rd(&l[2]), rd(&l[3])];
                let r = [rd(&r[0]), rd(&r[1]), rd(&r[2]), rd(&r[3])];
                Some($crate::hop::key6(l, r, local_port, remote_port))
            } else {
                None
            }
        }
    }};
}
pub(crate) use sock_key;

/// The [`SockKey`] of a full socket from its `bpf_sock` view (`src_*` is the local end,
/// `dst_*` the peer, `dst_port` network order in 16 bits); `None` for a null pointer or a
/// family other than IPv4 and IPv6.
#[inline(always)]
pub fn key_of_sock(sk: *mut bpf_sock) -> Option<SockKey> {
    if sk.is_null() {
        return None;
    }
    // SAFETY: `sk` is a non-null socket pointer from the kernel's context; plain loads of the
    // sizes the verifier allows (4 bytes, 2 for `dst_port`), the IPv6 words only for IPv6.
    unsafe {
        use core::ptr::read_volatile as rd;
        let family = rd(&(*sk).family);
        let local_port = rd(&(*sk).src_port);
        let remote_port = u32::from(rd(&(*sk).dst_port));
        if family == AF_INET {
            Some(key4(
                rd(&(*sk).src_ip4),
                rd(&(*sk).dst_ip4),
                local_port,
                remote_port,
            ))
        } else if family == AF_INET6 {
            let (l, r) = (&(*sk).src_ip6, &(*sk).dst_ip6);
            let l = [rd(&l[0]), rd(&l[1]), rd(&l[2]), rd(&l[3])];
            let r = [rd(&r[0]), rd(&r[1]), rd(&r[2]), rd(&r[3])];
            Some(key6(l, r, local_port, remote_port))
        } else {
            None
        }
    }
}

#[inline(always)]
pub fn key4(local: u32, remote: u32, local_port: u32, remote_port: u32) -> SockKey {
    SockKey {
        local: Endpoint {
            addr: [local, 0, 0, 0],
            port_be: local_port_be(local_port),
            family: FAMILY_V4,
        },
        remote: Endpoint {
            addr: [remote, 0, 0, 0],
            port_be: remote_port_be(remote_port),
            family: FAMILY_V4,
        },
    }
}

#[inline(always)]
pub fn key6(local: [u32; 4], remote: [u32; 4], local_port: u32, remote_port: u32) -> SockKey {
    SockKey {
        local: v6(local, local_port_be(local_port)),
        remote: v6(remote, remote_port_be(remote_port)),
    }
}

/// An IPv6 endpoint, or the IPv4 one an IPv4-mapped address stands for (a dual-stack
/// listener's accepted socket sees IPv4 clients that way), keyed as the loader keys it.
#[inline(always)]
fn v6(addr: [u32; 4], port_be: u16) -> Endpoint {
    if addr[0] == 0 && addr[1] == 0 && addr[2] == MAPPED {
        Endpoint {
            addr: [addr[3], 0, 0, 0],
            port_be,
            family: FAMILY_V4,
        }
    } else {
        Endpoint {
            addr,
            port_be,
            family: FAMILY_V6,
        }
    }
}

/// `local_port` is in host order.
#[inline(always)]
fn local_port_be(raw: u32) -> u16 {
    (raw as u16).to_be()
}

/// `remote_port` holds the network-order port in its upper 16 bits on little-endian hosts
/// (the kernel shifts `skc_dport` left by 16); older layouts put it in the lower 16.
#[inline(always)]
fn remote_port_be(raw: u32) -> u16 {
    if raw >> 16 != 0 {
        (raw >> 16) as u16
    } else {
        raw as u16
    }
}

/// Whether sk_msg acceleration is on (the agent's `--sk-msg` sets slot 0 to 1).
#[inline(always)]
pub fn accelerating() -> bool {
    SK_MSG_ON.get(0).is_some_and(|on| *on == 1)
}

/// Whether a connection with this origin that reached `server` is a proxy-mode hop: `server`
/// is the agent listener its VIP is rewritten to (steered and failed-open connects reach pods).
#[inline(always)]
pub fn to_agent(origin: &Origin, server: &Endpoint) -> bool {
    // SAFETY: plain Copy value, compared at once.
    match unsafe { SERVICES.get(&origin.vip) } {
        Some(listener) => same(listener, server),
        None => false,
    }
}

/// Whether `server` is an agent listener (some SERVICES value).
#[inline(always)]
pub fn is_listener(server: &Endpoint) -> bool {
    // SAFETY: read-only lookup of a plain value.
    unsafe { LISTENERS.get(server) }.is_some()
}

/// Field by field: a derived `==` on arrays may become a `bcmp` call, which BPF lacks.
#[inline(always)]
fn same(a: &Endpoint, b: &Endpoint) -> bool {
    a.family == b.family
        && a.port_be == b.port_be
        && a.addr[0] == b.addr[0]
        && a.addr[1] == b.addr[1]
        && a.addr[2] == b.addr[2]
        && a.addr[3] == b.addr[3]
}

/// Adds the socket of this sock_ops call to SOCKHASH under `key`, first clearing the TCP mark
/// an earlier connection with the same addresses may have left.
#[inline(always)]
pub fn add(ops: *mut bpf_sock_ops, mut key: SockKey) {
    // Absent (the usual case) or removed: either way no stale mark remains.
    match SK_MSG_TCP.remove(&key) {
        Ok(()) | Err(_) => {}
    }
    // SAFETY: `ops` is the kernel's valid bpf_sock_ops for this call.
    match SOCKHASH.update(&mut key, unsafe { &mut *ops }, u64::from(BPF_ANY)) {
        Ok(()) => count(Counter::SOCKHASH_ADDED),
        Err(_) => count(Counter::SOCKHASH_FAILED),
    }
}
