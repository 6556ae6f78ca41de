//! Request traces in the Mooncake format: one JSON object a line,
//!
//! ```json
//! {"timestamp": 3000, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3]}
//! ```
//!
//! `timestamp` in milliseconds from the trace's start, `hash_ids` one id per block of the
//! trace's block size (512 in Mooncake's published traces) of prompt tokens, the last partial.
//! A line's text is made of its blocks: each id becomes a run of seeded text of the shrunk
//! block's tokens (the same id, the same text), joined at spaces. `bench run --workload
//! trace` sends such lines at their times; `bench matrix`'s `mooncake:FILE` replays windows of
//! them (`crate::matrix::workloads::trace`).

use std::collections::HashMap;

use serde::Deserialize;
use warmpath_tokenizer::text::TextGen;

use super::text::chars;

/// The most blocks one line may name (Mooncake's longest prompt has 374).
pub const MAX_BLOCKS: usize = 4096;

/// The longest prompt or answer a line may give, in the trace's tokens (Mooncake's longest
/// prompt has 191,378).
pub const MAX_TOKENS: usize = 1 << 24;

/// The most tokens a block may become.
pub const MAX_BLOCK_TOKENS: usize = 4096;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Line {
    /// Milliseconds from the trace's start.
    pub timestamp: f64,
    pub input_length: usize,
    pub output_length: usize,
    pub hash_ids: Vec<u64>,
}

/// How a trace's blocks become text.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Shrink {
    /// Prompt tokens per block in the trace (Mooncake's: 512).
    pub block_size: usize,
    /// Tokens each block becomes.
    pub block_tokens: usize,
}

impl Shrink {
    /// A length in the trace's tokens, shrunk.
    pub fn tokens(&self, trace_tokens: usize) -> usize {
        trace_tokens
            .saturating_mul(self.block_tokens)
            .div_ceil(self.block_size.max(1))
    }

    /// Checked: a block of at least one token becoming 1..=[`MAX_BLOCK_TOKENS`].
    pub fn check(&self) -> Result<(), String> {
        if self.block_size == 0 || !(1..=MAX_BLOCK_TOKENS).contains(&self.block_tokens) {
            return Err(format!(
                "block size {} / block tokens {}: the size must be at least 1, the tokens \
                 1..={MAX_BLOCK_TOKENS}",
                self.block_size, self.block_tokens
            ));
        }
        Ok(())
    }
}

impl Line {
    /// One line of trace text, checked: timestamp finite and non-negative, 1..=[`MAX_BLOCKS`]
    /// ids, lengths at most [`MAX_TOKENS`].
    pub fn parse(text: &str) -> Result<Self, String> {
        let line: Line = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if !(line.timestamp.is_finite() && line.timestamp >= 0.0) {
            return Err(format!("timestamp {}: must be >= 0", line.timestamp));
        }
        if line.hash_ids.is_empty() || line.hash_ids.len() > MAX_BLOCKS {
            return Err(format!("hash_ids: 1..={MAX_BLOCKS} ids expected"));
        }
        if line.input_length > MAX_TOKENS || line.output_length > MAX_TOKENS {
            return Err(format!(
                "input_length {} / output_length {}: at most {MAX_TOKENS} each",
                line.input_length, line.output_length
            ));
        }
        Ok(line)
    }

    /// [`Line::parse`], and its ids one per block of `shrink.block_size` tokens.
    pub fn read(text: &str, shrink: Shrink) -> Result<Self, String> {
        let line = Self::parse(text)?;
        line.covers(shrink.block_size)?;
        Ok(line)
    }

    /// Whether the ids cover the prompt in blocks of `block_size` tokens, the last partial.
    pub fn covers(&self, block_size: usize) -> Result<(), String> {
        if self.input_length.div_ceil(block_size.max(1)) == self.hash_ids.len() {
            return Ok(());
        }
        Err(format!(
            "{} ids for {} prompt tokens, not one per block of {block_size} (is the block size \
             the trace's?)",
            self.hash_ids.len(),
            self.input_length
        ))
    }

    /// The prompt's and the answer's tokens, shrunk (each at least one).
    pub fn shrunk(&self, shrink: Shrink) -> (usize, usize) {
        (
            shrink.tokens(self.input_length).max(1),
            shrink.tokens(self.output_length).max(1),
        )
    }

    /// The prompt: each block's text (`cache`: by id and length) joined at a space.
    pub fn prompt(&self, shrink: Shrink, seed: u64, cache: &mut Texts) -> String {
        self.prompt_and_ends(shrink, seed, cache).0
    }

    /// The prompt and the byte where each of its blocks ends.
    pub fn prompt_and_ends(
        &self,
        shrink: Shrink,
        seed: u64,
        cache: &mut Texts,
    ) -> (String, Vec<usize>) {
        let last = self.hash_ids.len().saturating_sub(1);
        let tail = self.input_length.saturating_sub(last * shrink.block_size);
        let mut prompt = String::new();
        let mut ends = Vec::with_capacity(self.hash_ids.len());
        for (k, h) in self.hash_ids.iter().enumerate() {
            let tokens = shrink.tokens(if k == last { tail } else { shrink.block_size });
            let text = cache.entry((*h, tokens)).or_insert_with(|| {
                block_text(seed ^ h.wrapping_mul(0x9e37_79b9_7f4a_7c15), tokens)
            });
            if k > 0 {
                prompt.push(' ');
            }
            prompt.push_str(text);
            ends.push(prompt.len());
        }
        (prompt, ends)
    }
}

/// Block texts by id and length in tokens.
pub type Texts = HashMap<(u64, usize), String>;

/// About `tokens` tokens of seeded text: whole sentences, cut at the last space within the
/// characters `tokens` takes (a block shorter than a sentence would otherwise grow to one).
pub fn block_text(seed: u64, tokens: usize) -> String {
    let n = chars(tokens.max(1)).max(1);
    let mut text = TextGen::new(seed).text(n);
    if text.len() > n
        && let Some(cut) = text.get(..n).and_then(|head| head.rfind(' '))
    {
        text.truncate(cut);
    }
    text
}
