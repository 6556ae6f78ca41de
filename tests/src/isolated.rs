//! A test body in a network namespace of its own, for what loopback on the host cannot
//! show: traffic between some processes cut and restored (a partition between agents),
//! with nothing of the host's network touched. Root only.
//!
//! The parent test ([`run`]) executes its own test binary again under `unshare --net`
//! (util-linux), in a process group of its own, running only one ignored entry test (as
//! [`crate::agent_process`] does for agents) that checks [`entered`] first. The namespace
//! lives as long as the processes in it: when the child exits, or is killed with its whole
//! group once the time bound is spent, it is gone. The child, and every process it starts
//! with [`die_with_parent`], is killed by the kernel when its parent dies, so even a killed
//! test leaves nothing running.
//!
//! The parent also makes a scratch directory ([`dir`], mode 0755, removed by the parent
//! once the child is gone, however it ended; a killed parent's by the next run) and a test
//! binary that the child's unprivileged processes can run ([`exe`]): the binary itself when
//! each of those user ids can, or else a copy (mode 0755) in the scratch directory, since a
//! checkout or target directory under a home directory (0700) is closed to them.
//!
//! Inside, [`prepare`] brings loopback up and moves the `local` routing rule from
//! preference 0 to 100, so that rules placed before it act on local traffic. A [`Cut`] then
//! prohibits the routes from processes of some user ids to some loopback addresses
//! (`ip rule add pref 10 uidrange A-B to ADDR prohibit`): processes started under distinct
//! uids (agents: `AgentProcess::start_as`) with distinct addresses (127.0.0.2, ...) are
//! cut from each other while both still reach everything else (127.0.0.1). A new connect or
//! datagram across the cut fails at once (`EACCES`); an established TCP stream stalls, because
//! changing the rules flushes the route cache and its next segment finds no route. Deleting
//! the rules heals it.

