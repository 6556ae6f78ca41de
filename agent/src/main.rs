//! The `warmpath` binary: parse the command line, run the chosen role.

use clap::Parser;
use warmpath::cli::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    warmpath::telemetry::init_tracing();
    match cli.command {
        Command::Agent(args) => warmpath::agent::run(*args).await?,
        Command::Sim(args) => run_sim(*args).await?,
        Command::Bench(cmd) => warmpath::bench::run(cmd).await?,
        Command::Status(args) => warmpath::status::run(&args).await?,
    }
    Ok(())
}

/// Starts the engines, prints one JSON "ready" line on stdout, serves until a signal.
async fn run_sim(args: warmpath_sim::cli::SimArgs) -> anyhow::Result<()> {
    let engines = warmpath_sim::cli::start(&args).await?;
    println!("{}", warmpath_sim::cli::ready_line(&engines));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
