//! Continuous batching with chunked prefill, modelled on vLLM v1's scheduler.
//!
//! Each step has a token budget (`max_num_batched_tokens`). Running sequences are served first,
//! in admission order: a decoding sequence needs one token, a prefilling one the rest of its
//! prompt up to the budget (chunked prefill). If a running sequence needs a block and none is
//! free, the most recently admitted sequence is preempted by recompute (its blocks freed, back
//! to the FRONT of the waiting queue). Then waiting sequences are admitted FCFS while the
//! budget, `max_num_seqs` and free blocks allow; admission first reuses the longest cached
//! prefix (always leaving at least one token to compute).

use std::collections::VecDeque;

use super::{
    kv_cache::BlockPool,
    sequence::{FinishReason, Output, Sequence},
    timing::StepWork,
};

/// Scheduler limits (vLLM flags of the same names).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
}

/// What happened to one sequence in a completed step (for metrics).
#[derive(Debug, Clone, PartialEq)]
pub enum Completion {
    Admitted {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    FirstToken {
        ttft_s: f64,
        queue_s: f64,
    },
    Token,
    Finished {
        reason: FinishReason,
        e2e_s: f64,
        prompt_tokens: usize,
        generated: usize,
    },
    Aborted,
}

#[derive(Debug)]
pub struct Scheduler {
    pub limits: Limits,
    pub pool: BlockPool,
    pub waiting: VecDeque<Sequence>,
    pub running: Vec<Sequence>,
    /// Tokens scheduled this step for `running[i]`.
    scheduled: Vec<usize>,
    pub preemptions: u64,
}

impl Scheduler {
    pub fn new(limits: Limits, pool: BlockPool) -> Self {
        Self {
            limits,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            scheduled: Vec::new(),
            preemptions: 0,
        }
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.pool.block_size())
    }

    /// Plans one step; returns its work (zero work: nothing could be scheduled).
    pub fn schedule(&mut self, now_s: f64, events: &mut Vec<Completion>) -> StepWork {
        let mut budget = self.limits.max_num_batched_tokens;
        let mut work = StepWork::default();
        self.scheduled.clear();
        let mut i = 0;
        while i < self.running.len() {
            let (computed, len, have) = {
                let s = &self.running[i];
                (s.num_computed, s.tokens.len(), s.blocks.len())
            };
            let want = (len - computed).min(budget);
            if want == 0 {
                self.scheduled.push(0);
                i += 1;
                continue;
            }
            let need = self.blocks_for(computed + want).saturating_sub(have);
            if !self.reserve(i, need) {
                // `running[i]` itself was preempted; everything after it is gone too.
                break;
            }
            account(&mut work, &self.running[i], want);
            budget -= want;
            self.scheduled.push(want);
            i += 1;
        }
        self.admit(&mut budget, &mut work, now_s, events);
        work
    }

    /// Gets `need` blocks for `running[i]`, preempting from the back. False if `i` itself
    /// had to go.
    fn reserve(&mut self, i: usize, need: usize) -> bool {
        loop {
            if let Some(blocks) = self.pool.allocate(need) {
                self.running[i].blocks.extend(blocks);
                return true;
            }
            let victim_index = self.running.len() - 1;
            let mut victim = self
                .running
                .pop()
                .expect("running[i] exists, so running is not empty");
            let blocks = victim.reset_for_recompute();
            self.pool.free(&blocks);
            self.preemptions += 1;
            self.waiting.push_front(victim);
            if victim_index == i {
                return false;
            }
        }
    }

