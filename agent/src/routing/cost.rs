//! The time-to-first-token model: what a request would wait on each pod, in seconds, and how
//! a pod's coefficients are learnt online from what it answered.
//!
//! ```text
//! ttft(pod) = (queued_uncached_tokens(pod) + uncached_tokens(pod, request)) x secs_per_token(pod)
//!           + running(pod) x secs_per_running(pod)
//!           + base(pod)
//! ```
//!
//! The first term is prefill: an engine computes only the prompt tokens it does not hold, after
//! the uncached prompts already waiting there (less what it has most likely done of the one at
//! their head: [`crate::pool`]'s `prefill`). The second is the batch the prefill joins:
//! chunked prefill shares each step with the running requests' decode steps, so every one of
//! them lengthens the steps this prompt's prefill needs. The third is everything else (the
//! network, the scheduler, the first decode step). The harm the prefill does to that batch
//! — each running request waits for its `uncached_tokens x secs_per_token` too — is not part
//! of this request's TTFT; the router charges it separately ([`super::scorers::Stall`]).
//!
//! The three coefficients are fitted per pod by exponentially forgotten least squares
//! ([`Fit`]): each answered stream contributes its features at decision (work tokens ahead,
//! requests running) and its measured TTFT. A ridge prior ([`Timing::PRIOR`], worth
//! [`PRIOR_WEIGHT`] observations) keeps the fit sane before the first observation and when the
//! features do not vary; an observation further than [`OUTLIER_RATIO`] from the prediction is
//! clamped to that ratio, so one stalled request moves the fit a bounded step; coefficients are
//! clamped to physical ranges. Nothing here reads a simulator or hardware constant: the prior is
//! deliberately rough (a mid-size model on one modern GPU) and is forgotten after a few dozen
//! answers.

/// A pod's coefficients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Prefill time per uncached prompt token (1 / prefill throughput).
    pub secs_per_token: f64,
    /// Added to a prefill's TTFT per request running in the batch it joins.
    pub secs_per_running: f64,
    /// Fixed part of every TTFT on this pod.
    pub base: f64,
}

impl Default for Timing {
    fn default() -> Self {
        Self::PRIOR
    }
}

impl Timing {
    /// Before any observation: 10k prompt tokens/s, 1 ms per running request, 20 ms fixed —
    /// within a factor of a few of an 8B model on one H100 under vLLM, and only a start.
    pub const PRIOR: Timing = Timing {
        secs_per_token: 1e-4,
        secs_per_running: 1e-3,
        base: 0.02,
    };

    /// Predicted TTFT of a request whose prefill comes after `work_tokens` (its own uncached
    /// tokens included) with `running` requests in the batch.
    pub fn predict(&self, work_tokens: f64, running: f64) -> f64 {
        work_tokens * self.secs_per_token + running * self.secs_per_running + self.base
    }

    fn clamped(self) -> Self {
        let c = |v: f64, (lo, hi): (f64, f64), fallback: f64| {
            if v.is_finite() {
                v.clamp(lo, hi)
            } else {
                fallback
            }
        };
        Self {
            secs_per_token: c(
                self.secs_per_token,
                PER_TOKEN_RANGE,
                Self::PRIOR.secs_per_token,
            ),
            secs_per_running: c(
                self.secs_per_running,
                PER_RUNNING_RANGE,
                Self::PRIOR.secs_per_running,
            ),
            base: c(self.base, BASE_RANGE, Self::PRIOR.base),
        }
    }
}

/// 1 M to 100 prompt tokens per second.
const PER_TOKEN_RANGE: (f64, f64) = (1e-6, 1e-2);
/// A running request never shortens a prefill; one second each is beyond any engine.
const PER_RUNNING_RANGE: (f64, f64) = (0.0, 1.0);
const BASE_RANGE: (f64, f64) = (0.0, 10.0);
/// Observations the prior is worth: small, so the first answers dominate.
pub const PRIOR_WEIGHT: f64 = 2.0;
/// Effective memory of the fit in observations (forgetting factor `1 - 1/N`): long enough to
/// average noise, short enough to follow a pod that slows down.
pub const MEMORY: f64 = 128.0;
/// A measured TTFT is clamped to `[predicted / R, predicted x R]` before it is fitted.
pub const OUTLIER_RATIO: f64 = 4.0;
/// Work tokens are fitted in thousands, so the three features have comparable scales.
const TOKEN_SCALE: f64 = 1000.0;

/// What a request looked like at decision, for the fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features {
    /// Uncached prefill tokens ahead of it there, its own included.
    pub work_tokens: f64,
    /// Requests in flight there.
    pub running: f64,
}

/// A pod's decayed least-squares fit of TTFT on (work, running, 1). Fixed size.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// Decayed sums of x xᵀ and x y, x = (work / 1000, running, 1).
    xx: [[f64; 3]; 3],
    xy: [f64; 3],
    observations: u64,
    timing: Timing,
}

impl Default for Fit {
    fn default() -> Self {
        Self {
            xx: [[0.0; 3]; 3],
            xy: [0.0; 3],
            observations: 0,
            timing: Timing::PRIOR,
        }
    }
}

// === impl Fit ===

