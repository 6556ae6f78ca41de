//! How far behind the truth a replica is, per message (docs/cluster.md, "Lag"): the owner
//! stamps each delta with the wall-clock time it applied the batch (and the engine's own
//! time of the batch, when it sent one), and each placement with the time its agent made it;
//! the agent receiving one records `now - stamp` once it has applied it, in histograms
//! exported on `/metrics`:
//!
//! - `warmpath.cluster.delta_lag` (`warmpath_cluster_delta_lag_seconds`): the owner applied
//!   a batch -> this replica applied its delta;
//! - `warmpath.cluster.event_lag` (`warmpath_cluster_event_lag_seconds`): the engine
//!   published the batch (its `ts`) -> this replica applied it: event to remote index;
//! - `warmpath.cluster.placement_lag` (`warmpath_cluster_placement_lag_seconds`, attribute
//!   `hops`: 1 straight from the agent that routed, 2 relayed by the pod's owner): a placement
//!   made -> held here.
//!
//! Stamps are unix microseconds of the sender's clock, so across machines a figure includes
//! the two clocks' skew; a stamp from the future reads as 0, and a missing one (0: a peer that
//! does not stamp) is not recorded. A figure over [`MAX_LAG_SECONDS`] (a sender's clock far
//! behind ours) is not recorded either but counted (`warmpath.cluster.implausible_lags`), so
//! one peer's bad clock cannot skew the histograms' sums. Snapshots are not stamped: they are
//! catch-up, not lag.

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use opentelemetry::{
    KeyValue,
    metrics::{Histogram, Meter},
};

/// Bucket bounds in seconds: 100 us .. 30 s at about 1.5x steps, so the p99 of a loopback
/// stream (milliseconds) and the targets (20 ms, 200 ms: both bounds) read off
/// within a bucket of about a third.
pub const LAG_BOUNDS: [f64; 31] = [
    0.000_1, 0.000_15, 0.000_2, 0.000_3, 0.000_5, 0.000_7, 0.001, 0.001_5, 0.002, 0.003, 0.005,
    0.007, 0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0,
    5.0, 10.0, 30.0,
];

/// The largest lag recorded: an hour, far beyond any stream's real lag (the buckets end at
/// 30 s); above it the figure is the sender's clock, not the stream.
pub const MAX_LAG_SECONDS: f64 = 3_600.0;

/// Now, in unix microseconds of this machine's wall clock (0 if the clock reads before 1970).
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The lag in seconds from a sender's stamp to `now_us`; `None` for no stamp (0). A stamp
/// ahead of `now_us` (the sender's clock ahead of ours) is a lag of 0.
pub fn lag_seconds(now_us: u64, stamp_us: u64) -> Option<f64> {
    (stamp_us != 0).then(|| now_us.saturating_sub(stamp_us) as f64 / 1e6)
}

/// The stamps of one message as received, recorded once it is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// A delta: when the owner applied it, when its engine published it (0: unknown).
    Delta { applied_us: u64, event_us: u64 },
    /// A placement: when it was made, and whether the pod's owner relayed it.
    Placement { placed_us: u64, relayed: bool },
    /// Nothing to record (a snapshot).
    None,
}

/// One agent's lag histograms; recording does nothing until [`Lags::observe`] gave them a
/// meter (a node without telemetry, e.g. in tests and benchmarks in one process).
#[derive(Debug, Default)]
pub struct Lags {
    histograms: OnceLock<Histograms>,
    /// Lags over [`MAX_LAG_SECONDS`], left out of the histograms (counted from the start).
    implausible: AtomicU64,
}

#[derive(Debug)]
struct Histograms {
    delta: Histogram<f64>,
    event: Histogram<f64>,
    placement: Histogram<f64>,
}

// === impl Lags ===