use std::{
    io::Read as _,
    net::Ipv4Addr,
    ops::RangeInclusive,
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

mod scratch;

use scratch::{Scratch, runnable_exe};

/// Names the entry test a child runs (the parent sets it).
pub const ENTRY_ENV: &str = "WARMPATH_E2E_ISOLATED_ENTRY";
/// The parent's network namespace (`net:[inode]`), which the child must not be in.
const PARENT_NETNS_ENV: &str = "WARMPATH_E2E_PARENT_NETNS";
/// The scratch directory the parent made ([`dir`]).
const DIR_ENV: &str = "WARMPATH_E2E_ISOLATED_DIR";
/// The test binary the child's user ids can run ([`exe`]).
const EXE_ENV: &str = "WARMPATH_E2E_ISOLATED_EXE";
/// The group of processes started under another user id (Debian's `nogroup`).
pub const NOGROUP: u32 = 65534;
/// The preference of the cut rules: before the `local` table's, which [`prepare`] moves.
const CUT_PREF: &str = "10";
/// Where [`prepare`] moves the `local` table's rule.
const LOCAL_PREF: &str = "100";

/// Whether this process is the child [`run`] started for `entry` (the entry test does
/// nothing otherwise: run as an ordinary ignored test, it is a no-op).
pub fn entered(entry: &str) -> bool {
    std::env::var(ENTRY_ENV).is_ok_and(|e| e == entry)
}

/// Runs the ignored test `entry` of this test binary in a new network namespace and waits
/// for it, at most `limit`; returns its output, or why it failed with its output. The
/// child and everything it started are killed when the bound is reached; the scratch
/// directory is removed in any case. `uids` are the user ids the child starts processes
/// under ([`exe`] is runnable by each).
pub fn run(entry: &str, uids: RangeInclusive<u32>, limit: Duration) -> Result<String, String> {
    let scratch = Scratch::new(entry)?;
    let exe = runnable_exe(entry, scratch.path(), uids)?;
    let own = std::env::current_exe().map_err(|e| format!("the test binary's path: {e}"))?;
    let mut cmd = Command::new("unshare");
    cmd.arg("--net")
        .arg("--")
        .arg(own)
        .args([
            "--exact",
            entry,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ENTRY_ENV, entry)
        .env(PARENT_NETNS_ENV, own_netns()?)
        .env(DIR_ENV, scratch.path())
        .env(EXE_ENV, exe)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A group of its own: on timeout the child and its children go together.
        .process_group(0);
    die_with_parent(&mut cmd);
    let child = cmd
        .spawn()
        .map_err(|e| format!("unshare --net (util-linux): {e}"))?;
    let (status, output) = wait_group(child, limit)?;
    drop(scratch);
    match status {
        None => Err(format!("`{entry}` ran past {limit:?}; killed\n{output}")),
        Some(s) if !s.success() => Err(format!("`{entry}` failed ({s})\n{output}")),
        // libtest exits 0 when the filter matched nothing, too.
        Some(_) if !output.contains("1 passed") => Err(format!("`{entry}` did not run\n{output}")),
        Some(_) => Ok(output),
    }
}

/// In the child: the scratch directory [`run`] made (mode 0755, every user id can read
/// it; the parent removes it).
pub fn dir() -> Result<PathBuf, String> {
    std::env::var_os(DIR_ENV)
        .map(PathBuf::from)
        .ok_or_else(|| format!("{DIR_ENV} unset: not started by isolated::run"))
}

/// In the child: the test binary that the user ids given to [`run`] can execute.
pub fn exe() -> Result<PathBuf, String> {
    std::env::var_os(EXE_ENV)
        .map(PathBuf::from)
        .ok_or_else(|| format!("{EXE_ENV} unset: not started by isolated::run"))
}

/// Makes `cmd`'s process receive SIGKILL when the thread that starts it ends (the
/// process, in these tests: each spawns from the thread that waits for it), so that a test
/// killed before its own cleanup runs takes its children with it. Set after any change of
/// user id (which would clear it), just before `exec`.
#[allow(unsafe_code)]
pub fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before `exec`, where only
    // async-signal-safe calls are allowed: it makes two system calls (prctl, getppid) and
    // builds an `io::Error` from a raw code, which allocates nothing. std runs it after
    // setting the uid and gid, so the setting survives until `exec` (and `exec` of a binary
    // that is not set-uid keeps it).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the setting took effect: no signal will come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Waits for `child` (the leader of its process group) at most `limit`, then kills what is
/// left of the group; its exit status (`None`: killed at the bound) and its stdout and
/// stderr.
fn wait_group(
    mut child: std::process::Child,
    limit: Duration,
) -> Result<(Option<std::process::ExitStatus>, String), String> {
    use nix::sys::signal::{Signal, killpg};
    let pgid = nix::unistd::Pid::from_raw(
        i32::try_from(child.id()).map_err(|_| "child pid out of range".to_string())?,
    );
    let pipes = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    ];
    let readers: Vec<_> = pipes
        .into_iter()
        .flatten()
        .map(|mut pipe| {
            std::thread::spawn(move || {
                let mut out = String::new();
                let _ = pipe.read_to_string(&mut out);
                out
            })
        })
        .collect();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send(());
        status
    });
    let timed_out = rx.recv_timeout(limit).is_err();
    if timed_out {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    let status = waiter
        .join()
        .map_err(|_| "the waiting thread panicked".to_string())?
        .map_err(|e| format!("waiting for the child: {e}"))?;
    // Whatever is left of the group (children of a child that exited on its own).
    let _ = killpg(pgid, Signal::SIGKILL);
    let output = readers
        .into_iter()
        .map(|r| r.join().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    Ok(((!timed_out).then_some(status), output))
}

/// This process's network namespace, as `net:[inode]`.
fn own_netns() -> Result<String, String> {
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .map_err(|e| format!("this process's network namespace: {e}"))
}

/// In the child: loopback up and the `local` rule moved behind the cut's preference.
/// Refuses to touch any namespace but a new one (not the parent's: the host's).
pub fn prepare() -> Result<(), String> {
    let parent = std::env::var(PARENT_NETNS_ENV)
        .map_err(|_| format!("{PARENT_NETNS_ENV} unset: not started by isolated::run"))?;
    if own_netns()? == parent {
        return Err("not in a network namespace of its own: refusing to change routing".into());
    }
    ip(&["link", "set", "lo", "up"])?;
    ip(&["rule", "add", "pref", LOCAL_PREF, "lookup", "local"])?;
    ip(&["rule", "del", "pref", "0"])
}

/// Processes of some user ids, and the loopback addresses they serve on.
#[derive(Debug, Clone)]
pub struct Side {
    pub uids: RangeInclusive<u32>,
    pub addrs: Vec<Ipv4Addr>,
}

/// Traffic between two sides cut (both ways), until [`Cut::heal`] or drop.
#[derive(Debug)]
pub struct Cut {
    rules: Vec<Vec<String>>,
}

impl Cut {
    /// Prohibits every route from `a`'s processes to `b`'s addresses and back.
    pub fn between(a: &Side, b: &Side) -> Result<Self, String> {
        let mut cut = Self { rules: Vec::new() };
        for (from, to) in [(a, b), (b, a)] {
            for addr in &to.addrs {
                let rule: Vec<String> = [
                    "pref",
                    CUT_PREF,
                    "uidrange",
                    &format!("{}-{}", from.uids.start(), from.uids.end()),
                    "to",
                    &addr.to_string(),
                    "prohibit",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                let mut add = vec!["rule", "add"];
                add.extend(rule.iter().map(String::as_str));
                ip(&add)?;
                cut.rules.push(rule);
            }
        }
        Ok(cut)
    }

    /// Deletes the rules: traffic flows again.
    pub fn heal(&mut self) -> Result<(), String> {
        while let Some(rule) = self.rules.pop() {
            let mut del = vec!["rule", "del"];
            del.extend(rule.iter().map(String::as_str));
            ip(&del)?;
        }
        Ok(())
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        let _ = self.heal();
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Whether a test needing [`run`] can run here: root, `ip`, a network namespace it can
/// configure (root in an unprivileged container cannot make one), and processes started
/// under another user id (which a user namespace may not map).
pub fn unavailable_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (network namespaces, routing rules)".into());
    }
    let probes: [(&str, Command); 3] = [
        ("`ip` (iproute2) is not available", {
            let mut c = Command::new("ip");
            c.arg("-V");
            c
        }),
        ("cannot configure a network namespace of its own", {
            let mut c = Command::new("unshare");
            c.args(["--net", "--", "ip", "link", "set", "lo", "up"]);
            c
        }),
        ("cannot start a process under another user id", {
            let mut c = Command::new("true");
            c.uid(NOGROUP).gid(NOGROUP);
            c
        }),
    ];
    for (what, mut cmd) in probes {
        let program = cmd.get_program().to_string_lossy().into_owned();
        match cmd.stdin(Stdio::null()).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Some(format!(
                    "{what}: `{program}` {}: {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Err(e) => return Some(format!("{what}: `{program}`: {e}")),
        }
    }
    None
}
