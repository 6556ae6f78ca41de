//! One source's engine block hash -> router key map, with the tiers the engine holds the
//! block in. It resolves `BlockRemoved` (which names engine hashes only) and makes clearing a
//! source proportional to its blocks.
//!
//! Kept in the index's own table (20-byte slots, three to a cache line), so ingestion can
//! prefetch the slots of a batch's hashes and overlap their cache misses.

use super::{RouterKey, Tier, table::Table};

/// Engine maps never shrink below room for this many blocks.
const FLOOR: usize = 1024;

/// A router key (as two halves: 4-byte alignment keeps the slot at 20 bytes) and a tier
/// bitmask.
#[derive(Debug, Default, Clone, Copy)]
struct Block {
    key: [u32; 2],
    tiers: u8,
}

impl Block {
    fn key(self) -> RouterKey {
        RouterKey(u64::from(self.key[0]) | (u64::from(self.key[1]) << 32))
    }
}

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
    blocks: Table<Block>,
}

impl EngineMap {
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn bytes(&self) -> usize {
        self.blocks.bytes()
    }

    /// Starts loading `hash`'s slot (ingestion prefetches a batch ahead).
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        self.blocks.prefetch(hash);
    }

    /// The router key of an engine block.
    pub fn key(&self, hash: u64) -> Option<RouterKey> {
        self.blocks.get(hash).map(|b| b.key())
    }

    /// Records that the engine holds `hash` (router key `key`) in `tier`.
    pub fn store(&mut self, hash: u64, key: RouterKey, tier: Tier) {
        let b = self.blocks.get_or_insert_with(hash, Block::default);
        b.key = [key.0 as u32, (key.0 >> 32) as u32];
        b.tiers |= tier.bit();
    }

    /// Records that the engine dropped `hash` from `tier`; forgets the hash once no tier
    /// holds it.
    pub fn remove(&mut self, hash: u64, tier: Tier) -> Removal {
        let Some(b) = self.blocks.get_mut(hash) else {
            return Removal::Unknown;
        };
        if b.tiers & tier.bit() == 0 {
            return Removal::Unknown;
        }
        b.tiers &= !tier.bit();
        let (key, left) = (b.key(), b.tiers);
        if left == 0 {
            self.blocks.remove(hash);
        }
        Removal::Removed(key)
    }

    /// Gives memory back once the engine's cache shrank well below its peak.
    pub fn shrink_if_sparse(&mut self) {
        self.blocks.shrink_if_sparse(FLOOR);
    }

    /// Empties the map, returning every (router key, tiers).
    pub fn take_all(&mut self) -> Vec<(RouterKey, u8)> {
        self.blocks
            .take_all()
            .into_iter()
            .map(|(_, b)| (b.key(), b.tiers))
            .collect()
    }

    /// Every (engine hash, router key, tiers).
    pub fn iter(&self) -> impl Iterator<Item = (u64, RouterKey, u8)> + '_ {
        self.blocks.iter().map(|(h, b)| (h, b.key(), b.tiers))
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
