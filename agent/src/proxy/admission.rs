//! Overload admission: at most `max_concurrent` routed requests at once per agent, a bounded
//! wait queue with a timeout, and a prompt-size bound, so overload is refused promptly (429
//! with `Retry-After`) instead of growing every admitted request's latency.
//!
//! The algorithm:
//!
//! - **Fast path** (room, nobody waiting): one load of the waiting count and one
//!   compare-and-swap on the active count. The permit decrements it when the request's
//!   response body ends or is dropped.
//! - **Queue**: when full, or while others wait (first come, first served), a request takes a
//!   place in the queue unless `max_queued` already wait: then 429 at once. A waiter sleeps on
//!   a [`Notify`] (woken in arrival order by each released permit) until a slot frees or
//!   `queue_timeout` passes: then 429. So no admitted request waited longer than the queue
//!   timeout, and the agent holds at most `max_concurrent + max_queued` routed requests.
//! - `max_concurrent = 0` turns admission off (no counting at all).
//!
//! The admitted request's answer carries its permit ([`body::hold`]).
//!
//! Counters (`warmpath.admission.*`, read from atomics at collection time, so nothing on the
//! request path touches telemetry): refusals by reason, requests that waited, and the
//! active and waiting gauges; with them the engine timeouts the proxy enforces with these
//! limits (`warmpath.upstream.head_timeouts`, `warmpath.upstream.idle_timeouts`).

mod body;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use http::StatusCode;
use opentelemetry::{KeyValue, metrics::Meter};
use tokio::sync::Notify;

pub use body::hold;

use super::ProxyError;
use crate::config::Limits;

/// Why a request was refused before any work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `max_queued` requests were already waiting.
    QueueFull,
    /// No slot freed within the queue timeout.
    QueueTimeout,
    /// The prompt is larger than `max_prompt_bytes`.
    PromptTooLarge,
}

impl Refused {
    const ALL: [Refused; 3] = [
        Refused::QueueFull,
        Refused::QueueTimeout,
        Refused::PromptTooLarge,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Refused::QueueFull => "queue_full",
            Refused::QueueTimeout => "queue_timeout",
            Refused::PromptTooLarge => "prompt_too_large",
        }
    }
}

