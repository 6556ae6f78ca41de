//! `warmpath bench matrix`: issue #19's workload matrix in one command. Every workload
//! ([`workloads`]) at every load of the ladder is a cell; every cell runs each row — round-
//! robin, least-loaded, warmpath precise through `--agents` agents (cluster mode, as `bench
//! compare`) and through one central agent, and each peer router — in front of a fresh,
//! identical simulator fleet whose KV capacity is below the cell's working set. One table
//! (terminal, `<out>/matrix.md`, `<out>/matrix.json`), then the targets per cell
//! ([`verdict`]).
//!
//! The ladder: load 1.0x is the rate at which the cell's fleet saturates serving every
//! request cold, bound by prefill compute and by the requests its KV holds at once
//! ([`ladder`]); a cache-blind router saturates there, a cache-aware one has headroom in
//! proportion to its hits.

pub mod floor;
pub mod interval;
pub mod ladder;
pub mod reach;
mod requests;
mod table;
pub mod tail;
pub mod verdict;
pub mod workloads;

use std::{path::PathBuf, sync::Arc};

use clap::Args;
use warmpath_agent::routing::Policy;

use super::{
    Error,
    compare::{self, Row, Setup, Switch, Target},
    logs::{BenchLog, Logs},
    peers::PEERS,
    progress::Phase,
};
use workloads::{Generated, Sizes, Workload};

/// Options of `warmpath bench matrix`.
#[derive(Debug, Clone, Args)]
pub struct MatrixArgs {
    /// Workloads (rows of cells): `rag:SKEW:TOKENS` (Zipf-popular documents of TOKENS tokens),
    /// `chat`, `chat:SHARED` (every session opening with one system prompt of SHARED tokens),
    /// `agentic`, `no-sharing`, `mix` (RAG, chat, agentic and no-sharing on one fleet at once),
    /// `mooncake:FILE` (windows of a request trace in the Mooncake format, replayed shrunk).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "rag:0.6:1000,rag:1.0:2500,rag:1.4:1000,rag:1.4:2500,chat,agentic,no-sharing"
    )]
    pub workloads: Vec<Workload>,
    /// The load ladder, as multiples of the rate at which the cell's fleet saturates serving
    /// every request cold (prefill and KV bound; see the module docs).
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.8,1.0")]
    pub loads: Vec<f64>,
    /// Requests per cell (chat and agentic: rounded up to whole sessions).
    #[arg(long, default_value_t = 120)]
    pub requests: usize,
    /// Prompt tokens per block of a `mooncake:FILE` trace's `hash_ids` (Mooncake's: 512).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub trace_block_size: u32,
    /// Tokens each block of a trace becomes in the replay (and its answers shrink alike):
    /// 64 shrinks Mooncake's eightfold. Default 64, 4 with --quick.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub trace_block_tokens: Option<u32>,
    /// Tiny requests (a few tokens each) for tests; --requests still sets how many.
    #[arg(long)]
    pub quick: bool,
    /// The fleet's KV capacity as a share of the cell's working set (each engine gets at least
    /// twice its longest request).
    #[arg(long, default_value_t = 0.5)]
    pub kv_fraction: f64,
    /// Engines in each fleet.
    #[arg(long, default_value_t = 4)]
    pub replicas: u16,
    /// warmpath agents of the multi-agent precise row (a cluster, as `bench compare`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub agents: u16,
    #[arg(long, default_value = "llama-3.1-8b-h100")]
    pub profile: String,
    /// Wall seconds per modelled second.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Runs of each cell, on seeds SEED, SEED+1, ...: each run draws its own requests (same
    /// workload, rate and fleet) and starts fresh fleets; a row's figures pool the answers of
    /// all its runs (its p90 over N times the requests). Rows alternate within each run, so
    /// a slow spell of the machine falls on every row alike.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeats: u32,
    /// Peer routers: `auto` (all three; a missing one gets a "not installed" row), `none`,
    /// or names (`vllm-router-kv`, `vllm-router-cache`, `sglang-router-cache`).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    pub peers: Vec<String>,
    /// Scorer weight overrides for the precise rows (`NAME=W`, repeatable).
    #[arg(long = "precise-weight", value_name = "NAME=W")]
    pub precise_weights: Vec<String>,
    /// Give up on a row after this many wall seconds (its unanswered requests fail).
    #[arg(long, default_value_t = 90.0)]
    pub max_seconds: f64,
    /// Print each cell's floor (the TTFT quantiles no router can beat on its plans) and stop:
    /// no fleet, no router, nothing written.
    #[arg(long)]
    pub floor_only: bool,
    /// Directory for `matrix.md`, `matrix.json`, `requests.jsonl` (every answered request as
    /// its client saw it) and `logs/`.
    #[arg(long, value_name = "DIR", default_value = "warmpath-matrix")]
    pub out: PathBuf,
}

