//! msgpack encoding of KV event batches in both of vLLM's wire eras.
//!
//! - Array era (v0.9 .. v0.23): each event is an array whose first element is the tag, with
//!   every declared field present (trailing nils included).
//! - Map era (v0.26+): each event is a map with a "type" key; fields whose default is None are
//!   omitted when None, fields without a default are always present.
//!
//! The batch envelope is `[ts, [events...], data_parallel_rank]` in both eras.

use rmp::encode as mp;

use crate::engine::{BlockHash, kv_cache::KvEvent};

/// Which wire era to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireFormat {
    /// Events as tagged arrays (vLLM up to ~v0.23).
    Array,
    /// Events as maps with a "type" key (vLLM ~v0.26+).
    #[default]
    Map,
}

/// How block hashes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashEncoding {
    /// Low 64 bits of the digest as an unsigned int (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
    #[default]
    Int,
    /// The raw 32-byte digest as msgpack bin.
    Bytes,
}

/// Encoding settings for one engine's publisher.
#[derive(Debug, Clone, Default)]
pub struct Encoder {
    pub format: WireFormat,
    pub hashes: HashEncoding,
    pub dp_rank: Option<u32>,
    /// LoRA adapters in the order their ids are assigned (id = position + 1).
    pub loras: Vec<String>,
}

/// The int form of a block hash: the digest's low 64 bits, big-endian.
pub fn hash_to_u64(h: &BlockHash) -> u64 {
    u64::from_be_bytes(
        h[24..32]
            .try_into()
            .expect("a 32-byte digest has bytes 24..32"),
    )
}

type Buf = Vec<u8>;

fn w<E: std::fmt::Debug>(r: Result<(), E>) {
    r.expect("writing msgpack to a Vec cannot fail");
}

fn str(buf: &mut Buf, s: &str) {
    w(mp::write_str(buf, s));
}

fn nil(buf: &mut Buf) {
    w(mp::write_nil(buf).map(|_| ()));
}

fn opt_str(buf: &mut Buf, s: Option<&str>) {
    match s {
        Some(s) => str(buf, s),
        None => nil(buf),
    }
}

fn uint(buf: &mut Buf, v: u64) {
    w(mp::write_uint(buf, v).map(|_| ()));
}

fn array_len(buf: &mut Buf, n: usize) {
    w(mp::write_array_len(buf, n as u32).map(|_| ()));
}

impl Encoder {
    /// One batch's msgpack payload.
    pub fn batch(&self, ts: f64, events: &[KvEvent]) -> Vec<u8> {
        let mut buf = Vec::with_capacity(64 + events.len() * 128);
        array_len(&mut buf, 3);
        w(mp::write_f64(&mut buf, ts));
        array_len(&mut buf, events.len());
        for e in events {
            self.event(&mut buf, e);
        }
        match self.dp_rank {
            Some(r) => uint(&mut buf, u64::from(r)),
            None => nil(&mut buf),
        }
        buf
    }

    fn hash(&self, buf: &mut Buf, h: &BlockHash) {
        match self.hashes {
            HashEncoding::Int => uint(buf, hash_to_u64(h)),
            HashEncoding::Bytes => w(mp::write_bin(buf, h)),
        }
    }

    fn hashes(&self, buf: &mut Buf, hs: &[BlockHash]) {
        array_len(buf, hs.len());
        for h in hs {
            self.hash(buf, h);
        }
    }

    fn lora_id(&self, name: Option<&str>) -> Option<u64> {
        let name = name?;
        self.loras
            .iter()
            .position(|l| l == name)
            .map(|p| p as u64 + 1)
    }

    /// One event in the encoder's era: an array (the tag first, then every field in order) or
    /// a map (the tag under "type", then each field under its name). Both eras write the same
    /// fields in the same order; only the keys and the omitted defaults differ.
    fn event(&self, buf: &mut Buf, e: &KvEvent) {
        let map = self.format == WireFormat::Map;
        // Writes a field's key in the map era; the value follows either way.
        let key = |buf: &mut Buf, name: &str| {
            if map {
                str(buf, name);
            }
        };
        // The header (fields counted with the tag) and the tag.
        let head = |buf: &mut Buf, fields: usize, tag: &str| {
            if map {
                w(mp::write_map_len(buf, fields as u32).map(|_| ()));
            } else {
                array_len(buf, fields);
            }
            key(buf, "type");
            str(buf, tag);
        };
        match e {
            KvEvent::Stored {
                hashes,
                parent,
                token_ids,
                block_size,
                lora_name,
                extra_keys,
                medium,
            } => {
                // The array's twelfth field, kv_cache_spec_sliding_window, is None, so the map
                // omits it.
                head(buf, if map { 11 } else { 12 }, "BlockStored");
                key(buf, "block_hashes");
                self.hashes(buf, hashes);
                key(buf, "parent_block_hash");
                self.opt_hash(buf, parent.as_ref());
                key(buf, "token_ids");
                tokens(buf, token_ids);
                key(buf, "block_size");
                uint(buf, *block_size as u64);
                key(buf, "lora_id");
                self.opt_uint(buf, self.lora_id(lora_name.as_deref()));
                key(buf, "medium");
                str(buf, medium.as_str());
                key(buf, "lora_name");
                opt_str(buf, lora_name.as_deref());
                key(buf, "extra_keys");
                extra(buf, extra_keys);
                key(buf, "group_idx");
                uint(buf, 0);
                // kv_cache_spec_kind has a None default but is set for full attention.
                key(buf, "kv_cache_spec_kind");
                str(buf, "full_attention");
                if !map {
                    nil(buf);
                }
            }
            KvEvent::Removed { hashes, medium } => {
                head(buf, 4, "BlockRemoved");
                key(buf, "block_hashes");
                self.hashes(buf, hashes);
                key(buf, "medium");
                str(buf, medium.as_str());
                key(buf, "group_idx");
                uint(buf, 0);
            }
            KvEvent::AllCleared => head(buf, 1, "AllBlocksCleared"),
        }
    }

