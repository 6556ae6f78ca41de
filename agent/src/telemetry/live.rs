//! Live per-tenant figures for `warmpath status`: rates and TTFT quantiles over the last
//! minute, from a ring of six 10-second slots (each with its own HDR histogram), so old
//! traffic ages out without a background task. Memory per tenant is fixed.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::usage::{Receipt, TokenUsage};

/// Seconds per slot.
const SLOT_SECS: u64 = 10;
/// Slots kept: the window is SLOTS x SLOT_SECS.
const SLOTS: usize = 6;
/// Largest TTFT tracked, in microseconds (10 minutes); larger values are clamped.
const MAX_TTFT_US: u64 = 600_000_000;

#[derive(Debug)]
struct Slot {
    epoch: u64,
    requests: u64,
    errors: u64,
    tokens: TokenUsage,
    receipts: LiveReceipts,
    ttft_us: Histogram<u64>,
}

/// One tenant's recent traffic.
#[derive(Debug)]
pub struct Live {
    origin: Instant,
    slots: Vec<Slot>,
}

/// What `warmpath status` prints per tenant.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct LiveSummary {
    pub tenant: String,
    pub window_s: f64,
    pub requests: u64,
    pub errors: u64,
    pub requests_per_s: f64,
    pub prompt_tokens_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Prompt tokens served from the engines' prefix cache, percent.
    pub cache_hit_pct: f64,
    pub ttft_ms_p50: Option<f64>,
    pub ttft_ms_p90: Option<f64>,
    pub ttft_ms_p99: Option<f64>,
    /// Route receipts of the window's requests whose usage was reported.
    #[serde(default)]
    pub receipts: LiveReceipts,
}

/// A window's route receipts, in tokens ([`Receipt`]; delivered is the engines'
/// `cached_tokens`), with the two ratios `warmpath status` prints.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq)]
#[serde(default)]
pub struct LiveReceipts {
    pub requests: u64,
    pub available_tokens: u64,
    pub captured_tokens: u64,
    pub delivered_tokens: u64,
    /// Requests whose engine delivered fewer cached tokens than the chosen pod held.
    pub shortfall_requests: u64,
    /// Captured / available, percent (none while nothing was available).
    pub capture_pct: Option<f64>,
    /// Delivered / captured, percent (none while nothing was captured).
    pub delivery_pct: Option<f64>,
}

impl LiveReceipts {
    fn add(&mut self, r: Receipt, delivered: u64) {
        self.requests += 1;
        self.available_tokens += r.available;
        self.captured_tokens += r.captured;
        self.delivered_tokens += delivered;
        self.shortfall_requests += u64::from(r.captured > delivered);
    }

    fn merge(&mut self, o: &LiveReceipts) {
        self.requests += o.requests;
        self.available_tokens += o.available_tokens;
        self.captured_tokens += o.captured_tokens;
        self.delivered_tokens += o.delivered_tokens;
        self.shortfall_requests += o.shortfall_requests;
    }

    /// With its ratios filled in.
    fn with_ratios(mut self) -> Self {
        let pct = |a: u64, b: u64| (b > 0).then(|| 100.0 * a as f64 / b as f64);
        self.capture_pct = pct(self.captured_tokens, self.available_tokens);
        self.delivery_pct = pct(self.delivered_tokens, self.captured_tokens);
        self
    }
}

impl Live {
    pub fn new(origin: Instant) -> Self {
        let slots = (0..SLOTS)
            .map(|_| Slot {
                epoch: u64::MAX,
                requests: 0,
                errors: 0,
                tokens: TokenUsage::default(),
                receipts: LiveReceipts::default(),
                ttft_us: Histogram::new_with_bounds(1, MAX_TTFT_US, 2)
                    .expect("constant bounds are valid"),
            })
            .collect();
        Self { origin, slots }
    }

    fn epoch(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs() / SLOT_SECS
    }

    pub fn record(
        &mut self,
        now: Instant,
        ok: bool,
        usage: Option<TokenUsage>,
        receipt: Option<(Receipt, u64)>,
        ttft: Option<Duration>,
    ) {
        let epoch = self.epoch(now);
        let slot = &mut self.slots[(epoch % SLOTS as u64) as usize];
        if slot.epoch != epoch {
            slot.epoch = epoch;
            slot.requests = 0;
            slot.errors = 0;
            slot.tokens = TokenUsage::default();
            slot.receipts = LiveReceipts::default();
            slot.ttft_us.reset();
        }
        slot.requests += 1;
        slot.errors += u64::from(!ok);
        if let Some(u) = usage {
            slot.tokens.prompt += u.prompt;
            slot.tokens.cached += u.cached;
            slot.tokens.completion += u.completion;
        }
        if let Some((r, delivered)) = receipt {
            slot.receipts.add(r, delivered);
        }
        if let Some(t) = ttft {
            let us = u64::try_from(t.as_micros()).unwrap_or(u64::MAX);
            slot.ttft_us.saturating_record(us.clamp(1, MAX_TTFT_US));
        }
    }

