//! Demand-driven replication of hot prefixes: a prefix whose demand its home pods cannot
//! serve sooner than a cold prefill elsewhere gains a home, deliberately warmed; more as
//! demand grows, fewer as it falls. Every other prefix stays where the cost model puts it.
//!
//! The algorithm, per pool:
//!
//! - **Key.** A request's prefix is the block key at the end of the longest prefix any live
//!   pod holds (`available` blocks, at least [`Settings::min_blocks`]): the chained key names
//!   the whole prefix up to there. A prefix no pod holds is not tracked: it has no home to
//!   outgrow, so a cold prefix never gains one.
//! - **Demand.** A decayed rate in requests per second: at each request,
//!   `rate = rate x e^(-dt/tau) + 1/tau`; the pool's rate (every tracked request) likewise.
//!   Hot: `rate >= min_rate` and at least a pod's share of the pool's rate
//!   (`rate x pods >= pool_rate`) — more than one pod would get if every prefix were spread
//!   evenly, so a workload of many equally popular prefixes has none.
//! - **Homes.** The pods the prefix is kept on, first the best pod holding it when it is first
//!   seen. A home that no longer holds it (evicted) or left is dropped — except the one just
//!   warmed, which has `tau` to show its copy (the warming request in flight, the engine's
//!   events not yet seen).
//! - **Pressure.** Hot and the best home's predicted TTFT is above the
//!   best other pod's (a cold prefill there, by the same cost model): for
//!   [`Settings::sustain`] consecutive requests of the prefix, the wanted number of homes
//!   rises by one (at most [`Settings::max_homes`] and the live pods), remembering the rate at
//!   which it rose. The next request goes to the best non-home deliberately, which warms it.
//! - **Slack.** While the rate is below `lower x` the rate of the last rise for `sustain`
//!   consecutive requests, the wanted number falls by one and the newest home is released
//!   (hysteresis: a prefix does not flap between one and two homes at one load).
//! - **Routing.** A hot prefix's requests go to the best of its homes (its other holders are
//!   not used, so their copies age out); a prefix that is not hot is not constrained.
//!
//! State is bounded: at most [`Settings::max_tracked`] prefixes; when full, the coldest half
//! is dropped at once (amortised O(1) per request), each entry a fixed size.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use smallvec::SmallVec;

use crate::kv_index::RouterKey;

/// Homes a prefix can have (inline; [`Settings::max_homes`] is capped to it).
pub const MAX_HOMES: usize = 8;

/// The replication settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Time constant of the demand rate.
    pub tau: Duration,
    /// Requests per second (decayed) from which a prefix is hot.
    pub min_rate: f64,
    /// Consecutive requests a condition must hold for before homes change.
    pub sustain: u32,
    /// Homes are released below this fraction of the rate at which the last was added.
    pub lower: f64,
    pub max_homes: usize,
    /// Shortest prefix tracked, in blocks.
    pub min_blocks: usize,
    pub max_tracked: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            // A few seconds: a burst of a dozen requests is demand, one request a minute is not.
            tau: Duration::from_secs(4),
            min_rate: 2.0,
            sustain: 4,
            lower: 0.5,
            max_homes: 4,
            // 4 blocks (64 tokens at 16 per block): shorter prefixes cost little to recompute.
            min_blocks: 4,
            max_tracked: 4096,
        }
    }
}

/// One live pod as replication sees it for this request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pod {
    /// The pod's stable name (its address hashed: [`super::Candidate::affinity`]).
    pub affinity: u64,
    /// It holds the tracked prefix (by the signal the candidate is scored by).
    pub holds: bool,
    /// The cost model's predicted TTFT for this request there, seconds.
    pub predicted: f64,
}

/// What replication asks of this request's routing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Advice {
    /// Send it here first: a new home, to be warmed.
    pub warm: Option<u64>,
    /// The prefix is hot: only these pods (affinities) should serve it. Empty: no constraint.
    pub homes: SmallVec<[u64; MAX_HOMES]>,
}

#[derive(Debug, Clone)]
struct Entry {
    rate: f64,
    at: Instant,
    homes: SmallVec<[u64; MAX_HOMES]>,
    /// Rates at which each home beyond the first was added.
    raised_at: SmallVec<[f64; MAX_HOMES]>,
    pressure: u32,
    slack: u32,
    /// The home added last and when, until it is seen holding the prefix: its copy is still
    /// being written (the warming request in flight, the engine's events not yet seen), so it
    /// is not dropped for not holding it within [`Settings::tau`].
    warming: Option<(u64, Instant)>,
}

