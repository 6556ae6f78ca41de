//! The soak's memory figures from its RSS samples, and the result table.
//!
//! - RSS after warm-up and at the end: the median of the samples in the [`WINDOW_S`] seconds
//!   before each point (one sample can catch an allocator's passing peak).
//! - Growth: end against warm-up, in percent (goal: within 10 %).
//! - The last half: a line (Theil-Sen) through the samples of the second half of the
//!   measured time (after warm-up); its slope in KiB per minute, and what it adds over that
//!   half in percent of the warm-up RSS (flat: under [`FLAT_PCT`]).
//! - The middle: the median before the measured time's midpoint, which the CI soak compares
//!   the end with.

use serde::Serialize;

use super::{idle::IdleReport, load::Counts, procfs::Fds};

/// Seconds of samples a point's median is taken over.
pub const WINDOW_S: f64 = 5.0;
/// Growth goal, end against warm-up, percent.
pub const GROWTH_GOAL_PCT: f64 = 10.0;
/// The last half counts as flat when its fitted line rises less than this, in percent of
/// the warm-up RSS.
pub const FLAT_PCT: f64 = 2.0;
/// Points the slope is fitted on at most (pairs grow with the square).
const MAX_FIT_POINTS: usize = 400;

/// One reading of the agent.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub t: f64,
    pub rss_kib: u64,
    pub fds: Fds,
    /// Requests sent so far.
    pub requests: u64,
}

/// Memory over the measured time.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Growth {
    pub warmup_kib: f64,
    pub middle_kib: f64,
    pub end_kib: f64,
    pub growth_pct: f64,
    pub last_half_slope_kib_per_min: f64,
    pub last_half_rise_pct: f64,
}

impl Growth {
    /// From samples (in time order) and when warm-up ended; None without samples after it.
    pub fn of(samples: &[Sample], warmup_s: f64) -> Option<Self> {
        let end_t = samples.last()?.t;
        if end_t <= warmup_s {
            return None;
        }
        let median_before = |t: f64| {
            let mut v: Vec<f64> = samples
                .iter()
                .filter(|s| s.t <= t && s.t > t - WINDOW_S)
                .map(|s| s.rss_kib as f64)
                .collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let warmup_kib = median_before(warmup_s).or(samples.first().map(|s| s.rss_kib as f64))?;
        let mid_t = warmup_s + (end_t - warmup_s) / 2.0;
        let middle_kib = median_before(mid_t)?;
        let end_kib = median_before(end_t)?;
        let half: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| s.t >= mid_t)
            .map(|s| (s.t, s.rss_kib as f64))
            .collect();
        let slope_per_s = slope(&half).unwrap_or(0.0);
        Some(Self {
            warmup_kib,
            middle_kib,
            end_kib,
            growth_pct: 100.0 * (end_kib - warmup_kib) / warmup_kib.max(1.0),
            last_half_slope_kib_per_min: slope_per_s * 60.0,
            last_half_rise_pct: 100.0 * slope_per_s * (end_t - mid_t) / warmup_kib.max(1.0),
        })
    }

    /// Both goals: within [`GROWTH_GOAL_PCT`] of warm-up, flat over the last half.
    pub fn met(&self) -> bool {
        self.growth_pct <= GROWTH_GOAL_PCT && self.last_half_rise_pct < FLAT_PCT
    }
}

/// Slope of `y` over `x` by Theil-Sen: the median of the slopes between every two points
/// (an allocator's passing peak moves a least-squares line, not this median); None for fewer
/// than two distinct `x`. Long series are thinned to [`MAX_FIT_POINTS`] evenly spaced points.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let step = points.len().div_ceil(MAX_FIT_POINTS).max(1);
    let points: Vec<(f64, f64)> = points.iter().step_by(step).copied().collect();
    let mut slopes: Vec<f64> = Vec::new();
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            if b.0 != a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    slopes.sort_by(f64::total_cmp);
    let n = slopes.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(slopes[n / 2]),
        _ => Some((slopes[n / 2 - 1] + slopes[n / 2]) / 2.0),
    }
}

/// Everything the soak measured.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub load_seconds: f64,
    pub warmup_seconds: f64,
    pub rate: f64,
    pub requests: Counts,
    pub first_unexpected: Option<String>,
    /// Times the failing endpoint was killed (and started again).
    pub endpoint_kills: u64,
    pub growth: Option<Growth>,
    pub peak_rss_kib: u64,
    /// Before any request.
    pub fds_cold: Fds,
    pub fds_peak: usize,
    /// After the load stopped and the agent's client connections closed.
    pub fds_after: Fds,
    /// Idle streams asked for (`idle.asked` is what the open-file limit let it try).
    pub idle_requested: usize,
    pub idle: Option<IdleReport>,
    pub samples: Vec<Sample>,
}

impl SoakReport {
    /// Descriptors back to where they were: no client connection left, the rest as before
    /// the load (engine connections stay pooled, at most one per request in flight).
    pub fn fds_back(&self) -> bool {
        self.fds_after.clients == 0 && self.fds_after.other() <= self.fds_cold.other()
    }
}