    fn admit(
        &mut self,
        budget: &mut usize,
        work: &mut StepWork,
        now_s: f64,
        events: &mut Vec<Completion>,
    ) {
        while *budget > 0 && self.running.len() < self.limits.max_num_seqs {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            if seq.sink.is_closed() {
                self.waiting.pop_front();
                events.push(Completion::Aborted);
                continue;
            }
            if seq.hashes.len() < seq.tokens.len() / self.pool.block_size() {
                seq.hashes = self.pool.hash_blocks(&seq.tokens, &seq.extra);
            }
            let max_hit = ((seq.tokens.len() - 1) / self.pool.block_size()).min(seq.hashes.len());
            let hit = self.pool.cached_prefix_len(&seq.hashes[..max_hit]);
            // The prefix may continue in the CPU tier: those blocks are loaded, not prefilled.
            let cpu_hit = self.pool.cpu_prefix_len(&seq.hashes[hit..max_hit]);
            let computed = (hit + cpu_hit) * self.pool.block_size();
            let want = (seq.tokens.len() - computed).min(*budget);
            let new_blocks = (computed + want).div_ceil(self.pool.block_size()) - hit;
            if !self.pool.can_admit(&seq.hashes[..hit], new_blocks) {
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            self.pool.take_from_cpu(&seq.hashes[hit..hit + cpu_hit]);
            work.cpu_loaded_tokens += cpu_hit * self.pool.block_size();
            let mut blocks = self.pool.touch_prefix(&seq.hashes[..hit]);
            blocks.extend(
                self.pool
                    .allocate(new_blocks)
                    .expect("can_admit checked room"),
            );
            seq.blocks = blocks;
            seq.num_computed = computed;
            seq.num_committed = hit;
            if seq.cached_tokens.is_none() {
                seq.cached_tokens = Some(computed);
                seq.first_scheduled_s = Some(now_s);
                events.push(Completion::Admitted {
                    prompt_tokens: seq.prompt_len,
                    cached_tokens: computed,
                });
            }
            account(work, &seq, want);
            *budget -= want;
            self.scheduled.push(want);
            self.running.push(seq);
        }
    }

    /// Applies a finished step: progress, cache commits, sampling, finishing.
    pub fn complete(
        &mut self,
        now_s: f64,
        vocabulary: &[u32],
        eos: Option<u32>,
        events: &mut Vec<Completion>,
    ) {
        let bs = self.pool.block_size();
        let mut done = vec![false; self.running.len()];
        for (i, seq) in self.running.iter_mut().enumerate() {
            if seq.sink.is_closed() {
                done[i] = true;
                events.push(Completion::Aborted);
                continue;
            }
            let Some(&n) = self.scheduled.get(i).filter(|n| **n > 0) else {
                continue;
            };
            seq.num_computed += n;
            let full = seq.num_computed / bs;
            if seq.hashes.len() < full {
                seq.hashes = self.pool.hash_blocks(&seq.tokens[..full * bs], &seq.extra);
            }
            self.pool.commit_full_blocks(
                &seq.blocks,
                &seq.hashes[..full],
                seq.num_committed,
                &seq.tokens,
                &seq.extra,
            );
            seq.num_committed = seq.num_committed.max(full);
            if seq.num_computed < seq.tokens.len() {
                continue; // still prefilling
            }
            done[i] = step_token(
                seq,
                now_s,
                vocabulary,
                eos,
                self.limits.max_model_len,
                events,
            );
        }
        let mut index = 0;
        let pool = &mut self.pool;
        self.running.retain(|seq| {
            let finished = done[index];
            index += 1;
            if finished {
                pool.free(&seq.blocks);
            }
            !finished
        });
    }

    /// Removes every request (engine death): each gets `Failed`.
    pub fn fail_all(&mut self, message: &str) {
        for seq in self.running.drain(..).chain(self.waiting.drain(..)) {
            self.pool.free(&seq.blocks);
            let _ = seq.sink.send(Output::Failed(message.to_string()));
        }
    }
}

/// Samples the next token of a sequence whose context is fully computed. Returns true when
/// the sequence is finished (or its client went away).
fn step_token(
    seq: &mut Sequence,
    now_s: f64,
    vocabulary: &[u32],
    eos: Option<u32>,
    max_model_len: usize,
    events: &mut Vec<Completion>,
) -> bool {
    if seq.first_token_s.is_none() {
        seq.first_token_s = Some(now_s);
        let queue_s = seq.first_scheduled_s.unwrap_or(now_s) - seq.arrival_s;
        events.push(Completion::FirstToken {
            ttft_s: now_s - seq.arrival_s,
            queue_s,
        });
        let cached_tokens = seq.cached_tokens.unwrap_or(0);
        if seq.sink.send(Output::Prefilled { cached_tokens }).is_err() {
            events.push(Completion::Aborted);
            return true;
        }
    }
    let k = seq.generated();
    let natural_end = k + 1 >= seq.natural_len;
    let token = match eos {
        Some(eos) if natural_end => eos,
        _ => seq.token_at(k, vocabulary),
    };
    seq.tokens.push(token);
    events.push(Completion::Token);
    let reason = if natural_end && eos.is_some() {
        Some(FinishReason::Stop)
    } else if seq.generated() >= seq.max_tokens || seq.tokens.len() >= max_model_len {
        Some(FinishReason::Length)
    } else {
        None
    };
    let sent = if reason == Some(FinishReason::Stop) {
        Ok(()) // EOS itself is not shown
    } else {
        seq.sink.send(Output::Token(token))
    };
    if sent.is_err() {
        events.push(Completion::Aborted);
        return true;
    }
    let Some(reason) = reason else { return false };
    let _ = seq.sink.send(Output::Finished(reason));
    events.push(Completion::Finished {
        reason,
        e2e_s: now_s - seq.arrival_s,
        prompt_tokens: seq.prompt_len,
        generated: seq.generated(),
    });
    true
}

/// Adds a sequence's share of a step to the step's work.
fn account(work: &mut StepWork, seq: &Sequence, tokens: usize) {
    let decoding = seq.num_computed >= seq.prompt_len && tokens == 1;
    if decoding {
        work.decode_seqs += 1;
        work.kv_tokens_read += seq.tokens.len();
    } else {
        work.prefill_tokens += tokens;
        work.prefill_context_pairs += (tokens * seq.num_computed + tokens * tokens / 2) as u64;
    }
}

#[cfg(test)]
mod tests;
