//! Prometheus histograms read from an agent's `/metrics` text: one family's buckets per
//! label set, the difference between two scrapes (what a phase added), merged across
//! agents, and quantiles interpolated within a bucket the way Prometheus'
//! `histogram_quantile` does.

use std::collections::BTreeMap;

/// One histogram series: cumulative counts per upper bound (the `+Inf` bucket is `count`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Buckets {
    /// (upper bound, cumulative count), bounds rising, `+Inf` left out.
    pub bounds: Vec<(f64, u64)>,
    pub count: u64,
    pub sum: f64,
}

/// A family's series by their labels other than `le` (`""` without labels, else
/// `k="v",...` as rendered).
pub type Family = BTreeMap<String, Buckets>;

/// The series of histogram `name` (without `_bucket`) in a Prometheus text exposition.
pub fn parse(text: &str, name: &str) -> Family {
    let mut family = Family::new();
    let bucket = format!("{name}_bucket");
    let (sum, count) = (format!("{name}_sum"), format!("{name}_count"));
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, labels) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.strip_suffix('}').unwrap_or(rest)),
            None => (series, ""),
        };
        if metric == bucket {
            let (le, rest) = split_le(labels);
            let (Some(le), Ok(v)) = (le, value.parse::<f64>()) else {
                continue;
            };
            let b = family.entry(rest).or_default();
            if le == "+Inf" {
                b.count = v as u64;
            } else if let Ok(le) = le.parse::<f64>() {
                b.bounds.push((le, v as u64));
            }
        } else if metric == sum {
            if let Ok(v) = value.parse() {
                family.entry(labels.to_string()).or_default().sum = v;
            }
        } else if metric == count
            && let Ok(v) = value.parse::<f64>()
        {
            family.entry(labels.to_string()).or_default().count = v as u64;
        }
    }
    for b in family.values_mut() {
        b.bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    family
}

/// `le`'s value and the other labels, as rendered (`le` is rendered last).
fn split_le(labels: &str) -> (Option<&str>, String) {
    let mut le = None;
    let mut rest = Vec::new();
    for pair in labels.split(',').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("le=") {
            Some(v) => le = Some(v.trim_matches('"')),
            None => rest.push(pair),
        }
    }
    (le, rest.join(","))
}

impl Buckets {
    /// What `later` holds beyond `self` (an earlier scrape of the same series).
    pub fn since(&self, earlier: &Buckets) -> Buckets {
        Buckets {
            bounds: self
                .bounds
                .iter()
                .map(|&(le, c)| (le, c.saturating_sub(earlier.at(le))))
                .collect(),
            count: self.count.saturating_sub(earlier.count),
            sum: (self.sum - earlier.sum).max(0.0),
        }
    }

    /// Both series' samples together (same bounds; a bound missing from one counts as 0).
    pub fn merge(&self, other: &Buckets) -> Buckets {
        if self.bounds.is_empty() {
            return other.clone();
        }
        Buckets {
            bounds: self
                .bounds
                .iter()
                .map(|&(le, c)| (le, c + other.at(le)))
                .collect(),
            count: self.count + other.count,
            sum: self.sum + other.sum,
        }
    }

    /// The cumulative count at bound `le` (0 where this series has no such bound).
    fn at(&self, le: f64) -> u64 {
        self.bounds
            .iter()
            .find(|(b, _)| *b == le)
            .map_or(0, |(_, c)| *c)
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }

    /// The `q` quantile (0..1), linear within its bucket (from the previous bound, or 0);
    /// with the bucket's (lower, upper) bounds. `None` without samples; beyond the last
    /// finite bound the answer is that bound (the true value is larger).
    pub fn quantile(&self, q: f64) -> Option<Quantile> {
        if self.count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut lower = (0.0, 0u64);
        for &(le, cumulative) in &self.bounds {
            if cumulative as f64 >= rank && cumulative > lower.1 {
                let within = (rank - lower.1 as f64) / (cumulative - lower.1) as f64;
                return Some(Quantile {
                    value: lower.0 + (le - lower.0) * within.clamp(0.0, 1.0),
                    lower: lower.0,
                    upper: le,
                    beyond: false,
                });
            }
            lower = (le, cumulative);
        }
        Some(Quantile {
            value: lower.0,
            lower: lower.0,
            upper: f64::INFINITY,
            beyond: true,
        })
    }
}

