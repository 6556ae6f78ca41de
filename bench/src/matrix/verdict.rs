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
//! A TTFT target whose limit is under the best peer's figure (the 0.7x) also says whether
//! the run's own rows could meet it ([`super::reach`]): where the fewest cold answers of any
//! row, combined with the fastest warm and cold answers of any row, put fewer answers within
//! the limit than the quantile needs, it is beyond every row measured
//! ([`Verdict::beyond_rows`]). Not a floor: it stays a MISS like any other.
//!
//! Each TTFT verdict also carries a 95 % interval of its ratio ([`super::interval`]: a
//! paired bootstrap over the cell's chains) and says whether the limit lies inside it: a
//! verdict the draw of requests could turn ([`Verdict::within_noise`]).
//!
//! A row with a failed request misses every target. With no peer row that ran, the peer
//! targets are judged against the best of round-robin and least-loaded instead, and every
//! such line says it is a stand-in.

use super::{
    Cell, CellRow, RunFigures,
    interval::{Bootstrap, QUANTILES},
    reach::{self, Reach},
};
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
    /// A limit under the reference's own figure that the rows' best, combined, does not
    /// meet ([`super::reach`]): what they would put within it (under the quantile's share).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beyond_rows: Option<Reach>,
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
    /// A TTFT quantile: no router's can be under the cell's floor of it.
    Lower(Quantile),
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
    let judging = Judging::of(cell);
    let mut out = Vec::new();
    for row in cell
        .rows
        .iter()
        .filter(|r| JUDGED.contains(&r.name.as_str()))
    {
        let Some(me) = ran(row) else { continue };
        let errors = row.result.as_ref().map_or(0, |r| r.errors);
        for ask in judging.asks(cell, &me, top_load) {
            out.push(verdict(&row.name, errors, &judging.splits, ask));
        }
    }
    out
}

/// One target asked of one row: the figures, and how they are judged.
struct Ask {
    target: String,
    /// The row's figure and the best reference's.
    mine: f64,
    theirs: f64,
    /// Each run's ratio ([`against`]).
    by_run: Vec<RunRatio>,
    limit: f64,
    better: Better,
    /// The figures behind it, for its line.
    detail: String,
    /// A TTFT ratio's 95 % interval ([`super::interval`]).
    interval: Option<(f64, f64)>,
}

/// What every row's targets in one cell are judged against.
struct Judging<'a> {
    refs: Vec<Ran<'a>>,
    /// What the references are called in a target ("best peer", or a stand-in).
    against_what: &'static str,
    least: Vec<Ran<'a>>,
    boot: Option<Bootstrap>,
    /// Every row's answers, warm and cold ([`super::reach`]).
    splits: Vec<&'a reach::Split>,
}

impl<'a> Judging<'a> {
    fn of(cell: &'a Cell) -> Self {
        let (refs, against_what) = reference(&cell.rows);
        let least = cell
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
        Self {
            refs,
            against_what,
            least,
            boot: Bootstrap::of(&named, seed_of(cell)),
            splits: cell.rows.iter().map(|r| &r.split).collect(),
        }
    }