/// One row of a cell: its results, or why there are none.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CellRow {
    pub name: String,
    /// `ok`, `not installed`, or the error that ended it.
    pub status: String,
    /// With `--repeats` above 1, the answers of every run pooled.
    pub result: Option<Row>,
    /// Each run's own figures, in run order (with `--repeats` above 1): how far the pooled
    /// figures move from run to run ([`verdict`] judges each run too).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunFigures>,
    /// Each run's answered TTFTs by chain, in run order: what [`interval`] resamples (empty
    /// for a row that did not run).
    #[serde(skip)]
    pub answers: Vec<interval::RunAnswers>,
    /// Where its slowest answers came from, by their receipts ([`tail`]; none for a row that
    /// did not run or answered nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail: Option<tail::Anatomy>,
    /// Its answers warm and cold, its runs pooled ([`reach`]: what the rows' best could put
    /// within a limit; empty for a row that did not run).
    #[serde(skip)]
    pub split: reach::Split,
}

/// One run's figures of a row (seconds, tokens/s, failed requests).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RunFigures {
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    pub ttft_p99: f64,
    pub output_tokens_per_s: f64,
    pub errors: usize,
}

impl From<&Row> for RunFigures {
    fn from(r: &Row) -> Self {
        Self {
            ttft_p50: r.ttft_p50,
            ttft_p90: r.ttft_p90,
            ttft_p99: r.ttft_p99,
            output_tokens_per_s: r.output_tokens_per_s,
            errors: r.errors,
        }
    }
}

/// One workload at one load, every row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cell {
    pub workload: String,
    pub shares: bool,
    pub load: f64,
    /// Offered requests per modelled second.
    pub rate: f64,
    pub requests: usize,
    pub working_set_tokens: usize,
    pub blocks_per_engine: usize,
    /// The TTFT quantiles no router can beat on this cell's plans ([`floor`]).
    pub floor: floor::Floor,
    pub rows: Vec<CellRow>,
}

/// What runs in a cell: a target, or a peer that is not installed.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Run(Target),
    NotInstalled(&'static str),
}

/// Tokens per KV block of the fleets (the simulator's default).
const BLOCK_SIZE: usize = 16;

/// The longest request a cell may hold (prompt and answer): the fleets' `--max-model-len`.
const MAX_REQUEST_TOKENS: usize = 32_768;

/// Estimated wall seconds to start and stop a row's fleet and router(s) and to drain its
/// last requests (a debug build on a loaded 2-core machine: 1-3 s measured).
const ROW_SETUP_S: f64 = 4.0;

/// The settings a cell's rows share, its KV sized for the largest working set and the
/// longest request of its runs (`runs`: one plan per seed), and that working set.
fn setup(args: &MatrixArgs, runs: &[Generated]) -> (Setup, usize, usize) {
    let block = BLOCK_SIZE;
    let working_set = runs.iter().map(|g| g.working_set_tokens).max().unwrap_or(0);
    let longest = runs.iter().map(|g| g.longest_tokens).max().unwrap_or(0);
    let fleet = (args.kv_fraction * working_set as f64 / block as f64).ceil() as usize;
    let per_engine = fleet.div_ceil(usize::from(args.replicas.max(1)));
    let blocks = per_engine.max(2 * longest.div_ceil(block));
    let s = Setup {
        replicas: args.replicas,
        agents: args.agents,
        cluster: Switch::On,
        num_gpu_blocks: blocks,
        profile: args.profile.clone(),
        time_scale: args.time_scale,
        seed: args.seed,
        precise_weights: args.precise_weights.clone(),
        max_seconds: args.max_seconds,
    };
    (s, blocks, working_set)
}

