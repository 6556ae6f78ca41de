//! Decoding golden payloads made by vLLM's own msgspec structs (both eras, both hash forms,
//! v0.9's short layout), the test encoder pinned to those bytes, hand-made payloads for older
//! and newer vLLM shapes, and garbage.
//!
//! The goldens come from `tests/python/make_kv_event_goldens.py`; the expected values below
//! are that script's inputs, restated.

use proptest::prelude::*;

use super::{
    test_encoder::{BlockRemoved, BlockStored, Era, Extra, KvEvent, WireHash, encode_batch},
    *,
};

/// One golden file and how the script made it.
struct Golden {
    name: &'static str,
    payload: &'static [u8],
    era: Era,
    dp_rank: Option<u64>,
    /// Hashes as msgpack bin (`BYTES_HASHES`) rather than ints (`INT_HASHES`).
    bytes_hashes: bool,
}

const GOLDENS: [Golden; 4] = [
    Golden {
        name: "array_int",
        payload: include_bytes!("golden/array_int.msgpack"),
        era: Era::Array,
        dp_rank: Some(2),
        bytes_hashes: false,
    },
    Golden {
        name: "map_int",
        payload: include_bytes!("golden/map_int.msgpack"),
        era: Era::Map,
        dp_rank: Some(0),
        bytes_hashes: false,
    },
    Golden {
        name: "array_bytes",
        payload: include_bytes!("golden/array_bytes.msgpack"),
        era: Era::Array,
        dp_rank: None,
        bytes_hashes: true,
    },
    Golden {
        name: "map_bytes",
        payload: include_bytes!("golden/map_bytes.msgpack"),
        era: Era::Map,
        dp_rank: None,
        bytes_hashes: true,
    },
];
const MAP_BYTES: &[u8] = GOLDENS[3].payload;
const V09_ARRAY: &[u8] = include_bytes!("golden/v09_array.msgpack");

const TS: f64 = 1718000000.25;
/// The script's `INT_HASHES`.
const INT_HASHES: [u64; 4] = [15760518052499183552, 7, u64::MAX, 99];
/// The last eight bytes, big-endian, of the script's `BYTES_HASHES` (vLLM's int form of a
/// digest).
const BYTES_TAILS: [u64; 4] = [
    0x18191a1b1c1d1e1f,
    0x0102030405060708,
    0xfffffffffffffffe,
    0x1122334455667788,
];

/// The script's `BYTES_HASHES`.
fn bytes_hashes() -> [Vec<u8>; 4] {
    [
        (0u8..32).collect(),
        [[0xaa; 24].as_slice(), &[1, 2, 3, 4, 5, 6, 7, 8]].concat(),
        [
            [0x55; 24].as_slice(),
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe],
        ]
        .concat(),
        vec![0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88],
    ]
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The script's `events()`, as the decoder must see them, with hash number i decoded as
/// `h[i]`.
fn expected_events(h: [u64; 4]) -> Vec<Event> {
    let h = h.map(EngineHash);
    vec![
        Event::Stored(Stored {
            hashes: vec![h[0], h[1]],
            parent: None,
            token_ids: vec![101, 102, 103, 104, 105, 106, 107, 108],
            block_size: 4,
            lora_name: None,
            tier: Tier::Gpu,
            extra_keys: vec![None, None],
            reusable: true,
        }),
        Event::Stored(Stored {
            hashes: vec![h[2]],
            parent: Some(h[1]),
            token_ids: vec![109, 110, 111, 112],
            block_size: 4,
            lora_name: Some("sql-adapter".into()),
            tier: Tier::Cpu,
            extra_keys: vec![Some(strings(&["sql-adapter", "7"]))],
            reusable: true,
        }),
        Event::Stored(Stored {
            hashes: vec![h[3]],
            parent: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 4,
            lora_name: None,
            tier: Tier::Gpu,
            extra_keys: vec![],
            reusable: false,
        }),
        Event::Removed(Removed {
            hashes: vec![h[1], h[0]],
            tier: Tier::Gpu,
            reusable: true,
        }),
        Event::Removed(Removed {
            hashes: vec![h[2]],
            tier: Tier::Cpu,
            reusable: true,
        }),
        Event::AllCleared,
    ]
}

