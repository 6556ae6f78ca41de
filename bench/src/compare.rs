//! `warmpath bench compare`: the same seeded workload through each routing policy in turn,
//! each time in front of a fresh, identical simulator fleet (same seed, same KV capacity),
//! then one side-by-side table with ratios to round-robin (a plain Service).

use std::{path::PathBuf, sync::Arc};

use clap::Args;

use super::{
    Error,
    agents::Agents,
    cluster_agents::{self, AgentPods},
    logs::{BenchLog, Logs},
    process::fleet_flags,
    progress::Phase,
    workload::SharedPrefix,
};
use warmpath_agent::routing::Policy;

mod drive;
mod netns;
mod pod_client;
mod pods;

use drive::drive;
pub(crate) use drive::pool;
pub use pod_client::{PodClientArgs, run as run_pod_client};
pub use pods::{Intercept, PodRecord};

/// Options of `warmpath bench compare`.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub workload: SharedPrefix,
    /// Engines in each fleet.
    #[arg(long, default_value_t = 4)]
    pub replicas: u16,
    /// warmpath agents in front of the fleet, as on that many nodes (a DaemonSet): user `i`
    /// sends through agent `i mod N`. Each agent keeps its own load counts and routing
    /// history (on cluster mode, with the peers' placements in it); precise agents share one
    /// index as a cluster (--cluster). Peer routers run as one central instance.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub agents: u16,
    /// With several agents, the precise rows on cluster mode (docs/cluster.md): engine `j`
    /// on node `j mod N`, each agent subscribed to its own node's engines' KV events and
    /// replicating the others' from their agents (`on`); or every agent subscribed to every
    /// engine (`off`). The other policies read no KV events and run the same either way.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub cluster: Switch,
    /// With several agents, also run precise through one central agent subscribed to every
    /// engine (the row `Precise (1 agent)`), and print the multi-agent row's gap to it.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub central: Switch,
    /// KV blocks per engine (16 tokens each): small enough that the working set does not
    /// fit in every engine.
    #[arg(long, default_value_t = 640)]
    pub num_gpu_blocks: usize,
    #[arg(long, default_value = "llama-3.1-8b-h100")]
    pub profile: String,
    /// Wall seconds per modelled second. Real time by default: the agents' own loops (the
    /// engines' scrapes, the cluster's streams) run in wall time, so a compressed clock makes
    /// every peer's view of the fleet staler in modelled time than it is against a real
    /// engine (docs/benchmarks.md, "The demo in real time").
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Policies to compare, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round-robin,least-loaded,session,approximate,precise"
    )]
    pub policies: Vec<Policy>,
    /// Peer routers to add as rows: `auto` (those installed), `none`, or names
    /// (`vllm-router-kv`, `vllm-router-cache`, `sglang-router-cache`).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    pub peers: Vec<String>,
    /// Also run warmpath precise behind transparent interception, its clients in pod network
    /// namespaces and cgroups dialling a Service VIP that each node's agent intercepts with
    /// cgroup/connect4: `auto` (when privileged and supported), `on`, `off`.
    #[arg(long, default_value = "auto")]
    pub ebpf: String,
    /// Scorer weight overrides for the precise rows (`NAME=W`, repeatable; docs/routing.md).
    #[arg(long = "precise-weight", value_name = "NAME=W")]
    pub precise_weights: Vec<String>,
    /// Give up on a policy's run after this many wall seconds.
    #[arg(long, default_value_t = 120.0)]
    pub max_seconds: f64,
    /// Directory for this run's output: `logs/` (one file per process the run starts, and
    /// `bench.log` for its own), and the JSON and charts unless --json / --chart say otherwise.
    #[arg(long, value_name = "DIR", default_value = "warmpath-compare")]
    pub out: PathBuf,
    /// Write the results as JSON here (default `<out>/compare.json`).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the TTFT CDF per policy here (SVG or PNG by extension; the other format is
    /// written beside it; default `<out>/compare.svg`).
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,
}

/// A setting that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// Requests sent one after another by one client: each no earlier than its `at`, and after
/// the previous one's answer. With `grow`, each prompt is the conversation so far: every
/// earlier prompt and answer, then this turn's text (multi-turn chat, agent loops).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Chain {
    pub turns: Vec<super::workload::Planned>,
    pub grow: bool,
}

impl Chain {
    /// Independent requests, one chain each (the shared-prefix plan).
    pub fn singles(plan: Vec<super::workload::Planned>) -> Vec<Self> {
        plan.into_iter()
            .map(|p| Self {
                turns: vec![p],
                grow: false,
            })
            .collect()
    }
}

