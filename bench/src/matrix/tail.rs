//! Where a row's slowest answers came from, by their route receipts: each answer at or above
//! the row's p90 TTFT (its runs pooled) is put in one class, and the same classes are counted
//! over every answer of the row, so a report says why a tail is long without reading
//! `requests.jsonl` one request at a time.
//!
//! - hit: at least half the prompt delivered from cache;
//! - lost waiting: the chosen pod held at least half at decision (captured), under half was
//!   delivered: evicted while the request waited there;
//! - not taken: some ready pod held at least half (available), the chosen one held less;
//! - held nowhere: no ready pod held half: new to the fleet, or evicted before it came;
//! - miss: under half delivered and no receipt headers (a peer router: which of the three
//!   above is unknown), or no usage reported to judge by.
//!
//! Beside the classes, the answers the agent held before sending them (`router hold`: a
//! cold request's yield to warm ones, a burst's stagger; [`Sample::held_ms`]), in any class.
//!
//! Half is where a session's later turn counts as lost (docs/benchmarks.md reads chat and
//! agentic tails this way); a captured-but-not-delivered share at low load is how a stale
//! index or a mismatched tokenizer shows (docs/routing.md, "Route receipts").

use serde::Serialize;

use super::interval;
use crate::run::report::Sample;

/// Per class: answers in the slowest tenth, and answers in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Count {
    pub slowest: usize,
    pub all: usize,
}

/// A row's answers by class ([`classify`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Anatomy {
    pub hit: Count,
    pub lost_waiting: Count,
    pub not_taken: Count,
    pub held_nowhere: Count,
    pub miss: Count,
    /// Answers the agent held before sending, whatever their class.
    pub router_hold: Count,
}

/// One answer's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Hit,
    LostWaiting,
    NotTaken,
    HeldNowhere,
    Miss,
}

/// The class of one answer by its receipt (see the module's table).
pub fn classify(s: &Sample) -> Class {
    if s.prompt_tokens == 0 {
        // No usage in the answer: nothing to judge a share by.
        return Class::Miss;
    }
    // "At least half": 2 x part >= whole, in integers.
    let half = |part: u64| part.saturating_mul(2) >= s.prompt_tokens;
    if half(s.cached_tokens) {
        return Class::Hit;
    }
    match (s.captured_tokens, s.available_tokens) {
        (Some(captured), _) if half(captured) => Class::LostWaiting,
        (_, Some(available)) if half(available) => Class::NotTaken,
        (None, None) => Class::Miss,
        _ => Class::HeldNowhere,
    }
}

impl Anatomy {
    /// Of one row's answers (`runs`: each run's samples and its wall seconds per modelled
    /// second): the slowest are those at or above the pooled p90 TTFT by the table's rank
    /// rule ([`interval::quantile`]), in modelled time. Failed requests are not answers.
    pub fn of<'a>(runs: impl IntoIterator<Item = (&'a [Sample], f64)>) -> Self {
        let answers: Vec<(f64, Class, bool)> = runs
            .into_iter()
            .flat_map(|(samples, scale)| {
                samples.iter().filter(|s| s.ok).map(move |s| {
                    let held = s.held_ms.is_some_and(|ms| ms > 0.0);
                    (s.ttft / scale, classify(s), held)
                })
            })
            .collect();
        let mut ttfts: Vec<f64> = answers.iter().map(|(t, _, _)| *t).collect();
        let Some(p90) = interval::quantile(&mut ttfts, 0.9) else {
            return Self::default();
        };
        let mut out = Self::default();
        for (ttft, class, held) in answers {
            let slow = usize::from(ttft >= p90);
            let count = out.count_mut(class);
            count.all += 1;
            count.slowest += slow;
            if held {
                out.router_hold.all += 1;
                out.router_hold.slowest += slow;
            }
        }
        out
    }

    fn count_mut(&mut self, class: Class) -> &mut Count {
        match class {
            Class::Hit => &mut self.hit,
            Class::LostWaiting => &mut self.lost_waiting,
            Class::NotTaken => &mut self.not_taken,
            Class::HeldNowhere => &mut self.held_nowhere,
            Class::Miss => &mut self.miss,
        }
    }

    /// Answers in the slowest tenth (each in exactly one class).
    pub fn slowest(&self) -> usize {
        self.classes().iter().map(|c| c.slowest).sum()
    }

    /// Every class's count, in the report's column order.
    fn classes(&self) -> [Count; 5] {
        [
            self.hit,
            self.lost_waiting,
            self.not_taken,
            self.held_nowhere,
            self.miss,
        ]
    }

    /// Every class's count, then the router's holds (in any class): the report's columns.
    pub fn counts(&self) -> [Count; 6] {
        let [hit, lost, not_taken, nowhere, miss] = self.classes();
        [hit, lost, not_taken, nowhere, miss, self.router_hold]
    }
}

