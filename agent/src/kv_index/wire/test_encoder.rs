//! Test-only: writes KV event batches byte for byte as vLLM's msgspec structs do, in both wire
//! eras, so tests can make payloads without the simulator. Pinned to msgspec's own output by
//! `test_encoder_writes_the_golden_bytes` in `tests.rs` (the goldens in `golden/`).
//!
//! msgspec writes every int, string, array, map and bin in its shortest msgpack form and every
//! float as float64; `rmp::encode` does the same. Array-era events carry every declared field
//! (trailing nils included); map-era events carry `type` first, then the declared fields in
//! order, leaving out those whose default is None while they are None. The batch is always
//! the positional `[ts, events, data_parallel_rank]`.

use rmp::encode as mp;

/// Which of vLLM's two event layouts to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// Tagged arrays (vLLM up to ~v0.23).
    Array,
    /// Maps with a `type` key (vLLM ~v0.26+).
    Map,
}

/// `ExternalBlockHash = int | bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireHash {
    Int(u64),
    Bytes(Vec<u8>),
}

/// One element of an `extra_keys` tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extra {
    Str(String),
    Int(i64),
}

/// vLLM's `BlockStored`, field for field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockStored {
    pub block_hashes: Vec<WireHash>,
    pub parent_block_hash: Option<WireHash>,
    pub token_ids: Vec<u32>,
    pub block_size: u64,
    pub lora_id: Option<u64>,
    pub medium: Option<String>,
    pub lora_name: Option<String>,
    pub extra_keys: Option<Vec<Option<Vec<Extra>>>>,
    pub group_idx: Option<u64>,
    pub kv_cache_spec_kind: Option<String>,
    pub kv_cache_spec_sliding_window: Option<u64>,
}

/// vLLM's `BlockRemoved`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<WireHash>,
    pub medium: Option<String>,
    pub group_idx: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    AllBlocksCleared,
}

/// One `KVEventBatch` payload.
pub fn encode_batch(era: Era, ts: f64, events: &[KvEvent], dp_rank: Option<u64>) -> Vec<u8> {
    let mut w = W(Vec::with_capacity(64 + events.len() * 128));
    w.array(3);
    ok(mp::write_f64(&mut w.0, ts));
    w.array(events.len());
    for e in events {
        match era {
            Era::Array => w.event_array(e),
            Era::Map => w.event_map(e),
        }
    }
    w.opt_uint(dp_rank);
    w.0
}

struct W(Vec<u8>);

fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) {
    r.expect("writing msgpack to a Vec cannot fail");
}

// === impl W ===

impl W {
    fn array(&mut self, n: usize) {
        let n = u32::try_from(n).expect("test payloads have fewer than 2^32 items");
        ok(mp::write_array_len(&mut self.0, n));
    }

    fn map(&mut self, n: usize) {
        let n = u32::try_from(n).expect("test payloads have fewer than 2^32 items");
        ok(mp::write_map_len(&mut self.0, n));
    }

    fn str(&mut self, s: &str) {
        ok(mp::write_str(&mut self.0, s));
    }

    fn nil(&mut self) {
        ok(mp::write_nil(&mut self.0));
    }

    fn uint(&mut self, v: u64) {
        ok(mp::write_uint(&mut self.0, v));
    }

    fn opt_uint(&mut self, v: Option<u64>) {
        match v {
            Some(v) => self.uint(v),
            None => self.nil(),
        }
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }

    fn hash(&mut self, h: &WireHash) {
        match h {
            WireHash::Int(v) => self.uint(*v),
            WireHash::Bytes(b) => {
                ok(mp::write_bin(&mut self.0, b));
            }
        }
    }

    fn hashes(&mut self, hs: &[WireHash]) {
        self.array(hs.len());
        for h in hs {
            self.hash(h);
        }
    }

    fn opt_hash(&mut self, h: Option<&WireHash>) {
        match h {
            Some(h) => self.hash(h),
            None => self.nil(),
        }
    }

