//! The `warmpath` binary: parse the command line, run the chosen role.
//!
//! One executable for every role: the node agent (`warmpath-agent`), the engine simulator
//! (`warmpath-sim`), the benchmarks (`warmpath-bench`) and the status client.

use clap::{Parser, Subcommand};
use warmpath_agent::{args::AgentArgs, status::StatusArgs};
use warmpath_bench::BenchCommand;
use warmpath_sim::cli::SimArgs;

/// warmpath: KV-cache-aware inference routing for vLLM.
#[derive(Debug, Parser)]
#[command(name = "warmpath", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent.
    Agent(Box<AgentArgs>),
    /// Run vLLM-compatible engine simulators (one or a fleet) in this process.
    Sim(Box<SimArgs>),
    /// Show a running agent's tenants and pods (from its admin port).
    Status(StatusArgs),
    /// Benchmarks (see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Print the CustomResourceDefinitions of RoutePolicy and Tenant (docs/policy.md).
    Crds(warmpath_agent::policy::crds_command::CrdsArgs),
    /// Policy files: `validate` (docs/policy.md).
    #[command(subcommand)]
    Policy(warmpath_agent::policy::cli::PolicyCommand),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A benchmark sets up its own (`bench compare` logs to files, not over its table).
    if !matches!(cli.command, Command::Bench(_)) {
        warmpath_agent::telemetry::init_tracing();
    }
    match cli.command {
        Command::Agent(args) => warmpath_agent::agent::run(*args).await?,
        Command::Sim(args) => run_sim(*args).await?,
        Command::Bench(cmd) => warmpath_bench::run(cmd).await?,
        Command::Status(args) => warmpath_agent::status::run(&args).await?,
        Command::Crds(args) => warmpath_agent::policy::crds_command::run(&args)?,
        Command::Policy(cmd) => warmpath_agent::policy::cli::run(&cmd)?,
    }
    Ok(())
}

/// Starts the engines, prints one JSON "ready" line on stdout, serves until a signal.
async fn run_sim(args: SimArgs) -> anyhow::Result<()> {
    let engines = warmpath_sim::cli::start(&args).await?;
    println!("{}", warmpath_sim::cli::ready_line(&engines));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
