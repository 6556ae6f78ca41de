//! One source's engine block hash -> router key map, with the tiers the engine holds the
//! block in. It resolves `BlockRemoved` (which names engine hashes only) and makes clearing a
//! source proportional to its blocks.
//!
//! A hashbrown table, not the index's own: this map is only written and probed by
//! ingestion, and hashbrown's inserts and deletes (no cluster to shift) cost a third of the
//! Robin Hood table's (30 ns against 87 ns per insert + delete at 100k entries), while their
//! independent probes overlap without prefetching.

use super::{RouterKey, Tier, store::FastMap};

/// Engine maps never shrink below room for this many blocks.
const FLOOR: usize = 1024;

/// What removing a (hash, tier) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The block's router key; the engine may still hold it in other tiers.
    Removed(RouterKey),
    /// The engine never stored this hash in this tier (or we never saw it).
    Unknown,
}

#[derive(Debug, Default)]
pub struct EngineMap {
    /// engine hash -> router key.
    keys: FastMap<u64>,
    /// engine hash -> tier bitmask, only for blocks held anywhere but (only) on GPU: most
    /// engines never offload, and keeping the tiers out of `keys` makes its buckets 16
    /// bytes instead of 24.
    tiers: FastMap<u8>,
}

const GPU_ONLY: u8 = 1 << (Tier::Gpu as u8);

/// Bytes of a hashbrown map's buckets plus their control bytes.
fn map_bytes<V>(map: &FastMap<V>) -> usize {
    // capacity() is 7/8 of the buckets once a table has grown.
    let buckets = if map.capacity() == 0 {
        0
    } else {
        (map.capacity() * 8 / 7).next_power_of_two()
    };
    buckets * (std::mem::size_of::<(u64, V)>() + 1)
}

impl EngineMap {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn bytes(&self) -> usize {
        map_bytes(&self.keys) + map_bytes(&self.tiers)
    }

    fn tiers_of(&self, hash: u64) -> u8 {
        if self.tiers.is_empty() {
            return GPU_ONLY;
        }
        self.tiers.get(&hash).copied().unwrap_or(GPU_ONLY)
    }

    fn set_tiers(&mut self, hash: u64, tiers: u8) {
        if tiers == GPU_ONLY {
            if !self.tiers.is_empty() {
                self.tiers.remove(&hash);
            }
        } else {
            self.tiers.insert(hash, tiers);
        }
    }

    /// The router key of an engine block.
    pub fn key(&self, hash: u64) -> Option<RouterKey> {
        self.keys.get(&hash).map(|&k| RouterKey(k))
    }

    /// Records that the engine holds `hash` (router key `key`) in `tier`.
    pub fn store(&mut self, hash: u64, key: RouterKey, tier: Tier) {
        let tiers = match self.keys.entry(hash) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(key.0);
                tier.bit()
            }
            std::collections::hash_map::Entry::Occupied(mut o) => {
                o.insert(key.0);
                self.tiers_of(hash) | tier.bit()
            }
        };
        self.set_tiers(hash, tiers);
    }

    /// Records that the engine dropped `hash` from `tier`; forgets the hash once no tier
    /// holds it.
    pub fn remove(&mut self, hash: u64, tier: Tier) -> Removal {
        let tiers = self.tiers_of(hash);
        if tiers & tier.bit() == 0 {
            return Removal::Unknown;
        }
        // One probe of `keys`: read, and remove in place when no tier is left.
        let std::collections::hash_map::Entry::Occupied(slot) = self.keys.entry(hash) else {
            return Removal::Unknown;
        };
        let key = RouterKey(*slot.get());
        let left = tiers & !tier.bit();
        if left == 0 {
            slot.remove();
            if !self.tiers.is_empty() {
                self.tiers.remove(&hash);
            }
        } else {
            self.set_tiers(hash, left);
        }
        Removal::Removed(key)
    }

    /// Gives memory back once the engine's cache shrank well below its peak (a quarter
    /// full), keeping twice its entries so it can grow again without rehashing at once.
    pub fn shrink_if_sparse(&mut self) {
        if self.keys.capacity() > 4 * self.keys.len().max(FLOOR) {
            self.keys.shrink_to(self.keys.len() * 2);
            self.tiers.shrink_to(self.tiers.len() * 2);
        }
    }

    /// Empties the map, returning every (router key, tiers).
    pub fn take_all(&mut self) -> Vec<(RouterKey, u8)> {
        let tiers = std::mem::take(&mut self.tiers);
        std::mem::take(&mut self.keys)
            .into_iter()
            .map(|(h, k)| (RouterKey(k), tiers.get(&h).copied().unwrap_or(GPU_ONLY)))
            .collect()
    }

    /// Every (engine hash, router key, tiers).
    pub fn iter(&self) -> impl Iterator<Item = (u64, RouterKey, u8)> + '_ {
        self.keys
            .iter()
            .map(|(h, &k)| (*h, RouterKey(k), self.tiers_of(*h)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_are_tracked_per_hash_and_the_last_removal_forgets_it() {
        let mut m = EngineMap::default();
        m.store(7, RouterKey(u64::MAX - 1), Tier::Gpu);
        m.store(7, RouterKey(u64::MAX - 1), Tier::Cpu);
        assert_eq!(m.key(7), Some(RouterKey(u64::MAX - 1)));
        assert_eq!(m.remove(7, Tier::Disk), Removal::Unknown);
        assert_eq!(
            m.remove(7, Tier::Gpu),
            Removal::Removed(RouterKey(u64::MAX - 1))
        );
        assert_eq!(m.remove(7, Tier::Gpu), Removal::Unknown);
        assert_eq!(m.len(), 1, "still held on CPU");
        assert_eq!(
            m.remove(7, Tier::Cpu),
            Removal::Removed(RouterKey(u64::MAX - 1))
        );
        assert_eq!(m.len(), 0);
        assert_eq!(m.remove(8, Tier::Gpu), Removal::Unknown);
    }
}
