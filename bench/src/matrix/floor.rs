//! The floor of a cell: TTFT quantiles that no router can beat on the cell's plan, whatever
//! it does, so a target set below them is out of every router's reach.
//!
//! Some prompt tokens are new to the whole fleet when their request arrives, however it is
//! routed: a RAG document the first time any request asks for it, a session's opening
//! prompt, each turn's new message or tool result, the control's every token. No cache can
//! hold them, so the request that brings them computes them, at the least in one engine step
//! of its own, with nothing else in the batch:
//!
//! ```text
//! floor = overhead + new / prefill_tokens_per_s + (new x context + new^2 / 2) x attn_s_per_token_pair
//! ```
//!
//! (the simulator's step time, `warmpath_sim::engine::timing`, of a lone prefill of `new`
//! tokens after `context` cached ones). A real run adds queueing, batching with other
//! requests, decode steps and the network, never less. The floor's quantiles are the same
//! rank statistics of these per-request bounds as the rows' are of the measured TTFTs, so
//! each row's quantile is at or above the floor's: if at least k requests must each take at
//! least x, the k-th slowest takes at least x.
//!
//! Which request of a RAG document pays for it is up to the router; the bound gives the
//! document's cold prefill to its request with the fewest tokens and to each other request
//! the tokens after the longest whole-block prefix it shares with another (the document and
//! the start its questions share), so it holds for every order. Growing sessions count only each turn's appended text as new (the answer
//! before it may be cached where it was generated) and no context, a looser bound. Tokens
//! are the built-in tokenizer's, as the simulator counts them (a completion prompt with its
//! BOS token).

use std::sync::OnceLock;

use warmpath_sim::engine::timing::{Profile, StepWork};
use warmpath_tokenizer::Tokenizer;

use crate::run::report::Quantiles;

/// What one request must compute whatever the router does: `tokens` new to the fleet,
/// after `context` tokens that may be cached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Fresh {
    pub tokens: usize,
    pub context: usize,
}

/// A cell's floor: the TTFT quantiles (modelled seconds) below which no router's can be.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Floor {
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    pub ttft_p99: f64,
}

/// The floor of every request in `fresh` (every run of a cell together, as the rows pool
/// their answers) on `profile`'s engines.
pub fn of<'a>(profile: &Profile, fresh: impl IntoIterator<Item = &'a Fresh>) -> Floor {
    let q = Quantiles::of(fresh.into_iter().map(|f| lone_prefill(profile, *f)));
    Floor {
        ttft_p50: q.p50,
        ttft_p90: q.p90,
        ttft_p99: q.p99,
    }
}

/// Seconds of one engine step that prefills `f` alone.
pub fn lone_prefill(profile: &Profile, f: Fresh) -> f64 {
    let (n, c) = (f.tokens as u64, f.context as u64);
    profile
        .step_time(&StepWork {
            prefill_tokens: f.tokens,
            prefill_context_pairs: n * c + n * n / 2,
            ..StepWork::default()
        })
        .as_secs_f64()
}

/// Tokens of `text` as the simulator counts a completion prompt (`bos`: with the BOS token,
/// for a whole prompt) or a piece appended to one (`bos` false).
pub fn tokens(text: &str, bos: bool) -> usize {
    builtin()
        .encode(text, bos)
        // The built-in tokenizer encodes any text; were it to fail, the nominal size (3.85
        // characters a token) would overstate nothing by much, so a floor of zero is safer.
        .map_or(0, |ids| ids.len())
}

/// The new tokens of a RAG cell's requests, given as (document, prompt) pairs. Each
/// document used is new once, to its request with the fewest prompt tokens; every other
/// request of it brings what follows the longest prefix it shares with another request of the
/// document (the document and whatever the questions share after it), rounded down to a
/// whole `block` as the engines cache.
pub fn rag(requests: &[(usize, &str)], block: usize) -> Vec<Fresh> {
    let block = block.max(1);
    let ids: Vec<Vec<u32>> = requests
        .iter()
        .map(|(_, p)| token_ids(p).unwrap_or_default())
        .collect();
    let mut fresh = vec![Fresh::default(); requests.len()];
    let mut docs: Vec<usize> = requests.iter().map(|(d, _)| *d).collect();
    docs.sort_unstable();
    docs.dedup();
    for doc in docs {
        // The document's requests in token order: a request's longest prefix shared with any
        // other is the one shared with a neighbour.
        let mut group: Vec<usize> = (0..requests.len())
            .filter(|&i| requests[i].0 == doc)
            .collect();
        group.sort_by(|&a, &b| ids[a].cmp(&ids[b]));
        let shared = |a: usize, b: usize| {
            ids[a]
                .iter()
                .zip(&ids[b])
                .take_while(|(x, y)| x == y)
                .count()
        };
        for (k, &i) in group.iter().enumerate() {
            let before = k.checked_sub(1).map_or(0, |j| shared(group[j], i));
            let after = group.get(k + 1).map_or(0, |&j| shared(i, j));
            let cached = before.max(after) / block * block;
            fresh[i] = Fresh {
                tokens: ids[i].len() - cached,
                context: cached,
            };
        }
        if let Some(&cold) = group.iter().min_by_key(|&&i| (ids[i].len(), i)) {
            fresh[cold] = Fresh {
                tokens: ids[cold].len(),
                context: 0,
            };
        }
    }
    fresh
}