/// What a row needs of the run besides its plan: the fleet, the agents, the limits.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub replicas: u16,
    pub agents: u16,
    pub cluster: Switch,
    pub num_gpu_blocks: usize,
    pub profile: String,
    pub time_scale: f64,
    pub seed: u64,
    pub precise_weights: Vec<String>,
    pub max_seconds: f64,
}

impl CompareArgs {
    fn setup(&self) -> Setup {
        Setup {
            replicas: self.replicas,
            agents: self.agents,
            cluster: self.cluster,
            num_gpu_blocks: self.num_gpu_blocks,
            profile: self.profile.clone(),
            time_scale: self.time_scale,
            seed: self.seed,
            precise_weights: self.precise_weights.clone(),
            max_seconds: self.max_seconds,
        }
    }
}

/// One policy's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub policy: String,
    pub requests: usize,
    pub errors: usize,
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    pub ttft_p99: f64,
    pub e2e_p50: f64,
    pub output_tokens_per_s: f64,
    pub prefix_hit_ratio: f64,
    /// Prompt tokens of the answered requests (from their usage).
    pub prompt_tokens: u64,
    /// Route receipts summed over the answered requests (docs/routing.md "Route receipts"):
    /// the longest prefix any ready pod held and what the chosen pod held, from the agents'
    /// explain headers (`None` when no request had them: a peer router), and what the engines
    /// delivered (`usage.prompt_tokens_details.cached_tokens`).
    pub available_tokens: Option<u64>,
    pub captured_tokens: Option<u64>,
    pub delivered_tokens: u64,
    /// Sequences the engines preempted (`vllm:num_preemptions`: KV ran out, their blocks were
    /// freed and their prompt recomputed), summed over the fleet for the run.
    pub preemptions: u64,
    /// Median of |predicted - measured TTFT| (modelled ms) over the requests whose answer
    /// carried the cost model's `x-warmpath-predicted-ttft-ms`; `None` without any.
    pub ttft_prediction_error_ms_p50: Option<f64>,
    /// Requests answered through each agent (one entry for a peer router).
    pub requests_per_agent: Vec<usize>,
    /// A cluster row's agents: what each subscribed to and replicated when the run started
    /// (from their `/status`); empty for other rows.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cluster: Vec<AgentPods>,
    /// The intercepted row's pods: where each client ran and what its agent intercepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intercept: Option<Intercept>,
    /// Every TTFT, sorted (for the chart).
    #[serde(skip)]
    pub ttfts: Vec<f64>,
    /// What pooling this row with runs of other seeds needs (`bench matrix --repeats`).
    #[serde(skip)]
    pub raw: RawRun,
}

/// A row's raw measurements: every answered request, the run's length and the engines'
/// prefix counters, so rows of several runs pool into one ([`drive::pool`]) with the
/// figures a single longer run would give.
#[derive(Debug, Clone, Default)]
pub struct RawRun {
    pub samples: Vec<crate::run::report::Sample>,
    /// Wall seconds of the run.
    pub wall_s: f64,
    /// Wall seconds per modelled second.
    pub scale: f64,
    /// The engines' prefix-cache hits and lookups (blocks).
    pub prefix_hits: u64,
    pub prefix_queries: u64,
}