/// The result table (markdown).
pub fn render(r: &SoakReport) -> String {
    let mb = |kib: f64| format!("{:.1} MB", kib * 1024.0 / 1e6);
    let c = &r.requests;
    let mut out = format!(
        "bench soak: {:.0} s of load ({:.0} s warm-up) at {} req/s\n\n",
        r.load_seconds, r.warmup_seconds, r.rate
    );
    out += "| requests | ok | cancelled | refused (400/404) | engine errors | unexpected | shed | endpoint kills |\n|---|---|---|---|---|---|---|---|\n";
    out += &format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} |\n\n",
        c.sent,
        c.ok,
        c.cancelled,
        c.refused,
        c.upstream_errors,
        c.unexpected,
        c.shed,
        r.endpoint_kills
    );
    if let Some(first) = &r.first_unexpected {
        out += &format!("First unexpected outcome: {first}\n\n");
    }
    out += "| figure | value | goal |\n|---|---|---|\n";
    if let Some(g) = &r.growth {
        out += &format!(
            "| RSS after warm-up / middle / end | {} / {} / {} | |\n",
            mb(g.warmup_kib),
            mb(g.middle_kib),
            mb(g.end_kib)
        );
        out += &format!(
            "| growth, end vs warm-up | {:+.1} % | within {GROWTH_GOAL_PCT} %: {} |\n",
            g.growth_pct,
            yes(g.growth_pct <= GROWTH_GOAL_PCT)
        );
        out += &format!(
            "| last half: slope / fitted rise | {:+.1} KiB/min / {:+.2} % | flat (< {FLAT_PCT} %): {} |\n",
            g.last_half_slope_kib_per_min,
            g.last_half_rise_pct,
            yes(g.last_half_rise_pct < FLAT_PCT)
        );
    } else {
        out += "| RSS | no samples after warm-up | |\n";
    }
    out += &format!("| peak RSS | {} | |\n", mb(r.peak_rss_kib as f64));
    let fds = |f: &Fds| {
        format!(
            "{} ({} clients, {} engines, {} other)",
            f.total,
            f.clients,
            f.engines,
            f.other()
        )
    };
    out += &format!(
        "| fds before / peak / after | {} / {} / {} | back to baseline: {} |\n",
        fds(&r.fds_cold),
        r.fds_peak,
        fds(&r.fds_after),
        yes(r.fds_back())
    );
    if let Some(i) = &r.idle {
        out += &format!(
            "| idle streams held ({} upstream) | {} of {}{} in {:.1} s{} | |\n",
            i.upstream,
            i.held,
            i.asked,
            if i.asked < r.idle_requested {
                format!(" ({} asked; the open-file limit)", r.idle_requested)
            } else {
                String::new()
            },
            i.open_seconds,
            i.first_failure
                .as_ref()
                .map(|f| format!(" ({} failed, first: {f})", i.failed))
                .unwrap_or_default()
        );
        out += &format!(
            "| memory per idle stream | {:.0} bytes (RSS {} -> {}) | |\n",
            i.bytes_per_stream,
            mb(i.rss_before_kib as f64),
            mb(i.rss_held_kib as f64)
        );
        out += &format!(
            "| fds with streams held / after | {} / {} | |\n",
            fds(&i.fds_held),
            fds(&i.fds_after)
        );
        out += &format!(
            "| the soak's own fds with streams held | {} (open-file limit {}) | |\n",
            i.own_fds_held, i.own_fd_limit
        );
    }
    out
}

fn yes(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: f64, rss_kib: u64) -> Sample {
        Sample {
            t,
            rss_kib,
            fds: Fds::default(),
            requests: 0,
        }
    }

    #[test]
    fn slope_of_a_line_and_of_too_few_points() {
        assert_eq!(slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]), Some(2.0));
        assert_eq!(slope(&[(1.0, 1.0)]), None);
        assert_eq!(slope(&[(1.0, 1.0), (1.0, 2.0)]), None);
        // One outlier of five does not move it: slopes 0 x6, +-4000/k x4 -> median 0.
        let spiked = [
            (0.0, 1.0),
            (1.0, 1.0),
            (2.0, 4001.0),
            (3.0, 1.0),
            (4.0, 1.0),
        ];
        assert_eq!(slope(&spiked), Some(0.0));
    }

    #[test]
    fn flat_memory_meets_both_goals() {
        // Warm-up to 10 s; 1,000 KiB throughout, one passing peak the medians ignore.
        let mut samples: Vec<Sample> = (0..=30).map(|t| at(t as f64, 1_000)).collect();
        samples[29].rss_kib = 5_000;
        let g = Growth::of(&samples, 10.0).unwrap();
        assert_eq!(
            (g.warmup_kib, g.middle_kib, g.end_kib),
            (1_000.0, 1_000.0, 1_000.0)
        );
        assert_eq!(g.growth_pct, 0.0);
        assert_eq!(g.last_half_slope_kib_per_min, 0.0);
        assert!(g.met());
    }

    #[test]
    fn steady_growth_is_measured_and_fails() {
        // 1,000 KiB at warm-up's end (10 s), +6 KiB per second after it, to 30 s.
        let samples: Vec<Sample> = (0..=30)
            .map(|t| at(t as f64, 1_000 + 6 * (t.max(10) - 10) as u64))
            .collect();
        let g = Growth::of(&samples, 10.0).unwrap();
        // Medians of the 5 s up to each point: t = 8..10 -> 1,000; 16..20 -> t = 18 -> 1,048;
        // 26..30 -> t = 28 -> 1,108.
        assert_eq!(
            (g.warmup_kib, g.middle_kib, g.end_kib),
            (1_000.0, 1_048.0, 1_108.0)
        );
        assert!((g.growth_pct - 10.8).abs() < 1e-9);
        assert!((g.last_half_slope_kib_per_min - 360.0).abs() < 1e-9);
        // 6 KiB/s over the last 10 s: 60 KiB, 6 % of 1,000.
        assert!((g.last_half_rise_pct - 6.0).abs() < 1e-9);
        assert!(!g.met());
        assert_eq!(Growth::of(&samples[..5], 10.0), None);
    }
}
