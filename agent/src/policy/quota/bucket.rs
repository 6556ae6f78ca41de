//! The two clocks of a quota: a token bucket (what may be spent now) and an exponentially
//! weighted rate (what is asked for), both driven by `Instant`s passed in, so tests run on
//! simulated time.

use std::time::{Duration, Instant};

/// Time constant of the demand rates: about two seconds of history.
pub const DEMAND_TAU: Duration = Duration::from_secs(2);

/// A token bucket refilled continuously at `rate` per second up to `capacity` (rate x
/// burst). Its level may go below zero: debt (output tokens charged after the fact, a
/// prompt larger than estimated), repaid by the refill before the tenant is admitted again.
#[derive(Debug, Clone, Default)]
pub struct Bucket {
    level: f64,
    rate: f64,
    capacity: f64,
    /// When the level was last brought up to date; `None` until the bucket has a rate (it
    /// then starts full).
    at: Option<Instant>,
}

impl Bucket {
    /// Brings the level up to `now` at the current rate. Times earlier than the last one
    /// (callers on other threads) count as no time passed.
    pub fn advance(&mut self, now: Instant) {
        let Some(at) = self.at else { return };
        if now > at {
            let dt = (now - at).as_secs_f64();
            if self.level < self.capacity {
                self.level = (self.level + self.rate * dt).min(self.capacity);
            }
            self.at = Some(now);
        }
    }

    /// Sets the refill rate and burst (call [`Self::advance`] first). A bucket that had no
    /// rate starts full; a smaller capacity cuts the level down to it.
    pub fn set_rate(&mut self, rate: f64, burst: Duration, now: Instant) {
        self.rate = rate;
        self.capacity = rate * burst.as_secs_f64();
        if self.at.is_none() {
            self.level = self.capacity;
            self.at = Some(now);
        }
        self.level = self.level.min(self.capacity);
    }

    /// Forgets the bucket (its dimension has no limit any more): it starts full when it
    /// gets one again.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    pub fn is_set(&self) -> bool {
        self.at.is_some()
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn is_full(&self) -> bool {
        self.at.is_none() || self.level >= self.capacity
    }

    /// How long until the level reaches `need`; `None` when it already has. A `need` above
    /// the capacity waits for a full bucket instead (so a request larger than the burst is
    /// admitted once the bucket is full, into debt, rather than never).
    pub fn wait_for(&self, need: f64) -> Option<Duration> {
        let need = need.min(self.capacity);
        if self.level >= need {
            return None;
        }
        let secs = (need - self.level) / self.rate;
        Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
    }

    /// Spends `amount` (negative: a refund, up to the capacity).
    pub fn charge(&mut self, amount: f64) {
        self.level = (self.level - amount).min(self.capacity);
    }

    #[cfg(test)]
    pub fn level(&self) -> f64 {
        self.level
    }
}

/// An exponentially weighted rate of events per second with time constant [`DEMAND_TAU`]:
/// each amount adds `amount / tau`, and the value decays by `exp(-dt / tau)`; under a
/// steady rate it converges to that rate.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ewma {
    value: f64,
    at: Option<Instant>,
}

impl Ewma {
    pub fn add(&mut self, amount: f64, now: Instant) {
        self.value = (self.get(now) + amount / DEMAND_TAU.as_secs_f64()).max(0.0);
        self.at = Some(self.at.map_or(now, |at| at.max(now)));
    }

    /// The rate at `now`.
    pub fn get(&self, now: Instant) -> f64 {
        match self.at {
            Some(at) if now > at => {
                let dt = (now - at).as_secs_f64();
                self.value * (-dt / DEMAND_TAU.as_secs_f64()).exp()
            }
            _ => self.value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_starts_full_refills_continuously_and_caps() {
        let t0 = Instant::now();
        let mut b = Bucket::default();
        b.set_rate(10.0, Duration::from_secs(2), t0);
        assert_eq!(b.level(), 20.0);
        b.charge(25.0);
        assert_eq!(b.level(), -5.0, "debt");
        assert_eq!(b.wait_for(0.0), Some(Duration::from_millis(500)));
        b.advance(t0 + Duration::from_secs(1));
        assert_eq!(b.level(), 5.0);
        b.advance(t0 + Duration::from_millis(500));
        assert_eq!(b.level(), 5.0, "an earlier time changes nothing");
        b.advance(t0 + Duration::from_secs(60));
        assert_eq!(b.level(), 20.0);
        assert!(b.is_full());
        b.charge(-5.0);
        assert_eq!(b.level(), 20.0, "refunds stop at the capacity");
    }

    #[test]
    fn more_than_the_burst_waits_for_a_full_bucket() {
        let t0 = Instant::now();
        let mut b = Bucket::default();
        b.set_rate(100.0, Duration::from_secs(1), t0);
        assert_eq!(b.wait_for(500.0), None, "full: 500 > 100 may go into debt");
        b.charge(500.0);
        assert_eq!(b.wait_for(500.0), Some(Duration::from_secs(5)));
    }

    #[test]
    fn a_smaller_rate_cuts_the_level_to_the_new_capacity() {
        let t0 = Instant::now();
        let mut b = Bucket::default();
        b.set_rate(100.0, Duration::from_secs(1), t0);
        b.set_rate(10.0, Duration::from_secs(1), t0);
        assert_eq!(b.level(), 10.0);
    }

    #[test]
    fn the_rate_converges_to_a_steady_arrival_rate_and_decays() {
        let t0 = Instant::now();
        let mut r = Ewma::default();
        // 50 events per second for 20 s (10 tau).
        for i in 0..1000 {
            r.add(1.0, t0 + Duration::from_millis(20 * i));
        }
        let at = t0 + Duration::from_millis(20 * 999);
        assert!((r.get(at) - 50.0).abs() < 1.0, "{}", r.get(at));
        // Two time constants later: e^-2 of it.
        let later = r.get(at + 2 * DEMAND_TAU);
        assert!((later - r.get(at) * (-2.0f64).exp()).abs() < 1e-9);
    }
}
