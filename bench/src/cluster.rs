//! `warmpath bench cluster`: the cluster index's benchmarks (docs/benchmarks.md, "Cluster";
//! issue #21's targets):
//!
//! - `gossip` ([`gossip`]): 16 and 64 agents in this process on a paused clock:
//!   convergence after start, one change known to all, bytes and messages per node idle and
//!   with watermarks moving;
//! - `latency` ([`latency`]): agents as processes with simulator engines, real UDP gossip
//!   and gRPC on loopback: event -> remote index, owner -> replica, placement lag p50/p99,
//!   as the receiving agents record them;
//! - `memory` ([`memory`]): a replica agent's resident set and index accounting against
//!   replicated pods and cached blocks, fitted per (block, pod);
//! - `table` ([`table`]): a 1,000-node x 8-pod extrapolation from the measured inputs.
//!
//! The terminal gets a table per part and PASS/MISS per target; `<out>/cluster.json` all of it.

mod gossip;
mod histogram;
mod latency;
mod memory;
mod table;

use std::{path::PathBuf, time::Duration};

use clap::Args;

use crate::{
    Error,
    logs::{BenchLog, Logs},
    progress::Phase,
};
use warmpath_agent::cluster::{membership::DEFAULT_GOSSIP_INTERVAL, scale::GossipFigures};

/// Issue #21's targets.
const CONVERGE_TARGET_S: f64 = 2.0;
const GOSSIP_TARGET_BYTES: f64 = 20_000.0;
const DELTA_P99_TARGET_S: f64 = 0.2;
const PLACEMENT_P99_TARGET_S: f64 = 0.02;

/// The parts of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Part {
    Gossip,
    Latency,
    Memory,
    Table,
}

/// Options of `warmpath bench cluster`.
#[derive(Debug, Clone, Args)]
pub struct ClusterBenchArgs {
    /// Parts to run (the table needs gossip, and uses memory's fit when it ran).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "gossip,latency,memory,table"
    )]
    pub parts: Vec<Part>,
    /// Agents per gossip measurement.
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    pub sizes: Vec<usize>,
    /// Local pods per agent in the gossip part.
    #[arg(long, default_value_t = 8)]
    pub pods: usize,
    /// Gossip interval of the gossip part (default: the production default).
    #[arg(long, value_name = "MS")]
    pub gossip_interval_ms: Option<u64>,
    /// Virtual seconds each of the idle and busy gossip phases is measured.
    #[arg(long, default_value_t = 20)]
    pub phase_seconds: u64,
    /// Agent processes in the latency part (engines: two per agent).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=16))]
    pub agents: u16,
    /// Completions straight at the engines (each one batch of new blocks to replicate).
    #[arg(long, default_value_t = 200)]
    pub events: usize,
    /// Completions through the agents (each one placement for the others).
    #[arg(long, default_value_t = 200)]
    pub placements: usize,
    /// Replicated pods per memory measurement (one replica process each).
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    pub memory_pods: Vec<usize>,
    /// Cached blocks per pod at each memory point.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub memory_blocks: Vec<usize>,
    /// Nodes of the extrapolated table (8 pods each).
    #[arg(long, default_value_t = 1_000)]
    pub nodes: usize,
    /// Directory for `cluster.json` and `logs/`.
    #[arg(long, value_name = "DIR", default_value = "warmpath-cluster")]
    pub out: PathBuf,
}

/// Everything measured, as written to `cluster.json`.
#[derive(Debug, Default, serde::Serialize)]
struct Report {
    gossip: Vec<GossipFigures>,
    latency: Option<latency::LatencyFigures>,
    memory: Option<memory::MemoryFigures>,
    table: Vec<table::Row>,
    targets: Vec<Target>,
}

/// One of the targets against what was measured.
#[derive(Debug, serde::Serialize)]
struct Target {
    target: String,
    measured: String,
    met: bool,
}

