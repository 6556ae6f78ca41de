//! The median and range of a figure over a benchmark's rounds (shared by the table and the
//! in-kernel cost).

use serde::Serialize;

/// Median and range of a figure over rounds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub rounds: usize,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let median = match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Self {
            median,
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
            rounds: v.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_the_median_and_range_of_finite_values() {
        let s = Spread::of([3.0, 1.0, f64::NAN, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.rounds), (2.0, 1.0, 3.0, 3));
        assert_eq!(Spread::of([4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert!(Spread::of([]).median.is_nan());
    }
}
