//! connect4's cost as the kernel accounts it: with BPF run-time stats on, how often each
//! warmpath program ran over a known number of connects and the nanoseconds it spent, so the
//! cost per connect is a sum of measured program time instead of a difference of two noisy
//! connect() medians.
//!
//! What the figure includes: the body of every warmpath program that ran on those
//! connections (the connect4 pair, sock_ops on each callback — which also counts the bytes of
//! connections sent to a pod, on their segments only — and getpeername if called), each from the kernel's clock read before it to the one after it:
//! so also an interrupt taken meanwhile, and the part of the two clock reads that falls inside
//! (bounded in the report by the cheapest run measured). What it does not include: the
//! hook's own work around a program (walking the cgroup's program array, copying the
//! sockaddr in and out), the syscall, and TCP's and the loopback's work.

use serde::Serialize;

use super::spread::Spread;

/// One program's share of the measured connects.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelRow {
    pub program: String,
    /// Runs and nanoseconds over all the measured connects.
    pub runs: u64,
    pub run_time_ns: u64,
    pub runs_per_connect: f64,
    /// NaN when it never ran.
    pub ns_per_run: f64,
    pub ns_per_connect: f64,
}

/// The in-kernel cost per connect, or why it was not measured.
#[derive(Debug, Clone, Serialize)]
pub struct KernelCost {
    /// connect() calls made with stats on (over every round).
    pub connects: u64,
    pub programs: Vec<KernelRow>,
    /// Sum over the programs: BPF nanoseconds per connect.
    pub ns_per_connect: f64,
    /// The same sum per round.
    pub rounds_ns: Spread,
    /// Why it was not measured (empty when it was).
    pub missing: String,
}

/// Runs and run time of one program over some connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runs {
    pub program: String,
    pub runs: u64,
    pub run_time_ns: u64,
}

/// BPF nanoseconds per connect: every program's run time over `connects`, summed.
pub fn ns_per_connect(connects: u64, runs: &[Runs]) -> f64 {
    if connects == 0 {
        return f64::NAN;
    }
    runs.iter().map(|r| r.run_time_ns as f64).sum::<f64>() / connects as f64
}

impl KernelCost {
    /// From the totals over all rounds (`connects` connects, each program's runs and run
    /// time) and each round's [`ns_per_connect`].
    pub fn of(connects: u64, totals: &[Runs], rounds: &[f64]) -> Self {
        let per_connect = |x: u64| {
            if connects == 0 {
                f64::NAN
            } else {
                x as f64 / connects as f64
            }
        };
        let programs = totals
            .iter()
            .map(|r| KernelRow {
                program: r.program.clone(),
                runs: r.runs,
                run_time_ns: r.run_time_ns,
                runs_per_connect: per_connect(r.runs),
                ns_per_run: if r.runs == 0 {
                    f64::NAN
                } else {
                    r.run_time_ns as f64 / r.runs as f64
                },
                ns_per_connect: per_connect(r.run_time_ns),
            })
            .collect();
        Self {
            connects,
            programs,
            ns_per_connect: ns_per_connect(connects, totals),
            rounds_ns: Spread::of(rounds.iter().copied()),
            missing: String::new(),
        }
    }

    /// Not measured, and why.
    pub fn missing(why: &str) -> Self {
        Self {
            connects: 0,
            programs: Vec::new(),
            ns_per_connect: f64::NAN,
            rounds_ns: Spread::of([]),
            missing: why.into(),
        }
    }

    /// Program runs per connect, all programs together.
    pub fn runs_per_connect(&self) -> f64 {
        self.programs.iter().map(|p| p.runs_per_connect).sum()
    }

    /// The lowest time per run of any program that ran: an upper bound on what the
    /// accounting itself (its clock reads) adds to each run.
    pub fn cheapest_run_ns(&self) -> f64 {
        self.programs
            .iter()
            .filter(|p| p.runs > 0)
            .map(|p| p.ns_per_run)
            .fold(f64::NAN, f64::min)
    }

