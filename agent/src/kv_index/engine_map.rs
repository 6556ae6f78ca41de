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
    /// engine hash -> (router key, tier bitmask).
    blocks: FastMap<(u64, u8)>,
}

impl EngineMap {
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Bytes allocated: hashbrown's buckets plus one control byte each.
    pub fn bytes(&self) -> usize {
        // capacity() is 7/8 of the buckets once the table has grown.
        let buckets = if self.blocks.capacity() == 0 {
            0
        } else {
            (self.blocks.capacity() * 8 / 7).next_power_of_two()
        };
        buckets * (std::mem::size_of::<(u64, (u64, u8))>() + 1)
    }

    /// The router key of an engine block.
    pub fn key(&self, hash: u64) -> Option<RouterKey> {
        self.blocks.get(&hash).map(|&(k, _)| RouterKey(k))
    }

    /// Records that the engine holds `hash` (router key `key`) in `tier`.
    pub fn store(&mut self, hash: u64, key: RouterKey, tier: Tier) {
        let b = self.blocks.entry(hash).or_insert((key.0, 0));
        b.0 = key.0;
        b.1 |= tier.bit();
    }

    /// Records that the engine dropped `hash` from `tier`; forgets the hash once no tier
    /// holds it.
    pub fn remove(&mut self, hash: u64, tier: Tier) -> Removal {
        // One probe: update or remove in place.
        let std::collections::hash_map::Entry::Occupied(mut slot) = self.blocks.entry(hash) else {
            return Removal::Unknown;
        };
        let (key, tiers) = *slot.get();
        if tiers & tier.bit() == 0 {
            return Removal::Unknown;
        }
        if tiers == tier.bit() {
            slot.remove();
        } else {
            slot.get_mut().1 &= !tier.bit();
        }
        Removal::Removed(RouterKey(key))
    }

    /// Gives memory back once the engine's cache shrank well below its peak (a quarter
    /// full), keeping twice its entries so it can grow again without rehashing at once.
    pub fn shrink_if_sparse(&mut self) {
        if self.blocks.capacity() > 4 * self.blocks.len().max(FLOOR) {
            self.blocks.shrink_to(self.blocks.len() * 2);
        }
    }

    /// Empties the map, returning every (router key, tiers).
    pub fn take_all(&mut self) -> Vec<(RouterKey, u8)> {
        std::mem::take(&mut self.blocks)
            .into_values()
            .map(|(k, t)| (RouterKey(k), t))
            .collect()
    }

    /// Every (engine hash, router key, tiers).
    pub fn iter(&self) -> impl Iterator<Item = (u64, RouterKey, u8)> + '_ {
        self.blocks.iter().map(|(h, &(k, t))| (*h, RouterKey(k), t))
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