    /// The last minute (or less, right after start) up to `now`.
    pub fn summary(&self, tenant: &str, now: Instant) -> LiveSummary {
        let current = self.epoch(now);
        let oldest = current.saturating_sub(SLOTS as u64 - 1);
        let mut ttft = Histogram::<u64>::new_with_bounds(1, MAX_TTFT_US, 2)
            .expect("constant bounds are valid");
        let (mut requests, mut errors, mut tokens) = (0, 0, TokenUsage::default());
        let mut receipts = LiveReceipts::default();
        for s in self
            .slots
            .iter()
            .filter(|s| s.epoch != u64::MAX && s.epoch >= oldest && s.epoch <= current)
        {
            requests += s.requests;
            errors += s.errors;
            tokens.prompt += s.tokens.prompt;
            tokens.cached += s.tokens.cached;
            tokens.completion += s.tokens.completion;
            receipts.merge(&s.receipts);
            // Same bounds on both sides: adding cannot fail.
            let _ = ttft.add(&s.ttft_us);
        }
        let elapsed = now.saturating_duration_since(self.origin).as_secs_f64();
        let window = elapsed.min((SLOTS as u64 * SLOT_SECS) as f64).max(1e-3);
        let q = |p: f64| (!ttft.is_empty()).then(|| ttft.value_at_quantile(p) as f64 / 1000.0);
        LiveSummary {
            tenant: tenant.to_string(),
            window_s: window,
            requests,
            errors,
            requests_per_s: requests as f64 / window,
            prompt_tokens_per_s: tokens.prompt as f64 / window,
            output_tokens_per_s: tokens.completion as f64 / window,
            cache_hit_pct: if tokens.prompt == 0 {
                0.0
            } else {
                100.0 * tokens.cached as f64 / tokens.prompt as f64
            },
            ttft_ms_p50: q(0.5),
            ttft_ms_p90: q(0.9),
            ttft_ms_p99: q(0.99),
            receipts: receipts.with_ratios(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_counts_recent_traffic_and_ages_out_old() {
        let t0 = Instant::now();
        let mut live = Live::new(t0);
        let usage = TokenUsage {
            prompt: 100,
            cached: 75,
            completion: 10,
            cached_reported: true,
        };
        for i in 0..100u64 {
            // Half of them captured 64 of 80 available tokens and were delivered 48.
            let receipt = (i % 2 == 0).then_some((
                Receipt {
                    available: 80,
                    captured: 64,
                },
                48,
            ));
            live.record(
                t0,
                i % 10 != 0,
                Some(usage),
                receipt,
                Some(Duration::from_millis(i + 1)),
            );
        }
        let s = live.summary("a", t0 + Duration::from_secs(20));
        assert_eq!((s.requests, s.errors), (100, 10));
        assert!((s.cache_hit_pct - 75.0).abs() < 1e-9);
        let r = s.receipts;
        assert_eq!(
            (
                r.requests,
                r.available_tokens,
                r.captured_tokens,
                r.delivered_tokens,
                r.shortfall_requests
            ),
            (50, 4000, 3200, 2400, 50)
        );
        assert_eq!((r.capture_pct, r.delivery_pct), (Some(80.0), Some(75.0)));
        assert!(
            (s.requests_per_s - 5.0).abs() < 1e-9,
            "{}",
            s.requests_per_s
        );
        let p50 = s.ttft_ms_p50.unwrap();
        assert!((49.0..=51.0).contains(&p50), "{p50}");
        assert!((98.0..=101.0).contains(&s.ttft_ms_p99.unwrap()));
        // Two minutes later the slot has aged out of the window.
        let later = live.summary("a", t0 + Duration::from_secs(120));
        assert_eq!(later.requests, 0);
        assert_eq!(later.ttft_ms_p50, None);
        assert_eq!(later.receipts, LiveReceipts::default());
        // A new record in a reused slot starts that slot afresh.
        live.record(t0 + Duration::from_secs(60), true, None, None, None);
        let s = live.summary("a", t0 + Duration::from_secs(61));
        assert_eq!(s.requests, 1);
    }
}
