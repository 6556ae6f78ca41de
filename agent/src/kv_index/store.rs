//! The concurrent prefix index: router key -> the sources (pods or DP ranks) holding it, per
//! tier.
//!
//! - 16 shards, each a hash table (`table::Table`, open addressing) behind its own `RwLock`.
//!   A lookup read-locks every shard for a chunk of up to `CHUNK` keys; a `Writer`
//!   write-locks every shard for up to `WRITES_PER_LOCK` writes (in shard order, so lookups
//!   and writers never deadlock). Taking the locks once per run instead of once per key
//!   keeps the full barrier of each lock acquisition from serialising the cache misses of
//!   consecutive keys. Waiters spin before they park (`SPIN_BEFORE_PARKING`). The shards
//!   bound the work of one LRU eviction.
//! - Writers are the per-source ingestion tasks (in order per source) and the router's
//!   speculative inserts.
//! - Memory is bounded by `max_entries` (block, source) entries: a shard over its share evicts
//!   its least recently touched eighth (epochs are bumped by lookups and writes).
//! - Per source, an engine map (`engine_map`, owned by the index) resolves BlockRemoved and
//!   makes removing a source or an AllBlocksCleared proportional to that source's entries.

use std::{
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
    sync::atomic::{AtomicU32, AtomicUsize, Ordering},
};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{
    RouterKey, Tier,
    entry::{Entry, Holder, Spill, Upsert},
    table::Table,
};

const SHARDS: usize = 16;
/// Shards never shrink below this many keys' room (no rehash churn on small indexes).
const MIN_SHRINK: usize = 64;
/// Keys probed per round of a lookup.
const CHUNK: usize = 512;
/// Writes a `Writer` makes before it lets waiting readers in (re-locking the shards).
const WRITES_PER_LOCK: usize = 32;
/// How many keys ahead a writer prefetches the buckets it will write.
const WRITE_AHEAD: usize = 8;
/// How many keys ahead a lookup prefetches: enough to overlap ~16 cache misses, few enough
/// that a lookup ending early wastes little.
const PREFETCH_AHEAD: usize = 16;