/// The agent's admission state, shared by every data-path thread.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    active: AtomicUsize,
    waiting: AtomicUsize,
    wake: Notify,
    /// Requests that waited in the queue (admitted or not).
    queued: AtomicU64,
    refused: [AtomicU64; 3],
    /// Engine responses given up for silence.
    idle_timeouts: AtomicU64,
    /// Attempts given up for want of a response head.
    head_timeouts: AtomicU64,
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            active: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            wake: Notify::new(),
            queued: AtomicU64::new(0),
            refused: Default::default(),
            idle_timeouts: AtomicU64::new(0),
            head_timeouts: AtomicU64::new(0),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A slot for one request, waiting in the queue when the agent is full.
    pub async fn admit(self: &Arc<Self>) -> Result<Option<Permit>, ProxyError> {
        if self.limits.max_concurrent == 0 {
            return Ok(None);
        }
        if self.waiting.load(Ordering::Acquire) == 0 && self.try_take() {
            return Ok(Some(Permit(self.clone())));
        }
        // Boxed: the common path's future stays small.
        Box::pin(self.wait()).await.map(Some)
    }

    /// Counts a refusal made elsewhere (the prompt bound) and returns its error.
    pub fn refuse_prompt(&self, bytes: usize) -> ProxyError {
        self.count(Refused::PromptTooLarge);
        ProxyError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "The prompt is {bytes} bytes; this router accepts at most {} (max_prompt_bytes).",
                self.limits.max_prompt_bytes
            ),
        )
    }

    /// Counts an engine response given up after `upstream_idle_timeout` of silence.
    pub fn note_idle_timeout(&self) {
        self.idle_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an attempt given up after `upstream_head_timeout` without a response head.
    pub fn note_head_timeout(&self) {
        self.head_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests holding a slot now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Requests waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Refusals so far for `reason`.
    pub fn refused(&self, reason: Refused) -> u64 {
        self.refused[reason as usize].load(Ordering::Relaxed)
    }

    fn count(&self, reason: Refused) {
        self.refused[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn try_take(&self) -> bool {
        let max = self.limits.max_concurrent;
        let mut cur = self.active.load(Ordering::Relaxed);
        while cur < max {
            match self.active.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        false
    }

    async fn wait(self: &Arc<Self>) -> Result<Permit, ProxyError> {
        let place = self.waiting.fetch_add(1, Ordering::AcqRel);
        let _place = Waiting(self);
        if place >= self.limits.max_queued {
            self.count(Refused::QueueFull);
            return Err(self.busy(format!(
                "The router is at capacity ({} requests in progress, {} waiting); retry later.",
                self.limits.max_concurrent, self.limits.max_queued
            )));
        }
        self.queued.fetch_add(1, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + self.limits.queue_timeout;
        loop {
            let notified = self.wake.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a release in between is not missed.
            notified.as_mut().enable();
            if self.try_take() {
                return Ok(Permit(self.clone()));
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                self.count(Refused::QueueTimeout);
                return Err(self.busy(format!(
                    "No capacity freed within the queue timeout ({} ms); retry later.",
                    self.limits.queue_timeout.as_millis()
                )));
            }
        }
    }

    /// A 429 whose `Retry-After` is the queue timeout (at least a second).
    fn busy(&self, message: String) -> ProxyError {
        ProxyError {
            retry_after: Some(retry_after(self.limits.queue_timeout)),
            ..ProxyError::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    /// Registers `warmpath.admission.*` on `meter`.
    pub fn observe(self: &Arc<Self>, meter: &Meter) {
        let a = self.clone();
        meter
            .u64_observable_counter("warmpath.admission.refused")
            .with_unit("{request}")
            .with_description("Requests refused before any work, by reason")
            .with_callback(move |o| {
                for r in Refused::ALL {
                    o.observe(a.refused(r), &[KeyValue::new("reason", r.as_str())]);
                }
            })
            .build();
        let a = self.clone();
        meter
            .u64_observable_counter("warmpath.admission.queued")
            .with_unit("{request}")
            .with_description("Requests that waited for an admission slot")
            .with_callback(move |o| o.observe(a.queued.load(Ordering::Relaxed), &[]))
            .build();
        let a = self.clone();
        meter
            .u64_observable_counter("warmpath.upstream.idle_timeouts")
            .with_unit("{response}")
            .with_description(
                "Engine responses given up after sending nothing for the idle timeout",
            )
            .with_callback(move |o| o.observe(a.idle_timeouts.load(Ordering::Relaxed), &[]))
            .build();
        let a = self.clone();
        meter
            .u64_observable_counter("warmpath.upstream.head_timeouts")
            .with_unit("{attempt}")
            .with_description(
                "Engine attempts given up without a response head within the head timeout",
            )
            .with_callback(move |o| o.observe(a.head_timeouts.load(Ordering::Relaxed), &[]))
            .build();
        let a = self.clone();
        meter
            .u64_observable_gauge("warmpath.admission.active")
            .with_unit("{request}")
            .with_description("Requests holding an admission slot")
            .with_callback(move |o| o.observe(a.active() as u64, &[]))
            .build();
        let a = self.clone();
        meter
            .u64_observable_gauge("warmpath.admission.waiting")
            .with_unit("{request}")
            .with_description("Requests waiting for an admission slot")
            .with_callback(move |o| o.observe(a.waiting.load(Ordering::Relaxed) as u64, &[]))
            .build();
    }
}

/// Whole seconds, rounded up, at least 1.
fn retry_after(d: Duration) -> u32 {
    let s = d.as_millis().div_ceil(1000).max(1);
    u32::try_from(s).unwrap_or(u32::MAX)
}

/// A place in the queue, given back when the wait ends either way.
struct Waiting<'a>(&'a Admission);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
        // A waiter woken by a release that then timed out passes the slot on.
        if self.0.active() < self.0.limits.max_concurrent
            && self.0.waiting.load(Ordering::Acquire) > 0
        {
            self.0.wake.notify_one();
        }
    }
}

/// One admitted request's slot, released when dropped.
#[derive(Debug)]
pub struct Permit(Arc<Admission>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Release);
        if self.0.waiting.load(Ordering::Acquire) > 0 {
            self.0.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests;