fn slots(args: &MatrixArgs) -> Result<Vec<Slot>, Error> {
    let mut out = vec![
        Slot::Run(Target::Warmpath(Policy::RoundRobin)),
        Slot::Run(Target::Warmpath(Policy::LeastLoaded)),
        Slot::Run(Target::Warmpath(Policy::Precise)),
    ];
    if args.agents > 1 {
        out.push(Slot::Run(Target::Central));
    }
    let asked = compare::select_peers(&args.peers)?;
    let auto = args.peers.iter().any(|p| p == "auto");
    for peer in PEERS {
        if asked.contains(&peer) {
            out.push(Slot::Run(Target::Peer(peer)));
        } else if auto {
            out.push(Slot::NotInstalled(peer.name));
        }
    }
    Ok(out)
}

pub async fn run(args: MatrixArgs) -> Result<(), Error> {
    let profile = warmpath_sim::engine::timing::Profile::by_name(&args.profile)
        .ok_or_else(|| Error::Setup(format!("--profile {}: no such profile", args.profile)))?;
    if args.loads.is_empty() || args.loads.iter().any(|l| !(l.is_finite() && *l > 0.0)) {
        return Err(Error::Setup("--loads: each must be > 0".into()));
    }
    if args.workloads.is_empty()
        || args.requests == 0
        || args.kv_fraction.is_nan()
        || args.kv_fraction <= 0.0
    {
        return Err(Error::Setup(
            "--workloads, --requests and --kv-fraction must be non-empty / > 0".into(),
        ));
    }
    let slots = slots(&args)?;
    let runs = slots.iter().filter(|s| matches!(s, Slot::Run(_))).count();
    if args.agents > 1 {
        super::cluster_agents::check_nodes(args.agents, args.replicas)?;
    }
    let mut sizes = if args.quick {
        Sizes::quick(args.requests)
    } else {
        Sizes::full(args.requests)
    };
    sizes.trace.block_size = args.trace_block_size as usize;
    if let Some(tokens) = args.trace_block_tokens {
        sizes.trace.block_tokens = tokens as usize;
    }
    for w in &args.workloads {
        if let Workload::Trace(t) = w {
            t.check(sizes.trace.block_size).map_err(Error::Setup)?;
        }
    }
    let replicas = usize::from(args.replicas);
    // Every cell's plan first: the estimate, and the header's sizing, before anything runs.
    let mut plans = Vec::new();
    let mut estimate = 0.0;
    for w in &args.workloads {
        // The rate changes no plan's working set or sizes, so plans at 1 request/s size the
        // cell's fleet, and the ladder's 1.0x is that fleet's cold saturation.
        let units: Vec<Generated> = (0..u64::from(args.repeats))
            .map(|r| w.generate(&sizes, 1.0, replicas, args.seed.wrapping_add(r)))
            .collect();
        let (_, blocks_per_engine, _) = setup(&args, &units);
        let unit = &units[0];
        if let Some(long) = units.iter().find(|g| g.longest_tokens > MAX_REQUEST_TOKENS) {
            return Err(Error::Setup(format!(
                "{w}: a request of {} tokens, over the simulator's {MAX_REQUEST_TOKENS}-token context (a trace: lower --trace-block-tokens)",
                long.longest_tokens
            )));
        }
        let fleet = ladder::Fleet {
            engines: replicas,
            blocks_per_engine,
            block_size: BLOCK_SIZE,
            max_num_seqs: warmpath_sim::cli::DEFAULT_MAX_NUM_SEQS,
        };
        let capacity = ladder::cold_saturation(
            profile,
            fleet,
            unit.mean_prompt_tokens,
            unit.output_tokens as f64,
        );
        for &load in &args.loads {
            let rate = load * capacity;
            // One plan per run; one fleet size for all of them.
            let runs_of_cell: Vec<Generated> = (0..u64::from(args.repeats))
                .map(|r| w.generate(&sizes, rate, replicas, args.seed.wrapping_add(r)))
                .collect();
            for g in &runs_of_cell {
                let span = g
                    .chains
                    .iter()
                    .flat_map(|c| c.turns.last())
                    .map(|t| t.at.as_secs_f64())
                    .fold(0.0, f64::max);
                estimate +=
                    runs as f64 * (ROW_SETUP_S + (span * args.time_scale).min(args.max_seconds));
            }
            plans.push((w.clone(), load, rate, runs_of_cell));
        }
    }
    if args.floor_only {
        print!("{}", table::floors(profile, &plans));
        return Ok(());
    }
    let logs = Logs::create(&args.out)?;
    let bench_log = BenchLog::install(&logs)?;
    println!(
        "bench matrix: {} workloads x {} loads = {} cells, {} rows each ({} run), {} engines, {} agents (cluster) + 1 central, profile {}, time-scale {}; estimated {:.0} min",
        args.workloads.len(),
        args.loads.len(),
        plans.len(),
        slots.len(),
        runs,
        args.replicas,
        args.agents,
        args.profile,
        args.time_scale,
        (estimate / 60.0).ceil()
    );
    let mut requests_out = requests::Requests::create(&args.out)?;
    let mut cells = Vec::new();
    let total = plans.len();
    let mut stopped = None;
    for (n, plan) in plans.into_iter().enumerate() {
        let at = (n, total);
        match run_cell(&args, profile, &slots, &logs, &mut requests_out, plan, at).await {
            Ok(cell) => cells.push(cell),
            Err(e) => {
                stopped = Some(e);
                break;
            }
        }
    }
    // A run that stopped (a warmpath row failed) still reports the cells it finished, so
    // that an hour's matrix is not lost to its last row.
    let why = stopped.as_ref().map(|e| {
        format!(
            "Stopped early: {e}. The report holds the {} of {total} cells that finished.",
            cells.len()
        )
    });
    if cells.is_empty() {
        // Nothing finished: no report, only why.
        if let Some(why) = &why {
            println!("\n{why}");
        }
    } else {
        let verdicts = table::judge_all(&args, &cells);
        let mut report = table::render(&args, &cells, &verdicts);
        if let Some(why) = &why {
            report = format!("{why}\n\n{report}");
        }
        println!("\n{report}");
        table::write(&args, &cells, &verdicts, &report, why.as_deref())?;
    }
    println!("{}", bench_log.summary());
    stopped.map_or(Ok(()), Err)
}

