//! `warmpath agent`, `warmpath sim` and `warmpath bench` as a binary of this package, for the
//! suites that need them as processes of their own (the soak measures the agent's memory from
//! outside; the compare suite reads what a bench prints): cargo builds it before the suites
//! and names it in `CARGO_BIN_EXE_warmpath-roles`.

use clap::{Parser, Subcommand};
use warmpath_agent::args::AgentArgs;
use warmpath_bench::BenchCommand;
use warmpath_sim::cli::SimArgs;

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// The node agent, as `warmpath agent`.
    Agent(Box<AgentArgs>),
    /// Simulated engines, as `warmpath sim` (the same ready line on stdout).
    Sim(Box<SimArgs>),
    /// Benchmarks, as `warmpath bench` (their processes are this binary's other roles).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    match Cli::parse().role {
        Role::Agent(args) => {
            // As `warmpath agent` logs (to stderr, which a bench sends to the agent's log).
            warmpath_agent::telemetry::init_tracing();
            warmpath_agent::agent::run(*args).await?
        }
        Role::Bench(cmd) => warmpath_bench::run(cmd).await?,
        Role::Sim(args) => {
            let engines = warmpath_sim::cli::start(&args).await?;
            println!("{}", warmpath_sim::cli::ready_line(&engines));
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
    }
    Ok(())
}
