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
//! tokens after `context` cached ones). The simulator emits a first token only after a step
//! that completes the prompt, and a batched step costs at least each of its requests' parts
//! alone; queueing, chunking, decode steps and the network only add. The floor's quantiles
//! are the same rank statistics of these per-request bounds as the rows' are of the measured
//! TTFTs, so the quantile of a row that answered every request is at or above the floor's: if
//! at least k requests must each take at least x, the k-th slowest takes at least x.
//!
//! Which request of a RAG document pays for it is up to the router: each request is bounded
//! by what follows the longest whole-block prefix it shares with another request of the
//! document (the document and the start its questions share), and then the largest of these
//! bounds is replaced by the document's cold prefill for its shortest request — whichever
//! request comes first pays at least that, the others at least their own bounds, so it holds
//! for every order. Growing sessions count only each turn's appended text as new (the answer
//! before it may be cached where it was generated) and no context, a looser bound; sessions
//! that open with a common system prompt (`chat:SHARED`) share it as a document's requests
//! do, so their openings are bounded as those requests are. Tokens
//! are the built-in tokenizer's, as the simulator counts them (a completion prompt with its
//! BOS token; the generated texts join at whitespace, so a turn encodes alone as it does in
//! its prompt).
//!
//! The bound is on modelled time, as the engines keep it; the rows divide the client's wall
//! clock by the time-scale. An engine skips sleeps under 1 ms and, after falling behind the
//! wall clock (a loaded machine), runs steps back to back until it catches up, so a client can
//! see a first token up to (1 ms + that lag) / time-scale before the modelled time.

use std::{borrow::Borrow, sync::OnceLock};

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

/// What a plan's requests must compute however they are routed ([`of`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct NewWork {
    /// Each request's own new tokens, one per request of the plan.
    pub each: Vec<Fresh>,
    /// Prefixes new to the fleet that several requests share (a RAG document).
    pub shared: Vec<SharedPrefix>,
}

/// A prefix new to the fleet that several requests bring: whichever of them comes first
/// computes it, so one of them costs at least `cold`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SharedPrefix {
    /// The shortest of its requests, whole.
    pub cold: Fresh,
    /// Its requests, as indices into [`NewWork::each`].
    pub members: Vec<usize>,
}

impl NewWork {
    /// One lower bound per request, in seconds: each request's own, and for each shared
    /// prefix its members' largest replaced by the prefix's cold prefill.
    pub fn bounds(&self, profile: &Profile) -> Vec<f64> {
        let mut out: Vec<f64> = self
            .each
            .iter()
            .map(|f| lone_prefill(profile, *f))
            .collect();
        for prefix in &self.shared {
            let largest = prefix
                .members
                .iter()
                .copied()
                .filter(|&i| i < out.len())
                .max_by(|&a, &b| out[a].total_cmp(&out[b]));
            if let Some(i) = largest {
                out[i] = lone_prefill(profile, prefix.cold);
            }
        }
        out
    }
}

/// The floor of every request of `plans` (every run of a cell together, as the rows pool
/// their answers) on `profile`'s engines.
pub fn of(profile: &Profile, plans: impl IntoIterator<Item = impl Borrow<NewWork>>) -> Floor {
    let q = Quantiles::of(plans.into_iter().flat_map(|w| w.borrow().bounds(profile)));
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
        // The built-in tokenizer encodes any text; were it to fail, counting no tokens keeps
        // the bound a bound (an estimate from the text's length could overstate it).
        .map_or(0, |ids| ids.len())
}