/// A cell's plan: its workload, load, rate and one plan per run.
type CellPlan = (Workload, f64, f64, Vec<Generated>);

/// Runs every slot of one cell (`at`: its place among the matrix's cells) on each of its
/// runs' plans, writing each answered request to `requests_out`.
async fn run_cell(
    args: &MatrixArgs,
    profile: &warmpath_sim::engine::timing::Profile,
    slots: &[Slot],
    logs: &Logs,
    requests_out: &mut requests::Requests,
    (w, load, rate, runs_of_cell): CellPlan,
    (n, total): (usize, usize),
) -> Result<Cell, Error> {
    let (setup, blocks, working_set) = setup(args, &runs_of_cell);
    let mut cell = Cell {
        workload: w.to_string(),
        shares: w.shares(),
        load,
        rate,
        requests: runs_of_cell.iter().map(Generated::requests).sum(),
        working_set_tokens: working_set,
        blocks_per_engine: blocks,
        floor: floor::of(profile, runs_of_cell.iter().map(Generated::new_work)),
        rows: Vec::new(),
    };
    let repeats = runs_of_cell.len();
    // Each slot's row of each run, in run order.
    let mut by_slot: Vec<Vec<CellRow>> = vec![Vec::new(); slots.len()];
    for (r, g) in runs_of_cell.into_iter().enumerate() {
        let run_setup = Setup {
            seed: args.seed.wrapping_add(r as u64),
            ..setup.clone()
        };
        let requests = g.requests();
        let parts = g.parts;
        let chains = Arc::new(g.chains);
        for (i, slot) in slots.iter().enumerate() {
            let at = Position {
                cell: n,
                cells: total,
                row: i,
                rows: slots.len(),
                run: r,
                runs: repeats,
            };
            let row = run_slot(&run_setup, *slot, &chains, logs, &cell, requests, at).await?;
            if let Some(result) = &row.result {
                let of = requests::RunOf {
                    workload: &cell.workload,
                    load,
                    run: r,
                    seed: run_setup.seed,
                    row: &row.name,
                    parts: &parts,
                };
                requests_out.write(of, &result.raw.samples)?;
            }
            by_slot[i].push(row);
        }
    }
    cell.rows = by_slot.into_iter().map(pool_runs).collect();
    Ok(cell)
}

