//! The simulator's encoder pinned byte for byte to payloads msgspec made from vLLM's own
//! structs (`agent/src/kv_index/wire/golden/`, written by `tests/python/make_kv_event_goldens.py`).
//!
//! - The `sim_*` goldens hold only what the simulator emits (the script's `sim_events`); whole
//!   batches must match, in both eras and both hash forms.
//! - The shared goldens also hold what the simulator never writes (an int in `extra_keys`, a
//!   sliding-window group, a BlockRemoved without `group_idx`, 8-byte digests), so of those
//!   only the events it can express are compared, each by its own bytes.
//!
//! The values below are the script's inputs, restated. Change one side, change the other.

use super::{Encoder, HashEncoding, WireFormat};
use crate::engine::{
    BlockHash,
    kv_cache::{KvEvent, Medium},
};

const GOLDEN_DIR: &str = "agent/src/kv_index/wire/golden";

/// One golden batch and the encoder settings the script's batch corresponds to.
struct Golden {
    name: &'static str,
    payload: &'static [u8],
    format: WireFormat,
    hashes: HashEncoding,
    dp_rank: Option<u32>,
}

macro_rules! golden {
    ($name:literal, $format:ident, $hashes:ident, $dp:expr) => {
        Golden {
            name: $name,
            payload: include_bytes!(concat!(
                "../../../agent/src/kv_index/wire/golden/",
                $name,
                ".msgpack"
            )),
            format: WireFormat::$format,
            hashes: HashEncoding::$hashes,
            dp_rank: $dp,
        }
    };
}

const SIM_GOLDENS: [Golden; 4] = [
    golden!("sim_array_int", Array, Int, Some(2)),
    golden!("sim_map_int", Map, Int, Some(0)),
    golden!("sim_array_bytes", Array, Bytes, None),
    golden!("sim_map_bytes", Map, Bytes, None),
];

const SHARED_GOLDENS: [Golden; 4] = [
    golden!("array_int", Array, Int, Some(2)),
    golden!("map_int", Map, Int, Some(0)),
    golden!("array_bytes", Array, Bytes, None),
    golden!("map_bytes", Map, Bytes, None),
];

/// The script's `TS`.
const TS: f64 = 1718000000.25;
/// The script's first three `INT_HASHES` (the fourth only appears in an event the sim can't
/// express).
const INT_HASHES: [u64; 3] = [15760518052499183552, 7, u64::MAX];

/// Digests whose int form is the script's `INT_HASHES`; the upper 24 bytes are noise that the
/// int form must drop.
fn int_digests() -> [BlockHash; 3] {
    INT_HASHES.map(|low| {
        let mut h = [0xEE; 32];
        h[24..].copy_from_slice(&low.to_be_bytes());
        h
    })
}

/// The script's first three `BYTES_HASHES` (all sha256-sized; the fourth, an 8-byte xxhash
/// digest, is not a `BlockHash`).
fn bytes_digests() -> [BlockHash; 3] {
    let tail = |fill: u8, low: u64| {
        let mut h = [fill; 32];
        h[24..].copy_from_slice(&low.to_be_bytes());
        h
    };
    [
        std::array::from_fn(|i| i as u8),
        tail(0xAA, 0x0102_0304_0506_0708),
        tail(0x55, 0xffff_ffff_ffff_fffe),
    ]
}

fn encoder(g: &Golden) -> Encoder {
    Encoder {
        format: g.format,
        hashes: g.hashes,
        dp_rank: g.dp_rank,
        // "sql-adapter" gets LoRA id 2, as in the script.
        loras: vec!["chat-adapter".into(), "sql-adapter".into()],
    }
}

fn digests(g: &Golden) -> [BlockHash; 3] {
    match g.hashes {
        HashEncoding::Int => int_digests(),
        HashEncoding::Bytes => bytes_digests(),
    }
}

/// The script's `sim_events()` in the simulator's types.
fn sim_events([h0, h1, h2]: [BlockHash; 3]) -> Vec<KvEvent> {
    vec![
        KvEvent::Stored {
            hashes: vec![h0, h1],
            parent: None,
            token_ids: vec![101, 102, 103, 104, 105, 106, 107, 108],
            block_size: 4,
            lora_name: None,
            extra_keys: vec![Some(vec!["tenant-a".into()]), None],
            medium: Medium::Gpu,
        },
        KvEvent::Stored {
            hashes: vec![h2],
            parent: Some(h1),
            token_ids: vec![109, 110, 111, 128000],
            block_size: 4,
            lora_name: Some("sql-adapter".into()),
            extra_keys: vec![Some(vec!["sql-adapter".into()])],
            medium: Medium::Cpu,
        },
        KvEvent::Removed {
            hashes: vec![h1, h0],
            medium: Medium::Gpu,
        },
        KvEvent::Removed {
            hashes: vec![h2],
            medium: Medium::Cpu,
        },
        KvEvent::AllCleared,
    ]
}

/// The events of the script's `events()` that the simulator can express, by their index
/// there: the root run on GPU (0), its removal (3) and the clear (5).
fn expressible_shared_events([h0, h1, _]: [BlockHash; 3]) -> Vec<(usize, KvEvent)> {
    vec![
        (
            0,
            KvEvent::Stored {
                hashes: vec![h0, h1],
                parent: None,
                token_ids: vec![101, 102, 103, 104, 105, 106, 107, 108],
                block_size: 4,
                lora_name: None,
                extra_keys: vec![None, None],
                medium: Medium::Gpu,
            },
        ),
        (
            3,
            KvEvent::Removed {
                hashes: vec![h1, h0],
                medium: Medium::Gpu,
            },
        ),
        (5, KvEvent::AllCleared),
    ]
}

/// Each event's own bytes in a `[ts, [events...], dp_rank]` batch.
fn event_bytes(payload: &[u8]) -> Vec<&[u8]> {
    let mut cur = payload;
    assert_eq!(rmp::decode::read_array_len(&mut cur).expect("batch"), 3);
    rmp::decode::read_f64(&mut cur).expect("ts is a float64");
    let n = rmp::decode::read_array_len(&mut cur).expect("events array");
    (0..n)
        .map(|_| {
            let start = cur;
            rmpv::decode::read_value(&mut cur).expect("an event");
            &start[..start.len() - cur.len()]
        })
        .collect()
}

#[test]
fn sim_encoder_writes_the_sim_golden_bytes() {
    for g in &SIM_GOLDENS {
        let ours = encoder(g).batch(TS, &sim_events(digests(g)));
        assert!(
            ours == g.payload,
            "{GOLDEN_DIR}/{}.msgpack: sim encoder differs from msgspec\n  sim: {}\n vllm: {}",
            g.name,
            hex::encode(&ours),
            hex::encode(g.payload)
        );
    }
}

#[test]
fn sim_encoder_writes_the_shared_golden_events_it_can_express() {
    for g in &SHARED_GOLDENS {
        let theirs = event_bytes(g.payload);
        assert_eq!(theirs.len(), 6, "{}: the script's events()", g.name);
        for (i, event) in expressible_shared_events(digests(g)) {
            let batch = encoder(g).batch(TS, std::slice::from_ref(&event));
            let ours = event_bytes(&batch)[0];
            assert!(
                ours == theirs[i],
                "{GOLDEN_DIR}/{}.msgpack event {i}: differs from msgspec\n  sim: {}\n vllm: {}",
                g.name,
                hex::encode(ours),
                hex::encode(theirs[i])
            );
        }
    }
}
