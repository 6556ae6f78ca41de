//! Paged KV cache with prefix caching, modelled on vLLM v1's block pool.
//!
//! - Blocks of `block_size` tokens; only full blocks are hashed and reusable.
//! - `hash(block) = sha256(parent_hash or NONE_HASH, token ids, extra keys)`; extra keys are
//!   the LoRA name (every block) and `cache_salt` (only the block starting at token 0).
//! - Blocks are shared by reference count. A block whose count drops to zero goes to the tail
//!   of the free queue but keeps its hash: it is still a cache hit until it is reused. New
//!   blocks are taken from the head (least recently freed), evicting that block's hash.
//! - A request's blocks are freed tail first, so its last blocks are evicted before its first.
//!
//! Every store, eviction and clear is recorded as a [`KvEvent`] for the event publisher.

use std::{collections::HashMap, sync::Arc};

use sha2::{Digest, Sha256};

use super::{
    BlockHash,
    cpu_tier::{BlockMeta, CpuTier},
    free_list::FreeList,
};

/// What, besides token ids, identifies a block's content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraKeys {
    pub lora_name: Option<String>,
    pub cache_salt: Option<String>,
}

impl ExtraKeys {
    /// The extra keys of block `index` as vLLM lists them in events (None when empty).
    pub fn for_block(&self, index: usize) -> Option<Vec<String>> {
        let mut keys = Vec::new();
        if let Some(lora) = &self.lora_name {
            keys.push(lora.clone());
        }
        if index == 0
            && let Some(salt) = &self.cache_salt
        {
            keys.push(salt.clone());
        }
        (!keys.is_empty()).then_some(keys)
    }
}

/// Where a cached block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    Gpu,
    Cpu,
}

impl Medium {
    /// The `medium` string vLLM puts in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "GPU",
            Self::Cpu => "CPU",
        }
    }
}

/// A change to the set of cached blocks, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    Stored {
        hashes: Vec<BlockHash>,
        parent: Option<BlockHash>,
        token_ids: Vec<u32>,
        block_size: usize,
        lora_name: Option<String>,
        extra_keys: Vec<Option<Vec<String>>>,
        medium: Medium,
    },
    Removed {
        hashes: Vec<BlockHash>,
        medium: Medium,
    },
    AllCleared,
}

#[derive(Debug, Clone, Default)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    /// Kept for the CPU tier's events when the block is offloaded.
    meta: Option<Arc<BlockMeta>>,
}

/// The GPU block pool.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    none_hash: BlockHash,
    blocks: Vec<Block>,
    free: FreeList,
    cached: HashMap<BlockHash, u32>,
    cpu: Option<CpuTier>,
    events: Vec<KvEvent>,
}

impl BlockPool {
    /// A pool of `num_blocks` empty blocks. `seed` fixes NONE_HASH (vLLM: PYTHONHASHSEED).
    pub fn new(num_blocks: usize, block_size: usize, seed: u64) -> Self {
        let none_hash: BlockHash = Sha256::digest(format!("warmpath-sim-none-hash-{seed}")).into();
        Self {
            block_size,
            none_hash,
            blocks: vec![Block::default(); num_blocks],
            free: FreeList::with_all(num_blocks),
            cached: HashMap::new(),
            cpu: None,
            events: Vec::new(),
        }
    }

    /// Adds a CPU tier of `blocks` blocks (`--cpu-offload-blocks`).
    pub fn with_cpu_tier(mut self, blocks: usize) -> Self {
        self.cpu = (blocks > 0).then(|| CpuTier::new(blocks));
        self
    }

    /// How many blocks after a GPU hit continue in the CPU tier (not taken).
    pub fn cpu_prefix_len(&self, hashes: &[BlockHash]) -> usize {
        self.cpu.as_ref().map_or(0, |cpu| {
            hashes.iter().take_while(|h| cpu.contains(h)).count()
        })
    }