    fn tokens(&mut self, ids: &[u32]) {
        self.array(ids.len());
        for t in ids {
            self.uint(u64::from(*t));
        }
    }

    fn extra_keys(&mut self, keys: Option<&[Option<Vec<Extra>>]>) {
        let Some(keys) = keys else {
            return self.nil();
        };
        self.array(keys.len());
        for k in keys {
            let Some(items) = k else {
                self.nil();
                continue;
            };
            self.array(items.len());
            for item in items {
                match item {
                    Extra::Str(s) => self.str(s),
                    Extra::Int(i) => {
                        ok(mp::write_sint(&mut self.0, *i));
                    }
                }
            }
        }
    }

    fn event_array(&mut self, e: &KvEvent) {
        match e {
            KvEvent::BlockStored(s) => {
                self.array(12);
                self.str("BlockStored");
                self.hashes(&s.block_hashes);
                self.opt_hash(s.parent_block_hash.as_ref());
                self.tokens(&s.token_ids);
                self.uint(s.block_size);
                self.opt_uint(s.lora_id);
                self.opt_str(s.medium.as_deref());
                self.opt_str(s.lora_name.as_deref());
                self.extra_keys(s.extra_keys.as_deref());
                self.opt_uint(s.group_idx);
                self.opt_str(s.kv_cache_spec_kind.as_deref());
                self.opt_uint(s.kv_cache_spec_sliding_window);
            }
            KvEvent::BlockRemoved(r) => {
                self.array(4);
                self.str("BlockRemoved");
                self.hashes(&r.block_hashes);
                self.opt_str(r.medium.as_deref());
                self.opt_uint(r.group_idx);
            }
            KvEvent::AllBlocksCleared => {
                self.array(1);
                self.str("AllBlocksCleared");
            }
        }
    }

    fn event_map(&mut self, e: &KvEvent) {
        match e {
            KvEvent::BlockStored(s) => {
                let defaulted = [
                    s.extra_keys.is_some(),
                    s.group_idx.is_some(),
                    s.kv_cache_spec_kind.is_some(),
                    s.kv_cache_spec_sliding_window.is_some(),
                ];
                self.map(8 + defaulted.iter().filter(|x| **x).count());
                self.str("type");
                self.str("BlockStored");
                self.str("block_hashes");
                self.hashes(&s.block_hashes);
                self.str("parent_block_hash");
                self.opt_hash(s.parent_block_hash.as_ref());
                self.str("token_ids");
                self.tokens(&s.token_ids);
                self.str("block_size");
                self.uint(s.block_size);
                self.str("lora_id");
                self.opt_uint(s.lora_id);
                self.str("medium");
                self.opt_str(s.medium.as_deref());
                self.str("lora_name");
                self.opt_str(s.lora_name.as_deref());
                if s.extra_keys.is_some() {
                    self.str("extra_keys");
                    self.extra_keys(s.extra_keys.as_deref());
                }
                if let Some(g) = s.group_idx {
                    self.str("group_idx");
                    self.uint(g);
                }
                if let Some(kind) = &s.kv_cache_spec_kind {
                    self.str("kv_cache_spec_kind");
                    self.str(kind);
                }
                if let Some(window) = s.kv_cache_spec_sliding_window {
                    self.str("kv_cache_spec_sliding_window");
                    self.uint(window);
                }
            }
            KvEvent::BlockRemoved(r) => {
                self.map(3 + usize::from(r.group_idx.is_some()));
                self.str("type");
                self.str("BlockRemoved");
                self.str("block_hashes");
                self.hashes(&r.block_hashes);
                self.str("medium");
                self.opt_str(r.medium.as_deref());
                if let Some(g) = r.group_idx {
                    self.str("group_idx");
                    self.uint(g);
                }
            }
            KvEvent::AllBlocksCleared => {
                self.map(1);
                self.str("type");
                self.str("AllBlocksCleared");
            }
        }
    }
}