/// Keys are already uniform hashes; this mixes them once more for hashbrown's tables.
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
    map: Table<Entry>,
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

    /// Write access to every shard for a run of writes (a batch of events, a speculation,
    /// clearing a source), locked at the first write.
    pub fn writer(&self) -> Writer<'_> {
        Writer {
            store: self,
            guards: None,
            writes: 0,
            epoch: self.now(),
        }
    }

    fn lock_all(&self) -> [RwLockWriteGuard<'_, Shard>; SHARDS] {
        std::array::from_fn(|s| spin_write(&self.shards[s]))
    }

    fn insert_in(
        &self,
        shard: &mut Shard,
        key: RouterKey,
        source: u32,
        tier: Tier,
        speculative: bool,
        epoch: u32,
    ) -> Upsert {
        let entry = shard.map.get_or_insert_with(key.0, || Entry::new(epoch));
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

    fn remove_in(
        shard: &mut Shard,
        key: RouterKey,
        source: u32,
        tier: Tier,
        only_speculative: bool,
    ) -> bool {
        let Some(entry) = shard.map.get_mut(key.0) else {
            return false;
        };
        let removed = entry.remove(&mut shard.spill, source, tier, only_speculative);
        let empty = entry.is_empty();
        if removed {
            shard.holders -= 1;
        }
        if empty {
            shard.map.remove(key.0);
            // A source removed or cleared leaves shards sparse.
            shard.map.shrink_if_sparse(MIN_SHRINK);
        }
        removed
    }

    /// Drops the least recently touched eighth of a shard's keys.
    fn evict(&self, shard: &mut Shard) {
        let mut epochs: Vec<u32> = shard.map.iter().map(|(_, e)| e.epoch()).collect();
        let cut = epochs.len() / 8;
        if cut == 0 {
            return;
        }
        let (_, threshold, _) = epochs.select_nth_unstable(cut);
        let threshold = *threshold;
        let old: Vec<u64> = shard
            .map
            .iter()
            .filter(|(_, e)| e.epoch() <= threshold)
            .map(|(k, _)| k)
            .collect();
        let mut dropped = 0;
        for key in old {
            if let Some(mut e) = shard.map.remove(key) {
                dropped += e.clear(&mut shard.spill);
            }
        }
        shard.holders -= dropped;
        self.evicted.fetch_add(dropped, Ordering::Relaxed);
    }

    /// For every source holding a prefix of `chain`: the longest consecutive run from the
    /// first block and its tier-weighted score, ordered by source. `out` is cleared first.
    ///
    /// One pass over the chain that stops at the first key no still-matching source holds;
    /// per key, one probe (its home bucket prefetched `PREFETCH_AHEAD` keys earlier, so the
    /// cache misses of consecutive keys overlap) and a check of the (few) still-matching
    /// sources against the entry's holders — no per-position buffers. The read guards of
    /// every shard are taken before a chunk's probes (no atomic read-modify-write between
    /// probes) and released after at most `CHUNK` keys, so a writer waits for at most one
    /// chunk of probes.
    pub fn lookup(&self, chain: &[RouterKey], out: &mut Vec<Match>) {
        out.clear();
        let Some((first, _)) = chain.split_first() else {
            return;
        };
        let epoch = self.now();
        {
            let shard = spin_read(self.shard(*first));
            if let Some(e) = shard.map.get(first.0) {
                e.touch(epoch);
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
        }
        // out[..active] are the sources still matching.
        let mut active = out.len();
        'chain: for keys in chain[1..].chunks(CHUNK) {
            if active == 0 {
                break;
            }
            let guards: [_; SHARDS] = std::array::from_fn(|s| spin_read(&self.shards[s]));
            let probe = Probe {
                shards: std::array::from_fn(|s| &*guards[s]),
                keys,
                epoch,
                homes: std::array::from_fn(|_| std::cell::Cell::new(0)),
            };
            probe.start();
            let mut i = 0;
            while i < keys.len() {
                if active == 1 {
                    // The common case past a shared prefix: one source left.
                    let (n, score) = probe.run_of(i, out[0].source, &self.weights);
                    out[0].blocks += n;
                    out[0].score += score;
                    if i + n < keys.len() {
                        break 'chain;
                    }
                    break;
                }
                let Some((e, spill)) = probe.entry(i) else {
                    break 'chain;
                };
                let mut m = 0;
                while m < active {
                    if let Some(w) = e.best_weight(spill, out[m].source, &self.weights) {
                        out[m].blocks += 1;
                        out[m].score += w;
                        m += 1;
                    } else {
                        active -= 1;
                        out.swap(m, active);
                    }
                }
                if active == 0 {
                    break 'chain;
                }
                i += 1;
            }
        }
        out.sort_unstable_by_key(|m| m.source);
    }

    /// Every (source, tier) holding `key` (tests and diagnostics).
    pub fn holders_of(&self, key: RouterKey) -> Vec<Holder> {
        let shard = self.shard(key).read();
        let mut v = Vec::new();
        if let Some(e) = shard.map.get(key.0) {
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
                s.map.bytes() + s.spill.bytes()
            })
            .sum()
    }
}

/// Write access to every shard, taken once for a run of writes: the writes' cache misses
/// overlap instead of each waiting behind a lock's full barrier, as they would with a lock
/// per write. Every `WRITES_PER_LOCK` writes it releases and re-takes the locks, so a
/// lookup waits for at most that many writes.
pub struct Writer<'a> {
    store: &'a Store,
    guards: Option<[RwLockWriteGuard<'a, Shard>; SHARDS]>,
    writes: usize,
    epoch: u32,
}

impl Writer<'_> {
    fn shard(&mut self, key: RouterKey) -> &mut Shard {
        if self.writes == WRITES_PER_LOCK {
            self.writes = 0;
            self.guards = None;
        }
        self.writes += 1;
        let store = self.store;
        let guards = self.guards.get_or_insert_with(|| store.lock_all());
        &mut guards[key.0 as usize & (SHARDS - 1)]
    }

    /// Starts loading `key`'s bucket (a later write's).
    #[inline]
    fn prefetch(&mut self, key: RouterKey) {
        let store = self.store;
        let guards = self.guards.get_or_insert_with(|| store.lock_all());
        guards[key.0 as usize & (SHARDS - 1)].map.prefetch(key.0);
    }

    /// Calls `f` for each key in order, with the buckets of the keys `WRITE_AHEAD` places
    /// further on prefetched, so consecutive writes' cache misses overlap.
    pub fn each_prefetched(
        &mut self,
        keys: &[RouterKey],
        mut f: impl FnMut(&mut Self, usize, RouterKey),
    ) {
        for &key in keys.iter().take(WRITE_AHEAD) {
            self.prefetch(key);
        }
        for (i, &key) in keys.iter().enumerate() {
            if let Some(&ahead) = keys.get(i + WRITE_AHEAD) {
                self.prefetch(ahead);
            }
            f(self, i, key);
        }
    }

    /// `Store::insert` under this writer's locks.
    pub fn insert(&mut self, key: RouterKey, source: u32, tier: Tier, speculative: bool) -> Upsert {
        let (store, epoch) = (self.store, self.epoch);
        store.insert_in(self.shard(key), key, source, tier, speculative, epoch)
    }

    /// `Store::remove` under this writer's locks.
    pub fn remove(
        &mut self,
        key: RouterKey,
        source: u32,
        tier: Tier,
        only_speculative: bool,
    ) -> bool {
        Store::remove_in(self.shard(key), key, source, tier, only_speculative)
    }
}

