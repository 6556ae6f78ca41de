//! How far a verdict's TTFT ratio would move on another draw of the same cell: a 95 %
//! interval by a paired cluster bootstrap over the cell's chains.
//!
//! A cell's rows serve the same plans (one per run), so every request of one row has its
//! twin in every other: the same chain (a chat session, an agent loop, a RAG user) and turn.
//! One resample draws, in each run, as many chains as the run has, with replacement, and
//! takes the same chains' answers from every row; each row's quantile is then read off its
//! resampled answers ([`quantile`]: the rank rule of the table's), and a ratio against the
//! best of the reference rows is taken within the resample, as the verdict takes it on the
//! pooled answers. The 2.5th and 97.5th percentiles of [`RESAMPLES`] such ratios are the
//! interval.
//!
//! - **Why chains, not requests.** A chain's turns wait on one another and share a cache, so
//!   they are not independent draws; the chain is the unit the plan draws. Every matrix
//!   workload names each request's chain (a RAG user and a control request are chains of
//!   one); an answer without one is keyed by its place in the order its row sent, so it
//!   pairs with the answer sent in that place by every other row.
//! - **What it leaves out.** Requests of different chains still share the fleet's queues at
//!   the same moments, which the resample treats as independent: the interval is, if
//!   anything, too narrow. The best reference is taken in each resample, as the pooled
//!   verdict takes it; where two references nearly tie, the lower of two noisy figures
//!   leans low, which widens the interval upward. A p99 of a few hundred answers is one of
//!   the slowest few, and no resample's can exceed the slowest answer: its interval is the
//!   roughest of the three. The table's figures are read from a histogram at three
//!   significant figures and the resamples' from the exact answers, so a ratio within about
//!   0.1 % of an interval's edge may print just outside it. It is a reading aid beside the
//!   run-by-run ratios, not a test; the verdict stays the pooled figure's.
//! - **Deterministic.** The resamples come from a seeded generator, so the same answers give
//!   the same interval.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::run::report::Sample;

/// One run's answered TTFTs of a row by chain, in modelled seconds.
pub type RunAnswers = BTreeMap<usize, Vec<f64>>;

/// Resamples an interval is read from.
pub const RESAMPLES: usize = 1_000;

/// The quantiles the verdicts judge, in the order [`Bootstrap::interval`] indexes them.
pub const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// One run's answers of a row by chain (`scale`: wall seconds per modelled second). An
/// answer without a chain is a chain of its own, keyed from the top of the key space down by
/// its place in the order sent (the same place in another row is the same key).
pub fn answers(samples: &[Sample], scale: f64) -> RunAnswers {
    let mut order: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    order.sort_by(|a, b| a.start.total_cmp(&b.start));
    let mut out = RunAnswers::new();
    for (i, s) in order.into_iter().enumerate() {
        let chain = s.session.unwrap_or(usize::MAX - i);
        out.entry(chain).or_default().push(s.ttft / scale);
    }
    out
}

/// The `q` quantile of `values` by the table's rank rule: the value of rank `ceil(q x n)`
/// (the smallest for q = 0). `None` without values. Reorders `values`.
pub fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    let (_, v, _) = values.select_nth_unstable_by(rank - 1, f64::total_cmp);
    Some(*v)
}

/// Every row's quantiles in every resample of one cell.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    /// Each row's name and, per resample, its [`QUANTILES`] (NaN where it had no answer).
    rows: Vec<(String, Vec<[f64; 3]>)>,
}