/// The tracked prefixes of one pool.
#[derive(Debug)]
pub struct Replication {
    settings: Settings,
    entries: HashMap<RouterKey, Entry, foldhash::fast::RandomState>,
    /// Decayed rate of every tracked request, and when it was last updated.
    pool_rate: f64,
    pool_at: Option<Instant>,
}

impl Default for Replication {
    fn default() -> Self {
        Self::new(Settings::default())
    }
}

// === impl Replication ===

impl Replication {
    pub fn new(mut settings: Settings) -> Self {
        settings.max_homes = settings.max_homes.clamp(1, MAX_HOMES);
        settings.max_tracked = settings.max_tracked.max(2);
        Self {
            settings,
            entries: HashMap::default(),
            pool_rate: 0.0,
            pool_at: None,
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The prefix key of a request whose longest held prefix is `available` blocks of
    /// `keys`, if it is long enough to track.
    pub fn key(&self, keys: &[RouterKey], available: usize) -> Option<RouterKey> {
        let depth = available.min(keys.len());
        (depth >= self.settings.min_blocks).then(|| keys[depth - 1])
    }

    pub fn tracked(&self) -> usize {
        self.entries.len()
    }

    /// The homes a prefix has now (tests, status).
    pub fn homes(&self, key: RouterKey) -> usize {
        self.entries.get(&key).map_or(0, |e| e.homes.len())
    }

    /// One request of prefix `key` at `now`, with the live pods: updates demand and homes and
    /// says how to route it.
    pub fn observe(&mut self, key: RouterKey, now: Instant, pods: &[Pod]) -> Advice {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.settings.max_tracked {
            self.shrink(now);
        }
        let s = self.settings;
        let tau = s.tau.as_secs_f64().max(1e-3);
        let pool_at = self.pool_at.unwrap_or(now);
        self.pool_rate = decayed(self.pool_rate, pool_at, now, tau) + 1.0 / tau;
        self.pool_at = Some(now.max(pool_at));
        let pool_rate = self.pool_rate;
        let e = self.entries.entry(key).or_insert_with(|| Entry {
            rate: 0.0,
            at: now,
            homes: SmallVec::new(),
            raised_at: SmallVec::new(),
            pressure: 0,
            slack: 0,
            warming: None,
        });
        e.rate = decayed(e.rate, e.at, now, tau) + 1.0 / tau;
        e.at = now.max(e.at);
        // Homes that left or no longer hold the prefix are gone; the one being warmed is
        // given `tau` to show that it holds it.
        if let Some((w, since)) = e.warming {
            let holds = pods.iter().any(|p| p.affinity == w && p.holds);
            if holds || now.saturating_duration_since(since) >= s.tau {
                e.warming = None;
            }
        }
        let warming = e.warming.map(|(w, _)| w);
        e.homes.retain(|h| {
            pods.iter()
                .any(|p| p.affinity == *h && (p.holds || warming == Some(*h)))
        });
        let best = |only_homes: bool, e: &Entry| {
            pods.iter()
                .filter(|p| e.homes.contains(&p.affinity) == only_homes)
                .filter(|p| !only_homes || p.holds)
                .min_by(|a, b| a.predicted.total_cmp(&b.predicted))
                .copied()
        };
        if e.homes.is_empty() {
            let first = pods
                .iter()
                .filter(|p| p.holds)
                .min_by(|a, b| a.predicted.total_cmp(&b.predicted));
            let Some(first) = first else {
                return Advice::default();
            };
            e.homes.push(first.affinity);
        }
        // A lost home is a rise undone: pressure must build again to replace it.
        e.raised_at.truncate(e.homes.len() - 1);
        let hot = e.rate >= s.min_rate && e.rate * pods.len() as f64 >= pool_rate;
        let wanted = e.raised_at.len() + 1;
        let under = match (best(true, e), best(false, e)) {
            (Some(home), Some(other)) => home.predicted > other.predicted,
            _ => false,
        };
        let room = wanted < s.max_homes && wanted < pods.len();
        e.pressure = if hot && under && room {
            e.pressure + 1
        } else {
            0
        };
        let falling = e.raised_at.last().is_some_and(|&r| e.rate < r * s.lower);
        e.slack = if falling { e.slack + 1 } else { 0 };
        let mut advice = Advice::default();
        if e.pressure >= s.sustain {
            e.pressure = 0;
            e.raised_at.push(e.rate);
            if let Some(next) = best(false, e) {
                e.homes.push(next.affinity);
                e.warming = Some((next.affinity, now));
                advice.warm = Some(next.affinity);
            }
        } else if e.slack >= s.sustain {
            e.slack = 0;
            e.raised_at.pop();
        }
        while e.homes.len() > e.raised_at.len() + 1 {
            e.homes.pop();
        }
        if hot {
            advice.homes = e.homes.clone();
        }
        advice
    }

    /// Drops prefixes no longer hot, then, if still over three quarters full, the coldest
    /// half.
    fn shrink(&mut self, now: Instant) {
        let tau = self.settings.tau.as_secs_f64().max(1e-3);
        let floor = self.settings.min_rate / 8.0;
        self.entries
            .retain(|_, e| decayed(e.rate, e.at, now, tau) >= floor);
        if self.entries.len() * 4 < self.settings.max_tracked * 3 {
            return;
        }
        let mut rates: Vec<f64> = self
            .entries
            .values()
            .map(|e| decayed(e.rate, e.at, now, tau))
            .collect();
        let mid = rates.len() / 2;
        let (_, median, _) = rates.select_nth_unstable_by(mid, f64::total_cmp);
        let median = *median;
        self.entries
            .retain(|_, e| decayed(e.rate, e.at, now, tau) > median);
    }
}

fn decayed(rate: f64, at: Instant, now: Instant, tau: f64) -> f64 {
    rate * (-now.saturating_duration_since(at).as_secs_f64() / tau).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: RouterKey = RouterKey(7);

    /// Three pods; pod 0 holds the prefix. Its predicted TTFT grows with the demand the
    /// caller says it carries; the others would prefill the prefix cold in `cold` seconds.
    fn pods(home_ttft: f64, cold: f64, holders: &[u64]) -> Vec<Pod> {
        (0..3)
            .map(|i| Pod {
                affinity: i,
                holds: holders.contains(&i),
                predicted: if i == 0 {
                    home_ttft
                } else {
                    cold + i as f64 * 0.001
                },
            })
            .collect()
    }

    /// `n` requests `gap` apart from `start`; the last advice.
    fn run(
        r: &mut Replication,
        start: Instant,
        n: u32,
        gap: Duration,
        view: impl Fn(&Replication) -> Vec<Pod>,
    ) -> (Advice, Instant) {
        let mut advice = Advice::default();
        let mut now = start;
        for _ in 0..n {
            now += gap;
            let p = view(r);
            advice = r.observe(KEY, now, &p);
        }
        (advice, now)
    }

    #[test]
    fn a_hot_prefix_gains_a_second_home_when_demand_rises_and_loses_it_when_it_falls() {
        let mut r = Replication::default();
        let t0 = Instant::now();
        // 10 requests/s: hot (rate -> 10/s); the home is busier (0.5 s) than a cold prefill
        // elsewhere (0.2 s).
        let mut warmed = None;
        let mut now = t0;
        for _ in 0..40 {
            now += Duration::from_millis(100);
            let holders: Vec<u64> = std::iter::once(0).chain(warmed).collect();
            let a = r.observe(KEY, now, &pods(0.5, 0.2, &holders));
            if let Some(w) = a.warm {
                assert!(
                    warmed.is_none(),
                    "one home added at a time under sustained load"
                );
                warmed = Some(w);
                break;
            }
        }
        assert_eq!(warmed, Some(1), "the best other pod is warmed");
        assert_eq!(r.homes(KEY), 2);
        // Served by both homes now: the home is no longer worse than a cold prefill.
        let (a, now) = run(&mut r, now, 20, Duration::from_millis(100), |_| {
            pods(0.1, 0.2, &[0, 1])
        });
        assert_eq!((a.warm, a.homes.as_slice()), (None, &[0u64, 1][..]));
        // Demand falls to 1 request per 2 s: below half the rate at which the home was added.
        let (a, _) = run(&mut r, now, 10, Duration::from_secs(2), |_| {
            pods(0.1, 0.2, &[0, 1])
        });
        assert_eq!(r.homes(KEY), 1, "released");
        assert!(a.homes.is_empty(), "no longer hot: unconstrained");
    }

    #[test]
    fn a_cold_prefix_never_gains_a_home_and_a_lukewarm_one_keeps_one() {
        let mut r = Replication::default();
        let t0 = Instant::now();
        // Nobody holds it: not tracked, no advice, however busy.
        let (a, _) = run(&mut r, t0, 100, Duration::from_millis(10), |_| {
            pods(5.0, 0.1, &[])
        });
        assert_eq!(a, Advice::default());
        assert_eq!(r.homes(KEY), 0);
        // Held, and its home is slower than elsewhere, but demand is 1 request/s (< 2/s).
        let (a, _) = run(&mut r, t0, 100, Duration::from_secs(1), |_| {
            pods(5.0, 0.1, &[0])
        });
        assert_eq!((a.warm, r.homes(KEY)), (None, 1));
        // Hot, but its home serves it sooner than a cold prefill: no second home.
        let (a, _) = run(&mut r, t0, 100, Duration::from_millis(50), |_| {
            pods(0.05, 0.1, &[0])
        });
        assert_eq!((a.warm, a.homes.as_slice()), (None, &[0u64][..]));
    }

    #[test]
    fn many_equally_popular_prefixes_are_none_of_them_hot() {
        let mut r = Replication::default();
        let mut now = Instant::now();
        // Eight prefixes over three pods at 5 requests/s each (40/s in all): each has an
        // eighth of the pool's demand, less than a pod's third.
        for i in 0..800u64 {
            now += Duration::from_millis(25);
            let a = r.observe(RouterKey(i % 8), now, &pods(5.0, 0.1, &[0]));
            assert_eq!(a, Advice::default(), "request {i}");
        }
        assert!((0..8).all(|k| r.homes(RouterKey(k)) == 1));
    }

    #[test]
    fn homes_are_capped_and_an_evicted_home_is_dropped() {
        let mut r = Replication::new(Settings {
            max_homes: 2,
            ..Settings::default()
        });
        let t0 = Instant::now();
        // Every pod holding the prefix is slower than a cold prefill elsewhere, forever: at
        // most two homes.
        let (_, now) = run(&mut r, t0, 200, Duration::from_millis(20), |r| {
            let homes = r.homes(KEY) as u64;
            (0..3)
                .map(|i| Pod {
                    affinity: i,
                    holds: i < homes.max(1),
                    predicted: if i < homes.max(1) { 1.0 } else { 0.1 },
                })
                .collect()
        });
        assert_eq!(r.homes(KEY), 2);
        // Pod 1's copy was evicted: it is no longer a home.
        let a = r.observe(KEY, now + Duration::from_millis(20), &pods(0.05, 0.1, &[0]));
        assert_eq!(a.homes.as_slice(), [0]);
    }

    #[test]
    fn a_home_being_warmed_is_kept_until_its_copy_shows_or_tau_passes() {
        let mut r = Replication::default();
        let mut now = Instant::now();
        // Hot and the home slower than a cold prefill: a second home is warmed...
        let mut warmed = None;
        for _ in 0..40 {
            now += Duration::from_millis(100);
            if let Some(w) = r.observe(KEY, now, &pods(0.5, 0.2, &[0])).warm {
                warmed = Some(w);
                break;
            }
        }
        assert_eq!(warmed, Some(1));
        // ... whose copy the index does not show yet: for the next 3 s it stays a home.
        let (a, now) = run(&mut r, now, 30, Duration::from_millis(100), |_| {
            pods(0.1, 0.2, &[0])
        });
        assert_eq!(a.homes.as_slice(), [0, 1], "kept while warming");
        // Still not holding it 4 s (tau) after it was warmed: dropped.
        let (a, _) = run(&mut r, now, 11, Duration::from_millis(100), |_| {
            pods(0.1, 0.2, &[0])
        });
        assert_eq!(
            a.homes.as_slice(),
            [0],
            "a warm-up that never showed is dropped"
        );
    }

    #[test]
    fn memory_is_bounded_by_max_tracked() {
        let mut r = Replication::new(Settings {
            max_tracked: 64,
            ..Settings::default()
        });
        let mut now = Instant::now();
        for i in 0..10_000u64 {
            now += Duration::from_millis(1);
            r.observe(RouterKey(i), now, &pods(0.1, 0.1, &[0]));
            assert!(r.tracked() <= 64);
        }
        // Too short a prefix is not a key.
        let keys: Vec<RouterKey> = (1..=10).map(RouterKey).collect();
        assert_eq!(r.key(&keys, 3), None);
        assert_eq!(r.key(&keys, 6), Some(RouterKey(6)));
        assert_eq!(r.key(&keys, 99), Some(RouterKey(10)));
    }
}
