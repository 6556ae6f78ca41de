//! Step timing: how long one engine step takes on the modelled hardware.
//!
//! ```text
//! step = overhead
//!      + prefill_tokens / prefill_tokens_per_s                      (compute bound)
//!      + prefill_tokens * context_tokens * attn_s_per_token_pair    (attention over context)
//!      + cpu_loaded_tokens * cpu_load_s_per_token                   (CPU tier -> GPU copy)
//!      + [decode_seqs > 0] * (decode_base_s                          (weights read once)
//!                             + decode_seqs * decode_per_seq_s
//!                             + kv_tokens_read * kv_read_s_per_token) (KV read, memory bound)
//! ```
//!
//! Only UNCACHED prompt tokens are prefilled, so a prefix-cache hit shortens TTFT in
//! proportion to the cached part. Sources for the calibrated profiles are in docs/sim.md.

use std::time::Duration;

/// One hardware + model calibration.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    pub prefill_tokens_per_s: f64,
    pub attn_s_per_token_pair: f64,
    pub decode_base_s: f64,
    pub decode_per_seq_s: f64,
    pub kv_read_s_per_token: f64,
    pub cpu_load_s_per_token: f64,
    pub overhead_s: f64,
}

/// What one step does, as the scheduler planned it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepWork {
    /// Prompt tokens computed this step (uncached only).
    pub prefill_tokens: usize,
    /// Sum over prefill chunks of (chunk tokens x context before the chunk + chunk/2).
    pub prefill_context_pairs: u64,
    /// Sequences producing one token this step.
    pub decode_seqs: usize,
    /// Context tokens whose KV the decode sequences read.
    pub kv_tokens_read: usize,
    /// Prefix tokens loaded back from the CPU tier instead of prefilled.
    pub cpu_loaded_tokens: usize,
}

/// Llama-3.1-8B (bf16) on one H100 SXM.
pub const LLAMA_8B_H100: Profile = Profile {
    name: "llama-3.1-8b-h100",
    prefill_tokens_per_s: 20_000.0,
    attn_s_per_token_pair: 2.0e-10,
    decode_base_s: 0.006,
    decode_per_seq_s: 0.000_02,
    kv_read_s_per_token: 4.0e-8,
    // 128 KiB of KV per token over ~25 GB/s of PCIe 5 (effective).
    cpu_load_s_per_token: 5.0e-6,
    overhead_s: 0.000_5,
};

/// Llama-3.1-70B (bf16), tensor parallel 4 on H100 SXM.
pub const LLAMA_70B_H100_TP4: Profile = Profile {
    name: "llama-3.1-70b-h100-tp4",
    prefill_tokens_per_s: 7_000.0,
    attn_s_per_token_pair: 4.0e-10,
    decode_base_s: 0.014,
    decode_per_seq_s: 0.000_05,
    kv_read_s_per_token: 2.5e-8,
    // 320 KiB per token split over 4 GPUs' PCIe links.
    cpu_load_s_per_token: 3.2e-6,
    overhead_s: 0.001,
};

/// A tiny, fast model for tests: tokens are cheap, steps short.
pub const TINY: Profile = Profile {
    name: "tiny",
    prefill_tokens_per_s: 200_000.0,
    attn_s_per_token_pair: 0.0,
    decode_base_s: 0.001,
    decode_per_seq_s: 0.000_001,
    kv_read_s_per_token: 0.0,
    cpu_load_s_per_token: 0.000_000_5,
    overhead_s: 0.000_1,
};

/// Every named profile.
pub const PROFILES: &[Profile] = &[LLAMA_8B_H100, LLAMA_70B_H100_TP4, TINY];

impl Profile {
    /// Looks a profile up by name.
    pub fn by_name(name: &str) -> Option<&'static Profile> {
        PROFILES.iter().find(|p| p.name == name)
    }

    /// Modelled duration of a step.
    pub fn step_time(&self, work: &StepWork) -> Duration {
        let mut s = self.overhead_s;
        s += work.prefill_tokens as f64 / self.prefill_tokens_per_s;
        s += work.prefill_context_pairs as f64 * self.attn_s_per_token_pair;
        s += work.cpu_loaded_tokens as f64 * self.cpu_load_s_per_token;
        if work.decode_seqs > 0 {
            s += self.decode_base_s
                + work.decode_seqs as f64 * self.decode_per_seq_s
                + work.kv_tokens_read as f64 * self.kv_read_s_per_token;
        }
        Duration::from_secs_f64(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_scales_with_uncached_tokens_and_decode_with_batch() {
        let p = LLAMA_8B_H100;
        let full = p.step_time(&StepWork {
            prefill_tokens: 4096,
            ..Default::default()
        });
        let tail = p.step_time(&StepWork {
            prefill_tokens: 512,
            ..Default::default()
        });
        assert!(full > tail * 6, "{full:?} vs {tail:?}");
        // ~20k tokens/s: 4096 tokens in roughly 0.2 s.
        assert!((0.19..0.23).contains(&full.as_secs_f64()), "{full:?}");
        let one = p.step_time(&StepWork {
            decode_seqs: 1,
            kv_tokens_read: 1000,
            ..Default::default()
        });
        let many = p.step_time(&StepWork {
            decode_seqs: 64,
            kv_tokens_read: 64_000,
            ..Default::default()
        });
        assert!(
            one.as_secs_f64() > 0.005 && one.as_secs_f64() < 0.01,
            "{one:?}"
        );
        assert!(many > one);
        assert_eq!(Profile::by_name("tiny"), Some(&TINY));
        assert_eq!(Profile::by_name("nope"), None);
    }
}