pub async fn run(args: ClusterBenchArgs) -> Result<(), Error> {
    let logs = Logs::create(&args.out)?;
    let bench_log = BenchLog::install(&logs)?;
    let mut report = Report::default();
    let has = |p| args.parts.contains(&p);
    let interval = args
        .gossip_interval_ms
        .map_or(DEFAULT_GOSSIP_INTERVAL, Duration::from_millis);
    if has(Part::Gossip) || has(Part::Table) {
        for &n in &args.sizes {
            let started = std::time::Instant::now();
            eprintln!("gossip, {n} agents: running on a paused clock");
            let s = gossip::settings(
                n,
                args.pods,
                interval,
                Duration::from_secs(args.phase_seconds),
            );
            let f = gossip::measure(s).await?;
            eprintln!(
                "gossip, {n} agents: converged {:.2} s, a change known to all in {:.2} s ({:.0} s of wall time)",
                f.converged_s,
                f.change_known_s,
                started.elapsed().as_secs_f64()
            );
            report.gossip.push(f);
        }
        print_gossip(&report.gossip);
    }
    if has(Part::Latency) {
        let phase = Phase::start(
            format!("latency, {} agent processes", args.agents),
            (args.events + args.placements) as u64,
        );
        let s = latency::LatencySettings {
            agents: usize::from(args.agents),
            engines_per_agent: 2,
            events: args.events,
            placements: args.placements,
            within: Duration::from_secs(120),
        };
        let f = latency::run(&s, &logs, &phase).await?;
        phase.finish(&format!(
            "{} requests at engines, {} through agents",
            f.events_sent, f.placements_sent
        ));
        print_latency(&f);
        report.latency = Some(f);
    }
    if has(Part::Memory) {
        let started = std::time::Instant::now();
        eprintln!("memory: one replica agent per pod count");
        let f = memory::run(&args.memory_pods, &args.memory_blocks, &logs).await?;
        eprintln!(
            "memory: {} points ({:.0} s)",
            f.points.len(),
            started.elapsed().as_secs_f64()
        );
        print_memory(&f);
        report.memory = Some(f);
    }
    if has(Part::Table) && !report.gossip.is_empty() {
        report.table = table::gossip_rows(&report.gossip, args.nodes);
        if let Some(m) = &report.memory {
            report.table.extend(table::replica_rows(
                m.rss_per_entry,
                args.nodes,
                8,
                64,
                30_000,
            ));
        }
        print_table(&report.table, args.nodes);
    }
    report.targets = targets(&report);
    print_targets(&report.targets);
    let json = args.out.join("cluster.json");
    let text = serde_json::to_string_pretty(&report)
        .map_err(|e| Error::Setup(format!("cluster.json: {e}")))?;
    std::fs::write(&json, text).map_err(|source| Error::Io {
        what: format!("write {}", json.display()),
        source,
    })?;
    println!("wrote {}; {}", json.display(), bench_log.summary());
    Ok(())
}

fn kb(bytes: f64) -> String {
    format!("{:.1} KB/s", bytes / 1e3)
}

fn print_gossip(figures: &[GossipFigures]) {
    println!(
        "\ngossip (in-process, chitchat channel transport, paused clock; bytes are chitchat's messages)"
    );
    println!(
        "{:>6} {:>5} {:>9} {:>10} {:>16} {:>12} {:>10} {:>12} {:>10}",
        "agents",
        "pods",
        "interval",
        "converged",
        "change to all",
        "idle",
        "idle msg/s",
        "busy",
        "busy msg/s"
    );
    for f in figures {
        println!(
            "{:>6} {:>5} {:>7}ms {:>9.2}s {:>7.2}s ({:.1} r) {:>12} {:>10.1} {:>12} {:>10.1}",
            f.agents,
            f.pods,
            f.gossip_interval_ms,
            f.converged_s,
            f.change_known_s,
            f.change_known_rounds,
            kb(f.idle_bytes_per_node_s),
            f.idle_messages_per_node_s,
            kb(f.busy_bytes_per_node_s),
            f.busy_messages_per_node_s,
        );
    }
    for f in figures {
        println!(
            "{} agents: {} changes at phases spread over a round known to all in {:.2}-{:.2} s (mean {:.2} s)",
            f.agents, f.changes, f.change_known_min_s, f.change_known_s, f.change_known_mean_s
        );
    }
}

fn ms(q: Option<histogram::Quantile>) -> String {
    match q {
        None => "-".into(),
        Some(q) if q.beyond => format!("> {:.1} ms", q.value * 1e3),
        Some(q) => format!(
            "{:.2} ms (in {:.2}-{:.2})",
            q.value * 1e3,
            q.lower * 1e3,
            q.upper * 1e3
        ),
    }
}

fn print_latency(f: &latency::LatencyFigures) {
    println!(
        "\nlatency ({} agent processes, {} engines, loopback; {} requests at engines, {} through agents; as the receiving agents recorded them; load average {})",
        f.agents, f.engines, f.events_sent, f.placements_sent, f.load_average
    );
    println!(
        "{:<34} {:>8} {:>10} {:>26} {:>26}",
        "lag", "samples", "mean", "p50", "p99"
    );
    for (name, l) in [
        ("engine event -> remote index", &f.event),
        ("owner applied -> replica applied", &f.delta),
        ("placement -> held, 1 hop", &f.placement_direct),
        ("placement -> held, 2 hops (relayed)", &f.placement_relayed),
        ("placement -> held, all", &f.placement_all),
    ] {
        println!(
            "{:<34} {:>8} {:>10} {:>26} {:>26}",
            name,
            l.samples,
            l.mean_s
                .map_or("-".into(), |m| format!("{:.2} ms", m * 1e3)),
            ms(l.p50),
            ms(l.p99)
        );
    }
}

