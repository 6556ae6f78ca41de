//! Overload admission: at most `max_concurrent` routed requests at once per agent, a bounded
//! wait queue with a timeout, and a prompt-size bound, so overload is refused promptly (429
//! with `Retry-After`) instead of growing every admitted request's latency.
//!
//! The algorithm:
//!
//! - **Fast path** (room, nobody waiting): one load of the waiting count and one
//!   compare-and-swap on the active count. The permit decrements it when the request's
//!   response body ends or is dropped.
//! - **Queue**: when full, or while others wait, a request takes a place in the queue
//!   unless `max_queued` already wait: then 429 at once. The queue is fair across tenants
//!   (`admission/queue.rs`): strict priority, then start-time fair queueing by weight among the
//!   tenants of a priority, first come first served within a tenant. A released slot is
//!   handed straight to the next waiter (a one-shot channel per waiter, sent under the
//!   queue's lock), so a newcomer cannot take it first. A waiter gives up when
//!   `queue_timeout` passes: then 429. So no admitted request waited longer than the queue
//!   timeout at one stage (twice it with a pool's stage after the agent's), and the agent
//!   holds at most `max_concurrent + max_queued` routed requests.
//! - **No lost slot**: a waiter that gives up (timeout or cancellation) takes itself out
//!   of the queue under the lock; if a slot was handed to it first, it owns that slot: a
//!   timed-out waiter is then admitted, a cancelled one passes the slot on. A release and
//!   an arrival that race meet on the sequentially consistent `active` and `waiting`
//!   counters: either the arrival sees the freed slot or the releaser sees the waiter.
//! - `max_concurrent = 0` turns admission off (no counting at all).
//! - **Cluster gate** (`cluster_max_concurrent > 0`, [`gate`]): tenants contending for the
//!   agents' cluster-wide concurrency (agent-wide, so only with one pool: admission comes
//!   before the request names its pool; a pool's own is a second stage,
//!   [`Admission::for_pool`]) get slots by priority then weight
//!   cluster-wide ([`allocate`]); a tenant at its cap here waits even when a slot is free,
//!   and a released slot goes to the first waiter in queue order whose tenant is under its
//!   cap. Every decision then takes the queue's lock (no fast path). The gate holds while
//!   the exchange's view is fresh, peers with demand or not (alone, the agent divides the
//!   capacity over its own tenants); with no fresh view (no cluster, the exchange stopped)
//!   it has no caps: the agent's own slots and order, as above.
//!
//! The admitted request's answer carries its permit ([`body::hold`]).
//!
//! Counters (`warmpath.admission.*`, read from atomics at collection time, so nothing on the
//! request path touches telemetry): refusals by reason, requests that waited, and the
//! active and waiting gauges; with them the engine timeouts the proxy enforces with these
//! limits (`warmpath.upstream.head_timeouts`, `warmpath.upstream.idle_timeouts`).

pub mod allocate;
mod body;
mod gate;
mod queue;
mod quota;

