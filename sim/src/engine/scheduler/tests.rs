use tokio::sync::mpsc;

use super::*;
use crate::engine::{
    kv_cache::ExtraKeys,
    sequence::{Output, token_seed},
};

const VOCAB: &[u32] = &[1000, 1001, 1002];

fn seq(prompt: Vec<u32>, max_tokens: usize) -> (Sequence, mpsc::UnboundedReceiver<Output>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let s = Sequence {
        prompt_len: prompt.len(),
        token_seed: token_seed(&prompt, 0),
        tokens: prompt,
        max_tokens,
        natural_len: usize::MAX,
        extra: ExtraKeys::default(),
        hashes: Vec::new(),
        blocks: Vec::new(),
        num_computed: 0,
        num_committed: 0,
        cached_tokens: None,
        arrival_s: 0.0,
        first_scheduled_s: None,
        first_token_s: None,
        sink: tx,
    };
    (s, rx)
}

fn sched(blocks: usize, budget: usize) -> Scheduler {
    Scheduler::new(
        Limits {
            max_num_seqs: 8,
            max_num_batched_tokens: budget,
            max_model_len: 10_000,
        },
        BlockPool::new(blocks, 4, 0),
    )
}

/// Runs steps until idle; returns the work of each step.
fn drain(s: &mut Scheduler) -> Vec<StepWork> {
    let mut steps = Vec::new();
    let mut ev = Vec::new();
    for _ in 0..1000 {
        if !s.has_work() {
            break;
        }
        let w = s.schedule(0.0, &mut ev);
        s.complete(0.0, VOCAB, None, &mut ev);
        steps.push(w);
    }
    steps
}

fn outputs(rx: &mut mpsc::UnboundedReceiver<Output>) -> Vec<Output> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

#[test]
fn second_request_reuses_the_shared_prefix() {
    let mut s = sched(64, 1024);
    let prompt: Vec<u32> = (0..40).collect();
    let (a, mut rx_a) = seq(prompt.clone(), 3);
    s.waiting.push_back(a);
    let first = drain(&mut s);
    assert_eq!(first[0].prefill_tokens, 40);
    let out = outputs(&mut rx_a);
    assert_eq!(out[0], Output::Prefilled { cached_tokens: 0 });
    assert_eq!(
        out.iter().filter(|o| matches!(o, Output::Token(_))).count(),
        3
    );
    assert_eq!(out.last(), Some(&Output::Finished(FinishReason::Length)));

    let mut b_prompt = prompt[..32].to_vec();
    b_prompt.extend(500..508);
    let (b, mut rx_b) = seq(b_prompt, 1);
    s.waiting.push_back(b);
    let steps = drain(&mut s);
    assert_eq!(
        steps[0].prefill_tokens, 8,
        "only the uncached tail is prefilled"
    );
    assert_eq!(
        outputs(&mut rx_b)[0],
        Output::Prefilled { cached_tokens: 32 }
    );
}

#[test]
fn fully_cached_prompt_still_computes_its_last_block() {
    let mut s = sched(64, 1024);
    let prompt: Vec<u32> = (0..16).collect();
    let (a, _rx) = seq(prompt.clone(), 1);
    s.waiting.push_back(a);
    drain(&mut s);
    let (b, mut rx) = seq(prompt, 1);
    s.waiting.push_back(b);
    let steps = drain(&mut s);
    assert_eq!(steps[0].prefill_tokens, 4);
    assert_eq!(outputs(&mut rx)[0], Output::Prefilled { cached_tokens: 12 });
}

#[test]
fn chunked_prefill_respects_the_token_budget() {
    let mut s = sched(64, 16);
    let (a, _rx) = seq((0..40).collect(), 1);
    s.waiting.push_back(a);
    let steps = drain(&mut s);
    let prefills: Vec<_> = steps.iter().map(|w| w.prefill_tokens).collect();
    assert_eq!(prefills, vec![16, 16, 8]);
}

#[test]
fn kv_exhaustion_preempts_the_newest_and_everything_finishes() {
    // 6 blocks of 4 tokens: two 8-token prompts generating 8 tokens each cannot both fit.
    let mut s = sched(6, 1024);
    let (a, mut rx_a) = seq((0..8).collect(), 8);
    let (b, mut rx_b) = seq((100..108).collect(), 8);
    s.waiting.push_back(a);
    s.waiting.push_back(b);
    drain(&mut s);
    assert!(s.preemptions >= 1);
    for rx in [&mut rx_a, &mut rx_b] {
        let out = outputs(rx);
        assert_eq!(
            out.iter().filter(|o| matches!(o, Output::Token(_))).count(),
            8,
            "{out:?}"
        );
        assert_eq!(out.last(), Some(&Output::Finished(FinishReason::Length)));
    }
    assert_eq!(s.pool.num_free(), 6);
}

#[test]
fn disconnected_clients_are_aborted_and_free_their_blocks() {
    let mut s = sched(64, 1024);
    let (a, rx) = seq((0..40).collect(), 100);
    s.waiting.push_back(a);
    let mut ev = Vec::new();
    s.schedule(0.0, &mut ev);
    s.complete(0.0, VOCAB, None, &mut ev);
    drop(rx);
    s.schedule(0.0, &mut ev);
    s.complete(0.0, VOCAB, None, &mut ev);
    assert!(!s.has_work());
    assert!(ev.contains(&Completion::Aborted));
    assert_eq!(s.pool.num_free(), 64);
}
