//! The concurrent prefix index: router key -> the sources (pods or DP ranks) holding it, per
//! tier.
//!
//! - 64 shards, each a hash table behind its own `RwLock`; a lookup holds one shard's read
//!   lock for one probe, so readers never wait for more than a single key operation of a writer.
//! - Writers are the per-source ingestion tasks (in order per source) and the router's
//!   speculative inserts.
//! - Memory is bounded by `max_entries` (block, source) entries: a shard over its share evicts
//!   its least recently touched eighth (epochs are bumped by lookups and writes).
//! - Per source, a map engine hash -> router key (+ tiers) resolves BlockRemoved and makes
//!   removing a source or an AllBlocksCleared proportional to that source's entries.

use std::{
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
    sync::atomic::{AtomicU32, AtomicUsize, Ordering},
};

use parking_lot::RwLock;

use super::{
    RouterKey, Tier,
    entry::{Entry, Holder, Spill, Upsert},
};

const SHARDS: usize = 64;
/// Shards never shrink below this many keys' room (no rehash churn on small indexes).
const MIN_SHRINK: usize = 64;
/// Keys probed per round of a lookup.
const CHUNK: usize = 512;

/// Keys are already uniform hashes; shards take the low 6 bits, this mixes the rest.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v >> 6).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(26);
    }
}

/// HashMap keyed by already-random u64s.
pub type FastMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// Gives memory back once `map` is a quarter full (never below room for `floor` keys),
/// keeping twice its entries so it can grow again without rehashing at once.
pub fn shrink_if_sparse<V>(map: &mut FastMap<V>, floor: usize) {
    if map.capacity() > 4 * map.len().max(floor) {
        map.shrink_to(map.len() * 2);
    }
}

#[derive(Debug, Default)]
struct Shard {
    map: FastMap<Entry>,
    spill: Spill,
    /// (block, source) entries in this shard.
    holders: usize,
}

/// How well one source's blocks match a request's key chain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Match {
    pub source: u32,
    /// Longest consecutive prefix of the chain that the source holds, in blocks.
    pub blocks: usize,
    /// Sum over those blocks of the best tier weight the source holds each in.
    pub score: f64,
}

/// The shared index.
#[derive(Debug)]
pub struct Store {
    shards: Vec<RwLock<Shard>>,
    max_per_shard: usize,
    epoch: AtomicU32,
    evicted: AtomicUsize,
    /// Tier weight by a holder's raw tier bits (all eight values, so no branch or bounds
    /// check on the lookup path).
    weights: [f64; 8],
}

