//! Turning request samples into the report: latency quantiles (TTFT, inter-token, end to
//! end), rates, prefix-cache hit ratio, route receipts and errors — overall, per tenant and
//! per ladder step.
//! Pure functions of the samples, so a known synthetic run has known numbers.

use std::{collections::BTreeMap, time::Duration};

use hdrhistogram::Histogram;
use serde::Serialize;

/// One request as the client saw it. Times in seconds. (Deserialize: `bench compare`'s pod
/// clients send theirs back as JSON.)
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
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
    /// The route receipt's explain headers (`x-warmpath-available-tokens`,
    /// `x-warmpath-captured-tokens`), when the target sent them (a warmpath agent with
    /// `--explain`); `cached_tokens` is the receipt's delivered figure.
    pub available_tokens: Option<u64>,
    pub captured_tokens: Option<u64>,
    /// The cost model's predicted TTFT (`x-warmpath-predicted-ttft-ms`), when sent.
    pub predicted_ttft_ms: Option<f64>,
    /// The engine that answered, by address: the agent's pick (`x-warmpath-pod`, with
    /// `--explain`), else the simulator's own name for itself (`x-sim-engine`) where the
    /// router forwarded it.
    #[serde(default)]
    pub pod: Option<String>,
    /// Milliseconds the agent held the request before sending it, when it did: a cold
    /// request's yield to warm ones (`x-warmpath-cold-yield-ms`) plus its place in a burst's
    /// stagger (`x-warmpath-stagger-ms`); part of its TTFT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<f64>,
    /// The matrix's chain (a chat session, an agent loop, a RAG user) this request was a
    /// turn of, for reading a session's turns in order; absent outside the matrix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<usize>,
}

/// p50 / p90 / p99 of latencies (see [`quantile`]); NaN without data.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Quantiles {
    /// Of latencies in seconds.
    pub fn of(seconds: impl IntoIterator<Item = f64>) -> Self {
        let h = histogram(seconds);
        Self {
            p50: quantile(&h, 0.5),
            p90: quantile(&h, 0.9),
            p99: quantile(&h, 0.99),
        }
    }
}

/// Significant figures the latency histograms keep: values within 0.1 %, finer than the
/// report prints (ms for TTFT, 0.1 ms for gaps, above a few ms).
const SIGNIFICANT_FIGURES: u8 = 3;

/// The longest latency the histograms tell apart, in microseconds (an hour); longer ones
/// count as this.
const MAX_MICROS: u64 = 3_600_000_000;

/// Latencies in seconds, counted in microseconds.
pub fn histogram(seconds: impl IntoIterator<Item = f64>) -> Histogram<u64> {
    let mut h = Histogram::new_with_max(MAX_MICROS, SIGNIFICANT_FIGURES)
        .expect("an hour in microseconds at 3 significant figures is a valid histogram");
    for s in seconds {
        h.saturating_record((s * 1e6).round() as u64);
    }
    h
}

/// The `q` quantile in seconds: the (highest value equivalent to the) smallest recorded value
/// that at least `q` of the values do not exceed, i.e. the value of rank ceil(q * n). NaN
/// without data.
pub fn quantile(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        return f64::NAN;
    }
    h.value_at_quantile(q) as f64 / 1e6
}

/// The quantiles `qs` of short durations (the proxy's added latency, a routing decision, an
/// index lookup: microseconds), by the same rank rule as [`quantile`], counted in nanoseconds
/// at the same significant figures. Zero without data.
pub fn duration_quantiles<const N: usize>(
    samples: impl IntoIterator<Item = Duration>,
    qs: [f64; N],
) -> [Duration; N] {
    let mut h = Histogram::<u64>::new_with_max(MAX_MICROS * 1000, SIGNIFICANT_FIGURES)
        .expect("an hour in nanoseconds at 3 significant figures is a valid histogram");
    for d in samples {
        h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }
    qs.map(|q| match h.is_empty() {
        true => Duration::ZERO,
        false => Duration::from_nanos(h.value_at_quantile(q)),
    })
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
    /// Route receipts of the successful requests that carried them (none without).
    pub receipts: Option<Receipts>,
}

/// Route receipts summed over requests, as percentages of those requests' prompt tokens
/// (docs/routing.md, "Route receipts").
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Receipts {
    pub requests: usize,
    pub prompt_tokens: u64,
    /// Prompt tokens any live pod held.
    pub available_pct: f64,
    /// Prompt tokens the chosen pod held.
    pub captured_pct: f64,
    /// Prompt tokens the engine served from its cache.
    pub delivered_pct: f64,
}