fn print_memory(f: &memory::MemoryFigures) {
    println!("\nreplica memory (growth over the same replica with its pods empty)");
    println!(
        "{:>5} {:>8} {:>10} {:>12} {:>12} {:>10} {:>10}",
        "pods", "blocks", "entries", "RSS", "index", "RSS/entry", "idx/entry"
    );
    for p in &f.points {
        let per = |b: i64| b as f64 / p.entries.max(1) as f64;
        println!(
            "{:>5} {:>8} {:>10} {:>10.1}MB {:>10.1}MB {:>9.1}B {:>9.1}B",
            p.pods,
            p.blocks_per_pod,
            p.entries,
            p.rss_bytes as f64 / 1e6,
            p.index_bytes as f64 / 1e6,
            per(p.rss_bytes),
            per(p.index_bytes)
        );
    }
    println!(
        "fit per (block, pod): RSS {:.1} B, index accounting {:.1} B",
        f.rss_per_entry, f.index_per_entry
    );
}

fn value(v: f64, unit: &str) -> String {
    match unit {
        "B/s" => kb(v),
        "B" if v >= 1e6 => format!("{:.1} MB", v / 1e6),
        "B" => format!("{v:.0} B"),
        "s" => format!("{v:.2} s"),
        "" => format!("{v:.0}"),
        u => format!("{v:.1} {u}"),
    }
}

fn print_table(rows: &[table::Row], nodes: usize) {
    println!("\nextrapolated to {nodes} nodes x 8 pods (not measured at that size)");
    for r in rows {
        let measured: Vec<String> = r
            .measured
            .iter()
            .map(|(n, v)| format!("{n}: {}", value(*v, r.unit)))
            .collect();
        println!(
            "  {:<66} {:<34} {:<36} -> {}",
            r.quantity,
            r.formula,
            measured.join(", "),
            value(r.extrapolated, r.unit)
        );
    }
}

/// Each target with what was measured (only the parts that ran).
fn targets(r: &Report) -> Vec<Target> {
    let mut out = Vec::new();
    if let Some(g) = r.gossip.iter().find(|g| g.agents == 64) {
        out.push(Target {
            target: format!("64 agents learn a change within {CONVERGE_TARGET_S} s"),
            measured: format!(
                "{:.2} s ({:.1} rounds of {} ms)",
                g.change_known_s, g.change_known_rounds, g.gossip_interval_ms
            ),
            met: g.change_known_s <= CONVERGE_TARGET_S,
        });
    }
    for g in &r.gossip {
        out.push(Target {
            target: format!(
                "steady gossip <= {} per node at {} agents (watermarks moving)",
                kb(GOSSIP_TARGET_BYTES),
                g.agents
            ),
            measured: kb(g.busy_bytes_per_node_s),
            met: g.busy_bytes_per_node_s <= GOSSIP_TARGET_BYTES,
        });
    }
    if let Some(row) = r.table.get(1) {
        out.push(Target {
            target: format!(
                "steady gossip <= {} per node, extrapolated",
                kb(GOSSIP_TARGET_BYTES)
            ),
            measured: format!("{} ({})", kb(row.extrapolated), row.formula),
            met: row.extrapolated <= GOSSIP_TARGET_BYTES,
        });
    }
    if let Some(l) = &r.latency {
        // Met when the bucket holding the p99 ends at or below the target (both are bounds).
        let p99 = |lag: &latency::Lag, name: &str, limit: f64| Target {
            target: format!("{name} p99 <= {:.0} ms on loopback", limit * 1e3),
            measured: ms(lag.p99),
            met: lag.p99.is_some_and(|q| !q.beyond && q.upper <= limit),
        };
        out.push(p99(&l.event, "event -> remote index", DELTA_P99_TARGET_S));
        out.push(p99(
            &l.delta,
            "delta (owner -> replica)",
            DELTA_P99_TARGET_S,
        ));
        out.push(p99(
            &l.placement_all,
            "placement hint",
            PLACEMENT_P99_TARGET_S,
        ));
    }
    out
}

fn print_targets(targets: &[Target]) {
    println!("\ntargets (issue #21)");
    for t in targets {
        println!(
            "  {}  {}: {}",
            if t.met { "PASS" } else { "MISS" },
            t.target,
            t.measured
        );
    }
}
