//! `bench ebpf`'s one table: its rows, the targets' PASS/MISS lines, and the JSON and
//! markdown written under `--out`.

use std::{fmt::Write as _, path::Path};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::{Error, run::report::Quantiles};

/// Median and range of a figure over rounds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub rounds: usize,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let median = match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Self {
            median,
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
            rounds: v.len(),
        }
    }
}

/// connect() of one variant: latency over every round, connections/s per round.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectRow {
    pub variant: String,
    pub measured: bool,
    pub note: String,
    pub connects: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub connections_per_s: Spread,
}

impl ConnectRow {
    /// From a histogram of nanoseconds and each round's rate.
    pub fn measured(variant: &str, h: &Histogram<u64>, rates: &[f64]) -> Self {
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Self {
            variant: variant.into(),
            measured: true,
            note: String::new(),
            connects: h.len(),
            p50_us: us(0.5),
            p90_us: us(0.9),
            p99_us: us(0.99),
            connections_per_s: Spread::of(rates.iter().copied()),
        }
    }

    /// A variant that could not run here, and why.
    pub fn absent(variant: &str, why: &str) -> Self {
        Self {
            variant: variant.into(),
            measured: false,
            note: why.into(),
            connects: 0,
            p50_us: f64::NAN,
            p90_us: f64::NAN,
            p99_us: f64::NAN,
            connections_per_s: Spread::of([]),
        }
    }
}

/// Requests of one kind through one path.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRow {
    pub variant: String,
    /// `non-streamed` (end-to-end latency) or `SSE` (time to first token).
    pub kind: String,
    pub requests: usize,
    pub errors: usize,
    /// Milliseconds.
    pub latency_ms: Quantiles,
    /// Each round's median (ms), in round order.
    pub round_p50_ms: Vec<f64>,
    /// Their spread.
    pub p50_ms_rounds: Spread,
    pub note: String,
}

/// TTFT of the requests made after the agent was killed.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverRow {
    pub variant: String,
    pub requests: usize,
    pub errors: usize,
    /// Milliseconds (wall clock).
    pub ttft_ms: Quantiles,
    /// Share of their prompt tokens that were prefix-cache hits.
    pub cached_share: f64,
    /// Affinity entries of this run's clients in the kernel table when the agent died.
    pub affinity_entries: usize,
    pub note: String,
}

/// One target and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub name: String,
    pub value: String,
    pub met: bool,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub command: String,
    pub machine: String,
    /// `debug` or `release`: which build measured.
    pub build: &'static str,
    pub connect: Vec<ConnectRow>,
    /// connect4's median connect minus no interception's, per round (us).
    pub connect4_cost_us: Spread,
    pub requests: Vec<RequestRow>,
    pub failover: Vec<FailoverRow>,
    pub targets: Vec<Target>,
}

// === impl Report ===

