//! Cold decisions staggered across agents.
//!
//! Agents of a cluster rank the same fleet by the same figures and hear of each other's
//! placements a fraction of a millisecond to a millisecond or so later (docs/cluster.md,
//! "Shared load"). Requests that reach several agents at one instant — a burst, as a
//! production trace's arrivals come (Mooncake's conversation trace: 6-28 requests a
//! timestamp) — are ranked before any of them has heard of the others, and each agent's
//! cold prompt goes to the same cheapest pod, where all but one wait for the others'
//! prefills. Near-ties by each agent's turn ([`super::near_ties_by_turn`]) spread them only
//! where pods are within one request's load; in a burst the cheapest pod is usually the only
//! one.
//!
//! So an agent that is not first in its cluster's order holds a cold request for its slot's
//! share of a few milliseconds before ranking it again: agents are ordered by node id among
//! the live members, slot = position mod [`SLOTS`], and the agent in slot `s` waits `s x`
//! [`STEP`]. By then the placements of the agents in earlier slots have arrived and count on
//! their pods ([`crate::pool`]'s provisional placements), so the burst is ranked as one
//! central agent would rank it, a slot at a time. The hold is taken only where it is small
//! beside what the request waits anyway: at most [`MAX_SHARE`] of its predicted time to
//! first token at the first ranking's pick, and only for a cold request (its pick holds less
//! than half its prompt; a warm one keeps its pod whatever the others do). Measured on the
//! Mooncake conversation trace (docs/benchmarks.md, "A production trace"): the four agents'
//! slowest tenth had been predicted 226 ms short (the central agent's 19 ms long), 46 ms
//! short with it; their p90 at 0.8x 570 -> 425 ms (the central agent's 442 in the run
//! before, 428 in the run after; 440 with the gate below).
//!
//! Only while arrivals come in bursts ([`Bursts`]): more of the requests reaching this
//! agent's pool come within [`SAME_INSTANT`] of the one before than a steady (Poisson)
//! stream of the same rate would bring, and the agent staggers for [`BURST_MEMORY`] after.
//! Held always, every cold request of a steady stream waited its few milliseconds for
//! nothing: no peer's request of the same instant to wait for (docs/benchmarks.md,
//! "Staggered only in bursts"); gated by close pairs alone, a steady stream of tens of
//! requests a second was taken for bursts much of the time ("Bursts judged against the
//! rate").

use std::{
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use serde::Serialize;

/// Slots of the cluster's order: agents in one slot (every [`SLOTS`]th) still race.
pub const SLOTS: u32 = 4;

/// One slot's hold: above the time a placement takes to reach the peers (p99 1.2 ms on a
/// loaded 2-vCPU host), at the timer's millisecond resolution.
pub const STEP: Duration = Duration::from_millis(2);

/// The most of a request's predicted time to first token a hold may take.
pub const MAX_SHARE: f64 = 0.05;

/// This agent's place in the cluster's order (one per agent: [`crate::proxy::Proxy`]), set
/// by the membership's watcher; the first slot (a lone agent's) never holds.
#[derive(Debug, Default)]
pub struct Slot(AtomicU32);

impl Slot {
    /// Sets this agent's slot from its position among the live agents' sorted node ids.
    pub fn set_position(&self, position: usize) {
        self.0.store(slot_of(position), Ordering::Relaxed);
    }

    /// This agent's slot.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Two arrivals this close are a close pair (a replayed trace's instant reaches an agent
/// within a fraction of a millisecond).
pub const SAME_INSTANT: Duration = Duration::from_millis(1);

/// How long a burst keeps the agent staggering: past the gap between a trace's instants
/// (Mooncake's conversation trace at 0.8x: 0.26 s), so that an instant of which this agent
/// gets one request is staggered too.
pub const BURST_MEMORY: Duration = Duration::from_secs(1);

/// Arrivals the close-pair share and the mean gap remember (weight 1/N each; the first N
/// are averaged plainly).
pub const BURST_WINDOW: u64 = 32;

/// A gap counts in the mean gap at most this long: past about 29.5 ms the share floor
/// ([`MIN_BURST_SHARE`]) decides whatever the mean, and a quiet spell would otherwise hold
/// the mean high (the Poisson share near 0) for hundreds of arrivals after it.
pub const GAP_CAP: Duration = Duration::from_millis(30);

/// Arrivals come in bursts where the share of close pairs is above this many times what a
/// Poisson stream of the measured rate gives (`1 - e^(-SAME_INSTANT / mean gap)`)...
pub const BURST_FACTOR: f64 = 3.0;

/// ...and above this share (about four close pairs in the last [`BURST_WINDOW`] arrivals).
/// Of 4,000 arrivals of a Poisson stream at one agent (the unit test's), none staggered at
/// 10 to 300 requests a second, where a gate of close pairs alone staggered about 90 % of
/// them at 50 and nearly all from 100; a trace's instants (several requests an agent in the
/// same millisecond) from their second instant. The first few gaps after a start or a quiet
/// spell weigh much (plain averages), so they can start a burst's second of staggering by
/// chance. From a mean gap under 2.5 ms (about 400 requests a second at one agent) a
/// Poisson stream's close pairs are over a third of its arrivals, and nothing, bursts
/// included, is taken for bursts.
pub const MIN_BURST_SHARE: f64 = 0.1;

/// Whether a pool's requests arrive in bursts: each arrival noted, lock-free, by the data
/// path's threads (racing notes may lose one another's update of the means: a heuristic).
#[derive(Debug)]
pub struct Bursts {
    origin: Instant,
    /// The latest arrival, in microseconds after `origin` plus one (0: none yet).
    last: AtomicU64,
    /// Gaps noted so far.
    gaps: AtomicU64,
    /// Decayed means over the arrivals, as f64 bits: the gap to the one before, in
    /// microseconds (at most [`GAP_CAP`]), and the share of gaps under [`SAME_INSTANT`].
    gap: AtomicU64,
    close: AtomicU64,
    /// Staggering until then (same clock).
    until: AtomicU64,
}

impl Default for Bursts {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            gap: AtomicU64::new(0),
            close: AtomicU64::new(0),
            until: AtomicU64::new(0),
        }
    }
}

