//! The scale table: each quantity at the measured sizes and extrapolated to a cluster of
//! `nodes` x 8 pods, with its formula and the measured inputs (docs/benchmarks.md,
//! "Cluster"). Fits are least squares over the measured sizes: gossip bytes and messages
//! per node as `a + b·N` (chitchat's digest grows with N), the spread of a change in
//! rounds as `c + d·log3(N)` (chitchat gossips with 3 peers a round).

use warmpath_agent::cluster::scale::GossipFigures;

/// A line `y = a + b·x` fitted by least squares (`b` = 0 with fewer than two distinct x).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Line {
    pub a: f64,
    pub b: f64,
}

impl Line {
    pub fn fit(points: &[(f64, f64)]) -> Self {
        let n = points.len() as f64;
        if points.is_empty() {
            return Self { a: 0.0, b: 0.0 };
        }
        let (sx, sy) = points
            .iter()
            .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
        let (mx, my) = (sx / n, sy / n);
        let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(sxy, sxx), (x, y)| {
            (sxy + (x - mx) * (y - my), sxx + (x - mx) * (x - mx))
        });
        let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
        Self { a: my - b * mx, b }
    }

    pub fn at(&self, x: f64) -> f64 {
        self.a + self.b * x
    }
}

fn sign(x: f64) -> char {
    if x < 0.0 { '-' } else { '+' }
}

/// One row: a quantity at each measured size and at `nodes`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub quantity: String,
    pub formula: String,
    /// (agents, value) as measured.
    pub measured: Vec<(usize, f64)>,
    pub extrapolated: f64,
    pub unit: &'static str,
}

/// The table's rows from the gossip figures (one per size, same interval and pods).
pub fn gossip_rows(figures: &[GossipFigures], nodes: usize) -> Vec<Row> {
    let n = nodes as f64;
    let log3 = |x: f64| x.ln() / 3f64.ln();
    let measured = |f: fn(&GossipFigures) -> f64| -> Vec<(usize, f64)> {
        figures.iter().map(|g| (g.agents, f(g))).collect()
    };
    let line = |f: fn(&GossipFigures) -> f64, x: fn(f64) -> f64| {
        let pts: Vec<(f64, f64)> = figures.iter().map(|g| (x(g.agents as f64), f(g))).collect();
        Line::fit(&pts)
    };
    let linear = |x: f64| x;
    let mut rows = Vec::new();
    let mut per_node = |quantity: &str, f: fn(&GossipFigures) -> f64, unit| {
        let l = line(f, linear);
        rows.push(Row {
            quantity: quantity.into(),
            formula: format!("{:.1} {} {:.3}·N", l.a, sign(l.b), l.b.abs()),
            measured: measured(f),
            extrapolated: l.at(n),
            unit,
        });
    };
    per_node(
        "gossip sent per node, idle",
        |g| g.idle_bytes_per_node_s,
        "B/s",
    );
    per_node(
        "gossip sent per node, every pod's watermark moving",
        |g| g.busy_bytes_per_node_s,
        "B/s",
    );
    per_node(
        "gossip messages per node, busy",
        |g| g.busy_messages_per_node_s,
        "1/s",
    );
    per_node(
        "mean gossip message, busy (the largest is at most the 65,507-byte datagram)",
        |g| g.busy_bytes_per_node_s / g.busy_messages_per_node_s.max(f64::MIN_POSITIVE),
        "B",
    );
    let rounds = line(|g| g.change_known_rounds, log3);
    let interval = figures
        .first()
        .map_or(0.0, |g| g.gossip_interval_ms as f64 / 1e3);
    rows.push(Row {
        quantity: "one change known to all".into(),
        formula: format!(
            "({:.2} {} {:.2}·log3 N) rounds x {:.0} ms",
            rounds.a,
            sign(rounds.b),
            rounds.b.abs(),
            interval * 1e3
        ),
        measured: measured(|g| g.change_known_s),
        extrapolated: rounds.at(log3(n)) * interval,
        unit: "s",
    });
    rows
}

