//! Kernel-ABI data shared by the eBPF programs (`agent-ebpf`) and the agent's loader.
//!
//! Only `#[repr(C)]`, `Copy`, fixed-width types live here, with their padding written out and
//! their sizes asserted, so both sides agree on every byte. Map names and capacities are consts
//! so the loader never spells a map name by hand. The design is in docs/ebpf.md.
#![no_std]
#![cfg_attr(not(feature = "user"), forbid(unsafe_code))]

use core::mem::size_of;

/// Map: intercepted service address (VIP:port) -> the agent listener connections to it go to.
pub const SERVICES_MAP: &str = "WARMPATH_SERVICES";
/// How many VIP:port pairs (IPv4 and IPv6 together) one node can intercept.
pub const SERVICES_CAPACITY: u32 = 4096;

/// Map: socket local storage (`BPF_MAP_TYPE_SK_STORAGE`, key: a socket) -> [`Tracked`]: the
/// [`Origin`] of a connect sent to a pod (steered, or failed open), written by connect4/6 and
/// read by getpeername and by sock_ops, which counts the socket's bytes from it. An entry lives
/// exactly as long as its socket, so the map needs no capacity (the kernel reports 0) and never
/// evicts; userspace reads it by a socket fd it holds.
pub const ORIG_DST_MAP: &str = "WARMPATH_ORIG_DST";

/// Map: direct-mapped array, slot `cookie % RECENT_CAPACITY` -> [`Recent`]: the [`Origin`] of
/// a proxy-mode connect (rewritten to the agent listener), written by connect4/6 under the
/// socket's cookie and read once (then freed) by sock_ops when that connection is established,
/// a round trip later. A plain array store instead of an allocation per socket (docs/ebpf.md,
/// "Why a direct-mapped array"); a connect whose slot holds another socket's unread origin
/// keeps its own in socket storage instead.
pub const RECENT_MAP: &str = "WARMPATH_RECENT";
/// A power of two (the slot is the cookie's low bits): 65,536 x 40 B = 2.5 MiB.
pub const RECENT_CAPACITY: u32 = 65_536;

/// Map: agent listener address -> 1, every address [`SERVICES_MAP`] rewrites to: sock_ops
/// looks an established connection's peer up here before it asks for the socket's cookie,
/// so connections elsewhere pay one lookup.
pub const LISTENERS_MAP: &str = "WARMPATH_LISTENERS";
/// A handful: one listener per address family, and those of earlier agents until `--cleanup`.
pub const LISTENERS_CAPACITY: u32 = 64;

/// Map: client-side 4-tuple ([`FourTuple`]) -> [`Origin`], written by sock_ops when a
/// proxy-mode connection (rewritten to the agent listener) is established, so the agent can
/// look an accepted connection up by its addresses and getpeername can answer with the VIP;
/// the agent removes each entry when it closes the connection.
pub const CONNS_MAP: &str = "WARMPATH_CONNS";
/// LRU-bounded: entries the agent never reads (a client that closed before the accept, an
/// agent killed with connections open) age out instead of filling the map.
pub const CONNS_CAPACITY: u32 = 65_536;

/// Map: cgroup id -> 1 for cgroups whose connects are never rewritten (the agent's own).
pub const EXCLUDED_MAP: &str = "WARMPATH_EXCLUDED";
/// A handful: the agent, and whatever the operator adds.
pub const EXCLUDED_CAPACITY: u32 = 64;

/// Map: one-slot array holding the agent's heartbeat, `CLOCK_MONOTONIC` nanoseconds (the
/// clock of `bpf_ktime_get_ns`). [`HEARTBEAT_FOREVER`] means "links die with the agent, never
/// stale"; 0 (never written) is stale.
pub const HEARTBEAT_MAP: &str = "WARMPATH_HEARTBEAT";
/// A heartbeat older than this is stale: connects stop going to the agent and fail open.
pub const HEARTBEAT_STALE_NS: u64 = 1_000_000_000;
/// How often the agent writes its heartbeat (a quarter of the staleness bound).
pub const HEARTBEAT_INTERVAL_NS: u64 = 250_000_000;
/// The heartbeat of an agent whose links are not pinned (they detach when it exits).
pub const HEARTBEAT_FOREVER: u64 = u64::MAX;

/// Map: [`AffinityKey`] (client cgroup, VIP) -> [`Backends`]: the pods that served this
/// client's recent prefixes, used while the agent's heartbeat is stale.
pub const AFFINITY_MAP: &str = "WARMPATH_AFFINITY";
/// LRU-bounded: the least recently used clients age out.
pub const AFFINITY_CAPACITY: u32 = 65_536;

