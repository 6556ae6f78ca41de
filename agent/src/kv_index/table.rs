//! An open-addressing hash table keyed by already-random `u64`s, built for the index's
//! lookups: a key's home is a pure function of the key and the capacity, so a lookup can
//! prefetch the homes of keys it will probe next and overlap their cache misses.
//!
//! - Slots sit in 64-byte buckets of `BUCKET` (three 20-byte index slots fill one cache
//!   line), and a key hashes to a bucket: a probe that ends in its home bucket, which is
//!   most of them, touches exactly one cache line, and compares the bucket's keys without
//!   a branch per slot.
//! - Otherwise it is linear probing over the slot sequence, starting at the home bucket's
//!   first slot, with keys kept in order of home (Robin Hood), without wrap-around:
//!   `TAIL_BUCKETS` past the last home bucket take the clusters that run off the end (the
//!   table grows if one would run further). Deletion shifts the rest of the cluster back
//!   (no tombstones), so probe lengths depend only on the load.
//! - The number of home buckets is any integer (home = the high half of `mix(key) *
//!   homes`), so the table grows by a quarter instead of doubling and stays between 0.53
//!   and 0.67 full.
//! - Key 0 marks an empty slot; a value stored under key 0 lives beside the slots.
//! - Values are `Default`: an empty slot holds the default, so no slot is uninitialised.

/// Grow when more than `MAX_LOAD_NUM / MAX_LOAD_DEN` of the home slots are used...
const MAX_LOAD_NUM: usize = 2;
const MAX_LOAD_DEN: usize = 3;
/// ... to `GROWN_LOAD_NUM / GROWN_LOAD_DEN` (a quarter more slots): the load stays within
/// 0.53-0.67, so a 20-byte slot in a 64-byte bucket of three costs 32-40 bytes per entry.
/// (At up to 3/4 full an insert and a delete cost ~87 ns against ~59 ns here: Robin Hood
/// insertion and backward-shift deletion move the rest of a cluster, and clusters grow
/// fast with the load.)
const GROWN_LOAD_NUM: usize = 8;
const GROWN_LOAD_DEN: usize = 15;
/// Slots per bucket.
const BUCKET: usize = 3;
/// Slot positions are `bucket * STRIDE + offset`: a power of two, so finding a position's
/// bucket is a shift (positions with offset `BUCKET..STRIDE` are never used).
const STRIDE: usize = 4;
/// Smallest non-empty number of home buckets.
const MIN_HOMES: usize = 4;
/// Buckets past the last home bucket.
const TAIL_BUCKETS: usize = 8;

#[derive(Debug, Default)]
#[repr(C)]
struct Slot<V> {
    /// The key as two halves, so a slot of a 4-byte-aligned value has no padding.
    lo: u32,
    hi: u32,
    value: V,
}

impl<V> Slot<V> {
    #[inline]
    fn key(&self) -> u64 {
        u64::from(self.lo) | (u64::from(self.hi) << 32)
    }

    #[inline]
    fn set_key(&mut self, key: u64) {
        self.lo = key as u32;
        self.hi = (key >> 32) as u32;
    }
}

/// One cache line of slots.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct Bucket<V> {
    slots: [Slot<V>; BUCKET],
}

/// A map from `u64` keys to `V`. Keys are mixed once more before use, so even sequential
/// keys spread.
#[derive(Debug)]
pub struct Table<V> {
    /// `homes + TAIL_BUCKETS` buckets, or none.
    buckets: Box<[Bucket<V>]>,
    /// Home buckets: keys hash into `0..homes`.
    homes: usize,
    len: usize,
    zero: Option<V>,
}

impl<V: Default> Default for Table<V> {
    fn default() -> Self {
        Self {
            buckets: Box::default(),
            homes: 0,
            len: 0,
            zero: None,
        }
    }
}

