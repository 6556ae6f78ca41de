//! `warmpath sim`: flags (vLLM's names where vLLM has one) and turning them into engines.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use clap::{Args, ValueEnum};

use crate::{
    api::Faults,
    engine::{EngineConfig, scheduler::Limits, timing::Profile},
    events::{Encoder, HashEncoding, KvEventsConfig, Publisher, ReplayLayout, WireFormat},
    fleet::{EngineSpec, RunningEngine, StartError, start_engine},
};
use warmpath_tokenizer::Tokenizer;

/// Options of `warmpath sim`.
#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Served model name.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// LoRA adapters served beside the base model (`NAME` or vLLM's `NAME=PATH`). Repeatable.
    #[arg(long = "lora-modules", value_name = "NAME[=PATH]")]
    pub lora_modules: Vec<String>,
    /// HuggingFace tokenizer directory (tokenizer.json [+ tokenizer_config.json]); default: the
    /// built-in tokenizer the router also uses.
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// HTTP port of the first engine; engine i listens on PORT+i (0: any free port).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Engines in this process, each with its own cache, scheduler, metrics and events.
    #[arg(long, default_value_t = 1)]
    pub replicas: u16,
    /// Publish KV events bound on tcp://HOST:PORT+i (fleet shorthand for --kv-events-config).
    #[arg(long, value_name = "PORT")]
    pub kv_events_port: Option<u16>,
    /// Replay endpoint bound on tcp://HOST:PORT+i.
    #[arg(long, value_name = "PORT")]
    pub kv_replay_port: Option<u16>,
    /// vLLM's KVEventsConfig JSON (endpoint, replay_endpoint, topic, buffer_steps, ...).
    #[arg(long, value_name = "JSON")]
    pub kv_events_config: Option<String>,
    #[arg(long, value_enum, default_value_t = FormatArg::Map)]
    pub kv_events_format: FormatArg,
    /// Block hashes as 32-byte strings instead of 64-bit ints.
    #[arg(long)]
    pub kv_events_hash_bytes: bool,
    #[arg(long, value_enum, default_value_t = LayoutArg::V026)]
    pub kv_events_replay_layout: LayoutArg,
    /// Fill `data_parallel_rank` in event batches.
    #[arg(long)]
    pub data_parallel_rank: Option<u32>,
    #[arg(long, default_value_t = 4096)]
    pub num_gpu_blocks: usize,
    /// Blocks of a CPU tier that catches GPU evictions (events with medium "CPU"); 0 = none.
    #[arg(long, default_value_t = 0)]
    pub cpu_offload_blocks: usize,
    /// Tokens per KV block (must match the router's setting).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_SEQS)]
    pub max_num_seqs: usize,
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    #[arg(long, default_value_t = 32768)]
    pub max_model_len: usize,
    /// Timing profile (see docs/sim.md): llama-3.1-8b-h100, llama-3.1-70b-h100-tp4, tiny.
    #[arg(long, default_value = "llama-3.1-8b-h100")]
    pub profile: String,
    /// Wall-clock seconds per modelled second (0.1 runs ten times faster).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub faults: FaultArgs,
}

/// `--max-num-seqs` unless given: the most requests an engine runs at once (vLLM's default).
pub const DEFAULT_MAX_NUM_SEQS: usize = 256;

/// The served model name unless `--model` says otherwise.
pub const DEFAULT_MODEL: &str = "sim-llama";