impl Lags {
    /// Registers the histograms on `meter` (the first call only: later ones change nothing).
    pub fn observe(&self, meter: &Meter) {
        let histogram = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(LAG_BOUNDS.to_vec())
                .build()
        };
        let _ = self.histograms.set(Histograms {
            delta: histogram(
                "warmpath.cluster.delta_lag",
                "The owner applied a batch -> this replica applied its delta (sender's clock)",
            ),
            event: histogram(
                "warmpath.cluster.event_lag",
                "The engine published a KV event batch -> this replica applied it (engine's clock)",
            ),
            placement: histogram(
                "warmpath.cluster.placement_lag",
                "A placement made by another agent -> held here (hops: 1 direct, 2 relayed by the owner)",
            ),
        });
    }

    /// Records `stamp`'s lags as of now (this machine's wall clock).
    pub fn record(&self, stamp: Stamp) {
        if !matches!(stamp, Stamp::None) {
            self.record_at(unix_micros(), stamp);
        }
    }

    /// How many lags were over [`MAX_LAG_SECONDS`] and left out of the histograms.
    pub fn implausible(&self) -> u64 {
        self.implausible.load(Ordering::Relaxed)
    }

    /// Records `stamp`'s lags as of `now_us`.
    pub fn record_at(&self, now_us: u64, stamp: Stamp) {
        let h = self.histograms.get();
        match stamp {
            Stamp::Delta {
                applied_us,
                event_us,
            } => {
                if let Some(s) = self.plausible(now_us, applied_us)
                    && let Some(h) = h
                {
                    h.delta.record(s, &[]);
                }
                if let Some(s) = self.plausible(now_us, event_us)
                    && let Some(h) = h
                {
                    h.event.record(s, &[]);
                }
            }
            Stamp::Placement { placed_us, relayed } => {
                if let Some(s) = self.plausible(now_us, placed_us)
                    && let Some(h) = h
                {
                    let hops = if relayed { "2" } else { "1" };
                    h.placement.record(s, &[KeyValue::new("hops", hops)]);
                }
            }
            Stamp::None => {}
        }
    }

    /// The lag of one stamp if it is one to record; one over [`MAX_LAG_SECONDS`] is counted.
    fn plausible(&self, now_us: u64, stamp_us: u64) -> Option<f64> {
        let s = lag_seconds(now_us, stamp_us)?;
        if s > MAX_LAG_SECONDS {
            self.implausible.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::{
        SdkMeterProvider,
        data::{AggregatedMetrics, MetricData},
    };

    use super::*;
    use crate::telemetry::prometheus::SdkReader;

    #[test]
    fn lag_is_now_minus_the_stamp_and_no_stamp_is_no_figure() {
        assert_eq!(lag_seconds(5_000_000, 4_997_000), Some(0.003));
        assert_eq!(lag_seconds(5_000_000, 0), None);
        // The sender's clock ahead of ours: 0, not negative.
        assert_eq!(lag_seconds(5_000_000, 5_000_100), Some(0.0));
    }

    #[test]
    fn a_lag_over_an_hour_is_counted_not_recorded() {
        let reader = SdkReader::new();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.reader())
            .build();
        let lags = Lags::default();
        lags.observe(&provider.meter("test"));
        let now = 10_000_000_000;
        let hour_us = 3_600_000_000;
        // Exactly an hour is still a lag; a microsecond more is the sender's clock. The
        // engine's stamp (an hour and a second behind) is dropped with the delta's kept.
        lags.record_at(
            now,
            Stamp::Delta {
                applied_us: now - hour_us,
                event_us: now - hour_us - 1_000_000,
            },
        );
        lags.record_at(
            now,
            Stamp::Placement {
                placed_us: now - hour_us - 1,
                relayed: false,
            },
        );
        assert_eq!(lags.implausible(), 2);
        let delta = read(&reader, "warmpath.cluster.delta_lag", 30.0);
        assert_eq!(delta.len(), 1);
        assert_eq!(delta[0].1, 1, "the one-hour delta is recorded");
        assert!((delta[0].2 - 3_600.0).abs() < 1e-9, "{}", delta[0].2);
        assert!(
            read(&reader, "warmpath.cluster.event_lag", 30.0)
                .iter()
                .all(|p| p.1 == 0)
        );
        assert!(
            read(&reader, "warmpath.cluster.placement_lag", 30.0)
                .iter()
                .all(|p| p.1 == 0)
        );
        // Counted without a meter too (the count is exported apart from the histograms).
        let unobserved = Lags::default();
        unobserved.record_at(
            now,
            Stamp::Placement {
                placed_us: 1,
                relayed: true,
            },
        );
        assert_eq!(unobserved.implausible(), 1);
    }

    #[test]
    fn bounds_rise_and_hold_the_targets() {
        assert!(LAG_BOUNDS.windows(2).all(|w| w[0] < w[1]));
        // Issue #21: delta p99 <= 200 ms, placement p99 <= 20 ms.
        assert!(LAG_BOUNDS.contains(&0.2) && LAG_BOUNDS.contains(&0.02));
    }

    /// (count, sum, count in the bucket ending at `le`) of one histogram, per attribute set.
    fn read(reader: &SdkReader, name: &str, le: f64) -> Vec<(Vec<KeyValue>, u64, f64, u64)> {
        let mut out = Vec::new();
        if let Some(rm) = reader.collect_now() {
            for scope in rm.scope_metrics() {
                for m in scope.metrics().filter(|m| m.name() == name) {
                    let AggregatedMetrics::F64(MetricData::Histogram(h)) = m.data() else {
                        panic!("{name} is not an f64 histogram");
                    };
                    for p in h.data_points() {
                        let i = p.bounds().position(|b| b == le).expect("a bound");
                        let in_bucket = p.bucket_counts().nth(i).expect("a bucket");
                        out.push((
                            p.attributes().cloned().collect(),
                            p.count(),
                            p.sum(),
                            in_bucket,
                        ));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn stamps_are_recorded_in_their_histograms_once_observed() {
        let reader = SdkReader::new();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.reader())
            .build();
        let lags = Lags::default();
        let now = 10_000_000;
        // Before `observe`: nothing (and no panic).
        lags.record_at(
            now,
            Stamp::Delta {
                applied_us: now - 1_000,
                event_us: 0,
            },
        );
        lags.observe(&provider.meter("test"));
        lags.record_at(
            now,
            Stamp::Delta {
                applied_us: now - 2_500,
                event_us: now - 4_000,
            },
        );
        lags.record_at(
            now,
            Stamp::Delta {
                applied_us: 0,
                event_us: 0,
            },
        );
        lags.record_at(
            now,
            Stamp::Placement {
                placed_us: now - 1_200,
                relayed: false,
            },
        );
        lags.record_at(
            now,
            Stamp::Placement {
                placed_us: now - 9_000,
                relayed: true,
            },
        );

        // 2.5 ms falls in (2 ms, 3 ms]; 4 ms in (3 ms, 5 ms].
        let delta = read(&reader, "warmpath.cluster.delta_lag", 0.003);
        assert_eq!(delta.len(), 1);
        let (_, count, sum, in_bucket) = &delta[0];
        assert_eq!((*count, *in_bucket), (1, 1));
        assert!((sum - 0.0025).abs() < 1e-12, "{sum}");
        let event = read(&reader, "warmpath.cluster.event_lag", 0.005);
        assert_eq!(event.len(), 1);
        assert_eq!((event[0].1, event[0].3), (1, 1));
        assert!((event[0].2 - 0.004).abs() < 1e-12);

        let mut placement = read(&reader, "warmpath.cluster.placement_lag", 0.01);
        placement.sort_by(|a, b| a.2.total_cmp(&b.2));
        let hops: Vec<(String, u64, u64)> = placement
            .iter()
            .map(|(attrs, count, _, in_bucket)| {
                let hops = attrs
                    .iter()
                    .find(|kv| kv.key.as_str() == "hops")
                    .map(|kv| kv.value.as_str().into_owned())
                    .unwrap_or_default();
                (hops, *count, *in_bucket)
            })
            .collect();
        // 1.2 ms direct (not in (7 ms, 10 ms]); 9 ms relayed (in it).
        assert_eq!(hops, [("1".to_string(), 1, 0), ("2".to_string(), 1, 1)]);
    }
}
