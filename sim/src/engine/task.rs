//! The engine task: owns the scheduler and the block pool, runs steps on a virtual clock.
//!
//! Modelled time advances by each step's modelled duration; wall-clock time follows it scaled
//! by `time_scale` (0.1 = ten times faster than the modelled GPU). While busy the virtual clock
//! never jumps to the wall clock, so timer granularity cannot inflate modelled latencies;
//! when idle it catches up with the wall clock. Sleeps shorter than the timer's resolution are
//! batched (the engine runs ahead and sleeps once the debt is worth a timer tick).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

use super::{
    BlockHash,
    kv_cache::{BlockPool, KvEvent},
    metrics::EngineStats,
    scheduler::{Limits, Scheduler},
    sequence::{NewRequest, Output, Sequence, token_seed},
    timing::Profile,
};

/// Below this, a sleep is not worth a timer tick.
const MIN_SLEEP: Duration = Duration::from_millis(1);
/// Event batches buffered for the publisher before new ones are dropped (vLLM max_queue_size).
pub const EVENT_QUEUE: usize = 100_000;

/// How an engine is shaped.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    /// CPU-tier blocks (0: no CPU tier).
    pub cpu_offload_blocks: usize,
    pub limits: Limits,
    pub profile: Profile,
    pub time_scale: f64,
    pub seed: u64,
}

/// The tokens the engine generates and the EOS it ends with.
#[derive(Debug, Clone)]
pub struct Vocabulary {
    pub generation_ids: Arc<[u32]>,
    pub eos: Option<u32>,
}

/// KV events of one engine step, with the step's wall-clock time (unix seconds).
#[derive(Debug, Clone)]
pub struct StepEvents {
    pub ts: f64,
    pub events: Vec<KvEvent>,
}

enum Command {
    Submit(NewRequest),
    Reset(oneshot::Sender<bool>),
    CachedBlocks(oneshot::Sender<CachedBlocks>),
    Crash,
}

/// The engine's cached blocks per tier, each sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachedBlocks {
    pub gpu: Vec<BlockHash>,
    pub cpu: Vec<BlockHash>,
}

/// A cheap handle to a running engine.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Command>,
    stats: Arc<Mutex<EngineStats>>,
    config: Arc<EngineConfig>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Submit(_) => "Submit",
            Self::Reset(_) => "Reset",
            Self::CachedBlocks(_) => "CachedBlocks",
            Self::Crash => "Crash",
        })
    }
}

/// The engine is gone (crashed or shut down).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("engine is not running")]
pub struct EngineDead;

impl EngineHandle {
    /// Starts an engine on the current runtime. `events`, when given, receives each step's
    /// KV events.
    pub fn spawn(
        config: EngineConfig,
        vocabulary: Vocabulary,
        events: Option<mpsc::Sender<StepEvents>>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let pool = BlockPool::new(config.num_gpu_blocks, config.block_size, config.seed)
            .with_cpu_tier(config.cpu_offload_blocks);
        let engine = Engine {
            sched: Scheduler::new(config.limits, pool),
            config: config.clone(),
            vocabulary,
            rx,
            stats: stats.clone(),
            events,
            start: Instant::now(),
            vnow: 0.0,
        };
        tokio::spawn(engine.run());
        Self {
            tx,
            stats,
            config: Arc::new(config),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request; its outputs arrive on `request.sink`.
    pub fn submit(&self, request: NewRequest) -> Result<(), EngineDead> {
        self.tx
            .send(Command::Submit(request))
            .map_err(|_| EngineDead)
    }

    /// Clears the prefix cache (refused while requests hold blocks).
    pub async fn reset_prefix_cache(&self) -> Result<bool, EngineDead> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Command::Reset(tx)).map_err(|_| EngineDead)?;
        rx.await.map_err(|_| EngineDead)
    }

    /// Hashes of every cached block, sorted.
    pub async fn cached_blocks(&self) -> Result<CachedBlocks, EngineDead> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::CachedBlocks(tx))
            .map_err(|_| EngineDead)?;
        rx.await.map_err(|_| EngineDead)
    }

    /// Kills the engine (fault injection): in-flight requests fail, /health turns 503.
    pub fn crash(&self) {
        let _ = self.tx.send(Command::Crash);
    }

    /// A copy of the current statistics.
    pub fn stats(&self) -> EngineStats {
        self.stats
            .lock()
            .expect("stats lock is never poisoned: no panics while held")
            .clone()
    }
}

struct Engine {
    sched: Scheduler,
    config: EngineConfig,
    vocabulary: Vocabulary,
    rx: mpsc::UnboundedReceiver<Command>,
    stats: Arc<Mutex<EngineStats>>,
    events: Option<mpsc::Sender<StepEvents>>,
    start: Instant,
    vnow: f64,
}

