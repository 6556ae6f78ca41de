//! What the kernel recorded about an intercepted connection, looked up by its addresses.
//!
//! `sock_ops` writes (client, listener) -> [`Origin`] when a proxy-mode connection is
//! established on the client side; the agent looks it up on accept with the same pair as
//! (peer, local): one `bpf(MAP_LOOKUP_ELEM)` syscall, only while interception is on. The entry
//! stays while the agent holds the connection — the client's getpeername() reads the VIP from
//! it — and the [`Held`] guard removes it when the connection closes, so the map holds about
//! the open connections and the programs' inserts rarely pay for an LRU eviction
//! (docs/benchmarks.md, connect4's cost). An entry the agent never reads (the client closed
//! before the accept, an agent killed with connections open) ages out.

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
    /// rewrote it; the entry stays (see [`forget`](Self::forget)).
    pub fn get(&self, peer: SocketAddr, local: SocketAddr) -> Result<Option<Intercepted>, Error> {
        let origin = match self.conns.lock().get(&key(peer, local), 0) {
            Ok(origin) => origin,
            Err(aya::maps::MapError::KeyNotFound) => return Ok(None),
            Err(source) => {
                return Err(Error::Map {
                    name: CONNS_MAP,
                    source,
                });
            }
        };
        Ok(socket_addr(&origin.vip).map(|vip| Intercepted {
            vip,
            cgroup_id: origin.cgroup_id,
        }))
    }

    /// Removes the entry of the connection from `peer` on `local` (closed: its addresses may
    /// be reused). An absent entry is no error; a failed removal is logged and leaves the
    /// entry to age out.
    pub fn forget(&self, peer: SocketAddr, local: SocketAddr) {
        match self.conns.lock().remove(&key(peer, local)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(err) => tracing::debug!(%err, %peer, "origin kept after its connection closed"),
        }
    }

    /// [`get`](Self::get) then [`forget`](Self::forget): for a listener that closes each
    /// connection at once. A found origin is returned even when its removal failed.
    pub fn take(&self, peer: SocketAddr, local: SocketAddr) -> Result<Option<Intercepted>, Error> {
        let found = self.get(peer, local)?;
        if found.is_some() {
            self.forget(peer, local);
        }
        Ok(found)
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

/// Keeps an intercepted connection's entry while the agent serves it; dropping it (the
/// connection closed) removes the entry.
pub struct Held {
    origins: std::sync::Arc<Origins>,
    peer: SocketAddr,
    local: SocketAddr,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("peer", &self.peer).finish()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.origins.forget(self.peer, self.local);
    }
}

/// The origin of an accepted connection when this process intercepts (`None` otherwise, at
/// the cost of one atomic load), with the guard that removes its entry when the connection
/// is done. Errors are logged, never fatal: the connection is served without its origin.
pub fn intercepted(peer: SocketAddr, local: SocketAddr) -> Option<(Intercepted, Held)> {
    let origins = INSTALLED.get()?;
    match origins.get(peer, local) {
        Ok(Some(found)) => Some((
            found,
            Held {
                origins: origins.clone(),
                peer,
                local,
            },
        )),
        Ok(None) => None,
        Err(err) => {
            tracing::debug!(%err, %peer, "origin lookup failed");
            None
        }
    }
}

/// The map key of the connection from `peer` accepted on `local`.
fn key(peer: SocketAddr, local: SocketAddr) -> FourTuple {
    FourTuple {
        client: endpoint(peer),
        server: endpoint(local),
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
