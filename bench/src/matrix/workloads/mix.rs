//! `mix`: tenants with different workloads on one fleet at once, as a shared cluster serves
//! them — RAG over Zipf-popular documents (`rag:1.0:2500`), chat sessions, agent loops and
//! the control's requests with nothing to share, a quarter of the requests each. A router
//! tuned to one shape meets the others in the same engines' batches and KV: long agent
//! contexts evict chat sessions, a hot document's pod fills with cold control requests.
//!
//! Each part is its workload's own plan for its share of the requests, drawn on a seed of
//! its own; its arrivals are that plan's, with the rate split in proportion to the parts'
//! requests (Poisson processes at rates summing to the cell's rate merge into one at that
//! rate). Sessions and users are numbered across the parts, so no two share a chain.

use std::time::Duration;

use super::{Generated, Sizes, Workload};

/// The parts, in plan order.
pub const PARTS: [Workload; 4] = [
    Workload::Rag {
        skew: 1.0,
        doc_tokens: 2500,
    },
    Workload::CHAT,
    Workload::Agentic,
    Workload::NoSharing,
];

/// The mixed plan at `rate` requests per modelled second in front of `replicas` engines.
pub fn plan(sizes: &Sizes, rate: f64, replicas: usize, seed: u64) -> Generated {
    let share = Sizes {
        requests: sizes.requests.div_ceil(PARTS.len()).max(1),
        ..*sizes
    };
    // At 1 request/s, then rescaled: the plans do not depend on the rate but for the times.
    let plans: Vec<Generated> = PARTS
        .iter()
        .enumerate()
        .map(|(i, w)| w.generate(&share, 1.0, replicas, part_seed(seed, i)))
        .collect();
    let total: usize = plans.iter().map(Generated::requests).sum();
    let mut out = Generated {
        chains: Vec::with_capacity(plans.iter().map(|g| g.chains.len()).sum()),
        working_set_tokens: 0,
        mean_prompt_tokens: 0.0,
        longest_tokens: 0,
        output_tokens: 0,
        parts: Vec::with_capacity(PARTS.len()),
    };
    let mut outputs = 0.0;
    let mut first_user = 0;
    for g in plans {
        let n = g.requests();
        let weight = n as f64 / total.max(1) as f64;
        // This part's own rate: its share of the cell's.
        let slow = 1.0 / (rate * weight).max(f64::MIN_POSITIVE);
        let mut next_user = first_user;
        for mut chain in g.chains {
            for turn in &mut chain.turns {
                turn.at = Duration::try_from_secs_f64(turn.at.as_secs_f64() * slow)
                    .unwrap_or(Duration::MAX);
                turn.user += first_user;
                next_user = next_user.max(turn.user + 1);
            }
            out.chains.push(chain);
        }
        out.parts.extend(g.parts.into_iter().map(|mut p| {
            p.first_user += first_user;
            p
        }));
        first_user = next_user;
        out.working_set_tokens += g.working_set_tokens;
        out.mean_prompt_tokens += g.mean_prompt_tokens * weight;
        out.longest_tokens = out.longest_tokens.max(g.longest_tokens);
        outputs += g.output_tokens as f64 * weight;
    }
    out.output_tokens = outputs.round() as usize;
    out
}

/// Part `i`'s seed: its own stream, so no two parts draw the same text.
fn part_seed(seed: u64, i: usize) -> u64 {
    seed ^ 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1)
}