#[inline]
fn mix(key: u64) -> u64 {
    (key ^ (key >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl<V: Default> Table<V> {
    /// Entries held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes allocated (for memory accounting).
    pub fn bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket<V>>()
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        ((u128::from(mix(key)) * self.homes as u128) >> 64) as usize
    }

    /// One past the last slot position.
    fn end(&self) -> usize {
        self.buckets.len() * STRIDE
    }

    #[inline]
    fn next(p: usize) -> usize {
        if p % STRIDE == BUCKET - 1 {
            p + 1 + STRIDE - BUCKET
        } else {
            p + 1
        }
    }

    #[inline]
    fn prev(p: usize) -> usize {
        if p.is_multiple_of(STRIDE) {
            p - 1 - (STRIDE - BUCKET)
        } else {
            p - 1
        }
    }

    #[inline]
    fn slot(&self, i: usize) -> &Slot<V> {
        &self.buckets[i / STRIDE].slots[i % STRIDE]
    }

    #[inline]
    fn slot_mut(&mut self, i: usize) -> &mut Slot<V> {
        &mut self.buckets[i / STRIDE].slots[i % STRIDE]
    }

    /// Asks the CPU to start loading `key`'s home bucket and the one after it (where a
    /// displaced key sits; a hint: never faults, never waits). Returns the home bucket for
    /// `get_at`.
    #[inline(always)]
    pub fn prefetch(&self, key: u64) -> usize {
        if self.homes == 0 {
            return 0;
        }
        let h = self.home(key);
        prefetch_read(&self.buckets[h]);
        prefetch_read(&self.buckets[h + 1]);
        h
    }

    /// The slot holding `key` (non-zero).
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        if self.homes == 0 {
            return None;
        }
        let h = self.home(key);
        match self.find_in_bucket(h, key) {
            Ok(j) => Some(h * STRIDE + j),
            Err(absent) => (!absent).then(|| self.find_past(h, key)).flatten(),
        }
    }

    /// Compares the bucket's keys without a branch per slot: `Ok(position)` of `key`, or
    /// `Err(absent)`: `true` if the bucket has an empty slot (so `key` is nowhere),
    /// `false` if the search must go on past it.
    #[inline]
    fn find_in_bucket(&self, h: usize, key: u64) -> Result<usize, bool> {
        let (hits, empties) = self.masks(h, key);
        if hits != 0 {
            Ok(hits.trailing_zeros() as usize)
        } else {
            Err(empties != 0)
        }
    }

    /// Bit masks of bucket `h`'s slots holding `key` and of its empty slots.
    #[inline(always)]
    fn masks(&self, h: usize, key: u64) -> (u32, u32) {
        self.buckets[h]
            .slots
            .iter()
            .enumerate()
            .fold((0u32, 0u32), |(m, e), (i, s)| {
                (
                    m | (u32::from(s.key() == key) << i),
                    e | (u32::from(s.key() == 0) << i),
                )
            })
    }

    /// The cluster runs past home bucket `h`: search the following buckets, up to `key` or
    /// the cluster's end.
    fn find_past(&self, h: usize, key: u64) -> Option<usize> {
        for b in h + 1..self.buckets.len() {
            match self.find_in_bucket(b, key) {
                Ok(j) => return Some(b * STRIDE + j),
                Err(true) => return None,
                Err(false) => {}
            }
        }
        None
    }

    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<&V> {
        if self.homes == 0 {
            return if key == 0 { self.zero.as_ref() } else { None };
        }
        self.get_at(self.home(key), key)
    }

    /// `get` with `key`'s home bucket as `prefetch` returned it (on this table, with no
    /// write in between: a write may resize the table and move every home).
    #[inline(always)]
    pub fn get_at(&self, h: usize, key: u64) -> Option<&V> {
        if key == 0 {
            return self.zero.as_ref();
        }
        if self.homes == 0 {
            return None;
        }
        match self.find_in_bucket(h, key) {
            Ok(j) => Some(&self.buckets[h].slots[j].value),
            Err(true) => None,
            Err(false) => self.find_past(h, key).map(|i| &self.slot(i).value),
        }
    }

    pub fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        if key == 0 {
            return self.zero.as_mut();
        }
        self.find(key).map(|i| &mut self.slot_mut(i).value)
    }

    /// The value under `key`, inserted with `make` first if absent.
    pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> V) -> &mut V {
        if key == 0 {
            return self.zero.get_or_insert_with(make);
        }
        if (self.len + 1) * MAX_LOAD_DEN > self.homes * BUCKET * MAX_LOAD_NUM {
            self.resize(Self::homes_for(self.len + 1));
        }
        let (i, new) = loop {
            match self.place(key) {
                Some(placed) => break placed,
                // The cluster runs past the tail: spread the keys over more buckets.
                None => self.resize(self.homes + self.homes / 2),
            }
        };
        if new {
            self.len += 1;
            self.slot_mut(i).value = make();
        }
        &mut self.slot_mut(i).value
    }

    /// The slot holding `key`, or a slot made for it (key set, value default; `true`);
    /// `None`, with nothing changed, if the cluster would run past the tail.
    ///
    /// Keys sit in order of their home bucket (Robin Hood order): a new key goes before the
    /// first key whose home comes later, and the rest of the cluster moves one slot on. So
    /// the keys displaced from their home bucket are spread evenly instead of being the
    /// ones inserted last (which would make recently cached prefixes the slowest to look
    /// up).
    fn place(&mut self, key: u64) -> Option<(usize, bool)> {
        let h = self.home(key);
        // The common case: the home bucket holds the key or has room. Its keys all have
        // homes at or before it and fill it from the front, so the key goes at its first
        // empty slot, after all of them.
        let (hits, empties) = self.masks(h, key);
        if hits != 0 {
            return Some((h * STRIDE + hits.trailing_zeros() as usize, false));
        }
        if empties != 0 {
            let i = h * STRIDE + empties.trailing_zeros() as usize;
            self.slot_mut(i).set_key(key);
            return Some((i, true));
        }
        let n = self.end();
        let mut i = (h + 1) * STRIDE;
        while i < n {
            let k = self.slot(i).key();
            if k == key {
                return Some((i, false));
            }
            if k == 0 || self.home(k) > h {
                break;
            }
            i = Self::next(i);
        }
        let mut end = i;
        while end < n && self.slot(end).key() != 0 {
            end = Self::next(end);
        }
        if end >= n {
            return None;
        }
        while end != i {
            let from = Self::prev(end);
            let moved = std::mem::take(self.slot_mut(from));
            *self.slot_mut(end) = moved;
            end = from;
        }
        self.slot_mut(i).set_key(key);
        Some((i, true))
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: u64) -> Option<V> {
        if key == 0 {
            return self.zero.take();
        }
        let mut hole = self.find(key)?;
        let value = std::mem::take(&mut self.slot_mut(hole).value);
        self.slot_mut(hole).set_key(0);
        self.len -= 1;
        // Backward shift: pull the following keys one slot back while the hole lies at or
        // after their home bucket's first slot (the keys keep their order of home).
        let mut j = Self::next(hole);
        while j < self.end() {
            let k = self.slot(j).key();
            if k == 0 || self.home(k) * STRIDE > hole {
                break;
            }
            let moved = std::mem::take(self.slot_mut(j));
            *self.slot_mut(hole) = moved;
            hole = j;
            j = Self::next(j);
        }
        Some(value)
    }

    /// Every (key, value), in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.zero.iter().map(|v| (0, v)).chain(
            self.buckets
                .iter()
                .flat_map(|b| b.slots.iter())
                .filter(|s| s.key() != 0)
                .map(|s| (s.key(), &s.value)),
        )
    }

    /// Removes every entry, returning them.
    #[cfg(test)]
    pub fn take_all(&mut self) -> Vec<(u64, V)> {
        let mut out = Vec::with_capacity(self.len());
        if let Some(v) = self.zero.take() {
            out.push((0, v));
        }
        for b in std::mem::take(&mut self.buckets).into_vec() {
            for s in b.slots {
                if s.key() != 0 {
                    out.push((s.key(), s.value));
                }
            }
        }
        self.homes = 0;
        self.len = 0;
        out
    }

    /// Home buckets that hold `len` keys at the load right after growing.
    fn homes_for(len: usize) -> usize {
        (len * GROWN_LOAD_DEN).div_ceil(GROWN_LOAD_NUM * BUCKET)
    }

    /// Gives memory back once the table is under a quarter full (never below room for
    /// `floor` keys), back to the load right after growing.
    pub fn shrink_if_sparse(&mut self, floor: usize) {
        if self.len * 4 < self.homes * BUCKET {
            let want = Self::homes_for(self.len.max(floor)).max(MIN_HOMES);
            if want < self.homes {
                self.resize(want);
            }
        }
    }

    /// Rehashes into `homes` home buckets (at least enough for `len` at the maximum load);
    /// more if a cluster would run past the tail.
    fn resize(&mut self, homes: usize) {
        let mut homes = homes
            .max(self.len * MAX_LOAD_DEN / (MAX_LOAD_NUM * BUCKET) + 1)
            .max(MIN_HOMES);
        let old: Vec<Slot<V>> = std::mem::take(&mut self.buckets)
            .into_vec()
            .into_iter()
            .flat_map(|b| b.slots)
            .filter(|s| s.key() != 0)
            .collect();
        let mut at = vec![0; old.len()];
        loop {
            self.homes = homes;
            // Placing keys in order of home keeps the Robin Hood order.
            let mut by_home: Vec<(usize, usize)> = old
                .iter()
                .enumerate()
                .map(|(i, s)| (self.home(s.key()), i))
                .collect();
            by_home.sort_unstable();
            let end = (homes + TAIL_BUCKETS) * STRIDE;
            let mut next = 0;
            let fits = by_home.into_iter().all(|(h, i)| {
                at[i] = next.max(h * STRIDE);
                next = Self::next(at[i]);
                at[i] < end
            });
            if fits {
                break;
            }
            homes += homes / 2;
        }
        self.buckets = std::iter::repeat_with(Bucket::default)
            .take(homes + TAIL_BUCKETS)
            .collect();
        for (s, i) in old.into_iter().zip(at) {
            *self.slot_mut(i) = s;
        }
    }
}

