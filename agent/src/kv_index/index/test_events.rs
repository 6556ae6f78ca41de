//! Test-only: an engine's events in the shape the index tests reason about (32-byte digests,
//! a medium), written to vLLM's wire layout by the golden-pinned test encoder; and a churning
//! engine's pre-encoded batches for the ingestion tests.

use std::time::{Duration, Instant};

use super::{KvIndex, SourceId};
use crate::kv_index::wire::{
    decode_batch,
    test_encoder::{self as wire, Era, WireHash, encode_batch},
};

pub type Digest = [u8; 32];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    Gpu,
    Cpu,
}

impl Medium {
    fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
        }
    }
}

/// What an engine reports, before encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    Stored {
        hashes: Vec<Digest>,
        parent: Option<Digest>,
        token_ids: Vec<u32>,
        block_size: usize,
        lora_name: Option<String>,
        extra_keys: Vec<Option<Vec<String>>>,
        medium: Medium,
    },
    Removed {
        hashes: Vec<Digest>,
        medium: Medium,
    },
    AllCleared,
}

/// How digests go on the wire (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashForm {
    /// The digest's low 64 bits, big-endian, as an unsigned int (vLLM's default).
    #[default]
    Int,
    /// The raw digest as msgpack bin.
    Bytes,
}

/// One engine's publisher settings: a full-attention model (group 0), no LoRA ids.
#[derive(Debug, Clone, Copy)]
pub struct Encoder {
    pub era: Era,
    pub hashes: HashForm,
}

impl Default for Encoder {
    fn default() -> Self {
        Self {
            era: Era::Map,
            hashes: HashForm::Int,
        }
    }
}

// === impl Encoder ===

impl Encoder {
    pub fn batch(&self, ts: f64, events: &[EngineEvent]) -> Vec<u8> {
        let events: Vec<wire::KvEvent> = events.iter().map(|e| self.event(e)).collect();
        encode_batch(self.era, ts, &events, None)
    }

    fn hash(&self, d: &Digest) -> WireHash {
        match self.hashes {
            HashForm::Int => WireHash::Int(u64::from_be_bytes(
                d[24..]
                    .try_into()
                    .expect("a 32-byte digest has bytes 24..32"),
            )),
            HashForm::Bytes => WireHash::Bytes(d.to_vec()),
        }
    }

    fn event(&self, e: &EngineEvent) -> wire::KvEvent {
        match e {
            EngineEvent::Stored {
                hashes,
                parent,
                token_ids,
                block_size,
                lora_name,
                extra_keys,
                medium,
            } => wire::KvEvent::BlockStored(wire::BlockStored {
                block_hashes: hashes.iter().map(|h| self.hash(h)).collect(),
                parent_block_hash: parent.as_ref().map(|h| self.hash(h)),
                token_ids: token_ids.clone(),
                block_size: *block_size as u64,
                lora_id: None,
                medium: Some(medium.as_str().into()),
                lora_name: lora_name.clone(),
                extra_keys: Some(
                    extra_keys
                        .iter()
                        .map(|k| {
                            k.as_ref()
                                .map(|items| items.iter().cloned().map(wire::Extra::Str).collect())
                        })
                        .collect(),
                ),
                group_idx: Some(0),
                kv_cache_spec_kind: Some("full_attention".into()),
                kv_cache_spec_sliding_window: None,
            }),
            EngineEvent::Removed { hashes, medium } => {
                wire::KvEvent::BlockRemoved(wire::BlockRemoved {
                    block_hashes: hashes.iter().map(|h| self.hash(h)).collect(),
                    medium: Some(medium.as_str().into()),
                    group_idx: Some(0),
                })
            }
            EngineEvent::AllCleared => wire::KvEvent::AllBlocksCleared,
        }
    }
}

/// splitmix64: a seeded, dependency-free source of test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn digest(&mut self) -> Digest {
        let mut d = [0u8; 32];
        for chunk in d.chunks_mut(8) {
            chunk.copy_from_slice(&self.next().to_le_bytes());
        }
        d
    }
}

const CHURN_BLOCK: usize = 16;

/// Pre-encoded batches of one engine whose cache churns: every batch stores a run of 8 new
/// blocks (a 128-token continuation; a new chain every 16 batches) and, once 100,000 blocks
/// are live, evicts the 8 oldest. Returns the payloads and the block hashes they carry.
pub fn churn_payloads(batches: usize, seed: u64) -> (Vec<Vec<u8>>, usize) {
    let mut rng = Rng(seed);
    let encoder = Encoder::default();
    let mut live: std::collections::VecDeque<Digest> = Default::default();
    let mut hashes_total = 0;
    let mut parent: Option<Digest> = None;
    let payloads = (0..batches)
        .map(|b| {
            let hashes: Vec<Digest> = (0..8).map(|_| rng.digest()).collect();
            let token_ids: Vec<u32> = (0..8 * CHURN_BLOCK)
                .map(|_| (rng.next() % 128_000) as u32)
                .collect();
            if b % 16 == 0 {
                parent = None;
            }
            let mut events = vec![EngineEvent::Stored {
                hashes: hashes.clone(),
                parent,
                token_ids,
                block_size: CHURN_BLOCK,
                lora_name: None,
                extra_keys: vec![None; 8],
                medium: Medium::Gpu,
            }];
            parent = hashes.last().copied();
            live.extend(hashes.iter().copied());
            hashes_total += 8;
            if live.len() > 100_000 {
                let evicted: Vec<Digest> = live.drain(..8).collect();
                hashes_total += evicted.len();
                events.push(EngineEvent::Removed {
                    hashes: evicted,
                    medium: Medium::Gpu,
                });
            }
            encoder.batch(1.0, &events)
        })
        .collect();
    (payloads, hashes_total)
}

/// Decodes and applies every payload to one source, in sequence order; returns the elapsed
/// time.
pub fn ingest(index: &KvIndex, id: SourceId, payloads: &[Vec<u8>]) -> Duration {
    let start = Instant::now();
    for (seq, p) in payloads.iter().enumerate() {
        match decode_batch(p) {
            Ok(batch) => index.apply(id, &batch, seq as u64),
            Err(_) => index.note_malformed(id),
        }
    }
    start.elapsed()
}
