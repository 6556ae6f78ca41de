//! `warmpath bench ...`: measurements that back the numbers in docs/benchmarks.md.

mod agents;
mod chart;
pub mod cluster;
mod cluster_agents;
pub mod compare;
pub mod ebpf;
pub mod index;
mod logs;
pub mod matrix;
mod peers;
mod proc_stat;
mod process;
mod progress;
mod proxy;
pub mod run;
mod sim_streams;
pub mod soak;
pub mod workload;

use clap::Subcommand;

/// Loopback ports for child processes, from below the kernel's ephemeral range (the e2e
/// suites hand theirs out the same way).
pub use process::{free_port, free_port_where};
pub use sim_streams::SimStreamsArgs;

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Streams through a simulator fleet (a separate `warmpath sim` process): SSE chunks per
    /// second and the simulator's CPU use.
    SimStreams(SimStreamsArgs),
    /// The same workload through each routing policy, in front of identical fresh fleets.
    Compare(Box<compare::CompareArgs>),
    /// Issue #19's workload matrix: RAG, chat, agent loops and a no-sharing control at a load
    /// ladder, every router on fresh identical fleets; one table and the targets judged.
    Matrix(Box<matrix::MatrixArgs>),
    /// What the proxy adds: latency vs direct (and nginx), requests/s per core, decision cost.
    Proxy(proxy::ProxyBenchArgs),
    /// KV index: ingestion rate, lookup latency, bytes per entry, memory under the cap.
    Index(index::IndexBenchArgs),
    /// The cluster index: gossip convergence and bandwidth at 16 and 64 agents, delta and
    /// placement lag across agent processes, replica memory, a 1,000-node extrapolation.
    Cluster(Box<cluster::ClusterBenchArgs>),
    /// A seeded workload (shared-prefix, multi-turn, agentic, no-sharing, trace) against any
    /// OpenAI endpoint: report, JSON and charts.
    Run(Box<run::RunArgs>),
    /// Steady mixed load through an agent against simulator fleets (streams, cancellations,
    /// errors, a failing endpoint, fresh connections): RSS and descriptors over time, memory
    /// per idle stream.
    Soak(Box<soak::SoakArgs>),
    /// The eBPF data path (root): connect() cost and rate vs iptables REDIRECT, request
    /// latency direct vs proxy mode vs steer mode, TTFT with the agent killed (affinity
    /// fail-open vs the plain VIP fallback).
    Ebpf(Box<ebpf::EbpfBenchArgs>),
    /// `bench ebpf`'s client process (one request per stdin line, one answer per stdout line).
    #[command(hide = true)]
    EbpfClient(ebpf::ClientArgs),
    /// `bench compare`'s load generator in a pod of the intercepted row (one job on stdin,
    /// progress and samples on stdout).
    #[command(hide = true)]
    CompareClient(compare::PodClientArgs),
}

/// Errors that end a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Setup(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs a benchmark and prints its report. Sets up this process's tracing: `bench compare`
/// into its logs directory (the terminal is for its progress and table), the others to stderr.
/// On SIGINT or SIGTERM it drops the benchmark (stopping what it started), says so on stderr
/// and exits the process (130 or 143); `bench ebpf` finishes its cleanup first on its own.
pub async fn run(cmd: BenchCommand) -> Result<(), Error> {
    if !matches!(
        cmd,
        BenchCommand::Compare(_) | BenchCommand::Matrix(_) | BenchCommand::Cluster(_)
    ) {
        warmpath_agent::telemetry::init_tracing();
    }
    // `bench ebpf` stops its rounds itself on a signal and then removes what it made.
    let handles_signals = matches!(cmd, BenchCommand::Ebpf(_));
    let bench = async move {
        match cmd {
            BenchCommand::SimStreams(args) => sim_streams::run(args).await,
            BenchCommand::Compare(args) => compare::run(*args).await,
            BenchCommand::Matrix(args) => matrix::run(*args).await,
            BenchCommand::Proxy(args) => proxy::run(args).await,
            BenchCommand::Run(args) => run::run(*args).await,
            BenchCommand::Soak(args) => soak::run(*args).await,
            BenchCommand::Cluster(args) => cluster::run(*args).await,
            BenchCommand::Ebpf(args) => ebpf::run(*args).await,
            BenchCommand::EbpfClient(args) => ebpf::client::run(args).await,
            BenchCommand::CompareClient(args) => compare::run_pod_client(args).await,
            BenchCommand::Index(args) => tokio::task::spawn_blocking(move || index::run(args))
                .await
                .map_err(|e| Error::Setup(format!("index benchmark panicked: {e}"))),
        }
    };
    if handles_signals {
        return bench.await;
    }
    // Interrupted (Ctrl-C, or SIGTERM sent to this process alone), the benchmark is dropped
    // where it stands: every process it started is stopped and every network namespace,
    // cgroup and pin it made is removed as its guard drops, instead of outliving it. Then
    // the process exits at once: work on blocking threads (`bench index`, the gossip
    // measurement, a client role reading its stdin) would otherwise keep it alive.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| Error::Io {
            what: "watching for SIGTERM".into(),
            source,
        })?;
    let (signal, code) = tokio::select! {
        result = bench => return result,
        Ok(()) = tokio::signal::ctrl_c() => ("SIGINT", 130),
        _ = term.recv() => ("SIGTERM", 143),
    };
    eprintln!("Error: interrupted by {signal}: stopped every process the benchmark started");
    std::process::exit(code)
}
