//! CPU time of a process from /proc/PID/stat (utime + stime, all threads).

use std::time::Duration;

/// Clock ticks per second; Linux reports 100 for USER_HZ on every mainstream config.
const USER_HZ: f64 = 100.0;

/// CPU time a process consumed so far, split into user and kernel (system) time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuTimes {
    pub user: Duration,
    pub system: Duration,
}

/// Total CPU time consumed so far by `pid`, or None if it cannot be read.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    cpu_times(pid).map(|t| t.user + t.system)
}

/// User and kernel CPU time consumed so far by `pid`, or None if it cannot be read.
pub fn cpu_times(pid: u32) -> Option<CpuTimes> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse(&stat)
}

fn parse(stat: &str) -> Option<CpuTimes> {
    // The command name (field 2) may contain spaces; fields after it start past the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12 here.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(CpuTimes {
        user: Duration::from_secs_f64(utime / USER_HZ),
        system: Duration::from_secs_f64(stime / USER_HZ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_utime_and_stime_even_with_spaces_in_the_name() {
        let stat = "1234 (warm path) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 9 0 100 0 0";
        assert_eq!(
            parse(stat),
            Some(CpuTimes {
                user: Duration::from_millis(2500),
                system: Duration::from_millis(500)
            })
        );
        assert_eq!(parse("garbage"), None);
        assert!(cpu_time(std::process::id()).is_some());
    }
}