/// The new work of a RAG cell's requests, given as (document, prompt) pairs: each request
/// brings what follows the longest prefix it shares with another request of its document
/// (short of its last token), rounded down to a whole `block` as the engines cache; each
/// document used is a shared
/// prefix, cold for its shortest request.
pub fn rag(requests: &[(usize, &str)], block: usize) -> NewWork {
    let block = block.max(1);
    let ids: Vec<Vec<u32>> = requests
        .iter()
        .map(|(_, p)| token_ids(p).unwrap_or_default())
        .collect();
    let mut work = NewWork {
        each: vec![Fresh::default(); requests.len()],
        shared: Vec::new(),
    };
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
            // An engine computes at least a prompt's last token (vLLM's hit is at most
            // `len - 1` tokens, in whole blocks).
            let cached = before.max(after).min(ids[i].len().saturating_sub(1)) / block * block;
            work.each[i] = Fresh {
                tokens: ids[i].len() - cached,
                context: cached,
            };
        }
        if let Some(shortest) = group.iter().map(|&i| ids[i].len()).min() {
            work.shared.push(SharedPrefix {
                cold: Fresh {
                    tokens: shortest,
                    context: 0,
                },
                members: group,
            });
        }
    }
    work
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

    /// A plan of independent requests.
    fn each(plan: Vec<Fresh>) -> NewWork {
        NewWork {
            each: plan,
            shared: Vec::new(),
        }
    }

    #[test]
    fn the_floor_takes_the_rows_rank_rule() {
        // 20 requests: 18 warm of 9 tokens (10 ms), 2 cold of 99 (100 ms). p90 is the 18th
        // smallest (warm), p99 the 20th (cold); with 3 cold, p90 would be the 18th: cold.
        let mut plan: Vec<Fresh> = vec![fresh(9); 18];
        plan.extend([fresh(99), fresh(99)]);
        let f = of(&FLAT, [&each(plan.clone())]);
        let close = |a: f64, b: f64| (a - b).abs() < b * 0.002;
        assert!(close(f.ttft_p50, 0.010), "{f:?}");
        assert!(close(f.ttft_p90, 0.010), "{f:?}");
        assert!(close(f.ttft_p99, 0.100), "{f:?}");
        plan[0] = fresh(99);
        assert!(close(of(&FLAT, [&each(plan.clone())]).ttft_p90, 0.100));
        // Runs pool: the same plan twice has the same quantiles.
        let twice = of(&FLAT, [&each(plan.clone()), &each(plan)]);
        assert!(close(twice.ttft_p90, 0.100), "{twice:?}");
    }

    #[test]
    fn a_shared_prefix_replaces_its_members_largest_bound_with_its_cold_prefill() {
        // Requests 0 and 2 share a document (their own parts: 30 and 20 tokens, 31 and 21
        // ms); request 1 stands alone (5 tokens, 6 ms). Whichever of 0 and 2 comes first
        // computes the document (its shortest request whole: 120 tokens, 121 ms) and the
        // other pays at least its own part: the bound keeps the smaller part, 21 ms.
        let work = NewWork {
            each: vec![fresh(30), fresh(5), fresh(20)],
            shared: vec![SharedPrefix {
                cold: fresh(120),
                members: vec![0, 2],
            }],
        };
        let b = work.bounds(&FLAT);
        let want = [0.121, 0.006, 0.021];
        assert!(
            b.iter().zip(want).all(|(x, w)| (x - w).abs() < 1e-9),
            "{b:?}"
        );
        // A member index past the plan is ignored, not a panic.
        let odd = NewWork {
            shared: vec![SharedPrefix {
                cold: fresh(1),
                members: vec![7],
            }],
            ..work
        };
        assert_eq!(odd.bounds(&FLAT).len(), 3);
    }

    #[test]
    fn each_rag_request_brings_what_follows_its_longest_shared_prefix() {
        let docs = ["alpha beta gamma delta", "one two three four five six"];
        let q = |d: usize, s: &str| format!("{}\nQuestion: {s}", docs[d]);
        let prompts = [q(0, "why and how"), q(0, "why"), q(1, "what"), q(0, "how")];
        let requests: Vec<(usize, &str)> = [0, 0, 1, 0]
            .into_iter()
            .zip(prompts.iter().map(String::as_str))
            .collect();
        let all = |p: &str| tokens(p, true);
        // Block 1: every request of document 0 has cached what it shares with another
        // request of it, the document and "\nQuestion:" at least, short of its last token
        // ("why" is a prefix of "why and how": it still computes its last token).
        let got = rag(&requests, 1);
        assert_eq!(got.each.len(), 4);
        let doc_and_label = tokens(&format!("{}\nQuestion:", docs[0]), true);
        for i in [0, 1, 3] {
            let f = got.each[i];
            assert!(f.context >= doc_and_label, "request {i}: {got:?}");
            assert!(f.tokens >= 1, "request {i}: {got:?}");
            assert!(f.tokens <= all(&prompts[i]) - doc_and_label);
            assert_eq!(f.tokens + f.context, all(&prompts[i]));
        }
        // Document 1 has one request: nothing shared, all of it new.
        assert_eq!(got.each[2], fresh(all(&prompts[2])));
        // One shared prefix per document, cold for its shortest request.
        let shortest0 = [0, 1, 3].map(|i| all(&prompts[i])).into_iter().min();
        assert_eq!(got.shared.len(), 2);
        assert_eq!(Some(got.shared[0].cold), shortest0.map(fresh));
        assert_eq!(got.each[1].tokens, 1, "{got:?}");
        let mut members = got.shared[0].members.clone();
        members.sort_unstable();
        assert_eq!(members, [0, 1, 3]);
        assert_eq!(
            got.shared[1],
            SharedPrefix {
                cold: fresh(all(&prompts[2])),
                members: vec![2],
            }
        );
        // Blocks of 4: the cached prefix is a whole number of them, no longer than before.
        let blocks = rag(&requests, 4);
        for i in [0, 1, 3] {
            let (b, f) = (blocks.each[i], got.each[i]);
            assert_eq!(b.context % 4, 0);
            assert!(b.context <= f.context && b.context + 4 > f.context);
            assert_eq!(b.tokens + b.context, all(&prompts[i]));
        }
    }
}