    /// `connect4_proxy 1.00 x 180 ns + ...` over the programs that ran.
    pub fn terms(&self) -> String {
        self.programs
            .iter()
            .filter(|p| p.runs > 0)
            .map(|p| {
                format!(
                    "{} {:.2} x {:.0} ns",
                    p.program, p.runs_per_connect, p.ns_per_run
                )
            })
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// `after - before` per program (programs only in `after` count from zero).
pub fn delta(before: &[Runs], after: &[Runs]) -> Vec<Runs> {
    after
        .iter()
        .map(|a| {
            let b = before.iter().find(|b| b.program == a.program);
            Runs {
                program: a.program.clone(),
                runs: a.runs - b.map_or(0, |b| b.runs.min(a.runs)),
                run_time_ns: a.run_time_ns - b.map_or(0, |b| b.run_time_ns.min(a.run_time_ns)),
            }
        })
        .collect()
}

/// `into += add`, program by program (a program new to `into` is appended).
pub fn accumulate(into: &mut Vec<Runs>, add: &[Runs]) {
    for a in add {
        match into.iter_mut().find(|r| r.program == a.program) {
            Some(r) => {
                r.runs += a.runs;
                r.run_time_ns += a.run_time_ns;
            }
            None => into.push(a.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(program: &str, runs: u64, run_time_ns: u64) -> Runs {
        Runs {
            program: program.into(),
            runs,
            run_time_ns,
        }
    }

    #[test]
    fn cost_per_connect_is_the_sum_of_every_programs_time() {
        // 1,000 connects: connect4_proxy once each at 150 ns, sock_ops 5 times at 20 ns,
        // getpeername6 3 times at 30 ns, getpeername4 never.
        let totals = [
            runs("connect4_proxy", 1_000, 150_000),
            runs("sock_ops", 5_000, 100_000),
            runs("getpeername6", 3_000, 90_000),
            runs("getpeername4", 0, 0),
        ];
        let cost = KernelCost::of(1_000, &totals, &[330.0, 340.0, 360.0]);
        assert_eq!(cost.ns_per_connect, 340.0);
        assert_eq!(cost.rounds_ns.median, 340.0);
        let sock_ops = &cost.programs[1];
        assert_eq!(
            (
                sock_ops.runs_per_connect,
                sock_ops.ns_per_run,
                sock_ops.ns_per_connect
            ),
            (5.0, 20.0, 100.0)
        );
        assert!(cost.programs[3].ns_per_run.is_nan());
        assert_eq!(cost.programs[3].ns_per_connect, 0.0);
        assert_eq!(
            cost.terms(),
            "connect4_proxy 1.00 x 150 ns + sock_ops 5.00 x 20 ns + getpeername6 3.00 x 30 ns"
        );
        assert!(ns_per_connect(0, &totals).is_nan());
        assert_eq!(cost.runs_per_connect(), 9.0);
        assert_eq!(cost.cheapest_run_ns(), 20.0);
        assert!(KernelCost::missing("no stats").cheapest_run_ns().is_nan());
    }

    #[test]
    fn rounds_are_differenced_then_summed_per_program() {
        let before = [runs("connect4", 10, 1_000), runs("sock_ops", 50, 700)];
        let after = [
            runs("connect4", 110, 9_000),
            runs("sock_ops", 550, 10_700),
            runs("sk_msg_redirect", 4, 80),
        ];
        let d = delta(&before, &after);
        assert_eq!(
            d,
            [
                runs("connect4", 100, 8_000),
                runs("sock_ops", 500, 10_000),
                runs("sk_msg_redirect", 4, 80)
            ]
        );
        assert_eq!(ns_per_connect(100, &d), 180.8);
        let mut total = vec![runs("connect4", 1, 10)];
        accumulate(&mut total, &d);
        accumulate(&mut total, &d);
        assert_eq!(total[0], runs("connect4", 201, 16_010));
        assert_eq!(total[2], runs("sk_msg_redirect", 8, 160));
    }
}