impl Report {
    /// Judges the targets from the rows.
    pub fn judge(&mut self) {
        let mut t = Vec::new();
        let cost = self.connect4_cost_us.median;
        t.push(Target {
            name: "connect4 <= 2 us per connect (median difference vs no interception)".into(),
            value: format!(
                "{cost:.2} us (rounds {:.2}..{:.2})",
                self.connect4_cost_us.min, self.connect4_cost_us.max
            ),
            met: cost <= 2.0,
        });
        let rate = |v: &str| {
            self.connect
                .iter()
                .find(|r| r.variant == v && r.measured)
                .map(|r| r.connections_per_s.median)
        };
        let (bpf, ipt) = (rate("warmpath connect4"), rate("iptables REDIRECT"));
        t.push(Target {
            name: "connect4 beats iptables REDIRECT on connections/s".into(),
            value: match (bpf, ipt) {
                (Some(b), Some(i)) => format!("{b:.0} vs {i:.0} /s ({:.2}x)", b / i),
                _ => "iptables not measured".into(),
            },
            met: matches!((bpf, ipt), (Some(b), Some(i)) if b > i),
        });
        for kind in ["non-streamed", "SSE"] {
            let rounds = |v: &str| {
                self.requests
                    .iter()
                    .find(|r| r.variant == v && r.kind == kind)
                    .map(|r| r.round_p50_ms.clone())
            };
            // Per round, steer's median over direct's (adjacent in time, so the machine's
            // drift cancels), then the median of those ratios.
            let ratios = rounds("steer")
                .zip(rounds("direct"))
                .map(|(s, d)| Spread::of(s.iter().zip(&d).map(|(s, d)| s / d)));
            t.push(Target {
                name: format!(
                    "steer within 5 % of direct ({kind}, median of per-round p50 ratios)"
                ),
                value: ratios.map_or("not measured".into(), |r| {
                    format!("{:.3}x (rounds {:.3}..{:.3})", r.median, r.min, r.max)
                }),
                met: ratios.is_some_and(|r| r.median <= 1.05),
            });
        }
        let p90 = |v: &str| {
            self.failover
                .iter()
                .find(|r| r.variant == v)
                .map(|r| r.ttft_ms.p90)
        };
        let ratio = p90("affinity fail-open")
            .zip(p90("plain VIP fallback"))
            .map(|(a, p)| a / p);
        t.push(Target {
            name: "agent dead: p90 TTFT under affinity fail-open <= 0.3x the plain fallback's"
                .into(),
            value: ratio.map_or("not measured".into(), |r| format!("{r:.2}x")),
            met: ratio.is_some_and(|r| r <= 0.3),
        });
        self.targets = t;
    }

    /// The table (markdown) and the targets' lines.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| measurement | variant | samples | p50 | p90 | p99 | rate / hits | note |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for r in &self.connect {
            let rate = &r.connections_per_s;
            let _ = writeln!(
                s,
                "| connect() (us) | {} | {} | {:.1} | {:.1} | {:.1} | {:.0}/s ({:.0}-{:.0}) | {} |",
                r.variant,
                r.connects,
                r.p50_us,
                r.p90_us,
                r.p99_us,
                rate.median,
                rate.min,
                rate.max,
                r.note
            );
        }
        let c = &self.connect4_cost_us;
        let _ = writeln!(
            s,
            "| connect4 cost (us per connect) | median of per-round p50 differences | {} rounds | {:.2} | | | | rounds {:.2}..{:.2} |",
            c.rounds, c.median, c.min, c.max
        );
        for r in &self.requests {
            let what = if r.kind == "SSE" { "TTFT" } else { "latency" };
            let _ = writeln!(
                s,
                "| {} request {what} (ms) | {} | {} | {:.2} | {:.2} | {:.2} | | {} errors; per-round p50 {:.2}..{:.2}{}{} |",
                r.kind,
                r.variant,
                r.requests,
                r.latency_ms.p50,
                r.latency_ms.p90,
                r.latency_ms.p99,
                r.errors,
                r.p50_ms_rounds.min,
                r.p50_ms_rounds.max,
                if r.note.is_empty() { "" } else { "; " },
                r.note
            );
        }
        for r in &self.failover {
            let _ = writeln!(
                s,
                "| TTFT after the agent's kill (ms) | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} % cached | {} errors; {} |",
                r.variant,
                r.requests,
                r.ttft_ms.p50,
                r.ttft_ms.p90,
                r.ttft_ms.p99,
                r.cached_share * 100.0,
                r.errors,
                r.note
            );
        }
        s.push('\n');
        for t in &self.targets {
            let verdict = if t.met { "PASS" } else { "MISS" };
            let _ = writeln!(s, "{verdict} {}: {}", t.name, t.value);
        }
        s
    }

    /// `<out>/ebpf.json` and `<out>/ebpf.md`.
    pub fn write(&self, out: &Path) -> Result<(), Error> {
        let io = |what: String| move |source| Error::Io { what, source };
        std::fs::create_dir_all(out).map_err(io(format!("create {}", out.display())))?;
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Setup(format!("report as JSON: {e}")))?;
        let path = out.join("ebpf.json");
        std::fs::write(&path, json).map_err(io(format!("write {}", path.display())))?;
        let md = format!(
            "`{}` on {} ({} build)\n\n{}",
            self.command,
            self.machine,
            self.build,
            self.markdown()
        );
        let path = out.join("ebpf.md");
        std::fs::write(&path, md).map_err(io(format!("write {}", path.display())))
    }
}