/// Runs the comparison. Interrupted ([`crate::run`]: Ctrl-C or SIGTERM), it ends where it
/// stands, every process it started stopped and every namespace, cgroup and pin of the
/// intercepted row removed as their guards drop.
pub async fn run(args: CompareArgs) -> Result<(), Error> {
    // Logs first: from here on this process's own tracing goes to bench.log, not the terminal.
    let logs = Logs::create(&args.out)?;
    let bench_log = BenchLog::install(&logs)?;
    let plan = args.workload.plan(args.seed);
    if args.workload.skew > 0.0 {
        println!(
            "group popularity: Zipf, exponent {} (users per group: {:?})",
            args.workload.skew,
            super::workload::users_per_group(
                args.workload.groups,
                args.workload.users,
                args.workload.skew
            )
        );
    }
    println!(
        "bench compare: {} requests ({} groups x {} users x {} rounds, {} shared + {} question tokens, {} output), {:.1} req/s, {} engines x {} blocks, {} warmpath agent(s){}, profile {}, time-scale {}",
        plan.len(),
        args.workload.groups,
        args.workload.users,
        args.workload.rounds,
        if args.workload.no_sharing {
            0
        } else {
            args.workload.system_tokens
        },
        args.workload.question_tokens,
        args.workload.output_tokens,
        args.workload.rate,
        args.replicas,
        args.num_gpu_blocks,
        args.agents,
        if args.agents > 1 && args.cluster == Switch::On {
            " (precise: a cluster, each agent subscribed to its own node's engines)"
        } else {
            ""
        },
        args.profile,
        args.time_scale
    );
    let mut targets = Vec::new();
    for p in &args.policies {
        targets.push(Target::Warmpath(*p));
        if *p == Policy::Precise && args.agents > 1 && args.central == Switch::On {
            targets.push(Target::Central);
        }
    }
    match (args.ebpf.as_str(), pods::unavailable_reason()) {
        ("off", _) => {}
        ("auto" | "on", None) => targets.push(Target::Intercepted),
        ("auto", Some(why)) => println!("(transparent interception row skipped: {why})"),
        ("on", Some(why)) => return Err(Error::Setup(format!("--ebpf on: {why}"))),
        (other, _) => {
            return Err(Error::Setup(format!(
                "--ebpf {other}: expected auto, on or off"
            )));
        }
    }
    targets.extend(select_peers(&args.peers)?.into_iter().map(Target::Peer));
    // Before any row runs: a cluster row that cannot start would end the run midway.
    let clustered =
        |t: &Target| matches!(t, Target::Warmpath(Policy::Precise) | Target::Intercepted);
    if args.agents > 1 && args.cluster == Switch::On && targets.iter().any(clustered) {
        cluster_agents::check_nodes(args.agents, args.replicas)?;
    }
    let mut rows = Vec::new();
    let count = targets.len();
    let setup = args.setup();
    let requests = plan.len() as u64;
    let chains = Arc::new(Chain::singles(plan));
    for (i, target) in targets.into_iter().enumerate() {
        let label = format!("[{}/{count}] {}", i + 1, target.name());
        let phase = Arc::new(Phase::start(label, requests));
        let row = match run_target(&setup, target, chains.clone(), &logs, &phase).await {
            Ok(row) => row,
            // A peer that cannot run here is reported, not fatal.
            Err(e) if matches!(target, Target::Peer(_)) => {
                phase.finish(&format!("skipped: {e}"));
                continue;
            }
            Err(e) => return Err(e),
        };
        phase.finish(&format!(
            "{} requests, {} errors, p90 TTFT {:.3} s",
            row.requests, row.errors, row.ttft_p90
        ));
        rows.push(row);
    }
    print_table(&rows);
    print_central_gap(&rows);
    print_peer_ratios(&rows);
    write_outputs(&args, &rows)?;
    println!("{}", bench_log.summary());
    Ok(())
}

/// The JSON and both chart formats, where --out / --json / --chart say; prints each path.
fn write_outputs(args: &CompareArgs, rows: &[Row]) -> Result<(), Error> {
    let json_path = args
        .json
        .clone()
        .unwrap_or_else(|| args.out.join("compare.json"));
    let json = serde_json::to_string_pretty(rows).map_err(|e| Error::Setup(e.to_string()))?;
    std::fs::write(&json_path, json).map_err(|source| Error::Io {
        what: format!("write {}", json_path.display()),
        source,
    })?;
    println!("results: {}", json_path.display());
    let chart = args
        .chart
        .clone()
        .unwrap_or_else(|| args.out.join("compare.svg"));
    let series: Vec<(String, Vec<f64>)> = rows
        .iter()
        .map(|r| (r.policy.clone(), r.ttfts.clone()))
        .collect();
    // The asked-for file, and the other format beside it (SVG for docs, PNG for chat).
    let other = match chart.extension().and_then(|e| e.to_str()) {
        Some("png") => chart.with_extension("svg"),
        _ => chart.with_extension("png"),
    };
    for p in [chart.as_path(), other.as_path()] {
        super::chart::ttft_cdf(p, &series)?;
        println!("chart: {}", p.display());
    }
    Ok(())
}

/// What a run goes through: warmpath with a policy, or a peer router.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    Warmpath(Policy),
    /// Precise through one agent subscribed to every engine, whatever --agents says.
    Central,
    /// Precise, with clients in pod namespaces connecting to a VIP that connect4 redirects
    /// to their node's agent.
    Intercepted,
    Peer(super::peers::Peer),
}

impl Target {
    pub(crate) fn name(&self) -> String {
        match self {
            Target::Warmpath(p) => format!("{p:?}"),
            Target::Central => CENTRAL_ROW.into(),
            Target::Intercepted => "Precise (eBPF intercept)".into(),
            Target::Peer(p) => p.name.to_string(),
        }
    }
}

