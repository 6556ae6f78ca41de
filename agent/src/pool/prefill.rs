//! Prefill work ahead at a pod, less what its engine has most likely done of it already.
//!
//! The counters say how many prompt blocks were sent to a pod and have not produced a first
//! byte (this agent's, and with shared loads its peers' reports): all of it counts as still
//! to do until the first byte, although the engine has been prefilling the head of that
//! queue since the previous prefill there finished (or since the queue was empty). Two pods
//! each with one cold prompt queued look the same to the counters whether that prompt is
//! nearly done or has just arrived; a cold request choosing between them picks as a coin
//! would. Measured on the no-sharing control at 0.8x (docs/benchmarks.md, "Work ahead less
//! what the engine has done"): the picks' wait behind the prefill ahead of them, against the
//! best pod's at the same instant, was 13-22 ms longer on average; ranked by the counters
//! alone it would have been 10-18 ms, by the counters less the head's progress 3-11 ms.
//!
//! So each endpoint keeps a head clock: started when work joins an empty queue, restarted
//! when a prefill there finishes with more queued (a first byte of this agent's, a peer's
//! report of fewer blocks queued), stopped when the queue empties. The work ahead is the
//! counters' blocks less the head's progress:
//!
//! ```text
//! done = min(elapsed(head clock) / secs_per_block(pod), head_blocks, queued)
//! ```
//!
//! `secs_per_block` is the pod's calibrated prefill rate (the cost model's fit); the head's
//! own size is not known where the head is a peer's, so `head_blocks` is the pool's mean
//! uncached blocks per request: a stalled engine, or one slower than its fit, is credited
//! at most one typical prompt.

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use super::{Endpoint, Pool};

/// A process-wide instant the head clocks count from.
fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

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

    /// How long the engine has been at the head of the queued prefill here (zero while
    /// nothing is queued).
    pub fn head_elapsed(&self, now: Instant) -> Duration {
        match self.head_since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            since => Duration::from_micros(tick(now).saturating_sub(since)),
        }
    }

    /// Of `queued` blocks, those the engine has most likely prefilled by `now` at
    /// `secs_per_block`: the head's progress, at most `head_blocks` and `queued`.
    pub fn prefilled(
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
    /// the engine's waiting count.
    pub fn work_ahead(
        &self,
        e: &Endpoint,
        with_peers: bool,
        secs_per_block: f64,
        now: Instant,
    ) -> u64 {
        let mean = self.mean_prefill_blocks();
        let credited = |queued: u64| queued - e.prefilled(queued, secs_per_block, mean.max(1), now);
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
        // Nothing queued: nothing credited, however long.
        assert_eq!(pool.work_ahead(&e, true, rate, t0 + ms(500)), 0);
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
        let e2 = pool.endpoints()[0].clone();
        e2.queued_prefill_blocks.fetch_sub(299, Ordering::Relaxed);
        assert_eq!(pool.work_ahead(&e2, true, 1e-3, t0 + ms(10_000)), 0);
        // A rate no fit gives credits nothing.
        assert_eq!(pool.work_ahead(&e2, true, f64::NAN, t0 + ms(10_000)), 1);
        assert_eq!(pool.work_ahead(&e2, true, 0.0, t0 + ms(10_000)), 1);
    }

    /// With shared loads, a peer's report of more blocks queued starts the clock of an empty
    /// queue, and one of fewer restarts it; provisional placements are never credited.
    #[test]
    fn peers_reports_move_the_head_clock() {
        let pool = one_pod();
        pool.count_peers_exactly();
        for _ in 0..64 {
            pool.note_prefill(100);
        }
        let e = pool.endpoints()[0].clone();
        let t0 = Instant::now();
        let report = |blocks| AgentLoad {
            in_flight: 2,
            queued_prefill_blocks: blocks,
        };
        e.set_peer_load("b", report(150), t0);
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t0 + ms(20)), 130);
        // The peer's first prompt (100 blocks) finished at 95 ms: 50 left, its clock from then.
        e.set_peer_load("b", report(50), t0 + ms(95));
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t0 + ms(105)), 40);
        // A cold placement of 80 new blocks, too recent for a report: counted whole.
        e.note_cold_placement(80, 100, t0 + ms(105));
        assert_eq!(pool.work_ahead(&e, true, 1e-3, t0 + ms(106)), 39 + 80);
        // Without peers' figures (another preset), only this agent's own: none.
        assert_eq!(pool.work_ahead(&e, false, 1e-3, t0 + ms(106)), 0);
    }
}
