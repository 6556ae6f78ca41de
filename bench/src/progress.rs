//! What the terminal shows while a benchmark runs its phases: a bar per phase when stderr is
//! a terminal, plain one-line updates otherwise (CI logs, pipes), both on stderr, so that
//! stdout carries the report alone.

use std::{
    io::IsTerminal,
    sync::atomic::{AtomicU64, Ordering},
    time::Instant,
};

/// Plain mode prints a line each time this share of a phase more is done.
const PLAIN_STEPS: u64 = 4;

/// One phase (a policy or router on one workload): requests done of its total.
#[derive(Debug)]
pub struct Phase {
    label: String,
    total: u64,
    done: AtomicU64,
    started: Instant,
    /// The bar, on a terminal.
    bar: Option<indicatif::ProgressBar>,
}

impl Phase {
    /// Starts showing `label` (e.g. `[2/6] precise`) with `total` requests to go.
    pub fn start(label: String, total: u64) -> Self {
        Self::with_bar(label, total, std::io::stderr().is_terminal())
    }

    fn with_bar(label: String, total: u64, bar: bool) -> Self {
        let bar = bar.then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} requests",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_prefix(label.clone());
            bar
        });
        let phase = Self {
            label,
            total,
            done: AtomicU64::new(0),
            started: Instant::now(),
            bar,
        };
        if phase.bar.is_none() {
            eprintln!("{}: {total} requests", phase.label);
        }
        phase
    }

    /// One more request done (answered, failed or timed out).
    pub fn inc(&self) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        match &self.bar {
            Some(bar) => bar.inc(1),
            None => {
                if let Some(line) = self.plain_update(done) {
                    eprintln!("{line}");
                }
            }
        }
    }

    /// The plain-mode line for `done` requests, at each [`PLAIN_STEPS`]th of the total
    /// (not at the end: [`Phase::finish`] says that).
    fn plain_update(&self, done: u64) -> Option<String> {
        let step = self.total.div_ceil(PLAIN_STEPS).max(1);
        (done.is_multiple_of(step) && done < self.total).then(|| {
            format!(
                "{}: {done}/{} requests ({:.0} s)",
                self.label,
                self.total,
                self.started.elapsed().as_secs_f64()
            )
        })
    }

    /// Ends the phase with one line: its label and `summary`.
    pub fn finish(&self, summary: &str) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        eprintln!(
            "{}: {summary} ({:.0} s)",
            self.label,
            self.started.elapsed().as_secs_f64()
        );
    }

    /// A line about this phase, printed above its bar.
    pub fn note(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        // An early return (an error) must not leave a bar drawn over the message.
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_mode_reports_each_quarter_but_not_the_end() {
        let phase = Phase::with_bar("[1/2] precise".into(), 10, false);
        let lines: Vec<u64> = (1..=10)
            .filter(|&d| phase.plain_update(d).is_some())
            .collect();
        // Steps of ceil(10 / 4) = 3.
        assert_eq!(lines, [3, 6, 9]);
        let line = phase.plain_update(6).unwrap();
        assert!(line.starts_with("[1/2] precise: 6/10 requests ("), "{line}");
    }

    #[test]
    fn the_end_is_left_to_finish() {
        for total in 0..20 {
            let phase = Phase::with_bar("x".into(), total, false);
            assert_eq!(phase.plain_update(total), None, "total {total}");
        }
        // Fewer requests than steps: a line per request but the last.
        let phase = Phase::with_bar("x".into(), 2, false);
        assert!(phase.plain_update(1).is_some());
    }

    #[test]
    fn counts_requests_in_both_modes() {
        for bar in [false, true] {
            let phase = Phase::with_bar("x".into(), 8, bar);
            for _ in 0..5 {
                phase.inc();
            }
            assert_eq!(phase.done.load(Ordering::Relaxed), 5);
            phase.finish("done");
        }
    }
}