impl Fit {
    /// The coefficients now.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// Folds in one answered request: its features at decision and its measured TTFT.
    pub fn observe(&mut self, f: Features, ttft: f64) {
        if !(ttft.is_finite() && f.work_tokens.is_finite() && f.running.is_finite()) {
            return;
        }
        let predicted = self.timing.predict(f.work_tokens, f.running).max(1e-6);
        let y = ttft.clamp(predicted / OUTLIER_RATIO, predicted * OUTLIER_RATIO);
        let x = [
            f.work_tokens.max(0.0) / TOKEN_SCALE,
            f.running.max(0.0),
            1.0,
        ];
        let keep = 1.0 - 1.0 / MEMORY;
        for (i, row) in self.xx.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = *v * keep + x[i] * x[j];
            }
            self.xy[i] = self.xy[i] * keep + x[i] * y;
        }
        self.observations += 1;
        self.timing = self.solve();
    }

    /// Ridge solution towards the prior: `(XX + wI) θ = XY + w θ0`.
    fn solve(&self) -> Timing {
        let p = Timing::PRIOR;
        let prior = [p.secs_per_token * TOKEN_SCALE, p.secs_per_running, p.base];
        let mut a = self.xx;
        let mut b = self.xy;
        for i in 0..3 {
            a[i][i] += PRIOR_WEIGHT;
            b[i] += PRIOR_WEIGHT * prior[i];
        }
        match solve3(a, b) {
            Some(t) => Timing {
                secs_per_token: t[0] / TOKEN_SCALE,
                secs_per_running: t[1],
                base: t[2],
            }
            .clamped(),
            None => self.timing,
        }
    }
}

/// Gaussian elimination with partial pivoting; `None` when singular.
fn solve3(mut a: [[f64; 3]; 3], mut b: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let top = a[col];
        for row in col + 1..3 {
            let f = a[row][col] / top[col];
            for (v, t) in a[row].iter_mut().zip(top).skip(col) {
                *v -= f * t;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let rest: f64 = (row + 1..3).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - rest) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod that prefills 20k tokens/s, adds 5 ms per running request and 10 ms fixed.
    fn truth(f: Features) -> f64 {
        f.work_tokens / 20_000.0 + f.running * 0.005 + 0.010
    }

    /// Work 0..4k tokens and 0..7 running, varied independently.
    fn features(i: u64) -> Features {
        Features {
            work_tokens: ((i * 7919) % 4000) as f64,
            running: ((i * 31) % 8) as f64,
        }
    }

    #[test]
    fn the_prior_predicts_before_any_observation() {
        let fit = Fit::default();
        // 1,000 tokens at 10k/s + 2 running x 1 ms + 20 ms.
        let t = fit.timing().predict(1000.0, 2.0);
        assert!((t - 0.122).abs() < 1e-12, "{t}");
    }

    #[test]
    fn converges_to_a_pods_coefficients_from_its_answers() {
        let mut fit = Fit::default();
        for i in 0..400 {
            let f = features(i);
            fit.observe(f, truth(f));
        }
        let t = fit.timing();
        assert!((t.secs_per_token - 5e-5).abs() < 2e-6, "{t:?}");
        assert!((t.secs_per_running - 0.005).abs() < 5e-4, "{t:?}");
        assert!((t.base - 0.010).abs() < 2e-3, "{t:?}");
        // 2,000 tokens ahead, 3 running: 0.1 + 0.015 + 0.01.
        assert!((t.predict(2000.0, 3.0) - 0.125).abs() < 0.005);
    }

    #[test]
    fn follows_a_pod_ten_times_slower_than_the_prior_and_outliers_move_it_a_bounded_step() {
        let mut fit = Fit::default();
        let slow = |f: Features| 10.0 * (f.work_tokens * 1e-4 + 0.02);
        for i in 0..300 {
            let f = features(i);
            fit.observe(f, slow(f));
        }
        let f = Features {
            work_tokens: 1000.0,
            running: 0.0,
        };
        let before = fit.timing().predict(f.work_tokens, f.running);
        assert!((before - 1.2).abs() < 0.1, "{before}");
        // One request that took an hour moves the prediction by a clamped observation only.
        fit.observe(f, 3600.0);
        let after = fit.timing().predict(f.work_tokens, f.running);
        assert!(after < before * 1.5, "{before} -> {after}");
    }

    #[test]
    fn nonsense_is_ignored_and_coefficients_stay_in_range() {
        let mut fit = Fit::default();
        fit.observe(
            Features {
                work_tokens: f64::NAN,
                running: 0.0,
            },
            0.1,
        );
        fit.observe(
            Features {
                work_tokens: 10.0,
                running: 0.0,
            },
            f64::INFINITY,
        );
        assert_eq!(fit.observations(), 0);
        // Constant features (no variation to separate terms) and negative TTFTs: the prior
        // and the ranges hold.
        for _ in 0..100 {
            fit.observe(
                Features {
                    work_tokens: 0.0,
                    running: 0.0,
                },
                -1.0,
            );
        }
        let t = fit.timing();
        assert!(t.secs_per_token >= PER_TOKEN_RANGE.0 && t.secs_per_running >= 0.0);
        assert!(t.base >= 0.0);
    }

    #[test]
    fn solve3_solves_and_refuses_singular_systems() {
        let x = solve3(
            [[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]],
            [3.0, 5.0, 5.0],
        );
        let x = x.expect("regular");
        for (v, want) in x.iter().zip([1.0, 1.0, 1.0]) {
            assert!((v - want).abs() < 1e-12);
        }
        assert_eq!(
            solve3(
                [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]],
                [1.0; 3]
            ),
            None
        );
    }
}