/// One chunk of a lookup: the shards, read-locked, and the chunk's keys. Probing key `i`
/// first prefetches the home bucket of key `i + PREFETCH_AHEAD`, remembering it in `homes`.
struct Probe<'a> {
    shards: [&'a Shard; SHARDS],
    keys: &'a [RouterKey],
    epoch: u32,
    homes: [std::cell::Cell<usize>; HOME_RING],
}

/// Home buckets remembered between a key's prefetch and its probe (a power of two above
/// `PREFETCH_AHEAD`).
const HOME_RING: usize = 32;
const _: () = assert!(HOME_RING.is_power_of_two() && HOME_RING > PREFETCH_AHEAD);

impl<'a> Probe<'a> {
    #[inline(always)]
    fn shard(&self, key: RouterKey) -> &'a Shard {
        self.shards[key.0 as usize & (SHARDS - 1)]
    }

    /// Prefetches the first keys' buckets.
    fn start(&self) {
        for i in 0..PREFETCH_AHEAD.min(self.keys.len()) {
            self.prefetch(i);
        }
    }

    #[inline(always)]
    fn prefetch(&self, i: usize) {
        let k = self.keys[i];
        let h = self.shard(k).map.prefetch(k.0);
        self.homes[i & (HOME_RING - 1)].set(h);
    }

    /// Key `i`'s entry (touched for LRU) and its shard's spill lists.
    #[inline(always)]
    fn entry(&self, i: usize) -> Option<(&'a Entry, &'a Spill)> {
        if i + PREFETCH_AHEAD < self.keys.len() {
            self.prefetch(i + PREFETCH_AHEAD);
        }
        let k = self.keys[i];
        let shard = self.shard(k);
        let e = shard
            .map
            .get_at(self.homes[i & (HOME_RING - 1)].get(), k.0)?;
        e.touch(self.epoch);
        Some((e, &shard.spill))
    }

    /// How many keys from `from` on `source` holds in a row, and their summed tier weight.
    #[inline(always)]
    fn run_of(&self, from: usize, source: u32, weights: &[f64; 8]) -> (usize, f64) {
        let mut score = 0.0;
        for i in from..self.keys.len() {
            let Some(w) = self
                .entry(i)
                .and_then(|(e, spill)| e.best_weight(spill, source, weights))
            else {
                return (i - from, score);
            };
            score += w;
        }
        (self.keys.len() - from, score)
    }
}

/// How long lock acquisition spins before it parks the thread. Both sides hold the shard
/// locks for microseconds (a lookup round, a run of writes), less than it takes to park a
/// thread and wake it again on a VM (where a parked vCPU halts and needs an interrupt to
/// resume), so a waiter spins through a typical hold and parks only behind a long one.
const SPIN_BEFORE_PARKING: std::time::Duration = std::time::Duration::from_micros(50);

/// Takes a lock through `try_lock`, spinning for up to `SPIN_BEFORE_PARKING`, then through
/// `lock` (which parks).
fn spin_then<G>(try_lock: impl Fn() -> Option<G>, lock: impl FnOnce() -> G) -> G {
    if let Some(g) = try_lock() {
        return g;
    }
    let start = std::time::Instant::now();
    loop {
        for _ in 0..64 {
            std::hint::spin_loop();
        }
        if let Some(g) = try_lock() {
            return g;
        }
        if start.elapsed() > SPIN_BEFORE_PARKING {
            return lock();
        }
    }
}

fn spin_read(lock: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
    spin_then(|| lock.try_read(), || lock.read())
}

fn spin_write(lock: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
    spin_then(|| lock.try_write(), || lock.write())
}
