//! warmpath's per-request metric families: their names, units and labels, the cells each
//! series records into ([`super::cells`]), and the points both exports render
//! ([`super::prometheus`], [`super::push`]).

use super::cells::{HistTotals, Layout, SeriesKey, Totals};

/// Histogram bounds for latencies, seconds (1 ms .. 2 min).
pub const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0,
    3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0,
];
/// Bounds for time per output token, seconds (0.5 ms .. 2 s).
pub const TPOT_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 1.0, 2.0,
];
/// Bounds for time spent inside warmpath before the upstream request, seconds (10 us .. 1 s).
pub const QUEUE_BOUNDS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
];
/// Bounds for matched prefix blocks.
pub const BLOCK_BOUNDS: &[f64] = &[
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

/// Series kinds (`SeriesKey::kind`).
pub const REQUEST: u8 = 0;
pub const POOL: u8 = 1;

// Counters of a tenant's request series: one per outcome, then these.
pub const PROMPT_TOKENS: usize = 5;
pub const CACHED_TOKENS: usize = 6;
pub const COMPLETION_TOKENS: usize = 7;
pub const RETRIES: usize = 8;
// Route receipts (requests whose usage was reported): their count, the three figures in
// tokens, and how many delivered less than was captured.
pub const RECEIPTS: usize = 9;
pub const AVAILABLE_TOKENS: usize = 10;
pub const CAPTURED_TOKENS: usize = 11;
pub const DELIVERED_TOKENS: usize = 12;
pub const SHORTFALL: usize = 13;
// Its histograms.
pub const TTFT: usize = 0;
pub const TPOT: usize = 1;
pub const DURATION: usize = 2;
pub const QUEUE: usize = 3;

/// A tenant's requests in a pool: counters by outcome, token, retry and receipt counters,
/// latencies.
pub const REQUEST_LAYOUT: Layout = Layout {
    counters: 14,
    histograms: &[LATENCY_BOUNDS, TPOT_BOUNDS, LATENCY_BOUNDS, QUEUE_BOUNDS],
};
/// A pool's routing decisions: a counter per reason, the chosen pod's prefix blocks, and the
/// cost model's absolute TTFT prediction errors (streams).
pub const POOL_LAYOUT: Layout = Layout {
    counters: 5,
    histograms: &[BLOCK_BOUNDS, LATENCY_BOUNDS],
};
/// The pool histogram of prediction errors.
pub const PREDICTION_ERROR: usize = 1;

/// Label values of the request counter's split, in [`Outcome`] order.
const OUTCOMES: &[&str] = &[
    "ok",
    "client_error",
    "upstream_error",
    "rejected_quota",
    "cancelled",
];
/// Label values of the decision counter's split, in [`DecisionReason`] order.
const REASONS: &[&str] = &["prefix", "load", "session", "round_robin", "idle_warm"];

/// What a family's points are.
#[derive(Debug)]
pub enum Value {
    /// Counters from `first`; with a split, one per label value, from `first` on.
    Counter {
        first: usize,
        split: Option<(&'static str, &'static [&'static str])>,
    },
    Histogram(usize),
}

/// One metric family.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub unit: &'static str,
    pub description: &'static str,
    /// Which series it reads.
    pub kind: u8,
    pub value: Value,
}

const fn counter(
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    first: usize,
) -> Family {
    Family {
        name,
        unit,
        description,
        kind: REQUEST,
        value: Value::Counter { first, split: None },
    }
}

const fn seconds(name: &'static str, description: &'static str, index: usize) -> Family {
    Family {
        name,
        unit: "s",
        description,
        kind: REQUEST,
        value: Value::Histogram(index),
    }
}

/// Every family, in the order they are exported.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "warmpath.requests",
        unit: "{request}",
        description: "Requests by tenant and outcome",
        kind: REQUEST,
        value: Value::Counter {
            first: 0,
            split: Some(("outcome", OUTCOMES)),
        },
    },
    counter(
        "warmpath.prompt_tokens",
        "{token}",
        "Prompt tokens (engine usage)",
        PROMPT_TOKENS,
    ),
    counter(
        "warmpath.cached_prompt_tokens",
        "{token}",
        "Prompt tokens served from the engine's prefix cache",
        CACHED_TOKENS,
    ),
    counter(
        "warmpath.completion_tokens",
        "{token}",
        "Completion tokens (engine usage)",
        COMPLETION_TOKENS,
    ),
    counter(
        "warmpath.retries",
        "{retry}",
        "Upstream attempts retried on another pod before the first byte",
        RETRIES,
    ),
    counter(
        "warmpath.receipt.requests",
        "{request}",
        "Routed requests with a route receipt (the engine reported usage)",
        RECEIPTS,
    ),
    counter(
        "warmpath.receipt.available_tokens",
        "{token}",
        "Route receipts: prompt tokens of the longest prefix any live pod with a trusted index held",
        AVAILABLE_TOKENS,
    ),
    counter(
        "warmpath.receipt.captured_tokens",
        "{token}",
        "Route receipts: prompt tokens of the prefix the chosen pod held at decision",
        CAPTURED_TOKENS,
    ),
    counter(
        "warmpath.receipt.delivered_tokens",
        "{token}",
        "Route receipts: prompt tokens the engine served from its prefix cache (cached_tokens)",
        DELIVERED_TOKENS,
    ),
    counter(
        "warmpath.receipt.shortfall_requests",
        "{request}",
        "Route receipts whose engine delivered fewer cached tokens than the chosen pod held",
        SHORTFALL,
    ),
    seconds(
        "warmpath.ttft",
        "Time to first token (first response body bytes)",
        TTFT,
    ),
    seconds(
        "warmpath.tpot",
        "Time per output token after the first (streams)",
        TPOT,
    ),
    seconds(
        "warmpath.request.duration",
        "Request received to response complete",
        DURATION,
    ),
    seconds(
        "warmpath.queue.duration",
        "Time inside warmpath before the upstream request",
        QUEUE,
    ),
    Family {
        name: "warmpath.prefix_blocks",
        unit: "{block}",
        description: "Cached prefix blocks of the chosen pod per routing decision",
        kind: POOL,
        value: Value::Histogram(0),
    },
    Family {
        name: "warmpath.ttft_prediction_error",
        unit: "s",
        description: "Absolute error of the cost model's predicted TTFT against the measured one (streams)",
        kind: POOL,
        value: Value::Histogram(PREDICTION_ERROR),
    },
    Family {
        name: "warmpath.decisions",
        unit: "{decision}",
        description: "Routing decisions by reason",
        kind: POOL,
        value: Value::Counter {
            first: 0,
            split: Some(("reason", REASONS)),
        },
    },
];