/// Token ids of a whole completion prompt (with BOS), as the simulator counts them.
fn token_ids(text: &str) -> Option<Vec<u32>> {
    builtin().encode(text, true).ok()
}

fn builtin() -> &'static Tokenizer {
    static BUILTIN: OnceLock<Tokenizer> = OnceLock::new();
    BUILTIN.get_or_init(Tokenizer::builtin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1,000 tokens a second, 1 ms a step, no attention cost: a step of n tokens takes
    /// (1 + n) ms.
    const FLAT: Profile = Profile {
        name: "flat",
        prefill_tokens_per_s: 1000.0,
        attn_s_per_token_pair: 0.0,
        decode_base_s: 0.5,
        decode_per_seq_s: 0.5,
        kv_read_s_per_token: 0.5,
        cpu_load_s_per_token: 0.5,
        overhead_s: 0.001,
    };

    fn fresh(tokens: usize) -> Fresh {
        Fresh { tokens, context: 0 }
    }

    #[test]
    fn a_lone_prefill_costs_overhead_compute_and_attention_over_its_context() {
        // 100 tokens: 1 ms + 100 ms, no decode cost.
        assert!((lone_prefill(&FLAT, fresh(100)) - 0.101).abs() < 1e-9);
        let attn = Profile {
            attn_s_per_token_pair: 1e-6,
            ..FLAT
        };
        // 10 new tokens after 100: 10 x 100 + 10 x 10 / 2 = 1,050 pairs = 1.05 ms.
        let f = Fresh {
            tokens: 10,
            context: 100,
        };
        assert!((lone_prefill(&attn, f) - (0.001 + 0.010 + 0.001_05)).abs() < 1e-9);
    }

    #[test]
    fn the_floor_takes_the_rows_rank_rule() {
        // 20 requests: 18 warm of 9 tokens (10 ms), 2 cold of 99 (100 ms). p90 is the 18th
        // smallest (warm), p99 the 20th (cold); with 3 cold, p90 would be the 18th: cold.
        let mut plan: Vec<Fresh> = vec![fresh(9); 18];
        plan.extend([fresh(99), fresh(99)]);
        let f = of(&FLAT, &plan);
        let close = |a: f64, b: f64| (a - b).abs() < b * 0.002;
        assert!(close(f.ttft_p50, 0.010), "{f:?}");
        assert!(close(f.ttft_p90, 0.010), "{f:?}");
        assert!(close(f.ttft_p99, 0.100), "{f:?}");
        plan[0] = fresh(99);
        assert!(close(of(&FLAT, &plan).ttft_p90, 0.100));
    }

    #[test]
    fn each_rag_document_is_cold_once_for_its_shortest_request() {
        let docs = ["alpha beta gamma delta", "one two three four five six"];
        let q = |d: usize, s: &str| format!("{}\nQuestion: {s}", docs[d]);
        let prompts = [q(0, "why and how"), q(0, "why"), q(1, "what"), q(0, "how")];
        let requests: Vec<(usize, &str)> = [0, 0, 1, 0]
            .into_iter()
            .zip(prompts.iter().map(String::as_str))
            .collect();
        let all = |p: &str| tokens(p, true);
        // Block 1: a warm request has cached what it shares with another request of its
        // document: the document and "\nQuestion:" at least.
        let got = rag(&requests, 1);
        assert_eq!(got.len(), 4);
        // Request 2 is document 1's only one; request 1 ("why") is document 0's shortest,
        // or tied with request 3 ("how") and before it.
        assert!(all(&prompts[1]) <= all(&prompts[3]) && all(&prompts[1]) < all(&prompts[0]));
        assert_eq!(got[1], fresh(all(&prompts[1])));
        assert_eq!(got[2], fresh(all(&prompts[2])));
        let doc_and_label = tokens(&format!("{}\nQuestion:", docs[0]), true);
        for i in [0, 3] {
            assert!(got[i].context >= doc_and_label, "request {i}: {got:?}");
            assert!(got[i].tokens >= 1, "request {i}: {got:?}");
            assert_eq!(got[i].tokens + got[i].context, all(&prompts[i]));
        }
        // Blocks of 4: the cached prefix is a whole number of them, no longer than before.
        let blocks = rag(&requests, 4);
        for i in [0, 3] {
            assert_eq!(blocks[i].context % 4, 0);
            assert!(blocks[i].context <= got[i].context && blocks[i].context + 4 > got[i].context);
            assert_eq!(blocks[i].tokens + blocks[i].context, all(&prompts[i]));
        }
    }
}