    /// Takes blocks out of the CPU tier to load them back to the GPU.
    pub fn take_from_cpu(&mut self, hashes: &[BlockHash]) {
        let Some(cpu) = &mut self.cpu else { return };
        let taken: Vec<BlockHash> = hashes
            .iter()
            .filter(|h| cpu.take(h).is_some())
            .copied()
            .collect();
        if !taken.is_empty() {
            self.events.push(KvEvent::Removed {
                hashes: taken,
                medium: Medium::Cpu,
            });
        }
    }

    /// Copies an evicted GPU block into the CPU tier, recording both events.
    fn offload(&mut self, hash: BlockHash, meta: Option<Arc<BlockMeta>>) {
        let (Some(cpu), Some(meta)) = (&mut self.cpu, meta) else {
            return;
        };
        let evicted = cpu.insert(hash, meta.clone());
        if let Some(old) = evicted {
            self.events.push(KvEvent::Removed {
                hashes: vec![old],
                medium: Medium::Cpu,
            });
        }
        self.events.push(KvEvent::Stored {
            hashes: vec![hash],
            parent: meta.parent,
            token_ids: meta.tokens.clone(),
            block_size: self.block_size,
            lora_name: meta.lora_name.clone(),
            extra_keys: vec![meta.extra.clone()],
            medium: Medium::Cpu,
        });
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Fraction of blocks held by running requests (vllm:kv_cache_usage_perc).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - self.free.len() as f64 / self.blocks.len() as f64
    }

    /// Hash of the block after `parent` holding `tokens`, with `extra` keys.
    pub fn hash_block(
        &self,
        parent: Option<&BlockHash>,
        tokens: &[u32],
        extra: Option<&[String]>,
    ) -> BlockHash {
        let mut h = Sha256::new();
        h.update(parent.unwrap_or(&self.none_hash));
        for t in tokens {
            h.update(t.to_le_bytes());
        }
        for key in extra.into_iter().flatten() {
            h.update((key.len() as u32).to_le_bytes());
            h.update(key.as_bytes());
        }
        h.finalize().into()
    }

    /// Hashes of every full block of `tokens`.
    pub fn hash_blocks(&self, tokens: &[u32], extra: &ExtraKeys) -> Vec<BlockHash> {
        let mut out: Vec<BlockHash> = Vec::with_capacity(tokens.len() / self.block_size);
        for (i, chunk) in tokens.chunks_exact(self.block_size).enumerate() {
            let keys = extra.for_block(i);
            let h = self.hash_block(out.last(), chunk, keys.as_deref());
            out.push(h);
        }
        out
    }

    /// Takes a reference on the longest run of cached blocks at the start of `hashes`.
    pub fn touch_prefix(&mut self, hashes: &[BlockHash]) -> Vec<u32> {
        let mut taken = Vec::new();
        for h in hashes {
            let Some(&id) = self.cached.get(h) else { break };
            let block = &mut self.blocks[id as usize];
            if block.ref_cnt == 0 {
                self.free.remove(id);
            }
            block.ref_cnt += 1;
            taken.push(id);
        }
        taken
    }

    /// How many leading blocks of `hashes` are cached, without touching them.
    pub fn cached_prefix_len(&self, hashes: &[BlockHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(*h))
            .count()
    }

    /// Whether touching the cached prefix `hit` and then allocating `new_blocks` fresh ones
    /// can succeed (hit blocks sitting in the free queue leave it when touched).
    pub fn can_admit(&self, hit: &[BlockHash], new_blocks: usize) -> bool {
        let free_hits = hit
            .iter()
            .filter_map(|h| self.cached.get(h))
            .filter(|&&id| self.blocks[id as usize].ref_cnt == 0)
            .count();
        self.free.len() >= free_hits + new_blocks
    }

