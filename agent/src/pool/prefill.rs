//! Prefill work ahead at a pod, less what its engine has most likely done of it already.
//!
//! The counters say how many prompt blocks were sent to a pod and have not produced a first
//! byte (this agent's, and with shared loads its peers' reports): all of it counts as still
//! to do until the first byte, although the engine has been prefilling the head of that
//! queue since the previous prefill there finished (or since work joined an empty queue).
//! Two pods each with one cold prompt queued look the same to the counters whether that
//! prompt is nearly done or has just arrived; a cold request choosing between them picks as
//! a coin would. Measured on the no-sharing control at 0.8x (docs/benchmarks.md, "Work ahead less
//! what the engine has done"): the picks' wait behind the prefill ahead of them, against the
//! best pod's at the same instant, was 13-22 ms longer on average; ranked by the counters
//! alone it would have been 10-18 ms, by the counters less the head's progress 3-11 ms.
//!
//! So each endpoint keeps a head clock: started when work joins an empty queue, restarted
//! when a prefill there finishes with more queued (a first byte of this agent's, a peer's
//! report of fewer blocks queued; a request that failed before its first byte counts as
//! finished), stopped when the queue empties. A peer's report that expires (the peer gone)
//! does not touch the clock; the next request of this agent's to an otherwise empty queue
//! restarts it. The work ahead is the counters' blocks less the head's progress:
//!
//! ```text
//! done = min(elapsed(head clock) / secs_per_block(pod), head_blocks, queued)
//! ```
//!
//! `secs_per_block` is the pod's calibrated prefill rate (the cost model's fit, whose own
//! features are these credited blocks: the prediction and the fit see the same work); the
//! head's own size is not known where the head is a peer's, so `head_blocks` is the pool's
//! mean uncached blocks per request (at least 1): a stalled engine, or one slower than its
//! fit, is credited at most one typical prompt.

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use super::{Endpoint, Pool, idle::origin};

/// Microseconds from [`origin`] to `at`, plus one (0 means "stopped").
fn tick(at: Instant) -> u64 {
    (at.saturating_duration_since(origin()).as_micros() as u64).saturating_add(1)
}