/// The peers `--peers` asks for.
pub(crate) fn select_peers(asked: &[String]) -> Result<Vec<super::peers::Peer>, Error> {
    use super::peers::PEERS;
    let by_flag = |n: &str| match n {
        "vllm-router-kv" => Some(PEERS[0]),
        "vllm-router-cache" => Some(PEERS[1]),
        "sglang-router-cache" => Some(PEERS[2]),
        _ => None,
    };
    let mut out = Vec::new();
    for a in asked {
        match a.as_str() {
            "none" => return Ok(Vec::new()),
            "auto" => out.extend(PEERS.iter().copied().filter(|p| p.installed())),
            name => out.push(by_flag(name).ok_or_else(|| {
                Error::Setup(format!("--peers {name}: expected auto, none, vllm-router-kv, vllm-router-cache or sglang-router-cache"))
            })?),
        }
    }
    out.dedup();
    Ok(out)
}

/// The name of the central precise row.
pub(crate) const CENTRAL_ROW: &str = "Precise (1 agent)";

/// The multi-agent precise row against the central one, when both ran.
fn print_central_gap(rows: &[Row]) {
    let find = |name: &str| rows.iter().find(|r| r.policy == name);
    if let (Some(agents), Some(central)) = (find("Precise"), find(CENTRAL_ROW)) {
        let mode = if agents.cluster.is_empty() {
            "every agent subscribed to every engine"
        } else {
            "cluster"
        };
        println!(
            "{} agents ({mode}) against one:",
            agents.requests_per_agent.len()
        );
        for line in cluster_agents::gap_lines(&judged(agents), &judged(central)) {
            println!("  {line}");
        }
    }
}

/// What the cluster's gap lines judge of `row`.
fn judged(row: &Row) -> cluster_agents::Judged<'_> {
    cluster_agents::Judged {
        policy: &row.policy,
        prefix_hit_ratio: row.prefix_hit_ratio,
        ttft_p90: row.ttft_p90,
    }
}

/// warmpath precise against each peer row.
fn print_peer_ratios(rows: &[Row]) {
    let Some(precise) = rows.iter().find(|r| r.policy == "Precise") else {
        return;
    };
    for peer in rows.iter().filter(|r| r.policy.contains("-router")) {
        println!(
            "warmpath precise vs {}: p90 TTFT {:.2}x, output throughput {:.2}x",
            peer.policy,
            precise.ttft_p90 / peer.ttft_p90,
            precise.output_tokens_per_s / peer.output_tokens_per_s
        );
    }
}

pub(crate) async fn run_target(
    args: &Setup,
    target: Target,
    plan: Arc<Vec<Chain>>,
    logs: &Logs,
    phase: &Arc<Phase>,
) -> Result<Row, Error> {
    let mut sim_flags = vec!["sim".to_string()];
    sim_flags.extend(fleet_flags(args.replicas, &args.profile, args.time_scale));
    sim_flags.extend(
        [
            "--num-gpu-blocks",
            &args.num_gpu_blocks.to_string(),
            "--max-model-len",
            &(args.num_gpu_blocks * 16).min(32_768).to_string(),
            "--seed",
            &args.seed.to_string(),
            "--kv-events-port",
            "0",
            "--kv-replay-port",
            "0",
        ]
        .map(String::from),
    );
    // The intercepted row builds a node around its fleet (its sockets in the node's
    // namespace): compare/pods.rs.
    let policy = match target {
        Target::Intercepted => return pods::run_row(args, sim_flags, plan, logs, phase).await,
        Target::Peer(_) | Target::Central => Policy::Precise,
        Target::Warmpath(policy) => policy,
    };
    let (sim, engines) = super::process::start_fleet(sim_flags).await?;
    let result = match target {
        Target::Peer(peer) => run_peer(args, peer, plan, logs, phase, &engines, &sim.model).await,
        _ => run_agents(args, target, policy, plan, logs, phase, &engines).await,
    };
    for e in engines {
        e.shutdown();
    }
    result
}

/// The plan through one peer router in front of `engines`.
async fn run_peer(
    args: &Setup,
    peer: super::peers::Peer,
    plan: Arc<Vec<Chain>>,
    logs: &Logs,
    phase: &Arc<Phase>,
    engines: &[warmpath_sim::fleet::RunningEngine],
    model: &str,
) -> Result<Row, Error> {
    let (mut router, base) = peer.start(engines, model, logs).await?;
    let urls = [format!("{base}/v1/completions")];
    let row = drive(args, &Target::Peer(peer), plan, engines, &urls, phase).await;
    // A router that died mid-run explains the run's errors better than their count.
    router.check_running()?;
    router.stop(super::agents::STOP_WITHIN).await;
    row
}