#[test]
fn decodes_vllm_goldens_of_both_eras_and_both_hash_forms() {
    for g in &GOLDENS {
        let name = g.name;
        let batch = decode_batch(g.payload).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(batch.ts, TS, "{name}");
        assert_eq!(batch.dp_rank, g.dp_rank, "{name}");
        let hashes = if g.bytes_hashes {
            BYTES_TAILS
        } else {
            INT_HASHES
        };
        assert_eq!(batch.events, expected_events(hashes), "{name}");
    }
}

#[test]
fn decodes_the_v0_9_layout_without_a_rank() {
    let batch = decode_batch(V09_ARRAY).unwrap();
    assert_eq!((batch.ts, batch.dp_rank), (2.5, None));
    assert_eq!(
        batch.events,
        vec![
            Event::Stored(Stored {
                hashes: vec![EngineHash(5), EngineHash(6)],
                parent: Some(EngineHash(4)),
                token_ids: (0..32).collect(),
                block_size: 16,
                lora_name: None,
                tier: Tier::Gpu,
                extra_keys: vec![],
                reusable: true,
            }),
            Event::Removed(Removed {
                hashes: vec![EngineHash(5)],
                tier: Tier::Gpu,
                reusable: true,
            }),
            Event::AllCleared,
        ]
    );
}

/// The script's `events()` in the test encoder's types.
fn golden_events(h: [WireHash; 4]) -> Vec<KvEvent> {
    let [h0, h1, h2, h3] = h;
    let stored = |hashes, parent, token_ids: &[u32]| BlockStored {
        block_hashes: hashes,
        parent_block_hash: parent,
        token_ids: token_ids.to_vec(),
        block_size: 4,
        lora_id: None,
        medium: Some("GPU".into()),
        lora_name: None,
        extra_keys: None,
        group_idx: Some(0),
        kv_cache_spec_kind: Some("full_attention".into()),
        kv_cache_spec_sliding_window: None,
    };
    vec![
        KvEvent::BlockStored(BlockStored {
            extra_keys: Some(vec![None, None]),
            ..stored(
                vec![h0.clone(), h1.clone()],
                None,
                &[101, 102, 103, 104, 105, 106, 107, 108],
            )
        }),
        KvEvent::BlockStored(BlockStored {
            lora_id: Some(1),
            medium: Some("CPU".into()),
            lora_name: Some("sql-adapter".into()),
            extra_keys: Some(vec![Some(vec![
                Extra::Str("sql-adapter".into()),
                Extra::Int(7),
            ])]),
            ..stored(vec![h2.clone()], Some(h1.clone()), &[109, 110, 111, 112])
        }),
        KvEvent::BlockStored(BlockStored {
            group_idx: Some(1),
            kv_cache_spec_kind: Some("sliding_window".into()),
            kv_cache_spec_sliding_window: Some(128),
            ..stored(vec![h3], None, &[1, 2, 3, 4])
        }),
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![h1, h0],
            medium: Some("GPU".into()),
            group_idx: Some(0),
        }),
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![h2],
            medium: Some("CPU".into()),
            group_idx: None,
        }),
        KvEvent::AllBlocksCleared,
    ]
}

/// What anchors the test encoder (and every test built on it) to vLLM's bytes.
#[test]
fn test_encoder_writes_the_golden_bytes() {
    for g in &GOLDENS {
        let hashes = if g.bytes_hashes {
            bytes_hashes().map(WireHash::Bytes)
        } else {
            INT_HASHES.map(WireHash::Int)
        };
        let ours = encode_batch(g.era, TS, &golden_events(hashes), g.dp_rank);
        assert!(
            ours == g.payload,
            "{}: test encoder differs from msgspec\n ours: {}\n vllm: {}",
            g.name,
            hex::encode(&ours),
            hex::encode(g.payload)
        );
    }
}

