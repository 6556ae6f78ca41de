//! The optional CPU tier (`--cpu-offload-blocks`): a victim cache for GPU blocks.
//!
//! A hashed block evicted from the GPU pool is copied here (event: BlockStored, medium "CPU")
//! instead of being forgotten; when full, the least recently offloaded block is dropped
//! (BlockRemoved, "CPU"). A request whose prefix continues in this tier loads those blocks back
//! to the GPU (BlockRemoved "CPU", then BlockStored "GPU" once recomputed-or-loaded), paying a
//! transfer time per token instead of prefill.

use std::{collections::HashMap, sync::Arc};

use super::{BlockHash, free_list::FreeList};

/// What an event needs to describe a block again after it left the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMeta {
    pub parent: Option<BlockHash>,
    pub tokens: Vec<u32>,
    pub extra: Option<Vec<String>>,
    pub lora_name: Option<String>,
}

#[derive(Debug)]
pub struct CpuTier {
    slots: Vec<Option<(BlockHash, Arc<BlockMeta>)>>,
    index: HashMap<BlockHash, u32>,
    /// Occupied slots, least recently offloaded first.
    lru: FreeList,
    vacant: Vec<u32>,
}

impl CpuTier {
    pub fn new(capacity: usize) -> Self {
        Self {
            slots: vec![None; capacity],
            index: HashMap::new(),
            lru: FreeList::empty(capacity),
            vacant: (0..capacity as u32).rev().collect(),
        }
    }

    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.index.contains_key(hash)
    }

    /// Stores a block; returns the hash it evicted to make room, if any.
    pub fn insert(&mut self, hash: BlockHash, meta: Arc<BlockMeta>) -> Option<BlockHash> {
        if self.slots.is_empty() || self.index.contains_key(&hash) {
            return None;
        }
        let mut evicted = None;
        if self.vacant.is_empty()
            && let Some(slot) = self.lru.pop_front()
            && let Some((old, _)) = self.slots[slot as usize].take()
        {
            self.index.remove(&old);
            self.vacant.push(slot);
            evicted = Some(old);
        }
        let slot = self
            .vacant
            .pop()
            .expect("a slot was freed above when none was vacant");
        self.slots[slot as usize] = Some((hash, meta));
        self.index.insert(hash, slot);
        self.lru.push_back(slot);
        evicted
    }

    /// Removes a block (it is being loaded back to the GPU).
    pub fn take(&mut self, hash: &BlockHash) -> Option<Arc<BlockMeta>> {
        let slot = self.index.remove(hash)?;
        self.lru.remove(slot);
        self.vacant.push(slot);
        self.slots[slot as usize].take().map(|(_, meta)| meta)
    }

    pub fn hashes(&self) -> impl Iterator<Item = &BlockHash> {
        self.index.keys()
    }

    pub fn clear(&mut self) {
        let capacity = self.slots.len();
        *self = Self::new(capacity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Arc<BlockMeta> {
        Arc::new(BlockMeta {
            parent: None,
            tokens: vec![1, 2],
            extra: None,
            lora_name: None,
        })
    }

    #[test]
    fn lru_eviction_and_take() {
        let mut t = CpuTier::new(2);
        assert_eq!(t.insert([1; 32], meta()), None);
        assert_eq!(t.insert([2; 32], meta()), None);
        assert_eq!(t.insert([3; 32], meta()), Some([1; 32]));
        assert!(t.take(&[2; 32]).is_some());
        assert!(!t.contains(&[2; 32]));
        assert_eq!(
            t.insert([4; 32], meta()),
            None,
            "a slot was vacated by take"
        );
        assert_eq!(t.hashes().count(), 2);
        assert_eq!(CpuTier::new(0).insert([1; 32], meta()), None);
    }
}