impl Endpoint {
    /// Prefill work joined the queue here at `now`: the head clock starts if it was stopped
    /// (the queue was empty), else keeps running for the prefill already under way.
    pub(super) fn note_queued(&self, now: Instant) {
        let _ =
            self.head_since
                .compare_exchange(0, tick(now), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// A prefill here finished at `now`, leaving `left` blocks queued: the next in line
    /// starts now, or the clock stops with nothing left.
    pub(super) fn note_prefilled(&self, left: u64, now: Instant) {
        let at = if left == 0 { 0 } else { tick(now) };
        self.head_since.store(at, Ordering::Relaxed);
    }

    /// A prefill of this agent's joined the queue here at `now`, `own_before` of its blocks
    /// queued before it: as [`Endpoint::note_queued`], but a queue nobody reports anything in
    /// restarts the clock (left running by a peer's report that expired, or a race between
    /// reports: a new head must not inherit it).
    pub(super) fn note_joined(&self, own_before: u64, now: Instant) {
        if own_before == 0 && self.peer_load(now).queued_prefill_blocks == 0 {
            self.head_since.store(tick(now), Ordering::Relaxed);
        } else {
            self.note_queued(now);
        }
    }

    /// A prefill of this agent's here finished at `now` (its first byte, or its failure),
    /// `own_left` of its blocks still queued: the peers' queue is read, and the clock set,
    /// under their lock, so that a report of theirs cannot stop the clock in between.
    pub(super) fn note_own_prefilled(&self, own_left: u64, now: Instant) {
        if own_left > 0 {
            self.note_prefilled(own_left, now);
            return;
        }
        let mut loads = self.peer_loads.lock();
        self.note_prefilled(loads.sum(now).queued_prefill_blocks, now);
    }

    /// How long the engine has been at the head of the queued prefill here (zero while the
    /// clock is stopped).
    pub(super) fn head_elapsed(&self, now: Instant) -> Duration {
        match self.head_since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            since => Duration::from_micros(tick(now).saturating_sub(since)),
        }
    }

    /// Of `queued` blocks, those the engine has most likely prefilled by `now` at
    /// `secs_per_block`: the head's progress, at most `head_blocks` and `queued`; none at a
    /// rate no fit gives (not finite, or not positive).
    pub(super) fn prefilled(
        &self,
        queued: u64,
        secs_per_block: f64,
        head_blocks: u64,
        now: Instant,
    ) -> u64 {
        if queued == 0 || !(secs_per_block.is_finite() && secs_per_block > 0.0) {
            return 0;
        }
        let done = self.head_elapsed(now).as_secs_f64() / secs_per_block;
        // Saturating float-to-int: a clock of hours is any number of blocks.
        (done as u64).min(head_blocks).min(queued)
    }
}

impl Pool {
    /// Prefill work queued at an endpoint, in blocks, less what its engine has most likely
    /// done of it by `now` at `secs_per_block` (the pod's calibrated rate): what this proxy
    /// sent that has not started answering and, in a cluster, what peers' placements left to
    /// prefill there; or — when the engine reports more waiting requests than that explains
    /// (other routers) — its waiting count times the mean prefill.
    /// `with_peers`: count peers' placements' prefill (the prefix presets do; the others rank
    /// by this agent's own view).
    /// With exact peer loads ([`Pool::count_peers_exactly`]) the peers' part is what they
    /// report queued there, plus the prefill of peers' cold placements too recent for their
    /// reports ([`Endpoint::provisional_peer_load`]), and the engine's waiting count stands
    /// in only while it saw requests no agent reported (another router's). The head's
    /// progress ([`Endpoint::prefilled`]) is taken off this agent's and the peers' reported
    /// blocks, never off provisional placements (the newest work, not yet under way) nor
    /// the engine's waiting count; without exact peer loads, off this agent's own blocks
    /// only (the peers' placements' prefill is drained at the pod's rate already:
    /// [`Endpoint::queue_peer_prefill`]).
    pub fn work_ahead(
        &self,
        e: &Endpoint,
        with_peers: bool,
        secs_per_block: f64,
        now: Instant,
    ) -> u64 {
        let mean = self.mean_prefill_blocks();
        let credited = |queued: u64| {
            queued.saturating_sub(e.prefilled(queued, secs_per_block, mean.max(1), now))
        };
        let mut own = e.queued_prefill_blocks();
        if with_peers {
            if self.counts_peers_exactly() {
                own = credited(own.saturating_add(e.peer_load(now).queued_prefill_blocks))
                    .saturating_add(e.provisional_peer_load(now).1);
                if e.foreign_requests.load(Ordering::Relaxed) == 0 {
                    return own;
                }
            } else {
                own = credited(own).saturating_add(e.peer_prefill_blocks(now));
            }
        } else {
            own = credited(own);
        }
        if !e.engine_report_fresh() {
            return own;
        }
        own.max(u64::from(e.engine_waiting.load(Ordering::Relaxed)) * mean)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{kv_index::AgentLoad, pool::tests::one_pod};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// 1 ms a block: 100 blocks queued at t0 are 70 at t0 + 30 ms; a prefill finishing
    /// restarts the clock for the next; an empty queue stops it.
    #[test]
    fn the_head_of_the_queue_is_credited_from_when_it_started() {
        let pool = one_pod();
        // A mean prompt of about 200 blocks: above every credit here.
        for _ in 0..100 {
            pool.note_prefill(200);
        }
        let e = pool.endpoints()[0].clone();
        let t0 = Instant::now();
        let rate = 1e-3;
        e.queued_prefill_blocks.fetch_add(100, Ordering::Relaxed);
        e.note_queued(t0);
        assert_eq!(pool.work_ahead(&e, true, rate, t0), 100);
        assert_eq!(pool.work_ahead(&e, true, rate, t0 + ms(30)), 70);
        // A second prompt of 60 joins behind it: the clock keeps the head's start.
        e.queued_prefill_blocks.fetch_add(60, Ordering::Relaxed);
        e.note_queued(t0 + ms(40));
        assert_eq!(pool.work_ahead(&e, true, rate, t0 + ms(50)), 110);
        // The first finishes at 90 ms: the second is the head from then.
        e.queued_prefill_blocks.fetch_sub(100, Ordering::Relaxed);
        e.note_prefilled(60, t0 + ms(90));
        assert_eq!(pool.work_ahead(&e, true, rate, t0 + ms(90)), 60);
        assert_eq!(pool.work_ahead(&e, true, rate, t0 + ms(100)), 50);
        // It finishes: the clock stops, and new work starts it afresh.
        e.queued_prefill_blocks.fetch_sub(60, Ordering::Relaxed);
        e.note_prefilled(0, t0 + ms(150));
        e.queued_prefill_blocks.fetch_add(40, Ordering::Relaxed);
        e.note_queued(t0 + ms(400));
        assert_eq!(pool.work_ahead(&e, true, rate, t0 + ms(410)), 30);
    }

    /// An engine slower than its fit (or stalled) is credited at most one typical prompt
    /// (the pool's mean), and never more than is queued.
    #[test]
    fn the_credit_is_at_most_one_mean_prompt_and_the_queue() {
        let pool = one_pod();
        pool.note_prefill(16);
        let e = pool.endpoints()[0].clone();
        let t0 = Instant::now();
        e.queued_prefill_blocks.fetch_add(300, Ordering::Relaxed);
        e.note_queued(t0);
        // The mean after one note: 16 / 8 = 2 blocks (a 1/8 moving average from 0).
        let mean = pool.mean_prefill_blocks();
        assert_eq!(mean, 2);
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t0 + ms(10_000)), 298);
        e.queued_prefill_blocks.fetch_sub(299, Ordering::Relaxed);
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t0 + ms(10_000)), 0);
        // A rate no fit gives credits nothing.
        assert_eq!(pool.work_ahead(&e, true, f64::NAN, t0 + ms(10_000)), 1);
        assert_eq!(pool.work_ahead(&e, true, 0.0, t0 + ms(10_000)), 1);
    }

    /// With shared loads, a peer's report of more blocks queued starts the clock of an empty
    /// queue, one of fewer restarts it and one of none stops it; provisional placements are
    /// never credited.
    #[test]
    fn peers_reports_move_the_head_clock() {
        let (pool, e) = sharing_pod();
        let t0 = Instant::now();
        e.set_peer_load("b", report(150), t0);
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t0 + ms(20)), 130);
        // The peer's first prompt (100 blocks) finished at 95 ms: 50 left, its clock from then.
        e.set_peer_load("b", report(50), t0 + ms(95));
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t0 + ms(105)), 40);
        // 5 left from 200 ms, and a cold placement of 80 new blocks at 209 ms, too recent
        // for a report: at 211 ms the 5 are credited (11 ms of progress, at most the 5),
        // the 80 not at all (crediting them too would leave 85 - 11 = 74).
        e.set_peer_load("b", report(5), t0 + ms(200));
        e.note_cold_placement(80, 100, t0 + ms(209));
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t0 + ms(211)), 80);
        // Nothing left: the clock stops.
        e.set_peer_load("b", report(0), t0 + ms(300));
        assert_eq!(e.head_elapsed(t0 + ms(310)), Duration::ZERO);
    }

    /// A peer's report that expires leaves its clock running; this agent's next prompt to
    /// the queue nobody reports anything in restarts it, and this agent's first byte with a
    /// peer's prompt still queued makes that the head.
    #[test]
    fn this_agents_prompts_restart_a_clock_a_gone_peer_left_running() {
        let (pool, e) = sharing_pod();
        let t0 = Instant::now();
        e.set_peer_load("b", report(50), t0);
        // Five seconds on, the report has expired (`PEER_LOAD_TTL`): 40 blocks of this
        // agent's join an empty queue and are its head from then (a clock from t0 would
        // credit all 40).
        let t1 = t0 + ms(5_000);
        let before = e.queued_prefill_blocks.fetch_add(40, Ordering::Relaxed);
        e.note_joined(before, t1);
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t1 + ms(10)), 30);
        // A live peer queues 70 behind it; this agent's prompt gets its first byte at 50 ms:
        // the peer's 70 are the head from then.
        e.set_peer_load("c", report(70), t1 + ms(20));
        e.queued_prefill_blocks.fetch_sub(40, Ordering::Relaxed);
        e.note_own_prefilled(0, t1 + ms(50));
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t1 + ms(60)), 60);
    }

    /// A pool counting peers by their reports, its mean prompt about 100 blocks (above every
    /// credit in these tests), and its one endpoint.
    fn sharing_pod() -> (Pool, std::sync::Arc<Endpoint>) {
        let pool = one_pod();
        pool.count_peers_exactly();
        for _ in 0..64 {
            pool.note_prefill(100);
        }
        let e = pool.endpoints()[0].clone();
        (pool, e)
    }

    fn report(blocks: u64) -> AgentLoad {
        AgentLoad {
            in_flight: 2,
            queued_prefill_blocks: blocks,
        }
    }
}
