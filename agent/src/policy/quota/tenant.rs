//! One tenant's quota state at this agent: its buckets, demand, open streams and share of
//! each cluster-wide limit; the decisions of [`super::Quotas::admit`] on it.

use std::time::{Duration, Instant};

use super::{
    Dimension, IDLE_AFTER, MAX_RETRY_AFTER, QuotaLimits, QuotaRefusal, SHARE_REFRESH,
    bucket::{Bucket, Ewma},
    share,
};
use crate::usage::Demand;

/// Guarded by its tenant's lock.
#[derive(Debug)]
pub(super) struct TenantState {
    pub(super) limits: QuotaLimits,
    /// Requests, prompt tokens, output tokens ([`Dimension::RATES`] order).
    pub(super) buckets: [Bucket; 3],
    pub(super) demand: [Ewma; 3],
    /// This agent's share of the stream cap.
    pub(super) streams_cap: Option<u32>,
    pub(super) open_streams: u32,
    pub(super) output_per_request: f64,
    pub(super) shared_at: Option<(Instant, u64)>,
    pub(super) last_seen: Instant,
    pub(super) refused: [u64; 4],
}

impl TenantState {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            limits: QuotaLimits::default(),
            buckets: Default::default(),
            demand: Default::default(),
            streams_cap: None,
            open_streams: 0,
            output_per_request: 0.0,
            shared_at: None,
            last_seen: now,
            refused: [0; 4],
        }
    }

    /// Brings the buckets to `now` and, when stale, the shares to the latest limits and
    /// demands.
    pub(super) fn refresh(
        &mut self,
        limits: &QuotaLimits,
        now: Instant,
        generation: u64,
        remote: impl FnOnce() -> Vec<Demand>,
    ) {
        for b in &mut self.buckets {
            b.advance(now);
        }
        self.last_seen = self.last_seen.max(now);
        let fresh = self.limits == *limits
            && self.shared_at.is_some_and(|(at, g)| {
                g == generation && now.saturating_duration_since(at) < SHARE_REFRESH
            });
        if fresh {
            return;
        }
        self.limits = *limits;
        self.shared_at = Some((now, generation));
        let remote = remote();
        let own = self.demand_at(now);
        let pick = [
            |d: &Demand| d.requests,
            |d: &Demand| d.prompt_tokens,
            |d: &Demand| d.output_tokens,
        ];
        let own = [own.requests, own.prompt_tokens, own.output_tokens];
        for (i, limit) in limits.rates().into_iter().enumerate() {
            let Some(limit) = limit else {
                self.buckets[i].clear();
                continue;
            };
            let others: Vec<f64> = remote.iter().map(pick[i]).collect();
            let rate = share::local_share(limit, own[i], &others);
            self.buckets[i].set_rate(rate, limits.burst, now);
        }
        self.streams_cap = limits.concurrent_streams.map(|cap| {
            let others: Vec<f64> = remote.iter().map(|d| d.requests).collect();
            share::local_streams(cap, own[0], &others)
        });
    }

    /// The limit that refuses a request of `prompt` tokens now, with the longest wait among
    /// those that would (so a retry after it finds every bucket able to pay).
    pub(super) fn refusal(&self, prompt: f64) -> Option<(Dimension, Duration)> {
        let needs = [1.0, prompt, 0.0];
        let mut worst: Option<(Dimension, Duration)> = None;
        for (i, d) in Dimension::RATES.into_iter().enumerate() {
            if !self.buckets[i].is_set() {
                continue;
            }
            if let Some(wait) = self.buckets[i].wait_for(needs[i])
                && worst.is_none_or(|(_, w)| wait > w)
            {
                worst = Some((d, wait));
            }
        }
        let stream_wait = Duration::from_secs(1);
        if let Some(cap) = self.streams_cap
            && self.open_streams >= cap
            && worst.is_none_or(|(_, w)| stream_wait > w)
        {
            worst = Some((Dimension::ConcurrentStreams, stream_wait));
        }
        worst
    }

    pub(super) fn message(&self, tenant: &str, d: Dimension, wait: Duration) -> String {
        let secs = QuotaRefusal {
            dimension: d,
            retry_after: wait.min(MAX_RETRY_AFTER),
            message: String::new(),
        }
        .retry_after_secs();
        let cluster = match d {
            Dimension::Requests => self.limits.requests_per_s,
            Dimension::PromptTokens => self.limits.prompt_tokens_per_s,
            Dimension::OutputTokens => self.limits.output_tokens_per_s,
            Dimension::ConcurrentStreams => self.limits.concurrent_streams.map(f64::from),
        }
        .unwrap_or_default();
        let local = self.local_limit(d).unwrap_or_default();
        let what = match d {
            Dimension::OutputTokens => "output tokens already generated exceed",
            _ => "this request would exceed",
        };
        format!(
            "Rate limit reached for tenant `{tenant}` on {}: {what} its quota of {} {} \
             ({} at this router). Please try again in {secs} s.",
            d.as_str().replace('_', " "),
            number(cluster),
            d.unit(),
            number(local),
        )
    }

    pub(super) fn local_limit(&self, d: Dimension) -> Option<f64> {
        match d {
            Dimension::ConcurrentStreams => self.streams_cap.map(f64::from),
            _ => {
                let b = &self.buckets[d as usize];
                b.is_set().then(|| b.rate())
            }
        }
    }

    pub(super) fn demand_at(&self, now: Instant) -> Demand {
        Demand {
            requests: self.demand[0].get(now),
            prompt_tokens: self.demand[1].get(now),
            output_tokens: self.demand[2].get(now),
        }
    }

    pub(super) fn is_idle(&self, now: Instant) -> bool {
        self.open_streams == 0
            && now.saturating_duration_since(self.last_seen) >= IDLE_AFTER
            && self.buckets.iter().all(|b| {
                let mut b = b.clone();
                b.advance(now);
                b.is_full()
            })
    }
}

/// A rate for a message: whole above 100, else up to three decimals.
fn number(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}
