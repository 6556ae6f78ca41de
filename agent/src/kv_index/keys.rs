//! Router keys: warmpath's own chained 64-bit block hashes.
//!
//! `key(block) = xxh3_64(seed; parent key | token ids | extra keys)`, over full blocks only.
//! The same function runs on a BlockStored event's `token_ids` at ingestion and on a request's
//! tokens at routing time, so warmpath never depends on vLLM's hash algorithm, its seed
//! (PYTHONHASHSEED) or its int/bytes encoding. What must agree with the engine is the block
//! size and the tokenization.
//!
//! Extra keys are what vLLM folds into a block's hash besides tokens: the LoRA name (every
//! block), multimodal ids, and `cache_salt` (only the block starting at token 0). They are
//! hashed as length-prefixed strings in the engine's order.

use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};

/// A block's identity in warmpath's key space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouterKey(pub u64);

/// Seed of the key space; changing it invalidates every index (never persisted, so safe).
const KEY_SEED: u64 = 0x7761_726d_7061_7468; // "warmpath"

/// What, besides tokens, a request's blocks are keyed by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestExtras {
    pub lora_name: Option<String>,
    pub cache_salt: Option<String>,
}

impl RequestExtras {
    /// The extra keys of block `index`, in vLLM's order (LoRA, then salt on block 0).
    pub fn for_block(&self, index: usize) -> Vec<&str> {
        let mut keys = Vec::new();
        if let Some(l) = &self.lora_name {
            keys.push(l.as_str());
        }
        if index == 0
            && let Some(s) = &self.cache_salt
        {
            keys.push(s.as_str());
        }
        keys
    }
}

/// Key of one block given its parent's key, its tokens and its extra keys.
pub fn block_key<'a>(
    parent: Option<RouterKey>,
    tokens: &[u32],
    extra: impl IntoIterator<Item = &'a str>,
) -> RouterKey {
    let mut extra = extra.into_iter().peekable();
    // Common case (no extra keys, blocks up to 64 tokens): one-shot hash of a stack buffer.
    if extra.peek().is_none() && tokens.len() <= 64 {
        let mut buf = [0u8; 9 + 256];
        write_header(&mut buf, parent);
        for (i, t) in tokens.iter().enumerate() {
            buf[9 + i * 4..13 + i * 4].copy_from_slice(&t.to_le_bytes());
        }
        return RouterKey(xxh3_64_with_seed(&buf[..9 + tokens.len() * 4], KEY_SEED));
    }
    let mut h = Xxh3::with_seed(KEY_SEED);
    let mut header = [0u8; 9];
    write_header(&mut header, parent);
    h.update(&header);
    // Tokens as little-endian u32s, hashed through a stack buffer (no allocation).
    let mut buf = [0u8; 256];
    for chunk in tokens.chunks(64) {
        for (i, t) in chunk.iter().enumerate() {
            buf[i * 4..i * 4 + 4].copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 4]);
    }
    for key in extra {
        h.update(&(key.len() as u32).to_le_bytes());
        h.update(key.as_bytes());
    }
    RouterKey(h.digest())
}

/// Parent key (or 0) and a presence byte: the same 9 bytes whichever path hashes them.
fn write_header(buf: &mut [u8], parent: Option<RouterKey>) {
    buf[..8].copy_from_slice(
        &parent
            .map_or(0, |p| p.0 ^ 0x9e37_79b9_7f4a_7c15)
            .to_le_bytes(),
    );
    buf[8] = u8::from(parent.is_some());
}

/// Keys of every full block of `tokens` (a request's key chain).
pub fn request_keys(tokens: &[u32], block_size: usize, extras: &RequestExtras) -> Vec<RouterKey> {
    let mut keys: Vec<RouterKey> = Vec::with_capacity(tokens.len() / block_size.max(1));
    if block_size == 0 {
        return keys;
    }
    for (i, block) in tokens.chunks_exact(block_size).enumerate() {
        let k = block_key(keys.last().copied(), block, extras.for_block(i));
        keys.push(k);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_everything_before_and_on_extras() {
        let t: Vec<u32> = (0..64).collect();
        let plain = request_keys(&t, 16, &RequestExtras::default());
        assert_eq!(plain.len(), 4);
        let mut t2 = t.clone();
        t2[3] = 999;
        let changed = request_keys(&t2, 16, &RequestExtras::default());
        assert!(
            plain.iter().zip(&changed).all(|(a, b)| a != b),
            "a change in block 0 changes every key"
        );
        let salted = request_keys(
            &t,
            16,
            &RequestExtras {
                cache_salt: Some("s".into()),
                ..Default::default()
            },
        );
        assert!(plain.iter().zip(&salted).all(|(a, b)| a != b));
        let lora = request_keys(
            &t,
            16,
            &RequestExtras {
                lora_name: Some("l".into()),
                ..Default::default()
            },
        );
        assert!(plain.iter().zip(&lora).all(|(a, b)| a != b));
        assert_eq!(
            request_keys(&t[..15], 16, &RequestExtras::default()),
            vec![],
            "partial blocks have no key"
        );
        // Same inputs, same key; parent None differs from parent 0.
        assert_eq!(block_key(None, &t[..16], []), plain[0]);
        // The one-shot and streaming paths agree (70 tokens takes the streaming path).
        let long: Vec<u32> = (0..70).collect();
        let mut h = Xxh3::with_seed(KEY_SEED);
        let mut header = [0u8; 9];
        write_header(&mut header, None);
        h.update(&header);
        for t in &long {
            h.update(&t.to_le_bytes());
        }
        assert_eq!(block_key(None, &long, []).0, h.digest());
        assert_eq!(
            block_key(None, &long[..64], []).0,
            xxh3_64_with_seed(
                &[
                    &header[..],
                    &long[..64]
                        .iter()
                        .flat_map(|t| t.to_le_bytes())
                        .collect::<Vec<_>>()
                ]
                .concat(),
                KEY_SEED
            )
        );
        assert_ne!(block_key(Some(RouterKey(0)), &t[..16], []), plain[0]);
    }
}
