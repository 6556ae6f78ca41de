//! The matrix as one markdown report — settings, each workload's sizing, the table, the
//! targets — printed and written to `<out>/matrix.md`, with the same data in
//! `<out>/matrix.json`.

use std::fmt::Write as _;

use warmpath_sim::engine::timing::Profile;

use super::{Cell, MatrixArgs, floor, top_two, verdict, workloads::Generated};
use crate::Error;

/// The floor's line in each cell ([`super::floor`]).
const FLOOR_ROW: &str = "Floor (any router)";

/// Each cell's verdicts ([`verdict::judge`]), in cell order: judged once for the report and
/// `matrix.json` alike.
pub fn judge_all(args: &MatrixArgs, cells: &[Cell]) -> Vec<Vec<verdict::Verdict>> {
    cells
        .iter()
        .map(|c| verdict::judge(c, top_two(&args.loads, c.load)))
        .collect()
}

/// The whole report; `verdicts` from [`judge_all`].
pub fn render(args: &MatrixArgs, cells: &[Cell], verdicts: &[Vec<verdict::Verdict>]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Workload matrix: {} engines ({} profile), time-scale {}, {}, {} requests per cell{}{}; rows: warmpath with {} agents (precise: a cluster) and 1 central agent, peers; fleet KV {:.0} % of each cell's working set (at least twice the longest request per engine).",
        args.replicas,
        args.profile,
        args.time_scale,
        if args.repeats > 1 {
            format!(
                "seeds {}-{}",
                args.seed,
                args.seed.wrapping_add(u64::from(args.repeats) - 1)
            )
        } else {
            format!("seed {}", args.seed)
        },
        args.requests,
        if args.repeats > 1 {
            format!(
                " x {} runs (each row's figures pool its runs' answers)",
                args.repeats
            )
        } else {
            String::new()
        },
        if args.quick { " (--quick sizes)" } else { "" },
        args.agents,
        args.kv_fraction * 100.0
    );
    let _ = writeln!(s);
    let mut seen: Vec<&str> = Vec::new();
    for c in cells {
        if seen.contains(&c.workload.as_str()) {
            continue;
        }
        seen.push(&c.workload);
        let fleet = usize::from(args.replicas) * c.blocks_per_engine * super::BLOCK_SIZE;
        let _ = writeln!(
            s,
            "- {}: working set {} tokens; fleet KV {} x {} blocks = {} tokens ({:.0} % of it); 1.0x load = {:.1} req/s (the fleet's cold saturation)",
            c.workload,
            c.working_set_tokens,
            args.replicas,
            c.blocks_per_engine,
            fleet,
            100.0 * fleet as f64 / c.working_set_tokens.max(1) as f64,
            c.rate / c.load
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| workload | load | req/s | row | answered/sent | TTFT p50 (ms) | TTFT p90 (ms) | TTFT p99 (ms) | output tok/s | prefix hit % | available % | captured % | delivered % | pred. error p50 (ms) | preempted |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in cells {
        for r in &c.rows {
            let _ = write!(
                s,
                "| {} | {}x | {:.1} | {} | ",
                c.workload, c.load, c.rate, r.name
            );
            let Some(x) = &r.result else {
                let _ = writeln!(s, "{} | - | - | - | - | - | - | - | - | - | - |", r.status);
                continue;
            };
            let pct = |t: Option<u64>| {
                t.map_or("-".into(), |t| {
                    format!("{:.1}", 100.0 * t as f64 / x.prompt_tokens.max(1) as f64)
                })
            };
            let _ = writeln!(
                s,
                "{}/{} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {} | {} | {} | {} | {} |",
                x.requests,
                x.requests + x.errors,
                x.ttft_p50 * 1e3,
                x.ttft_p90 * 1e3,
                x.ttft_p99 * 1e3,
                x.output_tokens_per_s,
                x.prefix_hit_ratio * 100.0,
                pct(x.available_tokens),
                pct(x.captured_tokens),
                pct(Some(x.delivered_tokens)),
                x.ttft_prediction_error_ms_p50
                    .map_or("-".into(), |e| format!("{e:.0}")),
                x.preemptions,
            );
        }
        let f = &c.floor;
        let _ = writeln!(
            s,
            "| {} | {}x | {:.1} | {FLOOR_ROW} | - | {:.0} | {:.0} | {:.0} | - | - | - | - | - | - | - |",
            c.workload,
            c.load,
            c.rate,
            f.ttft_p50 * 1e3,
            f.ttft_p90 * 1e3,
            f.ttft_p99 * 1e3
        );
    }
    let _ = writeln!(
        s,
        "\n(modelled time: wall-clock / time-scale; receipts as % of the answered requests' prompt tokens; \"-\": the row sent no such header; {FLOOR_ROW}: the TTFT no router can beat on the cell's plans, each request's tokens new to the fleet prefilled alone in one step)"
    );
    let _ = writeln!(s, "\n{}", super::tail::render(cells));
    let _ = writeln!(s, "Targets (issue #19):\n");
    let (mut pass, mut miss, mut out_of_reach, mut beyond, mut noise) = (0, 0, 0, 0, 0);
    for (c, judged) in cells.iter().zip(verdicts) {
        for v in judged {
            if v.pass {
                pass += 1;
            } else {
                miss += 1;
                out_of_reach += usize::from(v.out_of_reach);
                beyond += usize::from(v.beyond_rows.is_some());
                noise += usize::from(v.within_noise);
            }
            let _ = writeln!(
                s,
                "- {} @ {}x, {}: {}: {} ({})",
                c.workload,
                c.load,
                v.row,
                v.target,
                if v.pass { "PASS" } else { "MISS" },
                v.detail
            );
        }
    }
    let _ = writeln!(
        s,
        "\n{pass} PASS, {miss} MISS ({out_of_reach} of them below the cell's floor: out of any router's reach; {beyond} beyond every row measured: the fewest cold answers and the fastest answers of any row, combined, do not meet them; {noise} with the limit inside their 95 % interval: another draw of the cell could pass them)"
    );
    s
}

/// Each cell's floor (`--floor-only`): `plans` as (workload, load, rate, every run's plan).
pub fn floors(profile: &Profile, plans: &[(super::Workload, f64, f64, Vec<Generated>)]) -> String {
    let mut s = String::from(
        "| workload | load | req/s | requests | floor p50 (ms) | floor p90 (ms) | floor p99 (ms) |\n|---|---|---|---|---|---|---|\n",
    );
    for (w, load, rate, runs) in plans {
        let f = floor::of(
            profile,
            runs.iter()
                .map(Generated::new_work)
                .collect::<Vec<_>>()
                .iter(),
        );
        let requests: usize = runs.iter().map(Generated::requests).sum();
        let _ = writeln!(
            s,
            "| {w} | {load}x | {rate:.1} | {requests} | {:.1} | {:.1} | {:.1} |",
            f.ttft_p50 * 1e3,
            f.ttft_p90 * 1e3,
            f.ttft_p99 * 1e3
        );
    }
    s
}

/// `matrix.md` (the report) and `matrix.json` (settings, cells, verdicts) under `--out`.
pub fn write(
    args: &MatrixArgs,
    cells: &[Cell],
    verdicts: &[Vec<verdict::Verdict>],
    report: &str,
    stopped: Option<&str>,
) -> Result<(), Error> {
    let verdicts: Vec<_> = cells
        .iter()
        .zip(verdicts)
        .map(|(c, judged)| {
            serde_json::json!({
                "workload": c.workload,
                "load": c.load,
                "verdicts": judged,
            })
        })
        .collect();
    let json = serde_json::json!({
        "settings": {
            "replicas": args.replicas,
            "agents": args.agents,
            "profile": args.profile,
            "time_scale": args.time_scale,
            "seed": args.seed,
            "repeats": args.repeats,
            "requests": args.requests,
            "quick": args.quick,
            "kv_fraction": args.kv_fraction,
            "loads": args.loads,
        },
        "cells": cells,
        "targets": verdicts,
        // Why the run ended before its last cell (`null`: it ran them all).
        "stopped": stopped,
    });
    let text = serde_json::to_string_pretty(&json).map_err(|e| Error::Setup(e.to_string()))?;
    for (name, body) in [("matrix.md", report), ("matrix.json", text.as_str())] {
        let path = args.out.join(name);
        std::fs::write(&path, body).map_err(|source| Error::Io {
            what: format!("write {}", path.display()),
            source,
        })?;
        println!("results: {}", path.display());
    }
    Ok(())
}