/// A pool's names, indexed by its `PoolId`.
#[derive(Debug, Clone)]
pub struct PoolNames {
    pub name: std::sync::Arc<str>,
    pub model: std::sync::Arc<str>,
}

/// One point of a family.
#[derive(Debug)]
pub struct Point<'a> {
    /// Sorted by name.
    pub labels: Vec<(&'static str, &'a str)>,
    pub value: PointValue<'a>,
}

#[derive(Debug)]
pub enum PointValue<'a> {
    Counter(u64),
    Histogram(&'a HistTotals),
}

/// The points of `family` in `totals`.
pub fn points<'a>(family: &Family, totals: &'a Totals, pools: &'a [PoolNames]) -> Vec<Point<'a>> {
    let mut out = Vec::new();
    for (key, series) in totals.range(kind_range(family.kind)) {
        let mut labels = Vec::with_capacity(6);
        if let Some(pool) = pools.get(usize::from(key.pool)) {
            labels.push(("pool", &*pool.name));
            labels.push(("model", &*pool.model));
        }
        if let Some(t) = &series.labels.tenant {
            labels.push(("tenant", &**t));
        }
        if let Some(p) = &series.labels.pod {
            labels.push(("pod", &**p));
        }
        match family.value {
            Value::Counter { first, split: None } => {
                labels.sort_unstable();
                out.push(Point {
                    labels,
                    value: PointValue::Counter(series.counters[first]),
                });
            }
            Value::Counter {
                first,
                split: Some((name, values)),
            } => {
                for (i, v) in values.iter().enumerate() {
                    let mut labels = labels.clone();
                    labels.push((name, v));
                    labels.sort_unstable();
                    out.push(Point {
                        labels,
                        value: PointValue::Counter(series.counters[first + i]),
                    });
                }
            }
            Value::Histogram(i) => {
                labels.sort_unstable();
                out.push(Point {
                    labels,
                    value: PointValue::Histogram(&series.histograms[i]),
                });
            }
        }
    }
    out
}

fn kind_range(kind: u8) -> std::ops::RangeInclusive<SeriesKey> {
    let key = |tenant, pool, pod| SeriesKey {
        kind,
        tenant,
        pool,
        pod,
    };
    key(0, 0, None)..=key(u32::MAX, u16::MAX, Some(u16::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{DecisionReason, Outcome};

    #[test]
    fn split_labels_follow_the_enums() {
        for o in Outcome::ALL {
            assert_eq!(OUTCOMES[o as usize], o.as_str());
        }
        for r in DecisionReason::ALL {
            assert_eq!(REASONS[r as usize], r.as_str());
        }
        assert_eq!(REQUEST_LAYOUT.counters, OUTCOMES.len() + 9);
        assert_eq!(POOL_LAYOUT.counters, REASONS.len());
    }
}