/// Fault injection flags (all off by default).
#[derive(Debug, Clone, Args)]
pub struct FaultArgs {
    #[arg(long, default_value_t = 0)]
    pub fault_latency_ms: u64,
    #[arg(long, default_value_t = 0)]
    pub fault_jitter_ms: u64,
    #[arg(long, default_value_t = 0.0)]
    pub fault_error_rate: f64,
    #[arg(long)]
    pub fault_crash_after: Option<u64>,
    #[arg(long)]
    pub fault_drop_event_batch_every: Option<u64>,
    /// Publish every Nth event batch twice.
    #[arg(long)]
    pub fault_duplicate_event_batch_every: Option<u64>,
    /// Hold back every Nth event batch and publish it after the next one.
    #[arg(long)]
    pub fault_reorder_event_batch_every: Option<u64>,
    #[arg(long)]
    pub fault_stall_after_tokens: Option<usize>,
    /// Answer 503 while this many requests are waiting (overload).
    #[arg(long)]
    pub max_waiting: Option<usize>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Array,
    Map,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LayoutArg {
    #[value(name = "v0.25")]
    V025,
    #[value(name = "v0.26")]
    V026,
}

/// Invalid flag combinations, named.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Tokenizer(#[from] warmpath_tokenizer::Error),
    #[error(transparent)]
    Start(#[from] StartError),
}

impl SimArgs {
    /// Validates the flags and builds one spec per engine.
    pub fn specs(&self) -> Result<Vec<EngineSpec>, Error> {
        let bad = |m: String| Err(Error::Invalid(m));
        let profile = match Profile::by_name(&self.profile) {
            Some(p) => p.clone(),
            None => {
                let names: Vec<_> = crate::engine::timing::PROFILES
                    .iter()
                    .map(|p| p.name)
                    .collect();
                return bad(format!(
                    "--profile {}: unknown (known: {})",
                    self.profile,
                    names.join(", ")
                ));
            }
        };
        if self.block_size == 0
            || self.num_gpu_blocks == 0
            || self.max_num_seqs == 0
            || self.max_num_batched_tokens == 0
        {
            return bad("--block-size, --num-gpu-blocks, --max-num-seqs and --max-num-batched-tokens must be positive".into());
        }
        if !(self.time_scale > 0.0 && self.time_scale.is_finite()) {
            return bad(format!(
                "--time-scale {}: must be a positive number",
                self.time_scale
            ));
        }
        if !(0.0..=1.0).contains(&self.faults.fault_error_rate) {
            return bad("--fault-error-rate must be within 0..=1".into());
        }
        let capacity = self.num_gpu_blocks * self.block_size;
        if self.max_model_len > capacity {
            return bad(format!(
                "--max-model-len {} is larger than the maximum number of tokens that can be stored in KV cache ({capacity}); raise --num-gpu-blocks or lower --max-model-len",
                self.max_model_len
            ));
        }
        if self.replicas == 0 {
            return bad("--replicas must be at least 1".into());
        }
        let config = self
            .kv_events_config
            .as_deref()
            .map(KvEventsConfig::from_json)
            .transpose()
            .map_err(Error::Invalid)?;
        (0..self.replicas)
            .map(|i| self.spec(i, &profile, config.as_ref()))
            .collect()
    }

    fn spec(
        &self,
        i: u16,
        profile: &Profile,
        config: Option<&KvEventsConfig>,
    ) -> Result<EngineSpec, Error> {
        let offset = |port: u16| if port == 0 { 0 } else { port + i };
        let events = self.events(i, config, offset)?;
        Ok(EngineSpec {
            model: self.model.clone(),
            loras: self.loras(),
            max_model_len: self.max_model_len,
            engine: EngineConfig {
                block_size: self.block_size,
                num_gpu_blocks: self.num_gpu_blocks,
                cpu_offload_blocks: self.cpu_offload_blocks,
                limits: Limits {
                    max_num_seqs: self.max_num_seqs,
                    max_num_batched_tokens: self.max_num_batched_tokens,
                    max_model_len: self.max_model_len,
                },
                profile: profile.clone(),
                time_scale: self.time_scale,
                seed: self.seed,
            },
            faults: Faults {
                latency: Duration::from_millis(self.faults.fault_latency_ms),
                jitter: Duration::from_millis(self.faults.fault_jitter_ms),
                error_rate: self.faults.fault_error_rate,
                crash_after: self.faults.fault_crash_after,
                stall_after_tokens: self.faults.fault_stall_after_tokens,
                max_waiting: self.faults.max_waiting,
            },
            listen: SocketAddr::new(self.host, offset(self.port)),
            events,
        })
    }