    fn opt_hash(&self, buf: &mut Buf, h: Option<&BlockHash>) {
        match h {
            Some(h) => self.hash(buf, h),
            None => nil(buf),
        }
    }

    fn opt_uint(&self, buf: &mut Buf, v: Option<u64>) {
        match v {
            Some(v) => uint(buf, v),
            None => nil(buf),
        }
    }
}

fn tokens(buf: &mut Buf, ids: &[u32]) {
    array_len(buf, ids.len());
    for t in ids {
        uint(buf, u64::from(*t));
    }
}

fn extra(buf: &mut Buf, keys: &[Option<Vec<String>>]) {
    array_len(buf, keys.len());
    for k in keys {
        match k {
            Some(items) => {
                array_len(buf, items.len());
                for s in items {
                    str(buf, s);
                }
            }
            None => nil(buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use rmpv::Value;

    use super::*;
    use crate::engine::kv_cache::Medium;

    fn stored() -> KvEvent {
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
        }
    }

    fn decode(buf: &[u8]) -> Value {
        let mut cursor = buf;
        let v = rmpv::decode::read_value(&mut cursor).expect("valid msgpack");
        assert!(cursor.is_empty(), "no trailing bytes");
        v
    }

    #[test]
    fn map_era_event_is_a_complete_map() {
        let enc = Encoder {
            loras: vec!["sql".into()],
            ..Default::default()
        };
        let batch = decode(&enc.batch(
            1.5,
            &[
                stored(),
                KvEvent::Removed {
                    hashes: vec![[1; 32]],
                    medium: Medium::Cpu,
                },
                KvEvent::AllCleared,
            ],
        ));
        let Value::Array(items) = batch else { panic!() };
        assert_eq!(items[0], Value::F64(1.5));
        assert_eq!(items[2], Value::Nil);
        let Value::Array(events) = &items[1] else {
            panic!()
        };
        let Value::Map(first) = &events[0] else {
            panic!()
        };
        let get = |k: &str| {
            first
                .iter()
                .find(|(key, _)| key.as_str() == Some(k))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(first.len(), 11);
        assert_eq!(get("type"), Some(Value::from("BlockStored")));
        assert_eq!(get("lora_id"), Some(Value::from(1u64)));
        assert_eq!(
            get("parent_block_hash"),
            Some(Value::from(hash_to_u64(&[9; 32])))
        );
        assert_eq!(get("kv_cache_spec_sliding_window"), None);
        let Value::Map(removed) = &events[1] else {
            panic!()
        };
        assert_eq!(removed.len(), 4);
    }

    #[test]
    fn array_era_event_carries_every_field_and_bytes_hashes() {
        let enc = Encoder {
            format: WireFormat::Array,
            hashes: HashEncoding::Bytes,
            dp_rank: Some(3),
            loras: vec![],
        };
        let Value::Array(items) = decode(&enc.batch(2.0, &[stored()])) else {
            panic!()
        };
        assert_eq!(items[2], Value::from(3u64));
        let Value::Array(events) = &items[1] else {
            panic!()
        };
        let Value::Array(fields) = &events[0] else {
            panic!()
        };
        assert_eq!(fields.len(), 12);
        assert_eq!(fields[0], Value::from("BlockStored"));
        assert_eq!(
            fields[1],
            Value::Array(vec![Value::Binary(vec![1; 32]), Value::Binary(vec![2; 32])])
        );
        assert_eq!(fields[5], Value::Nil, "unknown LoRA has no id");
        assert_eq!(fields[11], Value::Nil);
    }

    #[test]
    fn int_hash_is_the_low_64_bits_big_endian() {
        let mut h = [0u8; 32];
        h[24..].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        assert_eq!(hash_to_u64(&h), 0x0102_0304_0506_0708);
    }
}
