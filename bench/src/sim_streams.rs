//! `warmpath bench sim-streams`: how many SSE chunks per second a simulator fleet emits to many
//! concurrent streaming clients, and how much CPU the simulator process spends doing it.
//!
//! The fleet runs as a separate `warmpath sim` process (this binary) so its CPU time can be
//! read from /proc; the clients run here. Every loop is bounded by `--duration-s`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use clap::Args;
use futures::StreamExt;

use warmpath_agent::http::sse::{self, Piece, Splitter};

use super::{
    Error,
    logs::Logs,
    proc_stat,
    process::{fleet_flags, spawn_sim},
};

/// Options of `warmpath bench sim-streams`.
#[derive(Debug, Clone, Args)]
pub struct SimStreamsArgs {
    /// Engines in the simulator process.
    #[arg(long, default_value_t = 8)]
    pub replicas: u16,
    /// Concurrent streaming clients (spread round-robin over the engines).
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Tokens per response.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 64)]
    pub prompt_tokens: usize,
    /// Measured window, after the warm-up.
    #[arg(long, default_value_t = 20.0)]
    pub duration_s: f64,
    #[arg(long, default_value_t = 5.0)]
    pub warmup_s: f64,
    #[arg(long, default_value = "llama-3.1-8b-h100")]
    pub profile: String,
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Tokio worker threads of the simulator process.
    #[arg(long, default_value_t = 1)]
    pub sim_worker_threads: usize,
    /// Where the simulator process writes its output: `<DIR>/logs/sim-0.log` (default:
    /// `warmpath-bench/sim-streams` in the system's temporary directory).
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
}

/// Counters shared by the client tasks.
#[derive(Debug, Default)]
struct Tally {
    chunks: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
}

pub async fn run(args: SimStreamsArgs) -> Result<(), Error> {
    let per_engine = args.streams.div_ceil(usize::from(args.replicas.max(1)));
    let mut flags = fleet_flags(args.replicas, &args.profile, args.time_scale);
    flags.extend(
        [
            "--max-num-seqs",
            &per_engine.max(1).to_string(),
            "--num-gpu-blocks",
            "16384",
            "--max-num-batched-tokens",
            "16384",
        ]
        .map(String::from),
    );
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| super::logs::default_out("sim-streams"));
    let logs = Logs::create(&out)?;
    let (sim, engines) = spawn_sim(&flags, args.sim_worker_threads, &logs).await?;
    let pid = sim.pid;
    let urls: Vec<String> = engines
        .iter()
        .map(|h| format!("http://{h}/v1/completions"))
        .collect();

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.streams)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| Error::Setup(e.to_string()))?;
    let tally = Arc::new(Tally::default());
    let end = Instant::now() + Duration::from_secs_f64(args.warmup_s + args.duration_s);
    let tasks: Vec<_> = (0..args.streams)
        .map(|i| {
            tokio::spawn(client_loop(
                client.clone(),
                urls[i % urls.len()].clone(),
                i,
                args.clone(),
                tally.clone(),
                end,
            ))
        })
        .collect();

    tokio::time::sleep(Duration::from_secs_f64(args.warmup_s)).await;
    let (c0, r0, cpu0, t0) = (
        tally.chunks.load(Ordering::Relaxed),
        tally.requests.load(Ordering::Relaxed),
        proc_stat::cpu_time(pid),
        Instant::now(),
    );
    let own0 = proc_stat::cpu_time(std::process::id());
    tokio::time::sleep(Duration::from_secs_f64(args.duration_s)).await;
    let (c1, r1, cpu1, wall) = (
        tally.chunks.load(Ordering::Relaxed),
        tally.requests.load(Ordering::Relaxed),
        proc_stat::cpu_time(pid),
        t0.elapsed(),
    );
    let own1 = proc_stat::cpu_time(std::process::id());
    for t in tasks {
        t.abort();
    }

    let secs = wall.as_secs_f64();
    let cores = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}", (b - a).as_secs_f64() / secs),
        _ => "n/a".into(),
    };
    println!(
        "sim-streams: {} engines, {} concurrent streams, {} tokens each, profile {}, time-scale {}",
        args.replicas, args.streams, args.max_tokens, args.profile, args.time_scale
    );
    println!(
        "| measured window | SSE chunks/s | requests/s | simulator CPU (cores) | client CPU (cores) | errors |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {secs:.1} s | {:.0} | {:.1} | {} | {} | {} |",
        (c1 - c0) as f64 / secs,
        (r1 - r0) as f64 / secs,
        cores(cpu0, cpu1),
        cores(own0, own1),
        tally.errors.load(Ordering::Relaxed)
    );
    drop(sim);
    println!("logs: {}", out.join("logs").display());
    Ok(())
}

async fn client_loop(
    client: reqwest::Client,
    url: String,
    index: usize,
    args: SimStreamsArgs,
    tally: Arc<Tally>,
    end: Instant,
) {
    let mut n = 0u32;
    while Instant::now() < end {
        n += 1;
        // Distinct prompts (no prefix sharing): every request pays its own prefill.
        let prompt: Vec<u32> = (0..args.prompt_tokens as u32)
            .map(|k| 100 + (index as u32 * 131 + n * 17 + k * 31) % 5000)
            .collect();
        let body = serde_json::json!({"prompt": prompt, "max_tokens": args.max_tokens, "stream": true, "ignore_eos": true});
        let resp = match client.post(&url).json(&body).send().await {
            Ok(r) if r.status().is_success() => r,
            _ => {
                tally.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let mut stream = resp.bytes_stream();
        let mut split = Splitter::new(sse::DEFAULT_MAX_EVENT);
        while let Some(Ok(bytes)) = stream.next().await {
            let Piece::Events(done) = split.push(bytes) else {
                tally.errors.fetch_add(1, Ordering::Relaxed);
                break;
            };
            let events = sse::events(&done).count() as u64;
            tally.chunks.fetch_add(events, Ordering::Relaxed);
        }
        tally.requests.fetch_add(1, Ordering::Relaxed);
    }
}
