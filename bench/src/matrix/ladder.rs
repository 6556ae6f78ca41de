//! The load ladder's 1.0x: the request rate at which a fleet saturates serving every request
//! cold, as a cache-blind router makes it. A cache-aware router has headroom there in
//! proportion to its hits; past it, every router's queue grows for as long as a run lasts and
//! its TTFT quantiles measure the run's length, not the routing.
//!
//! An engine serving cold requests is bound by two things at once: prefill compute (each
//! prompt computed in full) and KV (a request holds its prompt's and answer's blocks from its
//! prefill to its last token, so only `n` run at once). Per engine, with `P` prompt and `O`
//! output tokens a request and the simulator profile's step costs:
//!
//! ```text
//! n      = clamp(blocks x block_size / (P + O), 1, max_num_seqs)    requests running at once
//! decode = overhead + decode_base + n x (decode_per_seq + (P + O/2) x kv_read)   one step
//! prefill = P / prefill_tokens_per_s + P^2/2 x attn_per_token_pair             one prompt
//! rate   = 1 / (O x decode / n + prefill)                                   requests / s
//! ```
//!
//! Each second is spent on prefill (`rate x prefill`) and on decode steps, each of which
//! advances the `n` running requests by one token, so `O / n` steps a request
//! (`rate x O x decode / n`): the two add up to one second at saturation. Chunked prefill
//! shares steps with decode, so the split is an approximation of the same sum. The fleet's
//! rate is the engines' sum.
//!
//! A first-order model: `n` is fractional (the KV's tokens over a request's), where the
//! simulator runs whole requests in whole blocks, and the first output token comes with the
//! prefill step (`O - 1` decode steps, not `O`). With the matrix's fleets the simulator's exact
//! cold saturation is up to 18 % lower (`rag:1.4:1000`: 3 requests fit 269 blocks, not 3.8;
//! the control's is the same), so at 1.0x a cache-blind router is at or a little past it.
//!
//! Until 3 December 2026 the ladder's 1.0x counted prefill alone (`engines x
//! prefill_tokens_per_s / P`), which ignores decode and KV: with the matrix's fleets (KV half
//! the working set) it was 1.5-1.6x (agentic, no-sharing) to 3.4x (chat) this rate, and its
//! 0.8x 1.2-2.7x, so every router's queue grew through a run at both top loads
//! (docs/benchmarks.md "The ladder at the fleet's saturation").

use warmpath_sim::engine::timing::Profile;

/// A fleet as the ladder sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fleet {
    pub engines: usize,
    pub blocks_per_engine: usize,
    pub block_size: usize,
    /// The most requests an engine runs at once.
    pub max_num_seqs: usize,
}

/// Requests per second at which `fleet` saturates serving requests of `prompt_tokens` and
/// `output_tokens` (means) with no prefix reuse, on `profile`'s engines.
pub fn cold_saturation(
    profile: &Profile,
    fleet: Fleet,
    prompt_tokens: f64,
    output_tokens: f64,
) -> f64 {
    let (p, o) = (prompt_tokens.max(1.0), output_tokens.max(0.0));
    let kv_tokens = (fleet.blocks_per_engine * fleet.block_size) as f64;
    let running = (kv_tokens / (p + o)).clamp(1.0, fleet.max_num_seqs.max(1) as f64);
    let decode = profile.overhead_s
        + profile.decode_base_s
        + running * (profile.decode_per_seq_s + (p + o / 2.0) * profile.kv_read_s_per_token);
    let prefill = p / profile.prefill_tokens_per_s + p * p / 2.0 * profile.attn_s_per_token_pair;
    fleet.engines as f64 / (o * decode / running + prefill)
}

#[cfg(test)]
mod tests {
    use warmpath_sim::engine::timing::LLAMA_8B_H100;

    use super::*;

    fn fleet(blocks_per_engine: usize) -> Fleet {
        Fleet {
            engines: 4,
            blocks_per_engine,
            block_size: 16,
            max_num_seqs: 256,
        }
    }

    #[test]
    fn kv_bounds_a_small_fleet_and_max_num_seqs_a_large_one() {
        // 308 blocks of 16 tokens hold 4928 / 1128 = 4.369 requests of 1064 + 64 tokens; a
        // decode step is 0.5 + 6 + 4.369 x (0.02 + 1096 x 4e-5) ms = 6.779 ms, 64 of them
        // shared by 4.369 requests 99.31 ms a request; prefill 53.2 + 0.113 ms; one engine
        // 1 / 0.15262 s = 6.552 requests/s, four 26.21.
        let rate = cold_saturation(&LLAMA_8B_H100, fleet(308), 1064.0, 64.0);
        assert!((rate - 26.2089).abs() < 1e-3, "{rate}");
        // KV for a million blocks: 256 run at once (the step 22.8 ms): 16.94 a second each.
        let wide = cold_saturation(&LLAMA_8B_H100, fleet(1_000_000), 1064.0, 64.0);
        assert!((wide - 4.0 * 16.9423).abs() < 1e-3, "{wide}");
        // No output: prefill alone, 1 / 53.31 ms an engine.
        let prefill_only = cold_saturation(&LLAMA_8B_H100, fleet(308), 1064.0, 0.0);
        assert!(
            (prefill_only - 4.0 * 18.7571).abs() < 1e-3,
            "{prefill_only}"
        );
        // The prefill-only ladder of before overstated the small fleet's rate 2.87x.
        let before = 4.0 * LLAMA_8B_H100.prefill_tokens_per_s / 1064.0;
        assert!((before / rate - 2.869).abs() < 1e-3, "{}", before / rate);
    }

    #[test]
    fn degenerate_sizes_stay_finite_and_positive() {
        // KV smaller than one request still runs one; a zero-token prompt counts as one.
        for (blocks, p, o) in [(0, 1064.0, 64.0), (308, 0.0, 64.0), (308, 1064.0, -5.0)] {
            let rate = cold_saturation(&LLAMA_8B_H100, fleet(blocks), p, o);
            assert!(rate.is_finite() && rate > 0.0, "{blocks} {p} {o}: {rate}");
        }
    }
}