impl Bursts {
    /// Notes a request that arrived `at`; true while arrivals come in bursts (at this one or
    /// one in the last [`BURST_MEMORY`], more close pairs than the rate explains:
    /// [`bursting`]).
    pub fn arrived(&self, at: Instant) -> bool {
        let now = self.tick(at);
        let before = self.last.swap(now, Ordering::Relaxed);
        if before != 0 {
            let gap = before.abs_diff(now);
            let close = f64::from(u8::from(gap < micros(SAME_INSTANT)));
            let n = self.gaps.fetch_add(1, Ordering::Relaxed).saturating_add(1);
            let mean_gap = fold(&self.gap, gap.min(micros(GAP_CAP)) as f64, n);
            if bursting(fold(&self.close, close, n), mean_gap) {
                let until = now.saturating_add(micros(BURST_MEMORY));
                self.until.fetch_max(until, Ordering::Relaxed);
            }
        }
        now < self.until.load(Ordering::Relaxed)
    }

    /// Whether the agent staggers at `at` (a burst in the [`BURST_MEMORY`] before it).
    pub fn active(&self, at: Instant) -> bool {
        self.tick(at) < self.until.load(Ordering::Relaxed)
    }

    /// `at` on the tracker's clock: microseconds after its origin, plus one (0: none).
    fn tick(&self, at: Instant) -> u64 {
        micros(at.saturating_duration_since(self.origin)).saturating_add(1)
    }
}

/// Whether a share `close` of arrivals within [`SAME_INSTANT`] of the one before, at a mean
/// gap of `mean_gap_us` microseconds, is more than a Poisson stream of that rate brings
/// ([`BURST_FACTOR`], [`MIN_BURST_SHARE`]).
pub fn bursting(close: f64, mean_gap_us: f64) -> bool {
    // Most arrivals of a steady stream stop at the floor, before the exponential.
    close > MIN_BURST_SHARE
        && mean_gap_us > 0.0
        && close > -BURST_FACTOR * (-(micros(SAME_INSTANT) as f64) / mean_gap_us).exp_m1()
}

/// Folds `x`, the `n`-th value, into the mean stored as f64 bits in `bits` (weight 1/n, at
/// least 1/[`BURST_WINDOW`]); returns the new mean.
fn fold(bits: &AtomicU64, x: f64, n: u64) -> f64 {
    let old = f64::from_bits(bits.load(Ordering::Relaxed));
    let new = old + (x - old) / n.clamp(1, BURST_WINDOW) as f64;
    bits.store(new.to_bits(), Ordering::Relaxed);
    new
}