use std::{
    collections::HashMap,
    sync::{
        Arc, Weak,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use http::StatusCode;
use opentelemetry::{KeyValue, metrics::Meter};
use parking_lot::Mutex;
use tokio::sync::oneshot;

pub use body::hold;
use gate::Gate;
pub use queue::Class;
use queue::{FairQueue, Key};

use super::ProxyError;
use crate::{
    config::Limits,
    contention::{Contention, ContentionExchange},
};

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

/// The agent's admission state, shared by every data-path thread; or a pool's second stage
/// ([`Admission::for_pool`]).
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    /// Set for a pool's second stage: the pool, and the agent's admission (which counts its
    /// refusals).
    pool: Option<(Arc<str>, Arc<Admission>)>,
    /// The pools' second stages (for the metrics).
    stages: Mutex<Vec<Weak<Admission>>>,
    active: AtomicUsize,
    waiting: AtomicUsize,
    /// Waiters in grant order, and the cluster gate's state.
    queue: Mutex<Queue>,
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
        Self::with(limits, None)
    }

    /// The second stage for pool `pool` with its own cluster-wide concurrency (`capacity`),
    /// taken once the request's pool is known, while the agent's slot (stage one) is held:
    /// no slots of its own, only the cluster gate, so a tenant at its cap in this pool waits
    /// in this pool's queue (the agent's `max_queued` and `queue_timeout`) and tenants of
    /// other pools do not wait behind it. Its refusals count in `agent`'s.
    ///
    /// `gated_pools` is how many pools of the agent have a stage. Each stage's queue holds at
    /// most the agent's `max_queued` and at most `max_concurrent / (gated_pools + 1)` (at
    /// least 1): its waiters hold agent slots, so the stages' queues together never take
    /// every agent slot and a tenant held at one pool's share cannot block the other pools.
    pub fn for_pool(
        agent: &Arc<Admission>,
        pool: &str,
        capacity: usize,
        gated_pools: usize,
    ) -> Arc<Self> {
        let share = (agent.limits.max_concurrent / gated_pools.saturating_add(1)).max(1);
        let limits = Limits {
            max_concurrent: usize::MAX,
            cluster_max_concurrent: capacity,
            max_queued: agent.limits.max_queued.min(share),
            ..agent.limits
        };
        let stage = Self::with(limits, Some((Arc::from(pool), agent.clone())));
        agent.stages.lock().push(Arc::downgrade(&stage));
        stage
    }

    fn with(limits: Limits, pool: Option<(Arc<str>, Arc<Admission>)>) -> Arc<Self> {
        Arc::new(Self {
            limits,
            pool,
            stages: Mutex::new(Vec::new()),
            active: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            queue: Mutex::new(Queue {
                order: FairQueue::default(),
                gate: (limits.cluster_max_concurrent > 0)
                    .then(|| Gate::new(clamp_u32(limits.cluster_max_concurrent))),
            }),
            queued: AtomicU64::new(0),
            refused: Default::default(),
            idle_timeouts: AtomicU64::new(0),
            head_timeouts: AtomicU64::new(0),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A slot for one request of the default class (priority 0, weight 1, tenant 0),
    /// waiting in the queue when the agent is full.
    pub async fn admit(self: &Arc<Self>) -> Result<Option<Permit>, ProxyError> {
        self.admit_as(Class::default(), &Arc::from("default")).await
    }

    /// A slot for one request of `tenant` in `class`, waiting in the queue when the agent
    /// is full or the tenant is at its cluster share (served by priority, then by weight
    /// among tenants: `admission/queue.rs`).
    pub async fn admit_as(
        self: &Arc<Self>,
        class: Class,
        tenant: &Arc<str>,
    ) -> Result<Option<Permit>, ProxyError> {
        if self.limits.max_concurrent == 0 {
            return Ok(None);
        }
        if self.limits.cluster_max_concurrent == 0
            && self.waiting.load(Ordering::SeqCst) == 0
            && self.try_take()
        {
            return Ok(Some(self.permit(None)));
        }
        // Boxed: the common path's future stays small.
        Box::pin(self.wait(class, tenant)).await.map(Some)
    }

    /// This agent's slots for `tenant` under the cluster gate now; `None` when the gate is
    /// off or has no fresh view from the exchange.
    pub fn cluster_cap(&self, tenant: &str) -> Option<u64> {
        let q = self.queue.lock();
        q.gate.as_ref()?.cap(tenant, Instant::now())
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
        if let Some((_, agent)) = &self.pool {
            agent.count(reason);
        }
    }

    fn try_take(&self) -> bool {
        let max = self.limits.max_concurrent;
        let mut cur = self.active.load(Ordering::SeqCst);
        while cur < max {
            match self.active.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        false
    }

    fn permit(self: &Arc<Self>, tenant: Option<Arc<str>>) -> Permit {
        Permit {
            admission: self.clone(),
            tenant,
        }
    }

    async fn wait(self: &Arc<Self>, class: Class, tenant: &Arc<str>) -> Result<Permit, ProxyError> {
        let place = self.waiting.fetch_add(1, Ordering::SeqCst);
        let gated = self.limits.cluster_max_concurrent > 0;
        let mut place_guard = Waiting {
            admission: self,
            key: None,
            tenant: gated.then(|| tenant.clone()),
        };
        let deadline = tokio::time::Instant::now() + self.limits.queue_timeout;
        let mut rx = {
            let mut queue = self.queue.lock();
            let now = Instant::now();
            // Waiters the gate let through since (caps moved, the view went stale) first.
            self.pump(&mut queue, now);
            // Nobody eligible ahead and a slot free (released since the fast path looked):
            // take it. Under the gate, a waiter still queued after the pump is at its cap.
            if (gated || queue.order.is_empty()) && queue.may_start(tenant, now) && self.try_take()
            {
                if let Some(g) = &mut queue.gate {
                    g.started(tenant, class);
                }
                return Ok(self.permit(place_guard.tenant.take()));
            }
            if place >= self.limits.max_queued {
                drop(queue);
                self.count(Refused::QueueFull);
                return Err(self.busy(self.full()));
            }
            self.queued.fetch_add(1, Ordering::Relaxed);
            if let Some(g) = &mut queue.gate {
                g.queued(tenant, class);
            }
            let (tx, rx) = oneshot::channel();
            let waiter = Waiter {
                tx,
                tenant: place_guard.tenant.clone(),
            };
            place_guard.key = Some(queue.order.push(class, waiter));
            rx
        };
        // Anything but a grant is a timeout (the sender is only dropped after sending, or
        // with the queue itself).
        if let Ok(Ok(())) = tokio::time::timeout_at(deadline, &mut rx).await {
            place_guard.key = None;
            return Ok(self.permit(place_guard.tenant.take()));
        }
        let still_queued = place_guard
            .key
            .take()
            .is_some_and(|k| self.withdraw(&mut self.queue.lock(), k));
        // Out of the queue before the deadline passed for it: a slot was handed over.
        if !still_queued && rx.try_recv().is_ok() {
            return Ok(self.permit(place_guard.tenant.take()));
        }
        self.count(Refused::QueueTimeout);
        Err(self.busy(format!(
            "No capacity freed within the queue timeout ({} ms); retry later.",
            self.limits.queue_timeout.as_millis()
        )))
    }

    /// Takes a waiter out of the queue (it gave up); false when it was granted already.
    fn withdraw(&self, queue: &mut Queue, key: Key) -> bool {
        let Some(waiter) = queue.order.remove(key) else {
            return false;
        };
        if let (Some(g), Some(t)) = (&mut queue.gate, &waiter.tenant) {
            g.gave_up(t);
        }
        true
    }

    /// Gives a released slot to the next waiter, or back to the pool.
    fn release(self: &Arc<Self>, tenant: Option<&str>) {
        if self.limits.cluster_max_concurrent > 0 {
            // Under the gate every change is made under the lock: a free slot and a waiter
            // under its cap never both remain.
            let mut queue = self.queue.lock();
            if let (Some(g), Some(t)) = (&mut queue.gate, tenant) {
                g.ended(t);
            }
            if !self.grant_next(&mut queue, Instant::now()) {
                self.active.fetch_sub(1, Ordering::SeqCst);
            }
            return;
        }
        if self.waiting.load(Ordering::SeqCst) > 0
            && self.grant_next(&mut self.queue.lock(), Instant::now())
        {
            return;
        }
        self.active.fetch_sub(1, Ordering::SeqCst);
        // A request that queued while the slot was being given back: serve it.
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.pump(&mut self.queue.lock(), Instant::now());
        }
    }

    /// Hands free slots to waiters that may start, while there are both.
    fn pump(&self, queue: &mut Queue, now: Instant) {
        while !queue.order.is_empty() && self.try_take() {
            if !self.grant_next(queue, now) {
                self.active.fetch_sub(1, Ordering::SeqCst);
                break;
            }
        }
    }

    /// Hands one slot (counted in `active`) to the first waiter in queue order that may
    /// start; false when there is none. A waiter that stopped listening (cancelled) owns
    /// the slot all the same: its place guard finds itself granted and passes it on.
    fn grant_next(&self, queue: &mut Queue, now: Instant) -> bool {
        let Queue { order, gate } = queue;
        let waiter = order.pop_where(|w| match (&*gate, &w.tenant) {
            (Some(g), Some(t)) => g.may_start(t, now),
            _ => true,
        });
        let Some(waiter) = waiter else {
            return false;
        };
        if let (Some(g), Some(t)) = (gate, &waiter.tenant) {
            g.granted(t);
        }
        let _ = waiter.tx.send(());
        true
    }

    /// Why a full queue refused.
    fn full(&self) -> String {
        let l = &self.limits;
        match &self.pool {
            Some((pool, _)) => format!(
                "This tenant is at its share of pool `{pool}`'s cluster-wide concurrency ({} requests) and {} requests wait for it; retry later.",
                l.cluster_max_concurrent, l.max_queued
            ),
            None => format!(
                "The router is at capacity ({} requests in progress, {} waiting); retry later.",
                l.max_concurrent, l.max_queued
            ),
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
            .u64_observable_gauge("warmpath.admission.pool_waiting")
            .with_unit("{request}")
            .with_description(
                "Requests waiting at a pool's stage (holding an agent slot, at no engine yet)",
            )
            .with_callback(move |o| {
                let stages: Vec<Arc<Admission>> =
                    a.stages.lock().iter().filter_map(Weak::upgrade).collect();
                for stage in stages {
                    let pool = stage.pool.as_ref().map_or("", |(p, _)| p).to_string();
                    o.observe(stage.waiting() as u64, &[KeyValue::new("pool", pool)]);
                }
            })
            .build();
        let a = self.clone();
        meter
            .u64_observable_gauge("warmpath.admission.cluster_cap")
            .with_unit("{request}")
            .with_description(
                "This agent's slots for a tenant under the cluster gate, while it is engaged",
            )
            .with_callback(move |o| {
                let now = Instant::now();
                for (tenant, cap) in a.caps(now) {
                    o.observe(cap, &[KeyValue::new("tenant", tenant.to_string())]);
                }
                let stages: Vec<Arc<Admission>> =
                    a.stages.lock().iter().filter_map(Weak::upgrade).collect();
                for stage in stages {
                    let pool = stage.pool.as_ref().map_or("", |(p, _)| p).to_string();
                    for (tenant, cap) in stage.caps(now) {
                        let tenant = KeyValue::new("tenant", tenant.to_string());
                        o.observe(cap, &[tenant, KeyValue::new("pool", pool.clone())]);
                    }
                }
            })
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

impl Admission {
    /// Every tenant's cap under this admission's cluster gate now (none when off or stale).
    fn caps(&self, now: Instant) -> Vec<(Arc<str>, u64)> {
        let q = self.queue.lock();
        q.gate.as_ref().map(|g| g.caps(now)).unwrap_or_default()
    }
}

impl ContentionExchange for Admission {
    fn take_round(&self) -> Vec<(Arc<str>, Contention)> {
        let mut q = self.queue.lock();
        q.gate.as_mut().map(Gate::publish).unwrap_or_default()
    }

    fn set_remote_contention(
        &self,
        remote: HashMap<Arc<str>, Vec<Contention>>,
        fresh_for: Duration,
    ) {
        let mut q = self.queue.lock();
        let now = Instant::now();
        let Some(g) = &mut q.gate else { return };
        g.set_remote(bound_remote(remote), fresh_for, now);
        // Caps that rose: waiters under them take the free slots.
        self.pump(&mut q, now);
    }
}

/// Waiters in grant order, and the cluster gate (when configured).
#[derive(Debug)]
struct Queue {
    order: FairQueue<Waiter>,
    gate: Option<Gate>,
}

impl Queue {
    fn may_start(&self, tenant: &str, now: Instant) -> bool {
        self.gate.as_ref().is_none_or(|g| g.may_start(tenant, now))
    }
}

/// One waiting request: the channel its slot is handed over on, and its tenant (under the
/// cluster gate).
#[derive(Debug)]
struct Waiter {
    tx: oneshot::Sender<()>,
    tenant: Option<Arc<str>>,
}

/// The peers' contention the gate keeps: per tenant the [`MAX_REMOTE_AGENTS`] most
/// demanding agents' entries, and the `16 x MAX_PUBLISHED` tenants of most demand summed
/// over those (ties by name), so that the cut is the same whatever order it came in.
///
/// [`MAX_REMOTE_AGENTS`]: crate::policy::quota::MAX_REMOTE_AGENTS
fn bound_remote(remote: HashMap<Arc<str>, Vec<Contention>>) -> HashMap<Arc<str>, Vec<Contention>> {
    let mut tenants: Vec<(u64, Arc<str>, Vec<Contention>)> = remote
        .into_iter()
        .map(|(t, mut cs)| {
            cs.sort_by(|a, b| {
                b.demand
                    .cmp(&a.demand)
                    .then_with(|| b.priority.cmp(&a.priority))
            });
            cs.truncate(crate::policy::quota::MAX_REMOTE_AGENTS);
            let demand = cs
                .iter()
                .fold(0u64, |n, c| n.saturating_add(u64::from(c.demand)));
            (demand, t, cs)
        })
        .collect();
    tenants.sort_by(|(da, ta, _), (db, tb, _)| db.cmp(da).then_with(|| ta.cmp(tb)));
    tenants.truncate(gate::MAX_PUBLISHED * 16);
    tenants.into_iter().map(|(_, t, cs)| (t, cs)).collect()
}

fn clamp_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Whole seconds, rounded up, at least 1.
fn retry_after(d: Duration) -> u32 {
    let s = d.as_millis().div_ceil(1000).max(1);
    u32::try_from(s).unwrap_or(u32::MAX)
}

/// A place in the queue, given back when the wait ends either way.
struct Waiting<'a> {
    admission: &'a Arc<Admission>,
    /// Set while in the queue.
    key: Option<Key>,
    /// The tenant, under the cluster gate (taken by the permit once admitted).
    tenant: Option<Arc<str>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let a = self.admission;
        // Still queued (the wait was cancelled): leave; granted meanwhile: the slot is ours,
        // pass it on.
        let handed_over = self
            .key
            .take()
            .is_some_and(|k| !a.withdraw(&mut a.queue.lock(), k));
        a.waiting.fetch_sub(1, Ordering::SeqCst);
        if handed_over {
            a.release(self.tenant.as_deref());
        }
    }
}

/// One admitted request's slot, released when dropped (to the next waiter, if any).
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    /// Its tenant, under the cluster gate.
    tenant: Option<Arc<str>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission.release(self.tenant.as_deref());
    }
}

#[cfg(test)]
mod tests;
