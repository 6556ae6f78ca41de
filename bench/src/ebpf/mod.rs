//! `warmpath bench ebpf`: what the kernel data path costs and what it buys (issue #20,
//! docs/ebpf.md), one run on one machine, one table:
//!
//! 1. connect() latency and connections/s with no interception, iptables `REDIRECT` and
//!    warmpath's connect4 ([`connects`]), and connect4's in-kernel cost from the kernel's BPF
//!    run-time stats ([`kernel_cost`]);
//! 2. request latency direct to a pod, through the VIP in proxy mode, in proxy mode with
//!    sk_msg acceleration (`--sk-msg`) and in steer mode ([`requests`]);
//! 3. TTFT with the agent killed halfway: affinity fail-open vs the plain VIP fallback
//!    ([`failover`]).
//!
//! Root only. Everything lives in network namespaces, cgroups and a pin directory the run
//! creates (named after `--tag`) and removes when it ends, also on an error or Ctrl-C.

pub(crate) mod client;
mod connects;
mod failover;
mod kernel_cost;
mod report;
mod requests;
pub(crate) mod setup;
mod spread;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

pub use client::ClientArgs;

use crate::{Error, logs::Logs};

/// Longest tag: netns names get a few characters more (`<tag>f1n`) and must stay short.
const MAX_TAG: usize = 10;

/// Options of `warmpath bench ebpf`.
#[derive(Debug, Clone, clap::Args)]
pub struct EbpfBenchArgs {
    /// Where the table (`ebpf.json`, `ebpf.md`) and every process's log (`logs/`) go.
    #[arg(long, default_value = "target/bench-ebpf")]
    pub out: PathBuf,
    /// Rounds of the connect part; the variants take turns within each.
    #[arg(long, default_value_t = 40)]
    pub connect_rounds: usize,
    /// connect() calls per variant per round.
    #[arg(long, default_value_t = 1000)]
    pub connects: usize,
    /// Rounds of the request part; the variants take turns within each.
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// Longest one variant's connect loop may take in one round, seconds.
    #[arg(long, default_value_t = 20.0)]
    pub max_round_seconds: f64,
    /// Requests of each kind (non-streamed, SSE) per variant per round.
    #[arg(long, default_value_t = 40)]
    pub requests: usize,
    /// Simulator profile and time scale of the request part (short requests).
    #[arg(long, default_value = "tiny")]
    pub request_profile: String,
    #[arg(long, default_value_t = 0.1)]
    pub request_time_scale: f64,
    /// Clients of the fail-over part, each in its own cgroup with its own prefix.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Requests per client before the agent's kill, and as many after it.
    #[arg(long, default_value_t = 16)]
    pub half: usize,
    /// Each client's system-prompt tokens.
    #[arg(long, default_value_t = 2048)]
    pub system_tokens: usize,
    /// KV blocks per simulator (16 tokens each): room for about half the clients' prefixes.
    #[arg(long, default_value_t = 320)]
    pub num_gpu_blocks: usize,
    #[arg(long, default_value = "llama-3.1-8b-h100")]
    pub profile: String,
    /// Wall seconds per modelled second in the fail-over part.
    #[arg(long, default_value_t = 0.25)]
    pub time_scale: f64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Names what the run creates: netns `<tag>a`, `<tag>b`, `<tag>rn`, `<tag>r0`, ...,
    /// cgroups `warmpath-bench-<tag>*`, pins `<bpffs>/warmpath-bench-<tag>*` (lower-case
    /// letters and digits, at most 10; default `wpb` and this process's id).
    #[arg(long)]
    pub tag: Option<String>,
}

/// Runs the benchmark and prints its table; Ctrl-C ends it early, cleaned up.
pub async fn run(args: EbpfBenchArgs) -> Result<(), Error> {
    if let Some(why) = warmpath_agent::ebpf::unavailable_reason() {
        return Err(Error::Setup(format!(
            "bench ebpf loads eBPF programs and builds network namespaces: {why}"
        )));
    }
    let tag = args
        .tag
        .clone()
        .unwrap_or_else(|| format!("wpb{}", std::process::id() % 100_000));
    if tag.is_empty()
        || tag.len() > MAX_TAG
        || !tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(Error::Setup(format!(
            "--tag `{tag}`: lower-case letters and digits, 1 to {MAX_TAG} of them"
        )));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // Ctrl-C or SIGTERM: the rounds stop and everything is removed (not dropped mid-round:
    // `crate::run` leaves this benchmark's signals to it).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| Error::Io {
            what: "watching for SIGTERM".into(),
            source,
        })?;
    let ctrl_c = tokio::spawn(async move {
        tokio::select! {
            Ok(()) = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("interrupted: cleaning up");
        flag.store(true, Ordering::Relaxed);
    });
    let result = measure(&args, &tag, &stop).await;
    ctrl_c.abort();
    let report = result?;
    println!("{}", report.markdown());
    report.write(&args.out)?;
    println!(
        "wrote {} and {}",
        args.out.join("ebpf.json").display(),
        args.out.join("ebpf.md").display()
    );
    Ok(())
}

async fn measure(
    args: &EbpfBenchArgs,
    tag: &str,
    stop: &Arc<AtomicBool>,
) -> Result<report::Report, Error> {
    let logs = Logs::create(&args.out)?;
    eprintln!(
        "bench ebpf: connect() x {} per variant per round, {} rounds",
        args.connects, args.connect_rounds
    );
    let settings = connects::Settings {
        tag: tag.into(),
        rounds: args.connect_rounds,
        connects: args.connects,
        max_round: Duration::from_secs_f64(args.max_round_seconds.clamp(0.1, 600.0)),
    };
    let flag = stop.clone();
    let connects = tokio::task::spawn_blocking(move || connects::measure(&settings, &flag))
        .await
        .map_err(|e| Error::Setup(format!("the connect part panicked: {e}")))??;
    eprintln!(
        "bench ebpf: requests direct / proxy mode / proxy mode + sk_msg / steer, {} of each kind per variant per round",
        args.requests
    );
    let requests = requests::measure(
        &requests::Settings {
            tag: tag.into(),
            rounds: args.rounds,
            requests: args.requests,
            profile: args.request_profile.clone(),
            time_scale: args.request_time_scale,
        },
        &logs,
        stop,
    )
    .await?;
    eprintln!(
        "bench ebpf: TTFT with the agent killed halfway, {} clients",
        args.clients
    );
    let failover = failover::measure(
        &failover::Settings {
            tag: tag.into(),
            clients: args.clients,
            half: args.half,
            system_tokens: args.system_tokens,
            num_gpu_blocks: args.num_gpu_blocks,
            profile: args.profile.clone(),
            time_scale: args.time_scale,
            seed: args.seed,
        },
        &logs,
        stop,
    )
    .await?;
    let mut report = report::Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine(),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        connect: connects.rows,
        connect4_cost_us: connects.difference_us,
        connect4_kernel: connects.kernel,
        connect4_kernel_passing: connects.kernel_passing,
        requests,
        failover,
        targets: Vec::new(),
    };
    report.judge();
    Ok(report)
}

/// CPU model, cores and kernel, for the table's heading.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".into(), |s| s.trim().to_string());
    format!("{cpu}, {cores} cores, Linux {kernel}")
}