    /// The targets `me` is judged on in `cell`, in the report's order.
    fn asks(&self, cell: &Cell, me: &Ran<'_>, top_load: bool) -> Vec<Ask> {
        // One target against `of`; `by`: name the best reference row in the line.
        let ask = |target: String, of: &[Ran<'_>], limit: f64, better: Better, by: bool| {
            let figure: Figure = match better {
                Better::Lower(at) => at.figure,
                Better::Higher => |r| r.output_tokens_per_s,
            };
            let lowest = matches!(better, Better::Lower(_));
            let (mine, theirs, name, by_run) = against(me, of, figure, lowest)?;
            let by = best_name(by, name);
            let (detail, interval) = match better {
                Better::Lower(at) => {
                    let names: Vec<&str> = of.iter().map(|r| r.name).collect();
                    let boot = self.boot.as_ref();
                    (
                        format!("{} vs {}{by}", ms(mine), ms(theirs)),
                        boot.and_then(|b| b.interval(me.name, &names, at.index)),
                    )
                }
                Better::Higher => (format!("{mine:.0} vs {theirs:.0} tok/s{by}"), None),
            };
            Some(Ask {
                target,
                mine,
                theirs,
                by_run,
                limit,
                better,
                detail,
                interval,
            })
        };
        let (w, refs) = (self.against_what, &self.refs);
        let [p50, p90, p99] = Quantile::of(&cell.floor).map(Better::Lower);
        let mut asks = Vec::new();
        if cell.shares && top_load {
            asks.extend(ask(format!("p90 <= 0.7x {w}"), refs, 0.7, p90, true));
        }
        for (name, at) in [("p50", p50), ("p90", p90), ("p99", p99)] {
            asks.extend(ask(format!("{name} <= 1.05x {w}"), refs, 1.05, at, true));
        }
        let tput = Better::Higher;
        asks.extend(ask(
            format!("throughput >= 0.98x {w}"),
            refs,
            0.98,
            tput,
            true,
        ));
        if !cell.shares && !self.least.is_empty() {
            let target = "p90 <= 1.05x least-loaded (control)";
            asks.extend(ask(target.into(), &self.least, 1.05, p90, false));
            let target = "throughput >= 0.95x least-loaded (control)";
            asks.extend(ask(target.into(), &self.least, 0.95, tput, false));
        }
        asks
    }
}

/// The best reference row's name for a verdict line, where `by` asks for it.
fn best_name(by: bool, name: &str) -> String {
    if by {
        format!(" ({name})")
    } else {
        String::new()
    }
}

/// A TTFT quantile a target is judged on.
#[derive(Debug, Clone, Copy)]
struct Quantile {
    figure: Figure,
    /// The cell's floor of it (seconds).
    floor: f64,
    /// Its share (`interval::QUANTILES`): 0.9 for the p90.
    q: f64,
    /// Its index into `interval::QUANTILES`.
    index: usize,
}

impl Quantile {
    /// The p50, p90 and p99, in the order of `interval::QUANTILES`, with `floor`'s.
    fn of(floor: &super::floor::Floor) -> [Self; 3] {
        let at = |figure: Figure, floor: f64, index: usize| Self {
            figure,
            floor,
            q: QUANTILES[index],
            index,
        };
        [
            at(|r| r.ttft_p50, floor.ttft_p50, 0),
            at(|r| r.ttft_p90, floor.ttft_p90, 1),
            at(|r| r.ttft_p99, floor.ttft_p99, 2),
        ]
    }
}

impl Better {
    /// Whether `ratio` meets `limit`.
    fn meets(self, ratio: f64, limit: f64) -> bool {
        match self {
            Better::Lower(_) => ratio <= limit,
            Better::Higher => ratio >= limit,
        }
    }
}

/// `ask` judged for the row named `row`, which had `errors` failed requests; `splits`: every
/// row's answers of the cell ([`beyond_rows`]).
fn verdict(row: &str, errors: usize, splits: &[&reach::Split], ask: Ask) -> Verdict {
    let Ask {
        target,
        mine,
        theirs,
        by_run,
        limit,
        better,
        detail,
        interval,
    } = ask;
    let ratio = mine / theirs;
    let out_of_reach = match better {
        Better::Lower(at) => (at.floor > limit * theirs).then_some(at.floor),
        Better::Higher => None,
    };
    let ok = |r: f64| better.meets(r, limit);
    let failed = (errors > 0).then(|| format!("; {errors} failed requests"));
    // Only a verdict the answers decide: failed requests miss on any draw, and no draw of
    // the plan beats its floor.
    let ratio_only = failed.is_some() || out_of_reach.is_some();
    let within_noise = !ratio_only && interval.is_some_and(|(lo, hi)| lo <= limit && limit <= hi);
    let floor_line = out_of_reach.map_or(String::new(), |f| {
        format!(
            "; out of any router's reach: the floor is {} ({:.2}x)",
            ms(f),
            f / theirs
        )
    });
    let pass = ok(ratio) && failed.is_none();
    let beyond_rows = beyond_rows(splits, better, limit, theirs).filter(|_| !pass);
    let beyond_line = beyond_rows.map_or(String::new(), |(r, q)| beyond(r, q, limit * theirs));
    Verdict {
        row: row.to_string(),
        target,
        pass,
        detail: format!(
            "{ratio:.2}x: {detail}{}{}{floor_line}{beyond_line}{}",
            by_run_line(&by_run, ok),
            spread_line(interval, within_noise, ratio_only, ok),
            failed.unwrap_or_default()
        ),
        out_of_reach: out_of_reach.is_some(),
        beyond_rows: beyond_rows.map(|(r, _)| r),
        by_run: by_run.into_iter().map(|r| r.map(|(r, _)| r)).collect(),
        interval,
        within_noise,
    }
}