/// Replica memory and streams for `nodes` x `pods_per_node`, a pool of `pool` pods with
/// `blocks` cached blocks each, at `per_entry` bytes per (block, pod).
pub fn replica_rows(
    per_entry: f64,
    nodes: usize,
    pods_per_node: usize,
    pool: usize,
    blocks: usize,
) -> Vec<Row> {
    let all = nodes * pods_per_node;
    vec![
        Row {
            quantity: format!("replica memory, a pool of {pool} pods x {blocks} blocks"),
            formula: format!("R x B x {per_entry:.1} B"),
            measured: Vec::new(),
            extrapolated: pool as f64 * blocks as f64 * per_entry,
            unit: "B",
        },
        Row {
            quantity: format!("replica memory, all {all} pods x {blocks} blocks"),
            formula: format!("R x B x {per_entry:.1} B"),
            measured: Vec::new(),
            extrapolated: all as f64 * blocks as f64 * per_entry,
            unit: "B",
        },
        Row {
            quantity: format!("IndexSync streams per agent, a pool of {pool} pods"),
            formula: format!("P / {pods_per_node} - 1"),
            measured: Vec::new(),
            extrapolated: (pool / pods_per_node.max(1)).saturating_sub(1) as f64,
            unit: "",
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(agents: usize, idle: f64, rounds: f64) -> GossipFigures {
        GossipFigures {
            agents,
            pods: 8,
            gossip_interval_ms: 500,
            converged_s: 1.0,
            change_known_s: rounds * 0.5,
            change_known_rounds: rounds,
            change_known_mean_s: rounds * 0.5,
            change_known_min_s: rounds * 0.5,
            changes: 1,
            idle_bytes_per_node_s: idle,
            idle_messages_per_node_s: 20.0,
            busy_bytes_per_node_s: idle * 2.0,
            busy_messages_per_node_s: 20.0,
        }
    }

    #[test]
    fn a_line_through_two_points_and_a_least_squares_one() {
        let l = Line::fit(&[(16.0, 1_000.0), (64.0, 2_500.0)]);
        assert!(
            (l.b - 31.25).abs() < 1e-9 && (l.a - 500.0).abs() < 1e-9,
            "{l:?}"
        );
        assert!((l.at(1_000.0) - 31_750.0).abs() < 1e-6);
        // Three points off a line: the least-squares slope of (0,0), (1,1), (2,4) is 2.
        let l = Line::fit(&[(0.0, 0.0), (1.0, 1.0), (2.0, 4.0)]);
        assert!(
            (l.b - 2.0).abs() < 1e-12 && (l.a + 1.0 / 3.0).abs() < 1e-12,
            "{l:?}"
        );
        assert_eq!(Line::fit(&[(3.0, 5.0)]), Line { a: 5.0, b: 0.0 });
    }

    #[test]
    fn gossip_rows_extrapolate_bytes_linearly_and_rounds_by_log3() {
        // 16 agents: 2 rounds, 64: 3 rounds; log3 16 = 2.524, log3 64 = 3.786.
        let rows = gossip_rows(
            &[figures(16, 1_000.0, 2.0), figures(64, 2_500.0, 3.0)],
            1_000,
        );
        assert!(
            (rows[0].extrapolated - 31_750.0).abs() < 1e-6,
            "{:?}",
            rows[0]
        );
        assert_eq!(rows[0].measured, [(16, 1_000.0), (64, 2_500.0)]);
        assert!((rows[1].extrapolated - 63_500.0).abs() < 1e-6);
        let change = rows.last().expect("the change row");
        let (l16, l64, l1000) = (16f64.log(3.0), 64f64.log(3.0), 1_000f64.log(3.0));
        let rounds = 2.0 + (l1000 - l16) / (l64 - l16);
        assert!(
            (change.extrapolated - rounds * 0.5).abs() < 1e-9,
            "{change:?}"
        );
    }

    #[test]
    fn replica_rows_multiply_out() {
        let rows = replica_rows(80.0, 1_000, 8, 64, 30_000);
        assert_eq!(rows[0].extrapolated, 64.0 * 30_000.0 * 80.0);
        assert_eq!(rows[1].extrapolated, 8_000.0 * 30_000.0 * 80.0);
        assert_eq!(rows[2].extrapolated, 7.0);
    }
}