impl Store {
    /// An empty index bounded to about `max_entries` (block, source) entries.
    pub fn new(max_entries: usize, weights: [f64; Tier::COUNT]) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            max_per_shard: max_entries.div_ceil(SHARDS).max(8),
            epoch: AtomicU32::new(1),
            evicted: AtomicUsize::new(0),
            weights: std::array::from_fn(|bits| weights[Tier::from_index(bits as u8) as usize]),
        }
    }

    fn shard(&self, key: RouterKey) -> &RwLock<Shard> {
        &self.shards[(key.0 as usize) & (SHARDS - 1)]
    }

    /// Advances the LRU clock (called once per ingested batch and per routing decision).
    pub fn tick(&self) -> u32 {
        self.epoch.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn now(&self) -> u32 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Adds (or confirms) `source` as a holder of `key` in `tier`.
    pub fn insert(&self, key: RouterKey, source: u32, tier: Tier, speculative: bool) -> Upsert {
        let epoch = self.now();
        let mut shard = self.shard(key).write();
        let shard = &mut *shard;
        let entry = shard.map.entry(key.0).or_insert_with(|| Entry::new(epoch));
        entry.touch(epoch);
        let outcome = entry.upsert(&mut shard.spill, Holder::new(source, tier, speculative));
        if outcome == Upsert::New {
            shard.holders += 1;
            if shard.holders > self.max_per_shard {
                self.evict(shard);
            }
        }
        outcome
    }

    /// Removes `source` from `key` in `tier` (only if still speculative, when asked).
    pub fn remove(&self, key: RouterKey, source: u32, tier: Tier, only_speculative: bool) -> bool {
        let mut shard = self.shard(key).write();
        let shard = &mut *shard;
        // One probe: update the entry and drop it in place when it empties.
        let std::collections::hash_map::Entry::Occupied(mut entry) = shard.map.entry(key.0) else {
            return false;
        };
        let removed = entry
            .get_mut()
            .remove(&mut shard.spill, source, tier, only_speculative);
        if removed {
            shard.holders -= 1;
        }
        if entry.get().is_empty() {
            entry.remove();
            // A source removed or cleared leaves shards sparse.
            shrink_if_sparse(&mut shard.map, MIN_SHRINK);
        }
        removed
    }

    /// Drops the least recently touched eighth of a shard's keys.
    fn evict(&self, shard: &mut Shard) {
        let mut epochs: Vec<u32> = shard.map.values().map(Entry::epoch).collect();
        let cut = epochs.len() / 8;
        if cut == 0 {
            return;
        }
        let (_, threshold, _) = epochs.select_nth_unstable(cut);
        let threshold = *threshold;
        let spill = &mut shard.spill;
        let mut dropped = 0;
        shard.map.retain(|_, e| {
            if e.epoch() <= threshold {
                dropped += e.clear(spill);
                false
            } else {
                true
            }
        });
        shard.holders -= dropped;
        self.evicted.fetch_add(dropped, Ordering::Relaxed);
    }

    /// For every source holding a prefix of `chain`: the longest consecutive run from the
    /// first block and its tier-weighted score, ordered by source. `out` is cleared first.
    ///
    /// One pass over the chain that stops at the first key no still-matching source holds;
    /// per key, one probe and a check of the (few) still-matching sources against the
    /// entry's holders — no per-position buffers. The read guards of a chunk's shards are
    /// taken before its probes (no atomic read-modify-write between probes, so the CPU
    /// overlaps their cache misses) and released after at most `CHUNK` keys, so a writer
    /// waits for at most one chunk of probes.
    pub fn lookup(&self, chain: &[RouterKey], out: &mut Vec<Match>) {
        out.clear();
        let epoch = self.now();
        // out[..active] are the sources still matching.
        let mut active = 0;
        'chain: for (c, keys) in chain.chunks(CHUNK).enumerate() {
            let mut guards: [Option<parking_lot::RwLockReadGuard<'_, Shard>>; SHARDS] =
                std::array::from_fn(|_| None);
            for k in keys {
                let s = k.0 as usize & (SHARDS - 1);
                if guards[s].is_none() {
                    guards[s] = Some(self.shards[s].read());
                }
            }
            let shard_of = |k: RouterKey| -> &Shard {
                guards[k.0 as usize & (SHARDS - 1)]
                    .as_deref()
                    .expect("a guard was taken for every key's shard above")
            };
            for (i, &k) in keys.iter().enumerate() {
                let shard = shard_of(k);
                let entry = shard.map.get(&k.0);
                if let Some(e) = entry {
                    e.touch(epoch);
                }
                if c == 0 && i == 0 {
                    if let Some(e) = entry {
                        e.for_each(&shard.spill, |h| {
                            let w = self.weights[h.tier_bits()];
                            match out.iter_mut().find(|m| m.source == h.source()) {
                                Some(m) => m.score = m.score.max(w),
                                None => out.push(Match {
                                    source: h.source(),
                                    blocks: 1,
                                    score: w,
                                }),
                            }
                        });
                    }
                    active = out.len();
                } else {
                    let mut m = 0;
                    while m < active {
                        let w = entry.and_then(|e| {
                            e.best_weight(&shard.spill, out[m].source, &self.weights)
                        });
                        if let Some(w) = w {
                            out[m].blocks += 1;
                            out[m].score += w;
                            m += 1;
                        } else {
                            active -= 1;
                            out.swap(m, active);
                        }
                    }
                }
                if active == 0 {
                    break 'chain;
                }
            }
        }
        out.sort_unstable_by_key(|m| m.source);
    }

    /// Every (source, tier) holding `key` (tests and diagnostics).
    pub fn holders_of(&self, key: RouterKey) -> Vec<Holder> {
        let shard = self.shard(key).read();
        let mut v = Vec::new();
        if let Some(e) = shard.map.get(&key.0) {
            e.for_each(&shard.spill, |h| v.push(h));
        }
        v
    }

    /// (block, source) entries currently indexed.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().holders).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries dropped by LRU eviction so far.
    pub fn evicted(&self) -> usize {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Bytes held by the shards' tables and spill lists (allocated capacity).
    pub fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.read();
                s.map.capacity() * (std::mem::size_of::<(u64, Entry)>() + 1) + s.spill.bytes()
            })
            .sum()
    }
}
