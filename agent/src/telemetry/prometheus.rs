//! The admin port's Prometheus text exposition: warmpath's own per-request families
//! ([`super::series`]) and what other subsystems registered on the SDK meter (index
//! health, ...), collected by a manual reader on each scrape.
//!
//! Names: dots become underscores; unit `s` adds `_seconds`; monotonic sums add `_total`
//! (`warmpath.ttft` -> `warmpath_ttft_seconds`, `warmpath.requests` ->
//! `warmpath_requests_total`). Attributes become labels.

use std::{fmt::Write as _, sync::Arc, time::Duration};

use opentelemetry::KeyValue;
use opentelemetry_sdk::{
    error::OTelSdkResult,
    metrics::{
        InstrumentKind, ManualReader, Pipeline, Temporality,
        data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics},
        reader::MetricReader,
    },
};

use super::series::{Family, Point, PointValue, Value};

/// A manual reader of the SDK's aggregation: the meter provider owns one handle, a consumer
/// (the admin port, the OTLP pusher) the other.
#[derive(Debug, Clone)]
pub struct SdkReader(Arc<ManualReader>);

impl SdkReader {
    pub fn new() -> Self {
        Self(Arc::new(ManualReader::builder().build()))
    }

    /// The handle given to the meter provider.
    pub fn reader(&self) -> Self {
        self.clone()
    }

    /// Everything the SDK's instruments hold now; `None` (logged) when collection fails.
    pub fn collect_now(&self) -> Option<ResourceMetrics> {
        let mut rm = ResourceMetrics::default();
        match self.0.collect(&mut rm) {
            Ok(()) => Some(rm),
            Err(err) => {
                tracing::debug!(%err, "SDK metrics collect");
                None
            }
        }
    }

    /// Collects now and renders the text format.
    pub fn render(&self, out: &mut String) {
        if let Some(rm) = self.collect_now() {
            for scope in rm.scope_metrics() {
                for metric in scope.metrics() {
                    render_metric(metric, out);
                }
            }
        }
    }
}

impl Default for SdkReader {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricReader for SdkReader {
    fn register_pipeline(&self, pipeline: std::sync::Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

/// Renders one of warmpath's own families; nothing when it has no points yet.
pub fn render_family(family: &Family, points: &[Point<'_>], out: &mut String) {
    if points.is_empty() {
        return;
    }
    let counter = matches!(family.value, Value::Counter { .. });
    let name = prom_name(family.name, family.unit, counter);
    let _ = writeln!(out, "# HELP {name} {}", family.description);
    let _ = writeln!(
        out,
        "# TYPE {name} {}",
        if counter { "counter" } else { "histogram" }
    );
    for p in points {
        let pairs = || p.labels.iter().map(|(k, v)| (*k, *v));
        match p.value {
            PointValue::Counter(v) => {
                let _ = writeln!(out, "{name}{} {v}", label_text(pairs(), None));
            }
            PointValue::Histogram(h) => {
                let mut cumulative = 0u64;
                for (bound, count) in h.bounds.iter().zip(&h.counts) {
                    cumulative += count;
                    let le = bound.to_string();
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {cumulative}",
                        label_text(pairs(), Some(("le", &le)))
                    );
                }
                let count = h.count();
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {count}",
                    label_text(pairs(), Some(("le", "+Inf")))
                );
                let l = label_text(pairs(), None);
                let _ = writeln!(out, "{name}_sum{l} {}", h.sum);
                let _ = writeln!(out, "{name}_count{l} {count}");
            }
        }
    }
}

/// The Prometheus name of an OpenTelemetry metric.
pub fn prom_name(name: &str, unit: &str, monotonic_sum: bool) -> String {
    let mut n: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if unit == "s" && !n.ends_with("_seconds") {
        n.push_str("_seconds");
    }
    if monotonic_sum && !n.ends_with("_total") {
        n.push_str("_total");
    }
    n
}

fn labels<'a>(attrs: impl Iterator<Item = &'a KeyValue>, extra: Option<(&str, &str)>) -> String {
    let mut pairs: Vec<(String, String)> = attrs
        .map(|kv| {
            (
                kv.key.as_str().replace('.', "_"),
                kv.value.as_str().into_owned(),
            )
        })
        .collect();
    pairs.sort();
    label_text(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())), extra)
}