/// The report's columns after workload, load, row and slowest, in [`Anatomy::counts`] order.
pub const COLUMNS: [&str; 6] = [
    "hit",
    "lost waiting",
    "not taken",
    "held nowhere",
    "miss (no receipt)",
    "router hold",
];

/// The report's section: one line per row that ran, each class as `slowest / all`.
pub fn render(cells: &[super::Cell]) -> String {
    use std::fmt::Write as _;
    let mut s = String::from(
        "Slowest tenth by route receipt (the answers at or above each row's p90 TTFT, its runs pooled; each entry: in the slowest tenth / of all answers; shares of the prompt: hit = at least half delivered from cache; lost waiting = the chosen pod held at least half at decision, under half was delivered; not taken = another ready pod held half, the chosen one less; held nowhere = no ready pod held half; miss = under half delivered, no receipt: a peer router; router hold, in any class: the agent held it before sending, a cold request's yield or a burst's stagger):\n\n",
    );
    let _ = writeln!(
        s,
        "| workload | load | row | slowest | {} |\n|---|---|---|---|{}",
        COLUMNS.join(" | "),
        "---|".repeat(COLUMNS.len())
    );
    for c in cells {
        for r in &c.rows {
            let Some(t) = &r.tail else {
                continue;
            };
            let _ = write!(
                s,
                "| {} | {}x | {} | {} |",
                c.workload,
                c.load,
                r.name,
                t.slowest()
            );
            for count in t.counts() {
                let _ = write!(s, " {} / {} |", count.slowest, count.all);
            }
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ttft: f64, prompt: u64, cached: u64, receipt: Option<(u64, u64)>) -> Sample {
        Sample {
            tenant: String::new(),
            step: 0,
            ok: true,
            start: 0.0,
            ttft,
            e2e: ttft,
            itl: Vec::new(),
            prompt_tokens: prompt,
            cached_tokens: cached,
            output_tokens: 1,
            available_tokens: receipt.map(|(a, _)| a),
            captured_tokens: receipt.map(|(_, c)| c),
            predicted_ttft_ms: None,
            pod: None,
            held_ms: None,
            session: None,
        }
    }

    #[test]
    fn each_receipt_falls_in_its_class_at_exactly_half() {
        // 1,000-token prompts; receipts (available, captured).
        assert_eq!(classify(&sample(0.1, 1000, 500, None)), Class::Hit);
        assert_eq!(
            classify(&sample(0.1, 1000, 499, Some((1000, 500)))),
            Class::LostWaiting
        );
        assert_eq!(
            classify(&sample(0.1, 1000, 0, Some((500, 499)))),
            Class::NotTaken
        );
        assert_eq!(
            classify(&sample(0.1, 1000, 0, Some((499, 499)))),
            Class::HeldNowhere
        );
        assert_eq!(classify(&sample(0.1, 1000, 499, None)), Class::Miss);
        // An answer without usage (0 prompt tokens) is no hit, whatever its receipt.
        assert_eq!(classify(&sample(0.1, 0, 0, Some((0, 0)))), Class::Miss);
        // A receipt with one header only still says what it can.
        let mut s = sample(0.1, 1000, 0, None);
        s.available_tokens = Some(800);
        assert_eq!(classify(&s), Class::NotTaken);
        s.available_tokens = None;
        s.captured_tokens = Some(100);
        assert_eq!(classify(&s), Class::HeldNowhere);
    }

    #[test]
    fn the_slowest_tenth_of_two_runs_pooled_in_modelled_time() {
        // Run A (scale 1): 10 answers at 10..100 ms; the two slowest were lost waiting and
        // held nowhere, the rest hits. Run B (scale 2: wall = 2 x modelled): 10 answers at
        // 20..200 ms wall = 10..100 ms modelled, its slowest a peer-style miss.
        let mut a: Vec<Sample> = (1..=8)
            .map(|i| sample(f64::from(i) * 0.01, 100, 90, Some((100, 100))))
            .collect();
        a.push(sample(0.09, 100, 0, Some((100, 100))));
        a.push(sample(0.10, 100, 0, Some((10, 0))));
        // Two held by the agent: a fast hit and the slowest answer.
        a[0].held_ms = Some(3.0);
        a[9].held_ms = Some(40.0);
        // (Each of B's wall times is exactly twice one of A's: the pooled values tie.)
        let mut b: Vec<Sample> = (1..=8)
            .map(|i| sample(2.0 * (f64::from(i) * 0.01), 100, 90, None))
            .collect();
        b.push(sample(2.0 * 0.09, 100, 90, None));
        b.push(sample(2.0 * 0.10, 100, 0, None));
        // A failed request is not an answer.
        let mut failed = sample(10.0, 100, 0, None);
        failed.ok = false;
        b.push(failed);
        let t = Anatomy::of([(a.as_slice(), 1.0), (b.as_slice(), 2.0)]);
        // 20 answers; p90 by rank ceil(0.9 x 20) = 18: 90 ms; at or above it: both runs'
        // 90 and 100 ms answers (4).
        assert_eq!(t.slowest(), 4);
        assert_eq!(
            t.hit,
            Count {
                slowest: 1,
                all: 17
            }
        );
        assert_eq!(t.lost_waiting, Count { slowest: 1, all: 1 });
        assert_eq!(t.held_nowhere, Count { slowest: 1, all: 1 });
        assert_eq!(t.miss, Count { slowest: 1, all: 1 });
        assert_eq!(t.not_taken, Count::default());
        assert_eq!(t.router_hold, Count { slowest: 1, all: 2 });
    }

    #[test]
    fn the_report_has_a_line_per_row_that_ran() {
        let row = |name: &str, tail| super::super::CellRow {
            name: name.into(),
            status: "ok".into(),
            result: None,
            runs: Vec::new(),
            answers: Vec::new(),
            tail,
            split: Default::default(),
        };
        let t = Anatomy {
            hit: Count {
                slowest: 1,
                all: 17,
            },
            lost_waiting: Count { slowest: 2, all: 3 },
            router_hold: Count { slowest: 2, all: 5 },
            ..Anatomy::default()
        };
        let cell = super::super::Cell {
            workload: "chat".into(),
            shares: true,
            load: 0.8,
            rate: 10.0,
            requests: 20,
            working_set_tokens: 100,
            blocks_per_engine: 8,
            floor: crate::matrix::floor::Floor {
                ttft_p50: 0.0,
                ttft_p90: 0.0,
                ttft_p99: 0.0,
            },
            rows: vec![row("Precise", Some(t)), row("sglang-router", None)],
        };
        let report = render(std::slice::from_ref(&cell));
        let lines: Vec<&str> = report.lines().filter(|l| l.starts_with("| chat")).collect();
        assert_eq!(
            lines,
            ["| chat | 0.8x | Precise | 3 | 1 / 17 | 2 / 3 | 0 / 0 | 0 / 0 | 0 / 0 | 2 / 5 |"]
        );
        assert!(report.contains(
            "| workload | load | row | slowest | hit | lost waiting | not taken | held nowhere | miss (no receipt) | router hold |"
        ));
    }

    #[test]
    fn no_answers_no_tail() {
        assert_eq!(Anatomy::of([]), Anatomy::default());
        let mut failed = sample(1.0, 100, 0, None);
        failed.ok = false;
        assert_eq!(
            Anatomy::of([(std::slice::from_ref(&failed), 1.0)]),
            Anatomy::default()
        );
    }
}