/// A duration in whole microseconds, saturating.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A pool's stagger: whether its requests come in bursts, and the requests held, how many
/// and for how long in all (on `/status` and `/metrics`, beside the cold yields).
#[derive(Debug, Default)]
pub struct Holds {
    bursts: Bursts,
    requests: AtomicU64,
    micros: AtomicU64,
}

/// What `/status` shows of them (`pools[].stagger`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct HoldStatus {
    /// Requests held for this agent's slot before their ranking.
    pub requests: u64,
    /// Seconds held, all requests together.
    pub seconds: f64,
    /// Whether the pool's requests come in bursts now (the agent staggers only then; noted
    /// only where peer agents route to the pool, so a lone agent's is always false).
    pub bursting: bool,
}

impl Holds {
    /// Notes a request that arrived `at`; true while the pool's requests come in bursts
    /// ([`Bursts::arrived`]).
    pub fn arrived(&self, at: Instant) -> bool {
        self.bursts.arrived(at)
    }

    /// One request held for `held`.
    pub fn note(&self, held: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.micros.fetch_add(micros(held), Ordering::Relaxed);
    }

    /// The requests held so far, and for how long in all.
    pub fn status(&self) -> HoldStatus {
        HoldStatus {
            requests: self.requests.load(Ordering::Relaxed),
            seconds: self.micros.load(Ordering::Relaxed) as f64 / 1e6,
            bursting: self.bursts.active(Instant::now()),
        }
    }
}

/// The slot of the agent at `position` in the cluster's order.
pub fn slot_of(position: usize) -> u32 {
    (position % SLOTS as usize) as u32
}

/// The hold for a cold request predicted to see its first token in `predicted_s` seconds, by
/// an agent in `slot`: `slot x STEP`, or none where that is more than [`MAX_SHARE`] of the
/// prediction (or the slot is the first).
pub fn hold(slot: u32, predicted_s: f64) -> Option<Duration> {
    let d = STEP * slot;
    (slot > 0 && d.as_secs_f64() <= MAX_SHARE * predicted_s).then_some(d)
}

