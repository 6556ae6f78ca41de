//! When sessions start: Poisson arrivals at a rate, a ladder of rates (each held for a step),
//! or a closed loop (a fixed number of sessions in flight). Trace sessions keep their own
//! timestamps.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use super::plan::Session;

/// Arrival parameters (flags, or the `arrivals:` section of a YAML file).
#[derive(Debug, Clone, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ArrivalArgs {
    /// Poisson arrivals: sessions per second (requests per second for single-turn workloads).
    #[arg(long, default_value_t = 4.0)]
    pub rate: f64,
    /// A rate ladder instead: comma-separated rates, each held for --step-seconds.
    #[arg(long, value_delimiter = ',')]
    pub ladder: Vec<f64>,
    #[arg(long, default_value_t = 20.0)]
    pub step_seconds: f64,
    /// Closed loop instead: keep this many sessions in flight.
    #[arg(long)]
    pub concurrency: Option<usize>,
}

impl Default for ArrivalArgs {
    fn default() -> Self {
        Self {
            rate: 4.0,
            ladder: Vec::new(),
            step_seconds: 20.0,
            concurrency: None,
        }
    }
}

/// How the runner starts sessions.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// Start each session at its time; `(start, ladder step)` per session, in session order.
    Open(Vec<(Duration, usize)>),
    /// Keep `n` sessions running, in session order.
    Closed(usize),
}

impl ArrivalArgs {
    /// (offered rate, seconds) per ladder step; one step without a ladder.
    pub fn steps(&self) -> Vec<(f64, f64)> {
        if self.ladder.is_empty() {
            Vec::new()
        } else {
            self.ladder
                .iter()
                .map(|&r| (r, self.step_seconds))
                .collect()
        }
    }

    /// The schedule for `sessions`, seeded.
    pub fn schedule(&self, sessions: &[Session], seed: u64) -> Result<Schedule, String> {
        if sessions.iter().all(|s| s.at.is_some()) && !sessions.is_empty() {
            return Ok(Schedule::Open(
                sessions
                    .iter()
                    .map(|s| (s.at.unwrap_or_default(), 0))
                    .collect(),
            ));
        }
        if let Some(n) = self.concurrency {
            if n == 0 {
                return Err("--concurrency must be at least 1".into());
            }
            return Ok(Schedule::Closed(n));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xa77);
        let gap = |rng: &mut ChaCha8Rng, rate: f64| {
            Duration::from_secs_f64(-(1.0 - rng.random::<f64>()).ln() / rate)
        };
        let positive = |r: f64| r.is_finite() && r > 0.0;
        if self.ladder.is_empty() {
            if !positive(self.rate) {
                return Err(format!("--rate {}: must be > 0", self.rate));
            }
            let mut at = Duration::ZERO;
            return Ok(Schedule::Open(
                sessions
                    .iter()
                    .map(|_| {
                        at += gap(&mut rng, self.rate);
                        (at, 0)
                    })
                    .collect(),
            ));
        }
        if !self.ladder.iter().all(|&r| positive(r)) || !positive(self.step_seconds) {
            return Err("--ladder rates and --step-seconds must be > 0".into());
        }
        let mut out = Vec::with_capacity(sessions.len());
        for (step, &rate) in self.ladder.iter().enumerate() {
            let begin = Duration::from_secs_f64(step as f64 * self.step_seconds);
            let end = begin + Duration::from_secs_f64(self.step_seconds);
            let mut at = begin + gap(&mut rng, rate);
            while at < end {
                if out.len() == sessions.len() {
                    let needed: f64 = self.ladder.iter().map(|r| r * self.step_seconds).sum();
                    return Err(format!(
                        "the ladder offers about {needed:.0} sessions but the workload has {}: raise --groups/--users/--rounds or --sessions",
                        sessions.len()
                    ));
                }
                out.push((at, step));
                at += gap(&mut rng, rate);
            }
        }
        Ok(Schedule::Open(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::plan::Turn;

    fn sessions(n: usize) -> Vec<Session> {
        (0..n)
            .map(|_| Session {
                turns: vec![Turn {
                    text: "x".into(),
                    append: false,
                    max_tokens: 1,
                    think: Duration::ZERO,
                }],
                at: None,
            })
            .collect()
    }

    #[test]
    fn poisson_rate_and_ladder_steps() {
        let a = ArrivalArgs {
            rate: 10.0,
            ..ArrivalArgs::default()
        };
        let Schedule::Open(times) = a.schedule(&sessions(2000), 1).unwrap() else {
            panic!()
        };
        let rate = times.len() as f64 / times.last().unwrap().0.as_secs_f64();
        assert!((9.5..10.5).contains(&rate), "{rate}");
        assert_eq!(
            a.schedule(&sessions(20), 1).unwrap(),
            a.schedule(&sessions(20), 1).unwrap()
        );
        let ladder = ArrivalArgs {
            ladder: vec![5.0, 20.0],
            step_seconds: 50.0,
            ..ArrivalArgs::default()
        };
        let Schedule::Open(times) = ladder.schedule(&sessions(2000), 1).unwrap() else {
            panic!()
        };
        let per_step = |s: usize| times.iter().filter(|t| t.1 == s).count() as f64 / 50.0;
        assert!((4.0..6.0).contains(&per_step(0)), "{}", per_step(0));
        assert!((18.0..22.0).contains(&per_step(1)), "{}", per_step(1));
        assert!(
            times
                .iter()
                .all(|(t, s)| t.as_secs_f64() >= *s as f64 * 50.0)
        );
        let e = ladder.schedule(&sessions(100), 1).unwrap_err();
        assert!(e.contains("ladder offers about 1250"), "{e}");
    }

    #[test]
    fn closed_loop_and_trace_times() {
        let c = ArrivalArgs {
            concurrency: Some(8),
            ..ArrivalArgs::default()
        };
        assert_eq!(c.schedule(&sessions(3), 1).unwrap(), Schedule::Closed(8));
        let mut traced = sessions(2);
        traced[0].at = Some(Duration::from_secs(3));
        traced[1].at = Some(Duration::from_secs(1));
        assert_eq!(
            c.schedule(&traced, 1).unwrap(),
            Schedule::Open(vec![
                (Duration::from_secs(3), 0),
                (Duration::from_secs(1), 0)
            ])
        );
        assert!(
            ArrivalArgs {
                rate: 0.0,
                ..ArrivalArgs::default()
            }
            .schedule(&sessions(1), 1)
            .is_err()
        );
    }
}