/// A quantile read off buckets.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Quantile {
    /// Interpolated within the bucket (seconds, for the lag histograms).
    pub value: f64,
    /// The bucket it fell in: the true quantile is within (lower, upper].
    pub lower: f64,
    pub upper: f64,
    /// Above every finite bound: `value` is the last bound, a lower limit.
    pub beyond: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP warmpath_cluster_placement_lag_seconds A placement
# TYPE warmpath_cluster_placement_lag_seconds histogram
warmpath_cluster_placement_lag_seconds_bucket{hops="1",le="0.001"} 2
warmpath_cluster_placement_lag_seconds_bucket{hops="1",le="0.002"} 8
warmpath_cluster_placement_lag_seconds_bucket{hops="1",le="0.005"} 10
warmpath_cluster_placement_lag_seconds_bucket{hops="1",le="+Inf"} 10
warmpath_cluster_placement_lag_seconds_sum{hops="1"} 0.015
warmpath_cluster_placement_lag_seconds_count{hops="1"} 10
warmpath_cluster_delta_lag_seconds_bucket{le="0.001"} 1
warmpath_cluster_delta_lag_seconds_bucket{le="+Inf"} 3
warmpath_cluster_delta_lag_seconds_sum 0.5
warmpath_cluster_delta_lag_seconds_count 3
"#;

    #[test]
    fn a_family_is_read_per_label_set() {
        let f = parse(TEXT, "warmpath_cluster_placement_lag_seconds");
        assert_eq!(f.len(), 1);
        let b = &f["hops=\"1\""];
        assert_eq!(b.bounds, [(0.001, 2), (0.002, 8), (0.005, 10)]);
        assert_eq!((b.count, b.sum), (10, 0.015));
        let d = parse(TEXT, "warmpath_cluster_delta_lag_seconds");
        assert_eq!(d[""].bounds, [(0.001, 1)]);
        assert_eq!((d[""].count, d[""].sum), (3, 0.5));
        assert!(parse(TEXT, "warmpath_cluster_event_lag_seconds").is_empty());
    }

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        let b = &parse(TEXT, "warmpath_cluster_placement_lag_seconds")["hops=\"1\""];
        // Rank 5 of 10: the (1 ms, 2 ms] bucket holds ranks 3..8, so 1 ms + 3/6 of 1 ms.
        let p50 = b.quantile(0.5).expect("samples");
        assert!((p50.value - 0.0015).abs() < 1e-12, "{p50:?}");
        assert_eq!((p50.lower, p50.upper), (0.001, 0.002));
        // Rank 9.9: (2 ms, 5 ms] holds 9 and 10: 2 ms + 1.9/2 of 3 ms.
        let p99 = b.quantile(0.99).expect("samples");
        assert!((p99.value - 0.00485).abs() < 1e-12, "{p99:?}");
        assert_eq!(b.mean(), Some(0.0015));
        // Two of three samples are above the last finite bound: p99 is at least it.
        let d = &parse(TEXT, "warmpath_cluster_delta_lag_seconds")[""];
        let q = d.quantile(0.99).expect("samples");
        assert!(q.beyond && q.value == 0.001, "{q:?}");
        assert_eq!(Buckets::default().quantile(0.5), None);
    }

    #[test]
    fn a_phase_is_the_difference_of_two_scrapes_and_agents_merge() {
        let later = Buckets {
            bounds: vec![(0.001, 5), (0.002, 9)],
            count: 10,
            sum: 0.02,
        };
        let earlier = Buckets {
            bounds: vec![(0.001, 1), (0.002, 2)],
            count: 2,
            sum: 0.002,
        };
        let phase = later.since(&earlier);
        assert_eq!(phase.bounds, [(0.001, 4), (0.002, 7)]);
        assert_eq!(phase.count, 8);
        assert!((phase.sum - 0.018).abs() < 1e-12);
        let both = phase.merge(&earlier);
        assert_eq!(both.bounds, [(0.001, 5), (0.002, 9)]);
        assert_eq!(both.count, 10);
        assert_eq!(Buckets::default().merge(&earlier), earlier);
    }
}
