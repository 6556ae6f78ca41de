//! Issue #19's targets judged per cell, PASS or MISS, for the warmpath precise rows (the
//! multi-agent one and the central one):
//!
//! - on a shared-prefix cell at one of the two highest loads: p90 TTFT <= 0.7x the best
//!   peer's;
//! - on every cell: p50, p90 and p99 TTFT each <= 1.05x the best peer's (the lowest of that
//!   quantile over the peer rows), and output throughput >= 0.98x the best peer's;
//! - on the no-sharing control: p90 TTFT <= 1.05x least-loaded's and output throughput
//!   >= 0.95x least-loaded's.
//!
//! With several runs (`--repeats`) a verdict is judged on the pooled figures and also run by
//! run, against each run's best ([`Verdict::by_run`]).
//!
//! A TTFT target set below the cell's floor ([`super::floor`]: the quantile no router can
//! beat on the plan) is out of every router's reach: it stays a MISS, and its line says so
//! ([`Verdict::out_of_reach`]).
//!
//! Each TTFT verdict also carries a 95 % interval of its ratio ([`super::interval`]: a
//! paired bootstrap over the cell's chains) and says whether the limit lies inside it: a
//! verdict the draw of requests could turn ([`Verdict::within_noise`]).
//!
//! A row with a failed request misses every target. With no peer row that ran, the peer
//! targets are judged against the best of round-robin and least-loaded instead, and every
//! such line says it is a stand-in.

use super::{Cell, CellRow, RunFigures, interval::Bootstrap};
use crate::compare::CENTRAL_ROW;

/// One target judged for one row of one cell.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Verdict {
    pub row: String,
    pub target: String,
    /// Judged on the pooled figures (every run's answers together).
    pub pass: bool,
    /// The figures behind it.
    pub detail: String,
    /// The target asks for a TTFT below the cell's floor: no router can meet it on this
    /// plan (the floor's quantile is above the limit times the reference).
    pub out_of_reach: bool,
    /// With several runs: the same ratio in each run alone, against the best of that run's
    /// reference rows, in run order (`None`: no reference row has the run). How far a
    /// verdict would move had only one run been made.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_run: Vec<Option<f64>>,
    /// A TTFT target's ratio, 95 % interval (2.5th, 97.5th percentile) over resamples of the
    /// cell's chains ([`super::interval`]); `None` for throughput or without answers.
    #[serde(rename = "interval_95", skip_serializing_if = "Option::is_none")]
    pub interval: Option<(f64, f64)>,
    /// The limit lies inside [`Verdict::interval`]: another draw of the same cell could turn
    /// the verdict (never for a row with failed requests, nor a target below the floor).
    pub within_noise: bool,
}

/// One figure of a row.
type Figure = fn(&RunFigures) -> f64;

/// Which way a target's figure is better.
#[derive(Debug, Clone, Copy)]
enum Better {
    /// A TTFT: no router's can be under the cell's `floor` (seconds) for it.
    Lower { floor: f64 },
    /// Throughput.
    Higher,
}

/// The rows the targets are judged for.
const JUDGED: [&str; 2] = ["Precise", CENTRAL_ROW];

/// Whether a row is a peer router's.
fn is_peer(name: &str) -> bool {
    name.contains("-router")
}

/// A row that ran: its name, pooled figures and each run's.
struct Ran<'a> {
    name: &'a str,
    pooled: RunFigures,
    runs: &'a [RunFigures],
}

fn ran(row: &CellRow) -> Option<Ran<'_>> {
    row.result.as_ref().map(|r| Ran {
        name: &r.policy,
        pooled: RunFigures::from(r),
        runs: &row.runs,
    })
}

/// The rows the peer targets compare against, and what to call them.
fn reference(rows: &[CellRow]) -> (Vec<Ran<'_>>, &'static str) {
    let pick = |keep: fn(&str) -> bool| -> Vec<Ran<'_>> {
        rows.iter()
            .filter(|r| keep(&r.name))
            .filter_map(ran)
            .collect()
    };
    let peers = pick(is_peer);
    if peers.is_empty() {
        let stand_in = pick(|n| n == "RoundRobin" || n == "LeastLoaded");
        (stand_in, "best non-warmpath row (stand-in: no peer ran)")
    } else {
        (peers, "best peer")
    }
}