    fn events(
        &self,
        i: u16,
        config: Option<&KvEventsConfig>,
        offset: impl Fn(u16) -> u16,
    ) -> Result<Option<Publisher>, Error> {
        let encoder = Encoder {
            format: match self.kv_events_format {
                FormatArg::Array => WireFormat::Array,
                FormatArg::Map => WireFormat::Map,
            },
            hashes: if self.kv_events_hash_bytes {
                HashEncoding::Bytes
            } else {
                HashEncoding::Int
            },
            dp_rank: self.data_parallel_rank,
            loras: self.loras(),
        };
        let replay_layout = match self.kv_events_replay_layout {
            LayoutArg::V025 => ReplayLayout::V025,
            LayoutArg::V026 => ReplayLayout::V026,
        };
        let spec = |endpoint: String,
                    bind: Option<bool>,
                    replay: Option<String>,
                    topic: String,
                    buffer_steps: usize| Publisher {
            endpoint,
            bind,
            replay_endpoint: replay,
            topic,
            buffer_steps,
            replay_layout,
            encoder: encoder.clone(),
            drop_every: self.faults.fault_drop_event_batch_every,
            duplicate_every: self.faults.fault_duplicate_event_batch_every,
            reorder_every: self.faults.fault_reorder_event_batch_every,
        };
        if let Some(port) = self.kv_events_port {
            let replay = self
                .kv_replay_port
                .map(|p| format!("tcp://{}:{}", self.host, offset(p)));
            return Ok(Some(spec(
                format!("tcp://{}:{}", self.host, offset(port)),
                Some(true),
                replay,
                String::new(),
                10_000,
            )));
        }
        if self.kv_replay_port.is_some() {
            return Err(Error::Invalid(
                "--kv-replay-port needs --kv-events-port".into(),
            ));
        }
        let Some(cfg) = config.filter(|c| c.active()) else {
            return Ok(None);
        };
        // Like data-parallel ranks: engine i uses the configured tcp port + i.
        let shift = |ep: &str| shift_port(ep, i);
        Ok(Some(spec(
            shift(&cfg.endpoint),
            None,
            cfg.replay_endpoint.as_deref().map(shift),
            cfg.topic.clone(),
            cfg.buffer_steps,
        )))
    }

    fn loras(&self) -> Vec<String> {
        self.lora_modules
            .iter()
            .map(|m| m.split('=').next().unwrap_or(m).to_string())
            .collect()
    }

    /// Loads the tokenizer the engines share.
    pub fn load_tokenizer(&self) -> Result<Arc<Tokenizer>, Error> {
        Ok(Arc::new(match &self.tokenizer {
            Some(dir) => Tokenizer::from_dir(dir)?,
            None => Tokenizer::builtin(),
        }))
    }
}

/// `tcp://host:5557` + 2 -> `tcp://host:5559`; other transports unchanged.
fn shift_port(endpoint: &str, by: u16) -> String {
    if by == 0 {
        return endpoint.to_string();
    }
    match endpoint.rsplit_once(':') {
        Some((head, port)) if endpoint.starts_with("tcp://") => match port.parse::<u16>() {
            Ok(p) => format!("{head}:{}", p.saturating_add(by)),
            Err(_) => endpoint.to_string(),
        },
        _ => endpoint.to_string(),
    }
}

/// Starts every engine described by `args`.
pub async fn start(args: &SimArgs) -> Result<Vec<RunningEngine>, Error> {
    let specs = args.specs()?;
    let encoder = Arc::new(warmpath_tokenizer::segments::SegmentTokenizer::new(
        args.load_tokenizer()?,
    ));
    let mut engines = Vec::with_capacity(specs.len());
    for spec in specs {
        engines.push(start_engine(spec, encoder.clone()).await?);
    }
    Ok(engines)
}

/// The line printed once every engine is up: one JSON object per engine.
pub fn ready_line(engines: &[RunningEngine]) -> String {
    let list: Vec<_> = engines
        .iter()
        .map(|e| {
            serde_json::json!({
                "http": e.http.to_string(),
                "kv_events": e.publisher.as_ref().map(|p| p.events_endpoint.clone()),
                "kv_replay": e.publisher.as_ref().and_then(|p| p.replay_endpoint.clone()),
            })
        })
        .collect();
    serde_json::json!({"ready": true, "engines": list}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_shift_per_replica() {
        assert_eq!(shift_port("tcp://*:5557", 2), "tcp://*:5559");
        assert_eq!(shift_port("ipc:///tmp/x", 2), "ipc:///tmp/x");
        assert_eq!(
            shift_port("tcp://127.0.0.1:5557", 0),
            "tcp://127.0.0.1:5557"
        );
    }
}
