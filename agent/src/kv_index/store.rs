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
/// Keys probed per round of a lookup.
const CHUNK: usize = 256;

thread_local! {
    static LOOKUP_SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Per-thread buffers of `lookup`: for each probed position, (source, best weight) pairs.
#[derive(Debug, Default)]
struct Scratch {
    /// Up to `INLINE` hits per position, flat.
    inline: Vec<(u32, f64)>,
    len: Vec<u8>,
    /// Positions with more hits than fit inline.
    overflow: Vec<(u16, u32, f64)>,
    spilled: Vec<(u32, f64)>,
}

const INLINE: usize = 4;

impl Scratch {
    fn reset(&mut self, n: usize) {
        self.inline.clear();
        self.inline.resize(n * INLINE, (0, 0.0));
        self.len.clear();
        self.len.resize(n, 0);
        self.overflow.clear();
    }

    /// Records that `source` holds position `i` with weight `w` (keeping the best tier).
    fn add(&mut self, i: usize, source: u32, w: f64) {
        let n = usize::from(self.len[i]);
        let slots = &mut self.inline[i * INLINE..i * INLINE + n.min(INLINE)];
        if let Some(hit) = slots.iter_mut().find(|(s, _)| *s == source) {
            hit.1 = hit.1.max(w);
            return;
        }
        if let Some(hit) = self
            .overflow
            .iter_mut()
            .find(|(p, s, _)| usize::from(*p) == i && *s == source)
        {
            hit.2 = hit.2.max(w);
            return;
        }
        if n < INLINE {
            self.inline[i * INLINE + n] = (source, w);
        } else {
            self.overflow.push((i as u16, source, w));
        }
        self.len[i] = self.len[i].saturating_add(1);
    }

    /// Hits of position `i`.
    fn hits(&mut self, i: usize) -> &[(u32, f64)] {
        let n = usize::from(self.len[i]);
        if n <= INLINE {
            return &self.inline[i * INLINE..i * INLINE + n];
        }
        self.spilled.clear();
        self.spilled
            .extend_from_slice(&self.inline[i * INLINE..(i + 1) * INLINE]);
        self.spilled.extend(
            self.overflow
                .iter()
                .filter(|(p, _, _)| usize::from(*p) == i)
                .map(|&(_, s, w)| (s, w)),
        );
        &self.spilled
    }
}

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
    weights: [f64; Tier::COUNT],
}

impl Store {
    /// An empty index bounded to about `max_entries` (block, source) entries.
    pub fn new(max_entries: usize, weights: [f64; Tier::COUNT]) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            max_per_shard: max_entries.div_ceil(SHARDS).max(8),
            epoch: AtomicU32::new(1),
            evicted: AtomicUsize::new(0),
            weights,
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
    /// first block and its tier-weighted score. `out` is cleared first.
    ///
    /// Keys are probed a chunk at a time: one read lock per shard per chunk, then a tight
    /// loop of independent probes with no atomic read-modify-write between them, so the CPU
    /// overlaps their cache misses. Probing stops after the chunk where the last source
    /// drops out.
    pub fn lookup(&self, chain: &[RouterKey], out: &mut Vec<Match>) {
        out.clear();
        LOOKUP_SCRATCH.with_borrow_mut(|scratch| self.lookup_with(chain, out, scratch));
    }

    fn lookup_with(&self, chain: &[RouterKey], out: &mut Vec<Match>, scratch: &mut Scratch) {
        let epoch = self.now();
        // Indices into `out` of the sources still matching.
        let mut active: Vec<usize> = Vec::new();
        let mut start = 0;
        while start < chain.len() {
            let end = (start + CHUNK).min(chain.len());
            self.probe(&chain[start..end], epoch, scratch);
            for i in start..end {
                let hits = scratch.hits(i - start);
                if i == 0 {
                    for &(source, w) in hits {
                        active.push(out.len());
                        out.push(Match {
                            source,
                            blocks: 1,
                            score: w,
                        });
                    }
                } else {
                    active.retain(|&m| match hits.iter().find(|(s, _)| *s == out[m].source) {
                        Some(&(_, w)) => {
                            out[m].blocks += 1;
                            out[m].score += w;
                            true
                        }
                        None => false,
                    });
                }
                if active.is_empty() {
                    return;
                }
            }
            start = end;
        }
    }

    /// Fills `scratch` with the best-tier weight per source for each key of `keys`.
    ///
    /// Read guards of every shard the chunk touches are taken first; then all keys are
    /// looked up in one tight loop of independent probes (the CPU overlaps their cache
    /// misses), and only then are the hits recorded.
    fn probe(&self, keys: &[RouterKey], epoch: u32, scratch: &mut Scratch) {
        scratch.reset(keys.len());
        let mut guards: [Option<parking_lot::RwLockReadGuard<'_, Shard>>; SHARDS] =
            std::array::from_fn(|_| None);
        for k in keys {
            let shard = k.0 as usize & (SHARDS - 1);
            if guards[shard].is_none() {
                guards[shard] = Some(self.shards[shard].read());
            }
        }
        let found: Vec<Option<(&Entry, &Spill)>> = keys
            .iter()
            .map(|k| {
                let guard = guards[k.0 as usize & (SHARDS - 1)].as_ref()?;
                guard.map.get(&k.0).map(|e| (e, &guard.spill))
            })
            .collect();
        for (i, hit) in found.into_iter().enumerate() {
            let Some((entry, spill)) = hit else { continue };
            entry.touch(epoch);
            entry.for_each(spill, |h| {
                scratch.add(i, h.source(), self.weights[h.tier() as usize])
            });
        }
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