impl Engine {
    async fn run(mut self) {
        loop {
            if !self.sched.has_work() {
                let Some(cmd) = self.rx.recv().await else {
                    return;
                };
                self.vnow = self.vnow.max(self.wall_s());
                if !self.handle(cmd) {
                    return;
                }
            }
            while let Ok(cmd) = self.rx.try_recv() {
                if !self.handle(cmd) {
                    return;
                }
            }
            if self.sched.has_work() {
                self.step().await;
            }
        }
    }

    fn wall_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64() / self.config.time_scale
    }

    /// Returns false when the engine must stop.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit(req) => self.enqueue(req),
            Command::Reset(reply) => {
                let ok = self.sched.pool.reset();
                let _ = reply.send(ok);
                self.publish();
            }
            Command::CachedBlocks(reply) => {
                let _ = reply.send(CachedBlocks {
                    gpu: self.sched.pool.cached_hashes(),
                    cpu: self.sched.pool.cpu_hashes(),
                });
            }
            Command::Crash => {
                self.sched.fail_all("engine crashed (injected fault)");
                self.stats.lock().expect("never poisoned").healthy = false;
                return false;
            }
        }
        true
    }

    fn enqueue(&mut self, req: NewRequest) {
        let natural_len = if req.ignore_eos || self.vocabulary.eos.is_none() {
            usize::MAX
        } else {
            // EOS is the natural_len-th token: at least `min_tokens` come before it.
            natural_length(token_seed(&req.prompt, self.config.seed))
                .max(req.min_tokens.saturating_add(1))
        };
        let prompt_len = req.prompt.len();
        self.sched.waiting.push_back(Sequence {
            prompt_len,
            token_seed: token_seed(&req.prompt, self.config.seed),
            tokens: req.prompt,
            max_tokens: req.max_tokens.max(1),
            natural_len,
            extra: req.extra,
            hashes: Vec::new(),
            blocks: Vec::new(),
            num_computed: 0,
            num_committed: 0,
            cached_tokens: None,
            arrival_s: self.wall_s().min(self.vnow),
            first_scheduled_s: None,
            first_token_s: None,
            sink: req.sink,
        });
    }

    async fn step(&mut self) {
        let mut completions = Vec::new();
        let work = self.sched.schedule(self.vnow, &mut completions);
        if work == Default::default() {
            // Nothing fits even with an empty batch: the request can never run here.
            if self.sched.running.is_empty()
                && let Some(seq) = self.sched.waiting.pop_front()
            {
                let _ = seq.sink.send(Output::Failed(format!(
                    "request needs more KV blocks than the engine has ({} of {} tokens each)",
                    self.config.num_gpu_blocks, self.config.block_size
                )));
            }
            self.record(&completions);
            return;
        }
        self.vnow += self.config.profile.step_time(&work).as_secs_f64();
        let deadline = self.start + Duration::from_secs_f64(self.vnow * self.config.time_scale);
        if deadline.saturating_duration_since(Instant::now()) >= MIN_SLEEP {
            tokio::time::sleep_until(deadline).await;
        }
        let vocab = self.vocabulary.generation_ids.clone();
        self.sched
            .complete(self.vnow, &vocab, self.vocabulary.eos, &mut completions);
        self.record(&completions);
        self.publish();
    }

    fn record(&mut self, completions: &[super::scheduler::Completion]) {
        let mut stats = self.stats.lock().expect("never poisoned");
        stats.record(completions);
        stats.running = self.sched.running.len();
        stats.waiting = self.sched.waiting.len();
        stats.kv_usage = self.sched.pool.usage();
        stats.preemptions = self.sched.preemptions;
        stats.running_loras = loras(self.sched.running.iter());
        stats.waiting_loras = loras(self.sched.waiting.iter());
    }

    fn publish(&mut self) {
        let events = self.sched.pool.take_events();
        let Some(tx) = &self.events else { return };
        if events.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        if tx.try_send(StepEvents { ts, events }).is_err() {
            tracing::warn!("KV event queue full; dropping a batch");
        }
    }
}

fn loras<'a>(seqs: impl Iterator<Item = &'a Sequence>) -> Vec<String> {
    let mut v: Vec<String> = seqs.filter_map(|s| s.extra.lora_name.clone()).collect();
    v.sort();
    v.dedup();
    v
}

/// Where a sequence would emit EOS: 16..=400 tokens, seeded.
fn natural_length(seed: u64) -> usize {
    16 + (seed % 385) as usize
}
