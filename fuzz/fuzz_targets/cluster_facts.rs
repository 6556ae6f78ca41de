//! Gossip facts as an agent reads a peer's chitchat key/value pairs (`Fact::parse`, from
//! `cluster::membership`): both are strings a peer chose.
//!
//! Input: `[prefix selector][key suffix] 0x00 [value]`; the selector picks one of the
//! warmpath key prefixes (or none), so every decoder is reached; key and value must be UTF-8
//! (chitchat's keys and values are `String`s).
//!
//! Properties: never a panic; an accepted fact has the key it was read from, re-encodes
//! within `MAX_FACT_BYTES` (identifiers within `MAX_ID_BYTES`), and its encoding reads back
//! equal; a value longer than `MAX_FACT_BYTES` is never accepted.

#![no_main]

use libfuzzer_sys::fuzz_target;
use warmpath_agent::cluster::facts::{Fact, MAX_FACT_BYTES, MAX_ID_BYTES};

const PREFIXES: [&str; 8] = [
    "agent", "pod:", "wm:", "load:", "usage:", "fair:", "fair", "",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (suffix, value) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let (Ok(suffix), Ok(value)) = (std::str::from_utf8(suffix), std::str::from_utf8(value)) else {
        return;
    };
    let key = format!(
        "{}{suffix}",
        PREFIXES[usize::from(selector) % PREFIXES.len()]
    );
    let Ok(fact) = Fact::parse(&key, value) else {
        return;
    };
    assert!(
        value.len() <= MAX_FACT_BYTES,
        "accepted a {}-byte value",
        value.len()
    );
    assert_eq!(fact.key(), key, "an accepted fact keeps its key");
    let id = match &fact {
        Fact::Agent(_) => "",
        Fact::Pod { pod, fact } => {
            assert!(fact.model.len() <= MAX_ID_BYTES && fact.addr.len() <= MAX_ID_BYTES);
            pod
        }
        Fact::Watermark { pod, .. } | Fact::Load { pod, .. } => pod,
        Fact::Usage { tenant, .. } => tenant,
        // `TENANT` or `TENANT@POOL`: each part an identifier, the pool without '@'.
        Fact::Contention { tenant, .. } => {
            let (tenant, pool) = tenant.split_once('@').unwrap_or((tenant, ""));
            assert!(
                pool.len() <= MAX_ID_BYTES && !pool.contains('@'),
                "pool {pool:?}"
            );
            tenant
        }
        Fact::ContentionRound(_) => "",
    };
    assert!(id.len() <= MAX_ID_BYTES, "a {}-byte identifier", id.len());
    let again = fact.value().expect("an accepted fact re-encodes");
    assert!(
        again.len() <= MAX_FACT_BYTES,
        "re-encoded to {} bytes",
        again.len()
    );
    assert_eq!(
        Fact::parse(&fact.key(), &again),
        Ok(fact),
        "value {again:?}"
    );
});