impl Bootstrap {
    /// Resamples `rows` (name, each run's answers). `None` unless every row has the same
    /// number of runs, at least one, and some answer.
    pub fn of(rows: &[(&str, &[RunAnswers])], seed: u64) -> Option<Self> {
        let runs = rows.first()?.1.len();
        if runs == 0 || rows.iter().any(|(_, r)| r.len() != runs) {
            return None;
        }
        // Each run's chains: every chain any row answered in it (the plan's).
        let chains: Vec<Vec<usize>> = (0..runs)
            .map(|r| {
                let mut ids: Vec<usize> = rows
                    .iter()
                    .flat_map(|(_, answers)| answers[r].keys().copied())
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                ids
            })
            .collect();
        if chains.iter().all(Vec::is_empty) {
            return None;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out: Vec<(String, Vec<[f64; 3]>)> = rows
            .iter()
            .map(|(name, _)| ((*name).to_string(), Vec::with_capacity(RESAMPLES)))
            .collect();
        let mut drawn: Vec<(usize, usize)> = Vec::new();
        let mut values: Vec<f64> = Vec::new();
        for _ in 0..RESAMPLES {
            drawn.clear();
            for (r, ids) in chains.iter().enumerate() {
                for _ in 0..ids.len() {
                    drawn.push((r, ids[rng.random_range(0..ids.len())]));
                }
            }
            for ((_, answers), (_, quantiles)) in rows.iter().zip(out.iter_mut()) {
                values.clear();
                for &(r, chain) in &drawn {
                    if let Some(ttfts) = answers[r].get(&chain) {
                        values.extend_from_slice(ttfts);
                    }
                }
                quantiles.push(QUANTILES.map(|q| quantile(&mut values, q).unwrap_or(f64::NAN)));
            }
        }
        Some(Self { rows: out })
    }

    /// The 95 % interval of `me`'s [`QUANTILES`]`[q]` over the lowest of `refs`' in the same
    /// resample. `None` for a row not resampled, or when no resample had both figures.
    pub fn interval(&self, me: &str, refs: &[&str], q: usize) -> Option<(f64, f64)> {
        let mine = &self.rows.iter().find(|(n, _)| n == me)?.1;
        let theirs: Vec<&Vec<[f64; 3]>> = refs
            .iter()
            .filter_map(|r| self.rows.iter().find(|(n, _)| n == r).map(|(_, v)| v))
            .collect();
        if theirs.is_empty() {
            return None;
        }
        let mut ratios: Vec<f64> = (0..mine.len())
            .filter_map(|b| {
                let best = theirs
                    .iter()
                    .map(|t| t[b][q])
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .reduce(f64::min)?;
                let r = mine[b][q] / best;
                r.is_finite().then_some(r)
            })
            .collect();
        let lo = quantile(&mut ratios, 0.025)?;
        let hi = quantile(&mut ratios, 0.975)?;
        Some((lo, hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One run of `chains`, each a list of TTFTs.
    fn run(chains: &[&[f64]]) -> RunAnswers {
        chains
            .iter()
            .enumerate()
            .map(|(i, t)| (i, t.to_vec()))
            .collect()
    }

    #[test]
    fn the_rank_rule_is_the_tables() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        // ceil(0.5 x 5) = 3rd smallest; ceil(0.9 x 5) = 5th; q = 0 is the smallest.
        assert_eq!(quantile(&mut v, 0.5), Some(3.0));
        assert_eq!(quantile(&mut v, 0.9), Some(5.0));
        assert_eq!(quantile(&mut v, 0.0), Some(1.0));
        assert_eq!(quantile(&mut [], 0.5), None);
    }

    #[test]
    fn twin_rows_resample_to_exactly_their_ratio() {
        // The same draws from both rows: identical answers are 1.0x in every resample, and
        // answers twice as slow request by request are 2.0x in every resample.
        let a = [
            run(&[&[0.1, 0.2], &[0.3], &[0.5, 0.05, 0.4]]),
            run(&[&[0.7], &[0.2, 0.2]]),
        ];
        let slow: Vec<RunAnswers> = a
            .iter()
            .map(|r| {
                r.iter()
                    .map(|(k, v)| (*k, v.iter().map(|t| t * 2.0).collect()))
                    .collect()
            })
            .collect();
        let b = Bootstrap::of(&[("me", &a), ("twin", &a), ("slow", &slow)], 1).unwrap();
        for q in 0..3 {
            assert_eq!(b.interval("me", &["twin"], q), Some((1.0, 1.0)));
            assert_eq!(b.interval("slow", &["me"], q), Some((2.0, 2.0)));
            // Against the best of two references, the faster one sets the ratio.
            assert_eq!(b.interval("me", &["slow", "twin"], q), Some((1.0, 1.0)));
        }
    }

    #[test]
    fn a_median_two_chains_decide_spans_both() {
        // Two chains, one answered in 1 s and one in 3 s, against a reference of 1 s each.
        // A resample draws two chains: its median (rank ceil(0.5 x 2) = 1, the faster) is 3 s
        // only when both draws are the slow chain, a quarter of the resamples; so the 2.5th
        // percentile of the ratio is 1.0x and the 97.5th is 3.0x.
        let me = [run(&[&[1.0], &[3.0]])];
        let reference = [run(&[&[1.0], &[1.0]])];
        let b = Bootstrap::of(&[("me", &me), ("ref", &reference)], 7).unwrap();
        assert_eq!(b.interval("me", &["ref"], 0), Some((1.0, 3.0)));
    }

    #[test]
    fn the_best_reference_is_taken_in_each_resample() {
        // Medians (rank 1 of 2: the faster chain's). Reference A answers its chains in 1 s
        // and 4 s: its median is 4 s only when a resample draws the slow chain twice (a
        // quarter of them), else 1 s. Reference B's is always 2 s. So the best reference is
        // 1 s in three resamples of four and 2 s in the fourth, and against `me` (1 s) the
        // ratio is 1.0x or 0.5x: the interval spans 0.50-1.00x. Against A's pooled median
        // (1 s, the pooled winner) it would have been 1.00x in every resample.
        let me = [run(&[&[1.0], &[1.0]])];
        let a = [run(&[&[1.0], &[4.0]])];
        let b = [run(&[&[2.0], &[2.0]])];
        let boot = Bootstrap::of(&[("me", &me), ("a", &a), ("b", &b)], 3).unwrap();
        assert_eq!(boot.interval("me", &["a", "b"], 0), Some((0.5, 1.0)));
    }

    #[test]
    fn rows_of_different_runs_or_no_answers_have_no_interval() {
        let one = [run(&[&[1.0]])];
        let two = [run(&[&[1.0]]), run(&[&[1.0]])];
        assert!(Bootstrap::of(&[("a", &one), ("b", &two)], 1).is_none());
        let none = [RunAnswers::new()];
        assert!(Bootstrap::of(&[("a", &none), ("b", &none)], 1).is_none());
        let b = Bootstrap::of(&[("a", &one), ("b", &one)], 1).unwrap();
        assert_eq!(b.interval("a", &["missing"], 1), None);
        assert_eq!(b.interval("missing", &["b"], 1), None);
    }

    #[test]
    fn answers_pair_by_chain_and_unchained_ones_by_the_order_sent() {
        let sample = |start: f64, ttft: f64, session: Option<usize>, ok: bool| Sample {
            tenant: String::new(),
            step: 0,
            ok,
            start,
            ttft,
            e2e: ttft,
            itl: Vec::new(),
            prompt_tokens: 1,
            cached_tokens: 0,
            output_tokens: 1,
            available_tokens: None,
            captured_tokens: None,
            predicted_ttft_ms: None,
            pod: None,
            held_ms: None,
            session,
        };
        let a = answers(
            &[
                sample(0.2, 0.4, Some(3), true),
                sample(0.1, 0.2, Some(3), true),
                sample(0.3, 0.6, None, true),
                sample(0.4, 9.0, Some(4), false),
            ],
            2.0,
        );
        // Modelled seconds (2 wall seconds per modelled one); chain 3's turns in the order sent;
        // the failed answer is not one.
        assert_eq!(a.get(&3), Some(&vec![0.1, 0.2]));
        assert_eq!(a.get(&(usize::MAX - 2)), Some(&vec![0.3]));
        assert_eq!(a.len(), 2);
    }
}
