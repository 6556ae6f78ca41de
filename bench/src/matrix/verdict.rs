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
//! A row with a failed request misses every target. With no peer row that ran, the peer
//! targets are judged against the best of round-robin and least-loaded instead, and every
//! such line says it is a stand-in.

use super::{Cell, CellRow};
use crate::compare::{CENTRAL_ROW, Row};

/// One target judged for one row of one cell.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Verdict {
    pub row: String,
    pub target: String,
    pub pass: bool,
    /// The figures behind it.
    pub detail: String,
}

/// One figure of a row.
type Figure = fn(&Row) -> f64;

/// The rows the targets are judged for.
const JUDGED: [&str; 2] = ["Precise", CENTRAL_ROW];

/// Whether a row is a peer router's.
fn is_peer(name: &str) -> bool {
    name.contains("-router")
}

/// The rows the peer targets compare against, and what to call them.
fn reference(rows: &[CellRow]) -> (Vec<&Row>, &'static str) {
    let ran = |keep: fn(&str) -> bool| -> Vec<&Row> {
        rows.iter()
            .filter(|r| keep(&r.name))
            .filter_map(|r| r.result.as_ref())
            .collect()
    };
    let peers = ran(is_peer);
    if peers.is_empty() {
        let stand_in = ran(|n| n == "RoundRobin" || n == "LeastLoaded");
        (stand_in, "best non-warmpath row (stand-in: no peer ran)")
    } else {
        (peers, "best peer")
    }
}

/// The lowest value of `f` over `rows` and the row that has it.
fn best<'a>(rows: &[&'a Row], f: Figure, lowest: bool) -> Option<(f64, &'a Row)> {
    rows.iter()
        .map(|r| (f(r), *r))
        .filter(|(v, _)| v.is_finite())
        .reduce(|a, b| if (b.0 < a.0) == lowest { b } else { a })
}

/// Every target for every judged row of `cell`; `top_load`: the cell is at one of the two
/// highest loads.
pub fn judge(cell: &Cell, top_load: bool) -> Vec<Verdict> {
    let (refs, against) = reference(&cell.rows);
    let mut out = Vec::new();
    for row in cell
        .rows
        .iter()
        .filter(|r| JUDGED.contains(&r.name.as_str()))
    {
        let Some(me) = &row.result else { continue };
        let mut check =
            |target: String, ratio: f64, limit: f64, lower_is_better: bool, detail: String| {
                let ok = if lower_is_better {
                    ratio <= limit
                } else {
                    ratio >= limit
                };
                let failed = (me.errors > 0).then(|| format!("; {} failed requests", me.errors));
                out.push(Verdict {
                    row: row.name.clone(),
                    target,
                    pass: ok && failed.is_none(),
                    detail: format!("{:.2}x: {detail}{}", ratio, failed.unwrap_or_default()),
                });
            };
        let quantiles: [(&str, Figure); 3] = [
            ("p50", |r| r.ttft_p50),
            ("p90", |r| r.ttft_p90),
            ("p99", |r| r.ttft_p99),
        ];
        if cell.shares
            && top_load
            && let Some((v, by)) = best(&refs, |r| r.ttft_p90, true)
        {
            check(
                format!("p90 <= 0.7x {against}"),
                me.ttft_p90 / v,
                0.7,
                true,
                format!("{} vs {} ({})", ms(me.ttft_p90), ms(v), by.policy),
            );
        }
        for (q, f) in quantiles {
            if let Some((v, by)) = best(&refs, f, true) {
                check(
                    format!("{q} <= 1.05x {against}"),
                    f(me) / v,
                    1.05,
                    true,
                    format!("{} vs {} ({})", ms(f(me)), ms(v), by.policy),
                );
            }
        }
        if let Some((v, by)) = best(&refs, |r| r.output_tokens_per_s, false) {
            check(
                format!("throughput >= 0.98x {against}"),
                me.output_tokens_per_s / v,
                0.98,
                false,
                format!(
                    "{:.0} vs {v:.0} tok/s ({})",
                    me.output_tokens_per_s, by.policy
                ),
            );
        }
        let least = cell.rows.iter().find(|r| r.name == "LeastLoaded");
        if !cell.shares
            && let Some(ll) = least.and_then(|r| r.result.as_ref())
        {
            check(
                "p90 <= 1.05x least-loaded (control)".into(),
                me.ttft_p90 / ll.ttft_p90,
                1.05,
                true,
                format!("{} vs {}", ms(me.ttft_p90), ms(ll.ttft_p90)),
            );
            check(
                "throughput >= 0.95x least-loaded (control)".into(),
                me.output_tokens_per_s / ll.output_tokens_per_s,
                0.95,
                false,
                format!(
                    "{:.0} vs {:.0} tok/s",
                    me.output_tokens_per_s, ll.output_tokens_per_s
                ),
            );
        }
    }
    out
}

/// Seconds as milliseconds for a verdict line.
fn ms(s: f64) -> String {
    format!("{:.0} ms", s * 1e3)
}

#[cfg(test)]
mod tests;