/// Where a row's run stands in the whole matrix (for its progress line).
#[derive(Debug, Clone, Copy)]
struct Position {
    cell: usize,
    cells: usize,
    row: usize,
    rows: usize,
    run: usize,
    runs: usize,
}

/// A slot's rows of every run of a cell as one ([`compare::pool`]); the first run that did
/// not finish (a peer that failed, not installed) stands for the slot instead.
fn pool_runs(runs: Vec<CellRow>) -> CellRow {
    if let Some(bad) = runs.iter().find(|r| r.result.is_none()) {
        return bad.clone();
    }
    let name = runs.first().map(|r| r.name.clone()).unwrap_or_default();
    let figures = match runs.len() {
        0 | 1 => Vec::new(),
        _ => runs
            .iter()
            .filter_map(|r| r.result.as_ref().map(RunFigures::from))
            .collect(),
    };
    let answers = runs
        .iter()
        .filter_map(|r| r.result.as_ref())
        .map(|r| interval::answers(&r.raw.samples, r.raw.scale))
        .collect();
    let tail = tail::Anatomy::of(
        runs.iter()
            .filter_map(|r| r.result.as_ref())
            .map(|r| (r.raw.samples.as_slice(), r.raw.scale)),
    );
    let split = reach::Split::of(
        runs.iter()
            .filter_map(|r| r.result.as_ref())
            .map(|r| (r.raw.samples.as_slice(), r.raw.scale)),
    );
    let mut result = compare::pool(runs.into_iter().filter_map(|r| r.result).collect());
    // The answers are pooled: the cell keeps its figures only.
    if let Some(r) = result.as_mut() {
        r.raw = Default::default();
    }
    CellRow {
        name,
        status: "ok".into(),
        result,
        runs: figures,
        answers,
        // A row that answered nothing has no tail to read.
        tail: (tail.slowest() > 0).then_some(tail),
        split,
    }
}

/// One row of a cell (one run of it: `requests` of them); a peer that fails is reported in
/// its row, warmpath's failures end the run.
async fn run_slot(
    setup: &Setup,
    slot: Slot,
    chains: &Arc<Vec<compare::Chain>>,
    logs: &Logs,
    cell: &Cell,
    requests: usize,
    at: Position,
) -> Result<CellRow, Error> {
    let target = match slot {
        Slot::NotInstalled(name) => {
            return Ok(CellRow {
                name: name.into(),
                status: "not installed".into(),
                result: None,
                runs: Vec::new(),
                answers: Vec::new(),
                tail: None,
                split: Default::default(),
            });
        }
        Slot::Run(t) => t,
    };
    let run = if at.runs > 1 {
        format!(", run {}/{}", at.run + 1, at.runs)
    } else {
        String::new()
    };
    let label = format!(
        "[cell {}/{} {} @ {}x{run}, row {}/{}] {}",
        at.cell + 1,
        at.cells,
        cell.workload,
        cell.load,
        at.row + 1,
        at.rows,
        target.name()
    );
    let phase = Arc::new(Phase::start(label, requests as u64));
    match compare::run_target(setup, target, chains.clone(), logs, &phase).await {
        Ok(row) => {
            phase.finish(&format!(
                "{} answered, {} errors, p90 TTFT {:.0} ms",
                row.requests,
                row.errors,
                row.ttft_p90 * 1e3
            ));
            Ok(CellRow {
                name: row.policy.clone(),
                status: "ok".into(),
                result: Some(row),
                runs: Vec::new(),
                answers: Vec::new(),
                tail: None,
                split: Default::default(),
            })
        }
        Err(e) if matches!(target, Target::Peer(_)) => {
            phase.finish(&format!("failed: {e}"));
            Ok(CellRow {
                name: target.name(),
                status: format!("failed: {e}"),
                result: None,
                runs: Vec::new(),
                answers: Vec::new(),
                tail: None,
                split: Default::default(),
            })
        }
        Err(e) => Err(e),
    }
}

/// Whether `load` is one of the two highest of `loads`.
fn top_two(loads: &[f64], load: f64) -> bool {
    let mut l: Vec<f64> = loads.to_vec();
    l.sort_by(|a, b| b.total_cmp(a));
    l.dedup();
    l.iter().take(2).any(|x| *x == load)
}