/// Map: VIP -> [`Backends`] for clients with no affinity entry while the agent is down.
pub const BACKENDS_MAP: &str = "WARMPATH_BACKENDS";
/// One set per intercepted service.
pub const BACKENDS_CAPACITY: u32 = SERVICES_CAPACITY;

/// Map: VIP -> 1 for services in steer mode: connects go to a pod from the affinity or
/// backend table even while the agent lives.
pub const STEER_MAP: &str = "WARMPATH_STEER";

/// Map: per-CPU counters indexed by [`Counter`] values.
pub const COUNTERS_MAP: &str = "WARMPATH_COUNTERS";
/// Number of slots in [`COUNTERS_MAP`].
pub const COUNTERS_LEN: u32 = 16;

/// Map: client cgroup id -> [`CgroupStats`] (per-CPU, summed by the agent): how that cgroup's
/// connects to intercepted VIPs were served and the TCP bytes of those sent to a pod, so
/// per-tenant telemetry covers steered and failed-open traffic too (proxied requests are in
/// the agent's own per-tenant request and token series; their bytes are counted nowhere).
pub const CGROUP_STATS_MAP: &str = "WARMPATH_CGROUP_STATS";
/// LRU-bounded: the least recently active cgroups age out (the agent keeps what it already
/// counted).
pub const CGROUP_STATS_CAPACITY: u32 = 16_384;

/// Map: [`SockKey`] -> socket, the two ends of each node-local hop (an intercepted client's
/// socket and the agent's accepted one) while `sk_msg` acceleration is on (`warmpath agent
/// --sk-msg`). Never pinned: the sockets are the agent's and its clients', and the map goes
/// with the programs that use it.
pub const SOCKHASH_MAP: &str = "WARMPATH_SOCKHASH";
/// Two entries per accelerated connection; when full, new connections take the TCP path.
pub const SOCKHASH_CAPACITY: u32 = 65_536;

/// Map: one-slot array, 1 while `sk_msg` acceleration is on (sock_ops adds hops to
/// [`SOCKHASH_MAP`] only then). Never pinned: each load starts with it off.
pub const SK_MSG_ON_MAP: &str = "WARMPATH_SK_MSG_ON";

/// Map: [`SockKey`] -> 1 for sockets that sent a message over TCP because their peer was not
/// (yet) in [`SOCKHASH_MAP`]: from then on every message of that socket goes over TCP too, so
/// the receiver never reads a redirected message before TCP bytes sent earlier. Never pinned.
pub const SK_MSG_TCP_MAP: &str = "WARMPATH_SK_MSG_TCP";
/// LRU-bounded. Marks are rare (a client that writes before the agent's end is in the map, a
/// socket whose peer closed); a mark evicted while both ends still live could let a later
/// message overtake unread TCP bytes, which takes this many newer marks meanwhile.
pub const SK_MSG_TCP_CAPACITY: u32 = 16_384;

/// Indices into [`COUNTERS_MAP`]. Plain consts, not an enum: the kernel side only sees `u32`.
pub struct Counter;

impl Counter {
    /// connect() calls that the programs inspected.
    pub const SEEN: u32 = 0;
    /// connect() calls rewritten to a target.
    pub const REDIRECTED: u32 = 1;
    /// Rewrites whose original destination could not be recorded (map full or error).
    pub const ORIG_DST_FAILED: u32 = 2;
    /// connect() calls to an intercepted VIP from an excluded cgroup, left untouched.
    pub const EXCLUDED: u32 = 3;
    /// Established rewritten connections recorded by 4-tuple (sock_ops).
    pub const TUPLE_RECORDED: u32 = 4;
    /// Established rewritten connections whose 4-tuple could not be recorded.
    pub const TUPLE_FAILED: u32 = 5;
    /// getpeername() answers rewritten back to the VIP.
    pub const PEERNAME_REWRITTEN: u32 = 6;
    /// connect() calls to a VIP while the heartbeat was stale, sent to an affinity pod.
    pub const FAILOPEN_AFFINITY: u32 = 7;
    /// ... sent to a pod of the VIP's backend set (no affinity entry).
    pub const FAILOPEN_BACKENDS: u32 = 8;
    /// ... left to the VIP untouched (no usable entry).
    pub const FAILOPEN_UNTOUCHED: u32 = 9;
    /// connect() calls to a steered VIP sent straight to a pod from the table.
    pub const STEERED: u32 = 10;
    /// Sockets of node-local hops added to [`SOCKHASH_MAP`] (sock_ops, acceleration on).
    pub const SOCKHASH_ADDED: u32 = 11;
    /// ... that could not be added (map full or error): that connection stays on TCP.
    pub const SOCKHASH_FAILED: u32 = 12;
    /// Messages `sk_msg` redirected to the peer socket's receive queue.
    pub const SK_MSG_REDIRECTED: u32 = 13;
    /// Messages of accelerated sockets sent over TCP instead (peer not in the map, or the
    /// socket already sent over TCP).
    pub const SK_MSG_TCP: u32 = 14;
    /// Messages sent over TCP whose socket could not be marked to stay on TCP (a later
    /// message may then be redirected ahead of them; LRU maps practically never refuse).
    pub const SK_MSG_MARK_FAILED: u32 = 15;
}