    /// Allocates `n` fresh blocks, or none if fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if self.free.len() < n {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        let mut evicted = Vec::new();
        for _ in 0..n {
            let id = self.free.pop_front().expect("length checked above");
            let block = &mut self.blocks[id as usize];
            let meta = block.meta.take();
            if let Some(h) = block.hash.take() {
                self.cached.remove(&h);
                evicted.push((h, meta));
            }
            block.ref_cnt = 1;
            out.push(id);
        }
        if !evicted.is_empty() {
            self.events.push(KvEvent::Removed {
                hashes: evicted.iter().map(|(h, _)| *h).collect(),
                medium: Medium::Gpu,
            });
            for (h, meta) in evicted {
                self.offload(h, meta);
            }
        }
        Some(out)
    }

    /// Marks `blocks[i]` as holding `hashes[i]` for the newly full blocks `first..` of a
    /// request and records Stored events, one per consecutive run. A hash already cached in
    /// another block stays uncached here (vLLM keeps such duplicates out of the cache).
    pub fn commit_full_blocks(
        &mut self,
        blocks: &[u32],
        hashes: &[BlockHash],
        first: usize,
        tokens: &[u32],
        extra: &ExtraKeys,
    ) {
        let end = hashes.len().min(blocks.len());
        let mut run_start = first;
        for i in first..end {
            let h = hashes[i];
            let block = &mut self.blocks[blocks[i] as usize];
            if block.hash.is_some() || self.cached.contains_key(&h) {
                self.record_stored(hashes, run_start..i, tokens, extra);
                run_start = i + 1;
                continue;
            }
            block.hash = Some(h);
            block.meta = self.cpu.is_some().then(|| {
                Arc::new(BlockMeta {
                    parent: i.checked_sub(1).map(|p| hashes[p]),
                    tokens: tokens[i * self.block_size..(i + 1) * self.block_size].to_vec(),
                    extra: extra.for_block(i),
                    lora_name: extra.lora_name.clone(),
                })
            });
            self.cached.insert(h, blocks[i]);
        }
        self.record_stored(hashes, run_start..end, tokens, extra);
    }

    fn record_stored(
        &mut self,
        hashes: &[BlockHash],
        run: std::ops::Range<usize>,
        tokens: &[u32],
        extra: &ExtraKeys,
    ) {
        if run.is_empty() {
            return;
        }
        let bs = self.block_size;
        self.events.push(KvEvent::Stored {
            parent: run.start.checked_sub(1).map(|p| hashes[p]),
            hashes: hashes[run.clone()].to_vec(),
            token_ids: tokens[run.start * bs..run.end * bs].to_vec(),
            block_size: bs,
            lora_name: extra.lora_name.clone(),
            extra_keys: run.map(|i| extra.for_block(i)).collect(),
            medium: Medium::Gpu,
        });
    }

    /// Drops a request's references, tail first.
    pub fn free(&mut self, blocks: &[u32]) {
        for &id in blocks.iter().rev() {
            let block = &mut self.blocks[id as usize];
            block.ref_cnt = block.ref_cnt.saturating_sub(1);
            if block.ref_cnt == 0 {
                self.free.push_back(id);
            }
        }
    }

    /// Forgets every cached hash (POST /reset_prefix_cache). Refused while blocks are in use,
    /// as in vLLM.
    pub fn reset(&mut self) -> bool {
        if self.free.len() != self.blocks.len() {
            return false;
        }
        for block in &mut self.blocks {
            block.hash = None;
            block.meta = None;
        }
        self.cached.clear();
        if let Some(cpu) = &mut self.cpu {
            cpu.clear();
        }
        self.events.push(KvEvent::AllCleared);
        true
    }

    /// Events since the last call.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Every cached GPU block hash, sorted (for tests and the `/sim/cache` endpoint).
    pub fn cached_hashes(&self) -> Vec<BlockHash> {
        let mut v: Vec<_> = self.cached.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Every CPU-tier block hash, sorted.
    pub fn cpu_hashes(&self) -> Vec<BlockHash> {
        let mut v: Vec<_> = self.cpu.iter().flat_map(|c| c.hashes().copied()).collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests;