/// `{k="v",...}` from pairs already in order, `extra` last; empty without labels.
pub(crate) fn label_text<'a, 'b>(
    pairs: impl Iterator<Item = (&'a str, &'b str)>,
    extra: Option<(&str, &str)>,
) -> String {
    let mut out = String::new();
    let mut push = |k: &str, v: &str| {
        out.push(if out.is_empty() { '{' } else { ',' });
        out.push_str(k);
        out.push_str("=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    };
    for (k, v) in pairs {
        push(k, v);
    }
    if let Some((k, v)) = extra {
        push(k, v);
    }
    if !out.is_empty() {
        out.push('}');
    }
    out
}

fn render_metric(metric: &Metric, out: &mut String) {
    match metric.data() {
        AggregatedMetrics::U64(d) => render_data(metric, d, |v| v as f64, out),
        AggregatedMetrics::I64(d) => render_data(metric, d, |v| v as f64, out),
        AggregatedMetrics::F64(d) => render_data(metric, d, |v| v, out),
    }
}

fn render_data<T: Copy>(
    metric: &Metric,
    data: &MetricData<T>,
    f: impl Fn(T) -> f64,
    out: &mut String,
) {
    let head = |out: &mut String, name: &str, kind: &str| {
        let _ = writeln!(out, "# HELP {name} {}", metric.description());
        let _ = writeln!(out, "# TYPE {name} {kind}");
    };
    match data {
        MetricData::Sum(sum) => {
            let name = prom_name(metric.name(), metric.unit(), sum.is_monotonic());
            head(
                out,
                &name,
                if sum.is_monotonic() {
                    "counter"
                } else {
                    "gauge"
                },
            );
            for p in sum.data_points() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(p.attributes(), None),
                    f(p.value())
                );
            }
        }
        MetricData::Gauge(g) => {
            let name = prom_name(metric.name(), metric.unit(), false);
            head(out, &name, "gauge");
            for p in g.data_points() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(p.attributes(), None),
                    f(p.value())
                );
            }
        }
        MetricData::Histogram(h) => {
            let name = prom_name(metric.name(), metric.unit(), false);
            head(out, &name, "histogram");
            for p in h.data_points() {
                let mut cumulative = 0u64;
                let counts: Vec<u64> = p.bucket_counts().collect();
                for (bound, count) in p.bounds().zip(&counts) {
                    cumulative += count;
                    let le = bound.to_string();
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {cumulative}",
                        labels(p.attributes(), Some(("le", &le)))
                    );
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {}",
                    labels(p.attributes(), Some(("le", "+Inf"))),
                    p.count()
                );
                let l = labels(p.attributes(), None);
                let _ = writeln!(out, "{name}_sum{l} {}", f(p.sum()));
                let _ = writeln!(out, "{name}_count{l} {}", p.count());
            }
        }
        // Not used by warmpath's instruments.
        MetricData::ExponentialHistogram(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        assert_eq!(
            prom_name("warmpath.ttft", "s", false),
            "warmpath_ttft_seconds"
        );
        assert_eq!(
            prom_name("warmpath.requests", "{request}", true),
            "warmpath_requests_total"
        );
        assert_eq!(
            prom_name("warmpath.index.entries", "{entry}", false),
            "warmpath_index_entries"
        );
    }

    #[test]
    fn label_values_are_escaped_and_sorted() {
        let kv = [KeyValue::new("z", "a\"b"), KeyValue::new("a.b", "x\\y")];
        assert_eq!(
            labels(kv.iter(), Some(("le", "1"))),
            r#"{a_b="x\\y",z="a\"b",le="1"}"#
        );
    }
}