/// [`Endpoint::family`] of an IPv4 endpoint.
pub const FAMILY_V4: u16 = 4;
/// [`Endpoint::family`] of an IPv6 endpoint.
pub const FAMILY_V6: u16 = 6;

/// An IPv4 or IPv6 address and port exactly as `struct bpf_sock_addr` carries them: address
/// words and port in network byte order. IPv4 uses `addr[0]` (as `user_ip4`) and leaves the
/// other words zero, so one map holds both families and keys hash identically on both sides.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Endpoint {
    /// Address words, network byte order (`user_ip4` in `[0]`, or `user_ip6`).
    pub addr: [u32; 4],
    /// Port, network byte order (as the low 16 bits of `user_port`).
    pub port_be: u16,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u16,
}

const _: () = assert!(size_of::<Endpoint>() == 20);

impl Endpoint {
    /// An IPv4 endpoint from host-order octets and port.
    pub const fn v4(octets: [u8; 4], port: u16) -> Self {
        Self {
            addr: [u32::from_ne_bytes(octets), 0, 0, 0],
            port_be: u16::from_ne_bytes(port.to_be_bytes()),
            family: FAMILY_V4,
        }
    }

    /// An IPv6 endpoint from its 16 octets and a host-order port.
    pub const fn v6(o: [u8; 16], port: u16) -> Self {
        Self {
            addr: [word(&o, 0), word(&o, 4), word(&o, 8), word(&o, 12)],
            port_be: u16::from_ne_bytes(port.to_be_bytes()),
            family: FAMILY_V6,
        }
    }

    /// The IPv4 octets (meaningful when `family == FAMILY_V4`).
    pub const fn octets4(&self) -> [u8; 4] {
        self.addr[0].to_ne_bytes()
    }

    /// The IPv6 octets (meaningful when `family == FAMILY_V6`).
    pub const fn octets6(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        let mut i = 0;
        while i < 4 {
            let b = self.addr[i].to_ne_bytes();
            out[i * 4] = b[0];
            out[i * 4 + 1] = b[1];
            out[i * 4 + 2] = b[2];
            out[i * 4 + 3] = b[3];
            i += 1;
        }
        out
    }

    /// The port in host order.
    pub const fn port(&self) -> u16 {
        u16::from_be_bytes(self.port_be.to_ne_bytes())
    }
}

/// Four octets of `o` from `i` as one network-order word.
const fn word(o: &[u8; 16], i: usize) -> u32 {
    u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]])
}

/// Where a rewritten connection was meant to go, and who made it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Origin {
    /// The VIP:port the application dialled.
    pub vip: Endpoint,
    /// Explicit padding; always zero.
    pub _pad: u32,
    /// cgroup v2 id (the cgroup directory's inode number) of the process that connected.
    pub cgroup_id: u64,
}

const _: () = assert!(size_of::<Origin>() == 32);

/// The value of [`ORIG_DST_MAP`] (a connect sent to a pod): its [`Origin`], and the socket's
/// TCP byte counts (`bytes_acked`, `bytes_received`) as sock_ops last added them to
/// [`CGROUP_STATS_MAP`], so each callback adds only what is new.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Tracked {
    pub origin: Origin,
    pub acked: u64,
    pub received: u64,
}

const _: () = assert!(size_of::<Tracked>() == 48);

/// A slot of [`RECENT_MAP`]: the origin, the cookie of the socket it belongs to (0: free —
/// never written, or already read; the kernel's socket cookies start at 1) and when it was
/// written (`bpf_ktime_get_ns`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Recent {
    pub cookie: u64,
    pub written_ns: u64,
    pub origin: Origin,
}

const _: () = assert!(size_of::<Recent>() == 48);

/// How long an unread [`RECENT_MAP`] slot stays taken: longer than a connect's handshake can
/// last with every SYN retry (`tcp_syn_retries` 6: ~127 s). A connect that finds its slot taken
/// keeps its origin in socket storage instead; a slot whose connect never completed is free
/// again after this.
pub const RECENT_HOLD_NS: u64 = 130_000_000_000;
const _: () = assert!(RECENT_CAPACITY.is_power_of_two());

/// A TCP connection's addresses as its client sees them: `client` (local) and `server` (the
/// agent listener the connect was rewritten to). The agent sees the same pair as (peer, local)
/// on accept.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FourTuple {
    pub client: Endpoint,
    pub server: Endpoint,
}