/// This agent's position among the live members' node ids (`members`, itself included,
/// any order, duplicates counted once).
pub fn position<'a>(me: &str, members: impl IntoIterator<Item = &'a str>) -> usize {
    let mut ids: Vec<&str> = members.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    ids.iter().position(|id| *id == me).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arrivals at `rate` a second after `t0`, their gaps exponential (a Poisson stream),
    /// from a fixed seed.
    fn poisson(t0: Instant, rate: f64, n: usize) -> Vec<Instant> {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut t = 0.0;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let u = ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                t += -u.ln() / rate;
                t0 + Duration::from_secs_f64(t)
            })
            .collect()
    }

    #[test]
    fn a_steady_stream_is_not_taken_for_bursts_whatever_its_rate() {
        let hour = Duration::from_secs(3600);
        for rate in [10.0, 20.0, 33.0, 40.0, 50.0, 100.0, 300.0] {
            let b = Bursts::default();
            let arrivals = poisson(b.origin, rate, 4000);
            // Close pairs come (at 100 a second about one arrival in ten): a gate of close
            // pairs alone staggered nearly always.
            let close = arrivals
                .windows(2)
                .filter(|w| w[1] - w[0] < SAME_INSTANT)
                .count();
            assert!(rate < 50.0 || close > 150, "{rate}/s: {close} close pairs");
            let staggered = arrivals.iter().filter(|at| b.arrived(**at)).count();
            assert!(staggered <= 40, "{rate}/s: {staggered} of 4000 staggered");
            // After an hour's quiet the same stream again: at most about a second of it
            // staggered while the first gaps after the spell weigh much.
            let last = *arrivals.last().expect("arrivals");
            let again = poisson(last + hour, rate, 4000);
            let staggered = again.iter().filter(|at| b.arrived(**at)).count();
            let second = (rate * 1.5) as usize;
            assert!(staggered <= second, "{rate}/s after a spell: {staggered}");
        }
    }

    #[test]
    fn a_traces_instants_mark_a_burst_that_lasts_a_second_after_the_last() {
        let b = Bursts::default();
        let t0 = b.origin;
        let us = |n: u64| Duration::from_micros(n);
        // Instants 260 ms apart, three requests each within 0.2 ms (one agent's share of
        // Mooncake's conversation trace): from the second instant on, every arrival staggers.
        let mut last = t0;
        let mut staggered = Vec::new();
        for k in 0..20u64 {
            for j in 0..3 {
                last = t0 + us(k * 260_000 + j * 100);
                staggered.push(b.arrived(last));
            }
        }
        assert_eq!(
            staggered[..3],
            [false; 3],
            "one instant is no stream to judge"
        );
        assert!(staggered[3..].iter().all(|s| *s), "{staggered:?}");
        // An instant before the tracker's origin counts as its origin.
        assert!(!Bursts::default().arrived(t0 - Duration::from_secs(5)));
        // Kept for a second after the last arrival.
        assert!(b.active(last + Duration::from_millis(999)));
        assert!(!b.active(last + Duration::from_millis(1001)));
    }

    #[test]
    fn bursts_are_close_pairs_beyond_what_the_rate_explains() {
        // One arrival in two close, 100 ms apart on average: a Poisson stream would have
        // about 1 % close pairs.
        assert!(bursting(0.5, 100_000.0));
        // Too few close pairs to tell, however slow the stream.
        assert!(!bursting(0.09, 100_000.0));
        // A gap of 1 ms on average: 63 % of a Poisson stream's gaps are under a millisecond.
        assert!(!bursting(0.9, 1_000.0));
        assert!(bursting(0.5, 20_000.0), "5 % expected, 10x that");
        assert!(!bursting(0.12, 20_000.0), "under 3x the 4.9 % expected");
        assert!(!bursting(1.0, 0.0), "no gap measured");
    }

    #[test]
    fn slots_after_the_first_hold_two_milliseconds_each_where_small_beside_the_wait() {
        // The first slot never holds.
        assert_eq!(hold(0, 10.0), None);
        // Slot 2 holds 4 ms, allowed from a predicted 80 ms (5 %) up.
        assert_eq!(hold(2, 0.080), Some(Duration::from_millis(4)));
        assert_eq!(hold(2, 0.5), Some(Duration::from_millis(4)));
        assert_eq!(hold(2, 0.079), None);
        // Slot 1 from 40 ms; slot 3 from 120 ms.
        assert_eq!(hold(1, 0.040), Some(Duration::from_millis(2)));
        assert_eq!(hold(3, 0.119), None);
        assert_eq!(hold(3, 0.120), Some(Duration::from_millis(6)));
        // No prediction (0) or a nonsense one: no hold.
        assert_eq!(hold(1, 0.0), None);
        assert_eq!(hold(1, f64::NAN), None);
    }

    #[test]
    fn a_slot_follows_its_position_and_the_holds_add_up() {
        let slot = Slot::default();
        assert_eq!(slot.get(), 0, "a lone agent's");
        slot.set_position(6);
        assert_eq!(slot.get(), 2, "the seventh agent: 6 mod 4");
        slot.set_position(0);
        assert_eq!(slot.get(), 0);
        let holds = Holds::default();
        holds.note(Duration::from_millis(2));
        holds.note(Duration::from_millis(6));
        assert_eq!(
            holds.status(),
            HoldStatus {
                requests: 2,
                seconds: 0.008,
                bursting: false
            }
        );
        // Instants of two arrivals, 260 ms apart (a minute ahead: read well within the
        // second after the last).
        let at = Instant::now() + Duration::from_secs(60);
        let bursting = (0..4u32)
            .flat_map(|k| [k, k].map(|k| at + Duration::from_millis(260) * k))
            .map(|t| holds.arrived(t))
            .collect::<Vec<_>>();
        assert_eq!(bursting, [false, false, true, true, true, true, true, true]);
        assert!(holds.status().bursting);
    }

    #[test]
    fn an_agents_position_is_its_rank_among_the_live_node_ids() {
        let live = ["node-c", "node-a", "node-b", "node-a"];
        assert_eq!(position("node-a", live), 0);
        assert_eq!(position("node-b", live), 1);
        assert_eq!(position("node-c", live), 2);
        // Not (yet) among them: first, as a lone agent.
        assert_eq!(position("node-z", live), 0);
        // Five agents: the fifth shares the first slot.
        assert_eq!([0, 1, 3, 4, 6].map(slot_of), [0, 1, 3, 0, 2]);
    }
}
