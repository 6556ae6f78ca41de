//! Golden agreement with the simulator's encoder (both eras, both hash forms), hand-made
//! payloads for older and newer vLLM shapes, and garbage.

use proptest::prelude::*;
use warmpath_sim::{
    engine::kv_cache::{KvEvent, Medium},
    events::{Encoder, HashEncoding, WireFormat, hash_to_u64},
};

use super::*;

fn sim_events() -> Vec<KvEvent> {
    vec![
        KvEvent::Stored {
            hashes: vec![[1; 32], [2; 32]],
            parent: Some([9; 32]),
            token_ids: (0..32).collect(),
            block_size: 16,
            lora_name: Some("sql".into()),
            extra_keys: vec![
                Some(vec!["sql".into(), "salt".into()]),
                Some(vec!["sql".into()]),
            ],
            medium: Medium::Gpu,
        },
        KvEvent::Removed {
            hashes: vec![[1; 32]],
            medium: Medium::Cpu,
        },
        KvEvent::AllCleared,
    ]
}

#[test]
fn decodes_what_the_simulator_publishes_in_every_format() {
    for format in [WireFormat::Array, WireFormat::Map] {
        for hashes in [HashEncoding::Int, HashEncoding::Bytes] {
            let enc = Encoder {
                format,
                hashes,
                dp_rank: Some(2),
                loras: vec!["sql".into()],
            };
            let batch = decode_batch(&enc.batch(12.5, &sim_events())).unwrap();
            assert_eq!(batch.ts, 12.5);
            assert_eq!(batch.dp_rank, Some(2));
            let [Event::Stored(s), Event::Removed(r), Event::AllCleared] = batch.events.as_slice()
            else {
                panic!("{format:?}/{hashes:?}: {:?}", batch.events)
            };
            // Int and bytes forms reduce to the same 64-bit identity.
            assert_eq!(
                s.hashes,
                vec![
                    EngineHash(hash_to_u64(&[1; 32])),
                    EngineHash(hash_to_u64(&[2; 32]))
                ]
            );
            assert_eq!(s.parent, Some(EngineHash(hash_to_u64(&[9; 32]))));
            assert_eq!(s.token_ids, (0..32).collect::<Vec<_>>());
            assert_eq!((s.block_size, s.tier, s.reusable), (16, Tier::Gpu, true));
            assert_eq!(s.lora_name.as_deref(), Some("sql"));
            assert_eq!(
                s.extra_keys[0],
                Some(vec!["sql".to_string(), "salt".to_string()])
            );
            assert_eq!(r.tier, Tier::Cpu);
        }
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
        let enc = Encoder { format: WireFormat::Map, hashes: HashEncoding::Bytes, dp_rank: None, loras: vec![] };
        let mut payload = enc.batch(1.0, &sim_events());
        for (i, b) in flips {
            let n = payload.len();
            payload[i % n] = b;
        }
        let _ = decode_batch(&payload);
    }
}
