//! The engine's own statistics, kept in vLLM's terms; `api::metrics` renders them.

use super::{scheduler::Completion, sequence::FinishReason};

/// vLLM's buckets for vllm:time_to_first_token_seconds.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for request-level latency histograms (e2e, queue).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A Prometheus histogram with fixed buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    pub bounds: &'static [f64],
    /// Non-cumulative counts per bucket, plus +Inf at the end.
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }
}

/// Everything /metrics reports for one engine.
#[derive(Debug, Clone)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub preemptions: u64,
    pub success_stop: u64,
    pub success_length: u64,
    pub aborted: u64,
    pub ttft: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    /// LoRA adapters of running / waiting requests, for vllm:lora_requests_info.
    pub running_loras: Vec<String>,
    pub waiting_loras: Vec<String>,
    /// Whether the engine is alive (false after an injected crash).
    pub healthy: bool,
}

impl Default for EngineStats {
    fn default() -> Self {
        Self {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            prefix_queries: 0,
            prefix_hits: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            preemptions: 0,
            success_stop: 0,
            success_length: 0,
            aborted: 0,
            ttft: Histogram::new(TTFT_BUCKETS),
            e2e: Histogram::new(REQUEST_LATENCY_BUCKETS),
            queue: Histogram::new(REQUEST_LATENCY_BUCKETS),
            running_loras: Vec::new(),
            waiting_loras: Vec::new(),
            healthy: true,
        }
    }
}

impl EngineStats {
    /// Folds one step's completions in. `time_scale` converts nothing: all times are modelled.
    pub fn record(&mut self, completions: &[Completion]) {
        for c in completions {
            match c {
                Completion::Admitted {
                    prompt_tokens,
                    cached_tokens,
                } => {
                    self.prefix_queries += *prompt_tokens as u64;
                    self.prefix_hits += *cached_tokens as u64;
                    self.prompt_tokens += *prompt_tokens as u64;
                }
                Completion::FirstToken { ttft_s, queue_s } => {
                    self.ttft.observe(*ttft_s);
                    self.queue.observe(*queue_s);
                }
                Completion::Token => self.generation_tokens += 1,
                Completion::Finished { reason, e2e_s, .. } => {
                    self.e2e.observe(*e2e_s);
                    match reason {
                        FinishReason::Stop => self.success_stop += 1,
                        FinishReason::Length => self.success_length += 1,
                    }
                }
                Completion::Aborted => self.aborted += 1,
            }
        }
    }
}