/// A verdict line's runs, each ratio and how many pass: a run passes as the pooled verdict
/// does, within the limit (`ok`) with nothing failed. Empty for a single run.
fn by_run_line(by_run: &[RunRatio], ok: impl Fn(f64) -> bool) -> String {
    if by_run.is_empty() {
        return String::new();
    }
    let ratios: Vec<String> = by_run
        .iter()
        .map(|r| r.map_or("-".into(), |(r, _)| format!("{r:.2}x")))
        .collect();
    let pass = by_run
        .iter()
        .flatten()
        .filter(|(r, failed)| ok(*r) && !failed)
        .count();
    format!(
        "; by run {} ({pass} of {} pass)",
        ratios.join(", "),
        by_run.len()
    )
}

/// A verdict line's 95 % interval and what it says (`ratio_only`: failed requests or a
/// target below the floor, which no draw turns). Empty without an interval.
fn spread_line(
    interval: Option<(f64, f64)>,
    within_noise: bool,
    ratio_only: bool,
    ok: impl Fn(f64) -> bool,
) -> String {
    let Some((lo, hi)) = interval else {
        return String::new();
    };
    let call = if within_noise {
        "the limit inside it"
    } else if ratio_only {
        "the answers' ratio only"
    } else if ok(lo) && ok(hi) {
        "a pass beyond the noise"
    } else {
        "a miss beyond the noise"
    };
    format!("; 95 % interval {lo:.2}-{hi:.2}x, {call}")
}

/// The resamples' seed of a cell: its workload and load, so a cell's intervals do not
/// change between the report and `matrix.json`, nor with the cells around it.
fn seed_of(cell: &Cell) -> u64 {
    cell.workload
        .bytes()
        .fold(cell.load.to_bits(), |h, b| h.rotate_left(7) ^ u64::from(b))
}

/// The rows' best, combined ([`super::reach`]), within `limit` times `theirs` (seconds),
/// with the quantile's share, where it is under that share; only for a TTFT limit under the
/// reference's own figure (the reference's answers meet any other).
fn beyond_rows(
    splits: &[&reach::Split],
    better: Better,
    limit: f64,
    theirs: f64,
) -> Option<(Reach, f64)> {
    let Better::Lower(Quantile { q, .. }) = better else {
        return None;
    };
    if limit >= 1.0 {
        return None;
    }
    // A share a rounding step under q (0.7 + 0.3 x 2/3 for 9 of 10) met it.
    reach::combined(splits.iter().copied(), limit * theirs)
        .filter(|r| r.within + 1e-9 < q)
        .map(|r| (r, q))
}

/// A verdict line's account of a limit (`limit` seconds) beyond every row measured.
fn beyond(r: Reach, q: f64, limit: f64) -> String {
    let pct = |x: f64| format!("{:.1} %", x * 100.0);
    format!(
        "; beyond every row measured: the fewest cold answers of any row ({}) with the fastest warm ({} within {}) and cold ({}) put {} within it, under the {} a p{:.0} needs",
        pct(r.fewest_cold),
        pct(r.warm_within),
        ms(limit),
        pct(r.cold_within),
        pct(r.within),
        pct(q),
        q * 100.0
    )
}

/// Seconds as milliseconds for a verdict line.
fn ms(s: f64) -> String {
    format!("{:.0} ms", s * 1e3)
}

#[cfg(test)]
mod tests;