/// Quantiles of millisecond values.
pub fn quantiles_ms(ms: &[f64]) -> Quantiles {
    // Quantiles::of takes seconds and answers seconds: scaled both ways it stays in ms.
    let q = Quantiles::of(ms.iter().map(|m| m / 1000.0));
    Quantiles {
        p50: q.p50 * 1000.0,
        p90: q.p90 * 1000.0,
        p99: q.p99 * 1000.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_the_median_and_range_of_finite_values() {
        let s = Spread::of([3.0, 1.0, f64::NAN, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.rounds), (2.0, 1.0, 3.0, 3));
        assert_eq!(Spread::of([4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert!(Spread::of([]).median.is_nan());
    }

    fn request(variant: &str, kind: &str, rounds: &[f64]) -> RequestRow {
        RequestRow {
            variant: variant.into(),
            kind: kind.into(),
            requests: rounds.len(),
            errors: 0,
            latency_ms: quantiles_ms(rounds),
            round_p50_ms: rounds.to_vec(),
            p50_ms_rounds: Spread::of(rounds.iter().copied()),
            note: String::new(),
        }
    }

    fn failover(variant: &str, p90: f64) -> FailoverRow {
        FailoverRow {
            variant: variant.into(),
            requests: 1,
            errors: 0,
            ttft_ms: Quantiles {
                p50: p90,
                p90,
                p99: p90,
            },
            cached_share: 0.5,
            affinity_entries: 1,
            note: String::new(),
        }
    }

    fn connect(variant: &str, rate: f64) -> ConnectRow {
        let mut row = ConnectRow::absent(variant, "");
        row.measured = true;
        row.connections_per_s = Spread::of([rate]);
        row
    }

    #[test]
    fn targets_are_judged_from_the_rows() {
        let mut r = Report {
            command: "bench ebpf".into(),
            machine: "test".into(),
            build: "debug",
            connect: vec![
                connect("no interception", 100.0),
                connect("iptables REDIRECT", 80.0),
                connect("warmpath connect4", 90.0),
            ],
            connect4_cost_us: Spread::of([1.0, 3.0, 1.5]),
            requests: vec![
                request("direct", "non-streamed", &[1.0, 2.0, 4.0]),
                // Per round 1.1, 1.0, 1.0: median 1.0.
                request("steer", "non-streamed", &[1.1, 2.0, 4.0]),
                request("direct", "SSE", &[1.0, 1.0, 1.0]),
                // Per round 1.2, 1.06, 1.0: median 1.06.
                request("steer", "SSE", &[1.2, 1.06, 1.0]),
            ],
            failover: vec![
                failover("affinity fail-open", 30.0),
                failover("plain VIP fallback", 100.0),
            ],
            targets: Vec::new(),
        };
        r.judge();
        let met: Vec<bool> = r.targets.iter().map(|t| t.met).collect();
        assert_eq!(met, [true, true, true, false, true], "{:?}", r.targets);
        assert_eq!(r.targets[0].value, "1.50 us (rounds 1.00..3.00)");
        assert_eq!(r.targets[1].value, "90 vs 80 /s (1.12x)");
        assert_eq!(r.targets[4].value, "0.30x");
        let md = r.markdown();
        assert!(
            md.contains("\nMISS steer within 5 % of direct (SSE, "),
            "{md}"
        );
        // Without iptables the rate target cannot be met.
        r.connect.remove(1);
        r.judge();
        assert_eq!(r.targets[1].value, "iptables not measured");
        assert!(!r.targets[1].met);
    }
}
