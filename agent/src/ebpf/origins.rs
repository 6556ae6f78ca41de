//! What the kernel recorded about an intercepted connection, looked up by its addresses.
//!
//! `sock_ops` writes (client, listener) -> [`Origin`] when a proxy-mode connection is
//! established on the client side; the agent takes it on accept with the same pair as
//! (peer, local): one `bpf(MAP_LOOKUP_ELEM)` syscall, and a `MAP_DELETE_ELEM` when found, only
//! while interception is on. Removing what it read keeps the map near empty, so the
//! programs' inserts never pay for an LRU eviction (docs/benchmarks.md, connect4's cost); an
//! entry the agent never reads (the client closed before the accept) ages out.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::OnceLock,
};

use aya::maps::{HashMap, MapData};
use warmpath_common::{CONNS_MAP, Endpoint, FAMILY_V4, FAMILY_V6, FourTuple, Origin};

use super::Error;

/// Where an accepted connection was headed and who opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intercepted {
    /// The VIP:port the client dialled.
    pub vip: SocketAddr,
    /// The client's cgroup v2 id (its cgroup directory's inode number); set by the kernel,
    /// so a pod cannot claim another's.
    pub cgroup_id: u64,
}

/// The 4-tuple map, shared by the loader and the listeners. The lock is held for the two
/// syscalls of one take (aya's remove wants the map mutably).
pub struct Origins {
    conns: parking_lot::Mutex<HashMap<MapData, FourTuple, Origin>>,
}

impl std::fmt::Debug for Origins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Origins").finish_non_exhaustive()
    }
}

/// The process's interception state, installed once by the agent when it attaches.
static INSTALLED: OnceLock<std::sync::Arc<Origins>> = OnceLock::new();

impl Origins {
    pub(super) fn new(conns: HashMap<MapData, FourTuple, Origin>) -> Self {
        Self {
            conns: parking_lot::Mutex::new(conns),
        }
    }

    /// The origin of the connection from `peer` accepted on `local`, if the programs
    /// rewrote it; the entry is removed (each connection is accepted once). A failed removal
    /// is logged and leaves the entry to age out: the origin is still returned.
    pub fn take(&self, peer: SocketAddr, local: SocketAddr) -> Result<Option<Intercepted>, Error> {
        let key = FourTuple {
            client: endpoint(peer),
            server: endpoint(local),
        };
        let mut conns = self.conns.lock();
        let origin = match conns.get(&key, 0) {
            Ok(origin) => origin,
            Err(aya::maps::MapError::KeyNotFound) => return Ok(None),
            Err(source) => {
                return Err(Error::Map {
                    name: CONNS_MAP,
                    source,
                });
            }
        };
        match conns.remove(&key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(err) => tracing::debug!(%err, %peer, "origin kept after its lookup"),
        }
        drop(conns);
        Ok(socket_addr(&origin.vip).map(|vip| Intercepted {
            vip,
            cgroup_id: origin.cgroup_id,
        }))
    }

    /// Makes these the origins [`intercepted`] answers from (first install wins).
    pub fn install(origins: std::sync::Arc<Self>) {
        if INSTALLED.set(origins).is_err() {
            tracing::warn!("interception origins installed twice; keeping the first");
        }
    }
}

/// Whether this process intercepts (origins installed): one atomic load.
pub fn intercepting() -> bool {
    INSTALLED.get().is_some()
}

/// The origin of an accepted connection when this process intercepts (`None` otherwise, at
/// the cost of one atomic load). Errors are logged, never fatal: the connection is served
/// without its origin.
pub fn intercepted(peer: SocketAddr, local: SocketAddr) -> Option<Intercepted> {
    let origins = INSTALLED.get()?;
    match origins.take(peer, local) {
        Ok(found) => found,
        Err(err) => {
            tracing::debug!(%err, %peer, "origin lookup failed");
            None
        }
    }
}

/// The map form of an address; IPv4-mapped IPv6 (a dual-stack listener's view of an IPv4
/// client) becomes IPv4, as the client's own socket sees it.
pub fn endpoint(addr: SocketAddr) -> Endpoint {
    match addr.ip().to_canonical() {
        IpAddr::V4(ip) => Endpoint::v4(ip.octets(), addr.port()),
        IpAddr::V6(ip) => Endpoint::v6(ip.octets(), addr.port()),
    }
}

/// The socket address of a map endpoint; `None` for an unknown family.
pub fn socket_addr(ep: &Endpoint) -> Option<SocketAddr> {
    let ip = match ep.family {
        FAMILY_V4 => IpAddr::V4(Ipv4Addr::from(ep.octets4())),
        FAMILY_V6 => IpAddr::V6(Ipv6Addr::from(ep.octets6())),
        _ => return None,
    };
    Some(SocketAddr::new(ip, ep.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_v4_is_v4_and_both_families_round_trip() {
        let mapped: SocketAddr = "[::ffff:10.231.0.2]:40000".parse().unwrap();
        let plain: SocketAddr = "10.231.0.2:40000".parse().unwrap();
        assert_eq!(endpoint(mapped), endpoint(plain));
        assert_eq!(endpoint(plain), Endpoint::v4([10, 231, 0, 2], 40000));
        assert_eq!(socket_addr(&endpoint(mapped)), Some(plain));
        let v6: SocketAddr = "[fd00:231::2]:443".parse().unwrap();
        assert_eq!(endpoint(v6).family, FAMILY_V6);
        assert_eq!(socket_addr(&endpoint(v6)), Some(v6));
        let bad = Endpoint {
            family: 9,
            ..Endpoint::default()
        };
        assert_eq!(socket_addr(&bad), None);
    }
}