/// The best value of `f` over `values` (the lowest, or the highest) and its index.
fn best(values: impl Iterator<Item = f64>, lowest: bool) -> Option<(f64, usize)> {
    values
        .enumerate()
        .map(|(i, v)| (v, i))
        .filter(|(v, _)| v.is_finite())
        .reduce(|a, b| if (b.0 < a.0) == lowest { b } else { a })
}

/// A run's ratio and whether that run had failed requests (`None`: no reference row has
/// the run).
type RunRatio = Option<(f64, bool)>;

/// `me`'s figure `f` against the best of `refs` (the lowest or the highest), pooled and in
/// each run: (my value, the best value, its row's name, each run's ratio).
fn against<'a>(
    me: &Ran<'_>,
    refs: &[Ran<'a>],
    f: Figure,
    lowest: bool,
) -> Option<(f64, f64, &'a str, Vec<RunRatio>)> {
    let (v, i) = best(refs.iter().map(|r| f(&r.pooled)), lowest)?;
    let by_run = me
        .runs
        .iter()
        .enumerate()
        .map(|(run, mine)| {
            let theirs = refs.iter().filter_map(|r| r.runs.get(run)).map(f);
            let (b, _) = best(theirs, lowest)?;
            Some((f(mine) / b, mine.errors > 0))
        })
        .collect();
    Some((f(&me.pooled), v, refs.get(i)?.name, by_run))
}