/// A prefetch hint for the cache line holding `r`.
#[inline]
#[allow(unsafe_code)]
fn prefetch_read<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` only hints the cache; it never dereferences in a way that can
    // fault or that Rust's memory model sees, and `r` is a valid reference anyway. The
    // `unsafe` is only there because the intrinsic carries `#[target_feature(enable =
    // "sse")]`, which every x86_64 target has.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(r).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        Shrink,
    }

    fn op(keys: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..keys, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => (0..keys).prop_map(Op::Remove),
            1 => Just(Op::Shrink),
        ]
    }

    proptest! {
        /// Same answers as std's HashMap under random inserts, removals and shrinks (small
        /// key ranges, so clusters, wrap-around and backward shifts happen often).
        #[test]
        fn behaves_like_a_hashmap(ops in prop::collection::vec(op(48), 1..400)) {
            let mut t: Table<u32> = Table::default();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        *t.get_or_insert_with(k, || 0) = v;
                        model.insert(k, v);
                    }
                    Op::Remove(k) => prop_assert_eq!(t.remove(k), model.remove(&k)),
                    Op::Shrink => t.shrink_if_sparse(0),
                }
                prop_assert_eq!(t.len(), model.len());
                for k in 0..48 {
                    prop_assert_eq!(t.get(k), model.get(&k));
                }
            }
            let mut all = t.take_all();
            all.sort_unstable();
            let mut want: Vec<_> = model.into_iter().collect();
            want.sort_unstable();
            prop_assert_eq!(all, want);
            prop_assert!(t.is_empty());
        }
    }

    #[test]
    fn stays_between_053_and_067_full_while_growing() {
        let mut t: Table<u64> = Table::default();
        for k in 1..=100_000u64 {
            *t.get_or_insert_with(k.wrapping_mul(0x2545_f491_4f6c_dd1d), || 0) = k;
            let load = t.len as f64 / (t.homes * BUCKET) as f64;
            assert!(load <= 0.67, "load {load} at {k}");
            if k > 64 {
                assert!(load >= 0.52, "load {load} at {k}");
            }
        }
        for k in 1..=100_000u64 {
            assert_eq!(t.get(k.wrapping_mul(0x2545_f491_4f6c_dd1d)), Some(&k));
        }
        for k in 1..=99_000u64 {
            assert_eq!(t.remove(k.wrapping_mul(0x2545_f491_4f6c_dd1d)), Some(k));
        }
        t.shrink_if_sparse(0);
        assert!(
            t.homes * BUCKET <= 4_000,
            "{} home buckets for 1,000 keys",
            t.homes
        );
        for k in 99_001..=100_000u64 {
            assert_eq!(t.get(k.wrapping_mul(0x2545_f491_4f6c_dd1d)), Some(&k));
        }
    }
}
