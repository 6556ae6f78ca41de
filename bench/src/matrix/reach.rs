//! Whether any router measured in a cell answers fast enough for a TTFT limit set under the
//! best peer's figure (the 0.7x target): the rows' best, combined.
//!
//! Each row's answers are split into warm (at least half the prompt delivered from cache,
//! [`tail::classify`]'s hit) and cold (the rest). For a limit, three figures are taken over
//! every row of the cell that answered — warmpath's, the baselines', the peers':
//!
//! - the fewest cold answers, as a share of a row's answers (`c`);
//! - the highest share of a row's warm answers at or under the limit (`w`);
//! - the highest share of a row's cold answers at or under the limit (`k`).
//!
//! A router with no more cold answers than the best row, whose warm answers were as fast as
//! the fastest row's and whose cold ones as fast as the fastest row's, would put
//! `max((1 - c) x w + c x k, k)` of its answers within the limit (the larger end of the
//! line from `c` cold to all cold). Where that is under the quantile's share (90 % for a
//! p90), no row's cold share and no row's answer speeds, however combined, meet the
//! target: the measured rows' best is beyond it.
//!
//! This is not a floor ([`super::floor`] is one, from the plan): a router unlike every row
//! could have fewer cold answers, or faster ones. It says what the target asks for against
//! what every router in the run did on the same requests: a limit under every row's warm
//! answers (each an engine step shared with the batch) asks for answers faster than any
//! router gave a request whose prefix it held.

use serde::Serialize;

use super::tail::{Class, classify};
use crate::run::report::Sample;

/// One row's answered TTFTs (modelled seconds), warm and cold, each sorted ascending.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Split {
    warm: Vec<f64>,
    cold: Vec<f64>,
}

impl Split {
    /// Of one row's answers (`runs`: each run's samples and its wall seconds per modelled
    /// second); failed requests are not answers.
    pub fn of<'a>(runs: impl IntoIterator<Item = (&'a [Sample], f64)>) -> Self {
        let mut out = Self::default();
        for (samples, scale) in runs {
            for s in samples.iter().filter(|s| s.ok) {
                let to = if classify(s) == Class::Hit {
                    &mut out.warm
                } else {
                    &mut out.cold
                };
                to.push(s.ttft / scale);
            }
        }
        out.warm.sort_by(f64::total_cmp);
        out.cold.sort_by(f64::total_cmp);
        out
    }

    /// From TTFTs already split (tests' rows, built by hand).
    #[cfg(test)]
    pub fn new(mut warm: Vec<f64>, mut cold: Vec<f64>) -> Self {
        warm.sort_by(f64::total_cmp);
        cold.sort_by(f64::total_cmp);
        Self { warm, cold }
    }

    fn answers(&self) -> usize {
        self.warm.len() + self.cold.len()
    }
}

/// The rows' best, combined, for one limit (shares in 0..=1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Reach {
    /// The share of answers within the limit of the combined router (the module's formula).
    pub within: f64,
    /// The fewest cold answers of any row, as a share of its answers.
    pub fewest_cold: f64,
    /// The highest share of any row's warm answers within the limit.
    pub warm_within: f64,
    /// The highest share of any row's cold answers within the limit.
    pub cold_within: f64,
}

/// The share of `sorted` at or under `limit` (0 for none).
fn share_within(sorted: &[f64], limit: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.partition_point(|t| *t <= limit) as f64 / sorted.len() as f64
}

/// The rows' best, combined, within `limit` seconds (`None`: no row answered).
pub fn combined<'a>(rows: impl IntoIterator<Item = &'a Split>, limit: f64) -> Option<Reach> {
    let rows: Vec<&Split> = rows.into_iter().filter(|r| r.answers() > 0).collect();
    let fewest_cold = rows
        .iter()
        .map(|r| r.cold.len() as f64 / r.answers() as f64)
        .reduce(f64::min)?;
    let best = |part: fn(&Split) -> &[f64]| {
        rows.iter()
            .map(|r| share_within(part(r), limit))
            .fold(0.0, f64::max)
    };
    let warm_within = best(|r| &r.warm);
    let cold_within = best(|r| &r.cold);
    let mixed = (1.0 - fewest_cold) * warm_within + fewest_cold * cold_within;
    Some(Reach {
        within: mixed.max(cold_within),
        fewest_cold,
        warm_within,
        cold_within,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[f64]) -> Vec<f64> {
        v.iter().map(|x| x / 1e3).collect()
    }

    #[test]
    fn the_best_cold_share_and_the_fastest_answers_of_different_rows_combine() {
        // Row a: 2 cold of 10 (both 140 ms), warm 8 at 15..22 ms.
        let a = Split::new(
            ms(&[15., 16., 17., 18., 19., 20., 21., 22.]),
            ms(&[140., 150.]),
        );
        // Row b: 4 cold of 10, its 6 warm answers all at 10 ms, one cold at 12 ms.
        let b = Split::new(ms(&[10.; 6]), ms(&[12., 140., 145., 150.]));
        let r = combined([&a, &b], 0.0175).expect("rows answered");
        // Fewest cold: a's 2 of 10; fastest warm within 17.5 ms: b's 6 of 6; fastest cold:
        // b's 1 of 4. Combined: 0.8 x 1 + 0.2 x 0.25 = 0.85.
        assert_eq!(r.fewest_cold, 0.2);
        assert_eq!(r.warm_within, 1.0);
        assert_eq!(r.cold_within, 0.25);
        assert!((r.within - 0.85).abs() < 1e-12, "{r:?}");
    }

    #[test]
    fn cold_answers_faster_than_warm_ones_take_the_all_cold_end() {
        // Warm answers slow (50 ms), cold ones fast (5 ms): every answer cold would do best.
        let a = Split::new(ms(&[50., 50., 50.]), ms(&[5.]));
        let r = combined([&a], 0.010).expect("rows answered");
        assert_eq!(r.warm_within, 0.0);
        assert_eq!(r.cold_within, 1.0);
        assert_eq!(r.within, 1.0);
    }

    #[test]
    fn a_limit_on_an_answer_counts_it_within_and_rows_without_answers_are_left_out() {
        let a = Split::new(ms(&[20., 20., 30., 40.]), Vec::new());
        let empty = Split::default();
        let r = combined([&empty, &a], 0.020).expect("a answered");
        assert_eq!(r.fewest_cold, 0.0);
        assert_eq!(r.within, 0.5);
        assert_eq!(combined([&empty], 0.020), None);
    }

    #[test]
    fn answers_are_split_by_the_share_delivered_from_cache() {
        let sample = |ttft: f64, cached: u64, ok: bool| Sample {
            ok,
            ttft,
            prompt_tokens: 100,
            cached_tokens: cached,
            ..Sample::default()
        };
        // Half delivered is warm; 49 of 100 is cold; a failed request is no answer. TTFTs in
        // wall seconds at time-scale 2 become modelled seconds halved.
        let samples = [
            sample(0.040, 50, true),
            sample(0.300, 49, true),
            sample(0.010, 100, false),
        ];
        let s = Split::of([(&samples[..], 2.0)]);
        assert_eq!(s, Split::new(vec![0.020], vec![0.150]));
    }
}
