//! Kernel-ABI data shared by the eBPF programs (`agent-ebpf`) and the agent's loader.
//!
//! Only `#[repr(C)]`, `Copy`, fixed-width types live here, with their padding written out and
//! their sizes asserted, so both sides agree on every byte. Map names and capacities are consts
//! so the loader never spells a map name by hand.
#![no_std]
#![cfg_attr(not(feature = "user"), forbid(unsafe_code))]

use core::mem::size_of;

/// Map: intercepted service address (VIP) -> where connections to it are sent.
pub const REDIRECTS_MAP: &str = "WARMPATH_REDIRECTS";
/// How many VIP:port pairs one node can intercept.
pub const REDIRECTS_CAPACITY: u32 = 4096;

/// Map: socket cookie -> the destination the application asked for before the rewrite.
pub const ORIG_DST_MAP: &str = "WARMPATH_ORIG_DST";
/// LRU-bounded: old connections' entries age out instead of filling the map.
pub const ORIG_DST_CAPACITY: u32 = 65_536;

/// Map: per-CPU counters indexed by [`Counter`] values.
pub const COUNTERS_MAP: &str = "WARMPATH_COUNTERS";
/// Number of slots in [`COUNTERS_MAP`].
pub const COUNTERS_LEN: u32 = 4;

/// Indices into [`COUNTERS_MAP`]. Plain consts, not an enum: the kernel side only sees `u32`.
pub struct Counter;

impl Counter {
    /// connect() calls that the program inspected.
    pub const SEEN: u32 = 0;
    /// connect() calls rewritten to a target.
    pub const REDIRECTED: u32 = 1;
    /// Rewrites whose original destination could not be recorded (map full or error).
    pub const ORIG_DST_FAILED: u32 = 2;
}

/// An IPv4 address and port exactly as `struct bpf_sock_addr` carries them: both in network
/// byte order, the port in the low 16 bits of its field.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Ipv4Endpoint {
    /// IPv4 address, network byte order (as `user_ip4`).
    pub addr_be: u32,
    /// Port, network byte order (as the low 16 bits of `user_port`).
    pub port_be: u16,
    /// Explicit padding; always zero so keys hash identically on both sides.
    pub _pad: u16,
}

const _: () = assert!(size_of::<Ipv4Endpoint>() == 8);

impl Ipv4Endpoint {
    /// Builds an endpoint from host-order octets and port.
    pub const fn new(octets: [u8; 4], port: u16) -> Self {
        Self {
            addr_be: u32::from_ne_bytes(octets),
            port_be: u16::from_ne_bytes(port.to_be_bytes()),
            _pad: 0,
        }
    }

    /// The address octets in the usual order (`127, 0, 0, 1`).
    pub const fn octets(&self) -> [u8; 4] {
        self.addr_be.to_ne_bytes()
    }

    /// The port in host order.
    pub const fn port(&self) -> u16 {
        u16::from_be_bytes(self.port_be.to_ne_bytes())
    }
}

#[cfg(feature = "user")]
#[allow(unsafe_code)]
// SAFETY: repr(C), Copy, no implicit padding (asserted above), every bit pattern valid.
unsafe impl aya::Pod for Ipv4Endpoint {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trips_host_order() {
        let ep = Ipv4Endpoint::new([127, 77, 0, 1], 8000);
        assert_eq!(ep.octets(), [127, 77, 0, 1]);
        assert_eq!(ep.port(), 8000);
        // Network order in memory: the first byte of the address field is the first octet.
        assert_eq!(ep.addr_be.to_ne_bytes()[0], 127);
        assert_eq!(ep.port_be.to_ne_bytes(), 8000u16.to_be_bytes());
    }
}
