//! One request inside the engine: its tokens, blocks, progress and where its output goes.

use tokio::sync::mpsc::UnboundedSender;

use super::{BlockHash, kv_cache::ExtraKeys};

/// Why generation stopped (OpenAI `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, or a stop string (the API layer decides the latter).
    Stop,
    /// `max_tokens` or the context limit.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// What the engine tells the request's HTTP handler, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Prefill finished; `cached_tokens` prompt tokens came from the prefix cache.
    Prefilled { cached_tokens: usize },
    /// One generated token.
    Token(u32),
    /// The last message.
    Finished(FinishReason),
    /// The engine gave up on the request (fault injection, engine death).
    Failed(String),
}

/// A request as submitted to the engine.
#[derive(Debug)]
pub struct NewRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// EOS cannot end the request before this many tokens (`min_tokens`).
    pub min_tokens: usize,
    pub ignore_eos: bool,
    pub extra: ExtraKeys,
    pub sink: UnboundedSender<Output>,
}

/// Engine-side state of one request.
#[derive(Debug)]
pub struct Sequence {
    pub prompt_len: usize,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub max_tokens: usize,
    /// Where generation ends with EOS when `ignore_eos` is off.
    pub natural_len: usize,
    pub extra: ExtraKeys,
    /// Hashes of the full blocks of `tokens` computed so far.
    pub hashes: Vec<BlockHash>,
    pub blocks: Vec<u32>,
    pub num_computed: usize,
    /// Full blocks already committed to the cache.
    pub num_committed: usize,
    /// Prefix-cache hit at first admission (reported as `cached_tokens`).
    pub cached_tokens: Option<usize>,
    pub token_seed: u64,
    pub arrival_s: f64,
    pub first_scheduled_s: Option<f64>,
    pub first_token_s: Option<f64>,
    pub sink: UnboundedSender<Output>,
}

impl Sequence {
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Drops blocks and progress after preemption by recompute.
    pub fn reset_for_recompute(&mut self) -> Vec<u32> {
        self.num_computed = 0;
        self.num_committed = 0;
        std::mem::take(&mut self.blocks)
    }

    /// The generated token at position `k`: a pure function of the prompt and the seed.
    pub fn token_at(&self, k: usize, vocabulary: &[u32]) -> u32 {
        let mut x = self.token_seed ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        vocabulary[(x % vocabulary.len() as u64) as usize]
    }
}

/// FNV-1a over the prompt mixed with the engine seed: same prompt, same seed, same output.
pub fn token_seed(prompt: &[u32], seed: u64) -> u64 {
    prompt.iter().fold(0xcbf2_9ce4_8422_2325 ^ seed, |h, t| {
        (h ^ u64::from(*t)).wrapping_mul(0x0100_0000_01b3)
    })
}
