//! Turning request samples into the report: latency quantiles (TTFT, inter-token, end to
//! end), rates, prefix-cache hit ratio and errors — overall, per tenant and per ladder step.
//! Pure functions of the samples, so a known synthetic run has known numbers.

use std::collections::BTreeMap;

use serde::Serialize;

/// One request as the client saw it. Times in seconds.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub tenant: String,
    /// Ladder step (0 without a ladder).
    pub step: usize,
    pub ok: bool,
    /// Sent, from the start of the run.
    pub start: f64,
    pub ttft: f64,
    pub e2e: f64,
    /// Gaps between consecutive content chunks.
    #[serde(skip)]
    pub itl: Vec<f64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
}

/// p50 / p90 / p99 (nearest rank); NaN without data.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Quantiles {
    pub fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        Self {
            p50: quantile(&v, 0.5),
            p90: quantile(&v, 0.9),
            p99: quantile(&v, 0.99),
        }
    }
}

/// Nearest-rank quantile of sorted values.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// The figures of a set of requests over a window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stats {
    pub requests: usize,
    pub errors: usize,
    pub ttft_s: Quantiles,
    pub itl_s: Quantiles,
    pub e2e_s: Quantiles,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Prompt tokens served from cache / prompt tokens (engine `usage`).
    pub prefix_hit_ratio: f64,
}

/// Stats of `samples` over `window_s` seconds (errors count as requests, not in latencies).
pub fn stats<'a>(samples: impl IntoIterator<Item = &'a Sample>, window_s: f64) -> Stats {
    let (mut ok, mut errors) = (Vec::new(), 0);
    for s in samples {
        if s.ok {
            ok.push(s);
        } else {
            errors += 1;
        }
    }
    let window = window_s.max(1e-9);
    let (prompt, cached, output) = ok.iter().fold((0u64, 0u64, 0u64), |(p, c, o), s| {
        (
            p + s.prompt_tokens,
            c + s.cached_tokens,
            o + s.output_tokens,
        )
    });
    Stats {
        requests: ok.len() + errors,
        errors,
        ttft_s: Quantiles::of(ok.iter().map(|s| s.ttft).collect()),
        itl_s: Quantiles::of(ok.iter().flat_map(|s| s.itl.iter().copied()).collect()),
        e2e_s: Quantiles::of(ok.iter().map(|s| s.e2e).collect()),
        requests_per_s: ok.len() as f64 / window,
        output_tokens_per_s: output as f64 / window,
        prefix_hit_ratio: if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        },
    }
}

/// One ladder step.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Step {
    pub offered_rate: f64,
    pub stats: Stats,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub overall: Stats,
    pub tenants: BTreeMap<String, Stats>,
    pub steps: Vec<Step>,
    /// Engine-side prefix cache hit ratio over the run (scraped `vllm:prefix_cache_*`).
    pub engine_prefix_hit_ratio: Option<f64>,
    pub wall_seconds: f64,
}

/// Builds the report. `steps` are (offered rate, window seconds) per ladder step.
pub fn report(samples: &[Sample], wall_s: f64, steps: &[(f64, f64)]) -> Report {
    let mut by_tenant: BTreeMap<String, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_tenant.entry(s.tenant.clone()).or_default().push(s);
    }
    Report {
        overall: stats(samples, wall_s),
        tenants: by_tenant
            .into_iter()
            .map(|(t, v)| (t, stats(v, wall_s)))
            .collect(),
        steps: steps
            .iter()
            .enumerate()
            .map(|(i, &(rate, window))| Step {
                offered_rate: rate,
                stats: stats(samples.iter().filter(|s| s.step == i), window),
            })
            .collect(),
        engine_prefix_hit_ratio: None,
        wall_seconds: wall_s,
    }
}