const _: () = assert!(size_of::<FourTuple>() == 40);

/// Key of [`SOCKHASH_MAP`] and [`SK_MSG_TCP_MAP`]: one socket's own addresses, `local` its
/// end and `remote` its peer's, IPv4-mapped IPv6 addresses turned back into IPv4. The peer of
/// the socket `{local: a, remote: b}` is `{local: b, remote: a}`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockKey {
    pub local: Endpoint,
    pub remote: Endpoint,
}

const _: () = assert!(size_of::<SockKey>() == 40);

impl SockKey {
    /// The key of the socket at the other end of this one's connection.
    pub const fn peer(&self) -> Self {
        Self {
            local: self.remote,
            remote: self.local,
        }
    }
}

/// Key of [`AFFINITY_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AffinityKey {
    pub cgroup_id: u64,
    pub vip: Endpoint,
    /// Explicit padding; always zero.
    pub _pad: u32,
}

const _: () = assert!(size_of::<AffinityKey>() == 32);

/// How many pods one affinity or backend entry lists.
pub const BACKENDS_MAX: usize = 4;

/// Up to [`BACKENDS_MAX`] pods, chosen uniformly among the first `len`; list a pod more than
/// once to weight it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Backends {
    pub len: u32,
    /// Explicit padding; always zero.
    pub _pad: u32,
    pub pods: [Endpoint; BACKENDS_MAX],
}

const _: () = assert!(size_of::<Backends>() == 88);

/// Value of [`CGROUP_STATS_MAP`]: monotonic per-CPU counts for one client cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CgroupStats {
    /// Connects to a VIP rewritten to the agent listener (proxy mode).
    pub connects_proxy: u64,
    /// Connects to a steered VIP sent straight to a pod.
    pub connects_steered: u64,
    /// Connects to a VIP while the heartbeat was stale: to an affinity or backend-set pod, or
    /// left to the VIP untouched.
    pub connects_failopen: u64,
    /// TCP bytes the pod acknowledged on sockets whose connect was sent to a pod (steered or
    /// failed open to a table pod): the payload, plus one for the FIN.
    pub bytes_sent: u64,
    /// TCP payload bytes received in order on those sockets.
    pub bytes_received: u64,
}

const _: () = assert!(size_of::<CgroupStats>() == 40);

#[cfg(feature = "user")]
#[allow(unsafe_code)]
mod pod {
    // SAFETY (all of them): repr(C), Copy, no implicit padding (sizes asserted above), every bit
    // pattern valid.
    unsafe impl aya::Pod for super::Endpoint {}
    unsafe impl aya::Pod for super::Origin {}
    unsafe impl aya::Pod for super::Recent {}
    unsafe impl aya::Pod for super::Tracked {}
    unsafe impl aya::Pod for super::FourTuple {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::Backends {}
    unsafe impl aya::Pod for super::CgroupStats {}
    unsafe impl aya::Pod for super::SockKey {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_endpoint_round_trips_host_order() {
        let ep = Endpoint::v4([127, 77, 0, 1], 8000);
        assert_eq!(ep.octets4(), [127, 77, 0, 1]);
        assert_eq!(ep.port(), 8000);
        // Network order in memory: the first byte of the address field is the first octet.
        assert_eq!(ep.addr[0].to_ne_bytes()[0], 127);
        assert_eq!(ep.addr[1..], [0, 0, 0]);
        assert_eq!(ep.port_be.to_ne_bytes(), 8000u16.to_be_bytes());
        assert_eq!(ep.family, FAMILY_V4);
    }

    #[test]
    fn a_sockets_peer_key_swaps_its_ends() {
        let client = Endpoint::v4([10, 231, 0, 2], 40_000);
        let agent = Endpoint::v4([10, 231, 0, 1], 8080);
        let key = SockKey {
            local: client,
            remote: agent,
        };
        assert_eq!(
            key.peer(),
            SockKey {
                local: agent,
                remote: client
            }
        );
        assert_eq!(key.peer().peer(), key);
    }

    #[test]
    fn v6_endpoint_round_trips_and_is_network_order() {
        let octets = [0xfd, 0, 2, 0x31, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];
        let ep = Endpoint::v6(octets, 443);
        assert_eq!(ep.octets6(), octets);
        assert_eq!(ep.port(), 443);
        assert_eq!(ep.addr[0].to_ne_bytes(), [0xfd, 0, 2, 0x31]);
        assert_eq!(ep.addr[3].to_ne_bytes(), [0, 0, 0, 0x10]);
        assert_eq!(ep.family, FAMILY_V6);
        assert_ne!(ep, Endpoint::v4([0xfd, 0, 2, 0x31], 443));
    }
}