/// The plan through `args.agents` warmpath agents (processes of their own) with `policy`.
async fn run_agents(
    args: &Setup,
    target: Target,
    policy: Policy,
    plan: Arc<Vec<Chain>>,
    logs: &Logs,
    phase: &Arc<Phase>,
    engines: &[warmpath_sim::fleet::RunningEngine],
) -> Result<Row, Error> {
    let (flags, cluster) = agent_flags(args, target, policy, engines)?;
    let role = match target {
        Target::Central => format!("agent-{}-central", policy_flag(policy)),
        _ => format!("agent-{}", policy_flag(policy)),
    };
    let mut agents = Agents::start(&flags, &role, logs).await?;
    let mut held = Vec::new();
    if cluster {
        let (pods, took) = cluster_agents::wait_converged(&mut agents, engines).await?;
        phase.note(&format!(
            "  cluster: {} agents converged {:.1} s after they were ready (each subscribed to its own node's engines, replicating the others')",
            flags.len(),
            took.as_secs_f64()
        ));
        held = pods;
    }
    let urls: Vec<String> = agents
        .listens()
        .map(|a| format!("http://{a}/v1/completions"))
        .collect();
    let row = drive(args, &target, plan, engines, &urls, phase)
        .await
        .map(|row| Row {
            cluster: held,
            ..row
        });
    agents.check_running()?;
    agents.stop().await;
    row
}

/// Each agent's flags for a row of `target` with `policy` in front of `engines` (without
/// `--listen` and `--admin`), and whether they form a cluster.
fn agent_flags(
    args: &Setup,
    target: Target,
    policy: Policy,
    engines: &[warmpath_sim::fleet::RunningEngine],
) -> Result<(Vec<Vec<String>>, bool), Error> {
    // --explain: the route receipt and the cost model's prediction come back as headers.
    let mut common = vec![
        "--policy".to_string(),
        policy_flag(policy),
        "--explain".into(),
    ];
    if policy == Policy::Precise {
        for w in &args.precise_weights {
            common.extend(["--weight".into(), w.clone()]);
        }
    }
    let count = match target {
        Target::Central => 1,
        _ => usize::from(args.agents),
    };
    let cluster = policy == Policy::Precise && count > 1 && args.cluster == Switch::On;
    let flags = if cluster {
        cluster_agents::agent_flags(&common, engines, count)?
    } else {
        let mut flags = common;
        flags.extend(
            engines
                .iter()
                .flat_map(cluster_agents::subscribed_engine_flags),
        );
        vec![flags; count]
    };
    // Parsed here first: a bad --precise-weight is a usage error, not an agent's early exit.
    let mut argv = vec!["agent".to_string()];
    argv.extend(flags.first().into_iter().flatten().cloned());
    <warmpath_agent::args::AgentArgs as clap::Parser>::try_parse_from(argv)
        .map_err(|e| Error::Setup(e.to_string()))?;
    Ok((flags, cluster))
}

/// `--policy` of `warmpath agent` for `policy` (its clap name).
fn policy_flag(policy: Policy) -> String {
    clap::ValueEnum::to_possible_value(&policy)
        .map_or_else(|| format!("{policy:?}"), |v| v.get_name().to_string())
}

fn print_table(rows: &[Row]) {
    let base = rows.iter().find(|r| r.policy == "RoundRobin");
    println!();
    println!(
        "| policy | requests | errors | TTFT p50 (s) | TTFT p90 (s) | TTFT p99 (s) | e2e p50 (s) | output tok/s | prefix hit % | p90 TTFT vs RR | throughput vs RR |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let ratio = |a: f64, b: Option<f64>| b.map_or("-".into(), |b| format!("{:.2}x", a / b));
        println!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.0} | {:.1} | {} | {} |",
            r.policy,
            r.requests,
            r.errors,
            r.ttft_p50,
            r.ttft_p90,
            r.ttft_p99,
            r.e2e_p50,
            r.output_tokens_per_s,
            r.prefix_hit_ratio * 100.0,
            ratio(r.ttft_p90, base.map(|b| b.ttft_p90)),
            ratio(r.output_tokens_per_s, base.map(|b| b.output_tokens_per_s)),
        );
    }
    println!("(times in modelled seconds: wall-clock divided by --time-scale)");
}