/// The report as markdown tables.
pub fn render(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let head = "| | requests | errors | TTFT p50/p90/p99 (s) | ITL p50/p90/p99 (ms) | e2e p50/p90/p99 (s) | req/s | output tok/s | prefix hit % |\n|---|---|---|---|---|---|---|---|---|\n";
    let row = |name: &str, s: &Stats| {
        // No gaps to measure (non-streaming, or one-token answers): a dash, not NaN.
        let itl = if s.itl_s.p50.is_nan() {
            "-".to_string()
        } else {
            format!(
                "{:.1} / {:.1} / {:.1}",
                s.itl_s.p50 * 1e3,
                s.itl_s.p90 * 1e3,
                s.itl_s.p99 * 1e3
            )
        };
        format!(
            "| {name} | {} | {} | {:.3} / {:.3} / {:.3} | {itl} | {:.2} / {:.2} / {:.2} | {:.2} | {:.0} | {:.1} |\n",
            s.requests,
            s.errors,
            s.ttft_s.p50,
            s.ttft_s.p90,
            s.ttft_s.p99,
            s.e2e_s.p50,
            s.e2e_s.p90,
            s.e2e_s.p99,
            s.requests_per_s,
            s.output_tokens_per_s,
            s.prefix_hit_ratio * 100.0
        )
    };
    out.push_str(head);
    out.push_str(&row("all", &r.overall));
    if r.tenants.len() > 1 {
        for (t, s) in &r.tenants {
            out.push_str(&row(&format!("tenant {t}"), s));
        }
    }
    for st in &r.steps {
        out.push_str(&row(
            &format!("offered {:.1} req/s", st.offered_rate),
            &st.stats,
        ));
    }
    if let Some(h) = r.engine_prefix_hit_ratio {
        let _ = writeln!(
            out,
            "\nengine prefix cache hit ratio (scraped): {:.1} %",
            h * 100.0
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(tenant: &str, step: usize, ok: bool, ttft: f64) -> Sample {
        Sample {
            tenant: tenant.into(),
            step,
            ok,
            start: 0.0,
            ttft,
            e2e: ttft + 1.0,
            itl: vec![0.01, 0.02],
            prompt_tokens: 100,
            cached_tokens: 75,
            output_tokens: 10,
        }
    }

    #[test]
    fn numbers_of_a_known_synthetic_run() {
        // 100 ok requests with TTFT 0.01 .. 1.00 s, plus 5 errors; tenant a has the first 40.
        let mut samples: Vec<Sample> = (1..=100)
            .map(|i| {
                sample(
                    if i <= 40 { "a" } else { "b" },
                    usize::from(i > 50),
                    true,
                    f64::from(i) / 100.0,
                )
            })
            .collect();
        samples.extend((0..5).map(|_| sample("b", 1, false, 0.0)));
        let r = report(&samples, 10.0, &[(4.0, 5.0), (8.0, 5.0)]);
        let o = &r.overall;
        assert_eq!((o.requests, o.errors), (105, 5));
        assert_eq!(
            o.ttft_s,
            Quantiles {
                p50: 0.51,
                p90: 0.9,
                p99: 0.99
            }
        );
        assert_eq!(o.e2e_s.p50, 1.51);
        assert_eq!(o.itl_s.p50, 0.02);
        assert_eq!(o.itl_s.p90, 0.02);
        assert!((o.requests_per_s - 10.0).abs() < 1e-12);
        assert!((o.output_tokens_per_s - 100.0).abs() < 1e-12);
        assert!((o.prefix_hit_ratio - 0.75).abs() < 1e-12);
        assert_eq!(r.tenants["a"].requests, 40);
        assert_eq!(r.tenants["b"].errors, 5);
        assert_eq!(r.tenants["a"].ttft_s.p99, 0.4);
        assert_eq!(r.steps[0].stats.requests, 50);
        assert_eq!(r.steps[1].stats.requests, 55);
        assert!((r.steps[1].stats.requests_per_s - 10.0).abs() < 1e-12);
        let text = render(&r);
        assert!(
            text.contains("| all | 105 | 5 | 0.510 / 0.900 / 0.990 |"),
            "{text}"
        );
        assert!(text.contains("| tenant a | 40 |"));
        assert!(text.contains("| offered 8.0 req/s | 55 |"));
    }

    #[test]
    fn empty_runs_are_nan_not_panics() {
        let s = stats(&[], 1.0);
        assert_eq!(s.requests, 0);
        assert!(s.ttft_s.p50.is_nan());
        assert_eq!(s.prefix_hit_ratio, 0.0);
    }
}
