//! Gossip datagrams as `SealedUdp` opens them: arbitrary bytes from the network against a
//! fixed cluster key (`ClusterKey::open`), and the same bytes as a payload sealed with it.
//!
//! Properties: never a panic; a datagram is opened only if it is exactly what sealing its
//! payload with this key gives (so an arbitrary input is essentially never accepted); a
//! sealed payload opens to itself, and not with another cluster id, not with any one byte
//! flipped, and not cut short.

#![no_main]

use libfuzzer_sys::fuzz_target;
use warmpath_agent::cluster::auth::{ClusterKey, MAX_DATAGRAM, OVERHEAD};

const SECRET: &[u8] = b"warmpath fuzz key: 32 bytes long";

fuzz_target!(|data: &[u8]| {
    let key = ClusterKey::new(SECRET, "fuzz").expect("a 32-byte secret");
    let mut sealed = Vec::with_capacity(MAX_DATAGRAM);
    if let Some(payload) = key.open(data) {
        key.seal(payload, &mut sealed);
        assert_eq!(sealed, data, "opened a datagram this key did not seal");
    }
    let payload = &data[..data.len().min(MAX_DATAGRAM - OVERHEAD)];
    key.seal(payload, &mut sealed);
    assert_eq!(sealed.len(), OVERHEAD + payload.len());
    assert_eq!(key.open(&sealed), Some(payload));
    let other = ClusterKey::new(SECRET, "fuzz2").expect("a 32-byte secret");
    assert_eq!(other.open(&sealed), None, "opened with another cluster id");
    // A byte chosen by the input (its first two bytes), flipped by a bit it chooses.
    let at = match data {
        [a, b, ..] => usize::from(u16::from_le_bytes([*a, *b])),
        [a] => usize::from(*a),
        [] => 0,
    } % sealed.len();
    let bit = 1u8 << (data.last().map_or(0, |&b| b) % 8);
    sealed[at] ^= bit;
    assert_eq!(key.open(&sealed), None, "opened with byte {at} flipped");
    sealed[at] ^= bit;
    let cut = sealed.len() - 1 - at % sealed.len().min(OVERHEAD + 1);
    assert_eq!(key.open(&sealed[..cut]), None, "opened cut to {cut} bytes");
});
