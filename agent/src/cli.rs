//! Command-line interface: one subcommand per role of the `warmpath` binary.

use std::{net::SocketAddrV4, path::PathBuf};

use clap::{Args, Parser, Subcommand};

/// warmpath: KV-cache-aware inference routing for vLLM.
#[derive(Debug, Parser)]
#[command(name = "warmpath", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent.
    Agent(AgentArgs),
    /// Run vLLM-compatible engine simulators (one or a fleet) in this process.
    Sim(Box<warmpath_sim::cli::SimArgs>),
    /// Benchmarks (see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
}

/// Options of `warmpath agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Where the routing proxy listens (with at least one --endpoint).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,

    /// Admin listener: /status, /metrics, /ready, /live.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
    pub admin: std::net::SocketAddr,

    /// Served model name of the pool.
    #[arg(long, default_value = "sim-llama")]
    pub model: String,

    /// A vLLM endpoint (`http://host:port`). Repeatable; the n-th --kv-events and
    /// --kv-replay belong to the n-th endpoint.
    #[arg(long = "endpoint", value_name = "URL")]
    pub endpoints: Vec<String>,

    /// KV events endpoint of the matching --endpoint (`tcp://host:port`).
    #[arg(long = "kv-events", value_name = "ZMQ")]
    pub kv_events: Vec<String>,

    /// Replay endpoint of the matching --endpoint.
    #[arg(long = "kv-replay", value_name = "ZMQ")]
    pub kv_replay: Vec<String>,

    /// HuggingFace tokenizer directory (default: the built-in one the simulator uses).
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,

    /// Tokens per KV block; must match vLLM --block-size.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,

    /// How endpoints are chosen.
    #[arg(long, value_enum, default_value_t = crate::routing::Policy::Precise)]
    pub policy: crate::routing::Policy,

    /// Add x-warmpath-pod / -prefix-blocks / -score headers to responses.
    #[arg(long)]
    pub explain: bool,

    /// Intercept connections to VIP:PORT and send them to TARGET:PORT instead, in the kernel
    /// (cgroup/connect4). Repeatable. Example: `--redirect 127.77.0.1:8000=127.0.0.1:8100`.
    #[arg(long = "redirect", value_name = "VIP:PORT=TARGET:PORT", value_parser = parse_redirect)]
    pub redirects: Vec<Redirect>,

    /// cgroup v2 directory whose processes are intercepted (default: the cgroup v2 root, i.e.
    /// every process on the node).
    #[arg(long, value_name = "DIR")]
    pub cgroup: Option<PathBuf>,

    /// Where bpffs is (mounted there if absent).
    #[arg(long, value_name = "DIR", default_value = crate::ebpf::DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
}

/// One `--redirect` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redirect {
    pub vip: SocketAddrV4,
    pub target: SocketAddrV4,
}

fn parse_redirect(s: &str) -> Result<Redirect, String> {
    let (vip, target) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected VIP:PORT=TARGET:PORT"))?;
    let parse = |what: &str, v: &str| {
        v.trim().parse::<SocketAddrV4>().map_err(|e| {
            format!("{what} `{v}`: {e} (expected an IPv4 address and port, e.g. 127.77.0.1:8000)")
        })
    };
    Ok(Redirect {
        vip: parse("VIP", vip)?,
        target: parse("target", target)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redirect_rules() {
        let r = parse_redirect("127.77.0.1:8000=127.0.0.1:8100").unwrap();
        assert_eq!(r.vip, "127.77.0.1:8000".parse().unwrap());
        assert_eq!(r.target, "127.0.0.1:8100".parse().unwrap());
        assert!(
            parse_redirect("127.77.0.1:8000")
                .unwrap_err()
                .contains("VIP:PORT=TARGET:PORT")
        );
        assert!(
            parse_redirect("x=127.0.0.1:1")
                .unwrap_err()
                .contains("VIP `x`")
        );
        assert!(
            parse_redirect("127.0.0.1:1=[::1]:2")
                .unwrap_err()
                .contains("target")
        );
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