/// Minimal msgpack writer for hand-made payloads.
fn mp(v: &rmpv::Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

fn s(x: &str) -> rmpv::Value {
    rmpv::Value::from(x)
}

#[test]
fn old_short_arrays_new_trailing_fields_signed_hashes_and_unknown_keys() {
    use rmpv::Value as V;
    let tokens = V::Array((0..16).map(V::from).collect());
    // v0.9: [tag, hashes, parent, token_ids, block_size, lora_id]
    let old = V::Array(vec![
        s("BlockStored"),
        V::Array(vec![V::from(-5i64)]),
        V::Nil,
        tokens.clone(),
        V::from(16),
        V::Nil,
    ]);
    // Newer than anything known: extra trailing fields.
    let newer = V::Array(vec![
        s("BlockStored"),
        V::Array(vec![V::from(7u64)]),
        V::from(-5i64),
        tokens.clone(),
        V::from(16),
        V::Nil,
        s("CPU"),
        V::Nil,
        V::Nil,
        V::from(0),
        s("full_attention"),
        V::Nil,
        s("node-local"),
        V::from(42),
    ]);
    // Map era with an unknown key and a sliding-window group.
    let swa = V::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), V::Array(vec![V::from(8u64)])),
        (s("parent_block_hash"), V::Nil),
        (s("token_ids"), tokens),
        (s("block_size"), V::from(16)),
        (s("lora_id"), V::Nil),
        (s("medium"), s("GPU")),
        (s("lora_name"), V::Nil),
        (s("group_idx"), V::from(1)),
        (s("kv_cache_spec_kind"), s("sliding_window")),
        (s("future_field"), V::from(true)),
    ]);
    let unknown = V::Array(vec![s("BlockMoved"), V::from(1)]);
    let batch = V::Array(vec![
        V::F64(1.0),
        V::Array(vec![old, newer, swa, unknown]),
        V::Nil,
        s("extra envelope field"),
    ]);
    let decoded = decode_batch(&mp(&batch)).unwrap();
    let [
        Event::Stored(a),
        Event::Stored(b),
        Event::Stored(c),
        Event::Unknown,
    ] = decoded.events.as_slice()
    else {
        panic!("{:?}", decoded.events)
    };
    assert_eq!(a.hashes, vec![EngineHash((-5i64) as u64)]);
    assert_eq!(a.tier, Tier::Gpu, "no medium field: GPU");
    assert_eq!(b.parent, Some(EngineHash((-5i64) as u64)));
    assert_eq!(b.tier, Tier::Cpu);
    assert!(b.reusable);
    assert!(!c.reusable, "sliding window groups are not prefix-reusable");
    // A batch sent as a map is accepted too.
    let as_map = V::Map(vec![
        (s("ts"), V::F64(2.0)),
        (s("events"), V::Array(vec![])),
        (s("data_parallel_rank"), V::from(1)),
    ]);
    assert_eq!(decode_batch(&mp(&as_map)).unwrap().dp_rank, Some(1));
}

#[test]
fn garbage_is_an_error() {
    assert!(decode_batch(b"").is_err());
    assert!(decode_batch(&[0x93, 0xcb]).is_err());
    assert!(decode_batch(&mp(&rmpv::Value::from("nope"))).is_err());
    let no_type = rmpv::Value::Array(vec![
        rmpv::Value::F64(1.0),
        rmpv::Value::Array(vec![rmpv::Value::Map(vec![])]),
        rmpv::Value::Nil,
    ]);
    assert!(decode_batch(&mp(&no_type)).is_err());
    let mut trailing = mp(&rmpv::Value::Array(vec![
        rmpv::Value::F64(1.0),
        rmpv::Value::Array(vec![]),
    ]));
    trailing.push(0xc0);
    assert!(matches!(
        decode_batch(&trailing),
        Err(WireError::Trailing { count: 1 })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0xbad_f00d),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn never_panics_on_corrupted_real_batches(flips in proptest::collection::vec((0usize..400, any::<u8>()), 1..8)) {
        let mut payload = MAP_BYTES.to_vec();
        for (i, b) in flips {
            let n = payload.len();
            payload[i % n] = b;
        }
        let _ = decode_batch(&payload);
    }
}
