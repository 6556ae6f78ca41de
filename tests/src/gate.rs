//! Deciding whether a privileged test runs, skips visibly, or fails.
//!
//! Without `WARMPATH_REQUIRE_BPF=1` a test that cannot run here prints one line saying why and
//! returns. With it (CI sets it) the same situation is a test failure, so CI can never go green
//! by skipping the kernel tests.

use std::io::Write as _;

/// The variable that turns a skip into a failure.
pub const REQUIRE_BPF: &str = "WARMPATH_REQUIRE_BPF";

/// Returns true when `test` may run its BPF body here.
///
/// # Panics
/// When the BPF path is unavailable and `WARMPATH_REQUIRE_BPF=1`.
pub fn bpf_available(test: &str) -> bool {
    available(test, warmpath_agent::ebpf::unavailable_reason())
}

/// Returns true when `test` may run in a network namespace of its own
/// ([`crate::isolated`]: root, `unshare`, `ip`); skips or fails as [`bpf_available`] does.
///
/// # Panics
/// When it cannot and `WARMPATH_REQUIRE_BPF=1`.
pub fn isolated_available(test: &str) -> bool {
    available(test, crate::isolated::unavailable_reason())
}

fn available(test: &str, reason: Option<String>) -> bool {
    let Some(reason) = reason else {
        return true;
    };
    if std::env::var(REQUIRE_BPF).is_ok_and(|v| v == "1") {
        panic!("{REQUIRE_BPF}=1 but `{test}` cannot run: {reason}");
    }
    // Written to the real stderr, not through eprintln!, so the test harness's output capture
    // does not hide it.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {reason} (set {REQUIRE_BPF}=1 to make this a failure)"
    );
    false
}

/// Prints a line that shows up in test output even when output is captured.
pub fn announce(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
