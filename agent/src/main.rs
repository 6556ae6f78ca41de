//! The `warmpath` binary: parse the command line, run the chosen role.

use clap::Parser;
use warmpath::cli::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    warmpath::telemetry::init_tracing();
    match cli.command {
        Command::Agent(args) => warmpath::agent::run(args).await?,
    }
    Ok(())
}