/// Every target for every judged row of `cell`; `top_load`: the cell is at one of the two
/// highest loads.
pub fn judge(cell: &Cell, top_load: bool) -> Vec<Verdict> {
    let (refs, against_what) = reference(&cell.rows);
    let least: Vec<Ran<'_>> = cell
        .rows
        .iter()
        .filter(|r| r.name == "LeastLoaded")
        .filter_map(ran)
        .collect();
    let named: Vec<(&str, &[super::interval::RunAnswers])> = cell
        .rows
        .iter()
        .filter(|r| !r.answers.is_empty())
        .map(|r| (r.name.as_str(), r.answers.as_slice()))
        .collect();
    let boot = Bootstrap::of(&named, seed_of(cell));
    let ref_names: Vec<&str> = refs.iter().map(|r| r.name).collect();
    let least_names: Vec<&str> = least.iter().map(|r| r.name).collect();
    // The interval of `me`'s quantile `q` (an index into `interval::QUANTILES`).
    let interval = |me: &str, of: &[&str], q: usize| -> Option<(f64, f64)> {
        boot.as_ref()?.interval(me, of, q)
    };
    let mut out = Vec::new();
    for row in cell
        .rows
        .iter()
        .filter(|r| JUDGED.contains(&r.name.as_str()))
    {
        let Some(me) = ran(row) else { continue };
        let errors = row.result.as_ref().map_or(0, |r| r.errors);
        let mut check = |target: String,
                         (mine, theirs, by_run): (f64, f64, Vec<RunRatio>),
                         limit: f64,
                         better: Better,
                         detail: String,
                         interval: Option<(f64, f64)>| {
            let ratio = mine / theirs;
            let out_of_reach = match better {
                Better::Lower { floor } => (floor > limit * theirs).then_some(floor),
                Better::Higher => None,
            };
            let ok = |r: f64| match better {
                Better::Lower { .. } => r <= limit,
                Better::Higher => r >= limit,
            };
            let failed = (errors > 0).then(|| format!("; {errors} failed requests"));
            // A run passes as the pooled verdict does: within the limit, nothing failed.
            let runs = match by_run.len() {
                0 => String::new(),
                n => format!(
                    "; by run {} ({} of {n} pass)",
                    by_run
                        .iter()
                        .map(|r| r.map_or("-".into(), |(r, _)| format!("{r:.2}x")))
                        .collect::<Vec<_>>()
                        .join(", "),
                    by_run
                        .iter()
                        .flatten()
                        .filter(|(r, failed)| ok(*r) && !failed)
                        .count()
                ),
            };
            // Only a verdict the answers decide: failed requests miss on any draw, and no
            // draw of the plan beats its floor.
            let within_noise = failed.is_none()
                && out_of_reach.is_none()
                && interval.is_some_and(|(lo, hi)| lo <= limit && limit <= hi);
            let spread = interval.map_or(String::new(), |(lo, hi)| {
                let call = if within_noise {
                    "the limit inside it"
                } else if failed.is_some() || out_of_reach.is_some() {
                    "the answers' ratio only"
                } else if ok(lo) && ok(hi) {
                    "a pass beyond the noise"
                } else {
                    "a miss beyond the noise"
                };
                format!("; 95 % interval {lo:.2}-{hi:.2}x, {call}")
            });
            let reach = out_of_reach.map_or(String::new(), |f| {
                format!(
                    "; out of any router's reach: the floor is {} ({:.2}x)",
                    ms(f),
                    f / theirs
                )
            });
            out.push(Verdict {
                row: row.name.clone(),
                target,
                pass: ok(ratio) && failed.is_none(),
                detail: format!(
                    "{ratio:.2}x: {detail}{runs}{spread}{reach}{}",
                    failed.unwrap_or_default()
                ),
                out_of_reach: out_of_reach.is_some(),
                by_run: by_run.into_iter().map(|r| r.map(|(r, _)| r)).collect(),
                interval,
                within_noise,
            });
        };
        let f = &cell.floor;
        // In the order of `interval::QUANTILES`.
        let quantiles: [(&str, Figure, f64); 3] = [
            ("p50", |r| r.ttft_p50, f.ttft_p50),
            ("p90", |r| r.ttft_p90, f.ttft_p90),
            ("p99", |r| r.ttft_p99, f.ttft_p99),
        ];
        let me_name = me.name;
        let p90: Figure = |r| r.ttft_p90;
        if cell.shares
            && top_load
            && let Some((mine, v, by, runs)) = against(&me, &refs, p90, true)
        {
            check(
                format!("p90 <= 0.7x {against_what}"),
                (mine, v, runs),
                0.7,
                Better::Lower { floor: f.ttft_p90 },
                format!("{} vs {} ({by})", ms(mine), ms(v)),
                interval(me_name, &ref_names, 1),
            );
        }
        for (qi, (q, figure, floor)) in quantiles.into_iter().enumerate() {
            if let Some((mine, v, by, runs)) = against(&me, &refs, figure, true) {
                check(
                    format!("{q} <= 1.05x {against_what}"),
                    (mine, v, runs),
                    1.05,
                    Better::Lower { floor },
                    format!("{} vs {} ({by})", ms(mine), ms(v)),
                    interval(me_name, &ref_names, qi),
                );
            }
        }
        let tput: Figure = |r| r.output_tokens_per_s;
        if let Some((mine, v, by, runs)) = against(&me, &refs, tput, false) {
            check(
                format!("throughput >= 0.98x {against_what}"),
                (mine, v, runs),
                0.98,
                Better::Higher,
                format!("{mine:.0} vs {v:.0} tok/s ({by})"),
                None,
            );
        }
        if !cell.shares && !least.is_empty() {
            if let Some((mine, v, _, runs)) = against(&me, &least, p90, true) {
                check(
                    "p90 <= 1.05x least-loaded (control)".into(),
                    (mine, v, runs),
                    1.05,
                    Better::Lower { floor: f.ttft_p90 },
                    format!("{} vs {}", ms(mine), ms(v)),
                    interval(me_name, &least_names, 1),
                );
            }
            if let Some((mine, v, _, runs)) = against(&me, &least, tput, false) {
                check(
                    "throughput >= 0.95x least-loaded (control)".into(),
                    (mine, v, runs),
                    0.95,
                    Better::Higher,
                    format!("{mine:.0} vs {v:.0} tok/s"),
                    None,
                );
            }
        }
    }
    out
}

/// The resamples' seed of a cell: its workload and load, so a cell's intervals do not
/// change between the report and `matrix.json`, nor with the cells around it.
fn seed_of(cell: &Cell) -> u64 {
    cell.workload
        .bytes()
        .fold(cell.load.to_bits(), |h, b| h.rotate_left(7) ^ u64::from(b))
}

/// Seconds as milliseconds for a verdict line.
fn ms(s: f64) -> String {
    format!("{:.0} ms", s * 1e3)
}

#[cfg(test)]
mod tests;