impl Receipts {
    fn of(ok: &[&Sample]) -> Option<Self> {
        let (mut n, mut prompt, mut available, mut captured, mut delivered) = (0, 0, 0, 0, 0);
        for s in ok {
            let (Some(a), Some(c)) = (s.available_tokens, s.captured_tokens) else {
                continue;
            };
            n += 1;
            prompt += s.prompt_tokens;
            available += a;
            captured += c;
            delivered += s.cached_tokens;
        }
        let pct = |v: u64| match prompt {
            0 => 0.0,
            p => 100.0 * v as f64 / p as f64,
        };
        (n > 0).then(|| Self {
            requests: n,
            prompt_tokens: prompt,
            available_pct: pct(available),
            captured_pct: pct(captured),
            delivered_pct: pct(delivered),
        })
    }
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
        ttft_s: Quantiles::of(ok.iter().map(|s| s.ttft)),
        itl_s: Quantiles::of(ok.iter().flat_map(|s| s.itl.iter().copied())),
        e2e_s: Quantiles::of(ok.iter().map(|s| s.e2e)),
        requests_per_s: ok.len() as f64 / window,
        output_tokens_per_s: output as f64 / window,
        prefix_hit_ratio: if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        },
        receipts: Receipts::of(&ok),
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
    let head = "| | requests | errors | TTFT p50/p90/p99 (s) | ITL p50/p90/p99 (ms) | e2e p50/p90/p99 (s) | req/s | output tok/s | prefix hit % | available / captured / delivered % |\n|---|---|---|---|---|---|---|---|---|---|\n";
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
        // Route receipts only from a target that sends them (a warmpath agent, --explain).
        let receipts = s.receipts.map_or("-".to_string(), |r| {
            format!(
                "{:.1} / {:.1} / {:.1}",
                r.available_pct, r.captured_pct, r.delivered_pct
            )
        });
        format!(
            "| {name} | {} | {} | {:.3} / {:.3} / {:.3} | {itl} | {:.2} / {:.2} / {:.2} | {:.2} | {:.0} | {:.1} | {receipts} |\n",
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
            // Tenant a's requests came with receipts, b's without.
            available_tokens: (tenant == "a").then_some(90),
            captured_tokens: (tenant == "a").then_some(80),
            predicted_ttft_ms: None,
            pod: None,
            held_ms: None,
            session: None,
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
        // Quantiles are of rank ceil(q * n), reported as the top of the value's histogram
        // bucket (3 significant figures: 1024 steps per power of two of microseconds).
        // p50 of 100 TTFTs: the 50th, 0.50 s = 500000 us; in [2^18, 2^19) a step is 256 us:
        // 1953 * 256 + 255 = 500223. p90: 900000 us, steps of 512: 1757 * 512 + 511. p99:
        // 990000 us: 1933 * 512 + 511.
        assert_eq!(
            o.ttft_s,
            Quantiles {
                p50: 500_223.0 / 1e6,
                p90: 900_095.0 / 1e6,
                p99: 990_207.0 / 1e6
            }
        );
        // e2e = TTFT + 1 s: 1500000 us, steps of 1024: 1464 * 1024 + 1023.
        assert_eq!(o.e2e_s.p50, 1_500_159.0 / 1e6);
        // 200 gaps, half 10 ms and half 20 ms: the 100th is 10000 us (steps of 8: 1250 * 8 + 7),
        // the 180th 20000 us (steps of 16: 1250 * 16 + 15).
        assert_eq!(o.itl_s.p50, 10_007.0 / 1e6);
        assert_eq!(o.itl_s.p90, 20_015.0 / 1e6);
        assert!((o.requests_per_s - 10.0).abs() < 1e-12);
        assert!((o.output_tokens_per_s - 100.0).abs() < 1e-12);
        assert!((o.prefix_hit_ratio - 0.75).abs() < 1e-12);
        assert_eq!(r.tenants["a"].requests, 40);
        // Receipts: tenant a's 40 requests of 100 prompt tokens, 90 available, 80 captured,
        // 75 delivered each; b's are not counted in them.
        let receipts = Receipts {
            requests: 40,
            prompt_tokens: 4000,
            available_pct: 90.0,
            captured_pct: 80.0,
            delivered_pct: 75.0,
        };
        assert_eq!(o.receipts, Some(receipts));
        assert_eq!(r.tenants["a"].receipts, Some(receipts));
        assert_eq!(r.tenants["b"].receipts, None);
        assert_eq!(r.tenants["b"].errors, 5);
        // Tenant a's 40: the 40th, 400000 us (steps of 256: 1562 * 256 + 255).
        assert_eq!(r.tenants["a"].ttft_s.p99, 400_127.0 / 1e6);
        assert_eq!(r.steps[0].stats.requests, 50);
        assert_eq!(r.steps[1].stats.requests, 55);
        assert!((r.steps[1].stats.requests_per_s - 10.0).abs() < 1e-12);
        let text = render(&r);
        assert!(
            text.contains("| all | 105 | 5 | 0.500 / 0.900 / 0.990 |"),
            "{text}"
        );
        assert!(text.contains("| tenant a | 40 |"));
        assert!(text.contains("| 75.0 | 90.0 / 80.0 / 75.0 |\n"), "{text}");
        let b = text
            .lines()
            .find(|l| l.starts_with("| tenant b |"))
            .unwrap();
        assert!(b.ends_with("| 75.0 | - |"), "{b}");
        assert!(text.contains("| offered 8.0 req/s | 55 |"));
    }

    #[test]
    fn quantiles_of_a_known_run() {
        // 1 .. 100 ms. The 50th is 50000 us, in [2^15, 2^16) where a step is 32 us:
        // 1562 * 32 + 31 = 50015. The 90th, 90000 us, steps of 64: 1406 * 64 + 63 = 90047.
        // The 99th, 99000 us: 1546 * 64 + 63 = 99007.
        let h = histogram((1..=100).map(|ms| f64::from(ms) / 1e3));
        assert_eq!(quantile(&h, 0.5), 50_015.0 / 1e6);
        assert_eq!(quantile(&h, 0.9), 90_047.0 / 1e6);
        assert_eq!(quantile(&h, 0.99), 99_007.0 / 1e6);
        // One value of 3 ms: 3000 us, steps of 2 in [2048, 4096): 3001.
        assert_eq!(quantile(&histogram([0.003]), 0.9), 3_001.0 / 1e6);
        assert!(quantile(&histogram([]), 0.5).is_nan());
    }

    #[test]
    fn empty_runs_are_nan_not_panics() {
        let s = stats(&[], 1.0);
        assert_eq!(s.requests, 0);
        assert!(s.ttft_s.p50.is_nan());
        assert_eq!(s.prefix_hit_ratio, 0.0);
        assert_eq!(s.receipts, None);
    }
}
