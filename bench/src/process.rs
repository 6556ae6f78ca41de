//! Child processes of the benchmarks: this binary in another role (`warmpath sim`, `warmpath
//! agent`) or a peer (nginx, vllm-router, sglang-router), stopped when dropped; their output
//! into log files ([`super::logs`]), never the terminal.

use std::{path::Path, process::Stdio};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use super::{
    Error,
    logs::{LogFile, Logs},
};

/// A child process, sent SIGTERM when dropped (a graceful stop: nginx's master then takes its
/// workers down; SIGKILL would orphan them).
pub struct Child(pub tokio::process::Child);

impl Child {
    pub fn terminate(&mut self) {
        if let Some(pid) = self.0.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// A free loopback port for a child to listen on (bound, then released), taken **below** the
/// kernel's ephemeral range (`net.ipv4.ip_local_port_range`). A port the kernel hands out
/// for `bind(0)` comes from that range, and so does the source port of every outgoing
/// connection: under a benchmark's load one of those connects could take the port in the
/// moment between its release here and the child's bind ("Address already in use", a
/// matrix run lost at its second cell). Below the range no connect is given it. Ports are
/// tried in turn from an offset of this process's id, so concurrent benchmarks rarely try
/// the same ones; where there is no room below the range, it falls back to `bind(0)`.
pub fn free_port() -> Result<u16, Error> {
    free_port_where(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
}

/// [`free_port`] for the port kind `free` checks (TCP or UDP: it tries to bind the port).
pub fn free_port_where(free: impl Fn(u16) -> bool) -> Result<u16, Error> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let io = |source| Error::Io {
        what: "bind 127.0.0.1:0".into(),
        source,
    };
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(0);
    if ephemeral_low > LOWEST + 1_000 {
        let span = ephemeral_low - LOWEST;
        let start = std::process::id().wrapping_mul(2_654_435_761) % span;
        for _ in 0..span.min(4_096) {
            let port = LOWEST + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            let Ok(port) = u16::try_from(port) else {
                continue;
            };
            if free(port) {
                return Ok(port);
            }
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
    l.local_addr().map(|a| a.port()).map_err(io)
}

/// This binary's path.
pub fn self_exe() -> Result<std::path::PathBuf, Error> {
    std::env::current_exe().map_err(|source| Error::Io {
        what: "find the warmpath binary".into(),
        source,
    })
}

/// Runs `exe <args>` (a `warmpath` binary in another role) with `worker_threads` tokio
/// workers, its output in the next `<role>-<n>.log` of `logs`.
pub fn spawn_exe(
    exe: &Path,
    args: &[String],
    worker_threads: usize,
    role: &str,
    logs: &Logs,
) -> Result<Logged, Error> {
    let log = logs.open(role)?;
    let name = log.name();
    let mut command = tokio::process::Command::new(exe);
    command
        .args(args)
        .env("TOKIO_WORKER_THREADS", worker_threads.to_string());
    spawn_logged(&mut command, &name, log, false)
}

/// Starts the simulator fleet that `flags` (`warmpath sim`'s, after a first `sim`) describe:
/// its settings and its running engines.
pub async fn start_fleet(
    flags: Vec<String>,
) -> Result<
    (
        warmpath_sim::cli::SimArgs,
        Vec<warmpath_sim::fleet::RunningEngine>,
    ),
    Error,
> {
    #[derive(clap::Parser)]
    struct SimWrap {
        #[command(flatten)]
        sim: warmpath_sim::cli::SimArgs,
    }
    let sim = <SimWrap as clap::Parser>::try_parse_from(flags)
        .map_err(|e| Error::Setup(e.to_string()))?
        .sim;
    let engines = warmpath_sim::cli::start(&sim)
        .await
        .map_err(|e| Error::Setup(format!("simulator: {e}")))?;
    Ok((sim, engines))
}

/// The flags every benchmark's simulator fleet starts with: `replicas` engines on free ports,
/// timed by `profile` at `time_scale`.
pub fn fleet_flags(replicas: u16, profile: &str, time_scale: f64) -> Vec<String> {
    let (replicas, time_scale) = (replicas.to_string(), time_scale.to_string());
    [
        "--port",
        "0",
        "--replicas",
        &replicas,
        "--profile",
        profile,
        "--time-scale",
        &time_scale,
    ]
    .map(String::from)
    .to_vec()
}

/// Starts `warmpath sim <flags>` (this binary), its output in the next `sim-<n>.log` of
/// `logs`, and waits for its ready line; returns the process and its engines' HTTP addresses.
pub async fn spawn_sim(
    flags: &[String],
    worker_threads: usize,
    logs: &Logs,
) -> Result<(Logged, Vec<String>), Error> {
    let (sim, engines) = spawn_fleet(&self_exe()?, flags, worker_threads, "sim", logs).await?;
    Ok((sim, engines.into_iter().map(|e| e.http).collect()))
}

/// One simulated engine's addresses, from the simulator's ready line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineAddrs {
    /// `host:port` of its HTTP server.
    pub http: String,
    /// `tcp://host:port` of its KV events publisher, when it publishes.
    pub kv_events: Option<String>,
    pub kv_replay: Option<String>,
}

/// Starts `exe sim <flags>`, its output in the next `<role>-<n>.log` of `logs`, and waits
/// for its ready line; returns the process and its engines' addresses.
pub async fn spawn_fleet(
    exe: &Path,
    flags: &[String],
    worker_threads: usize,
    role: &str,
    logs: &Logs,
) -> Result<(Logged, Vec<EngineAddrs>), Error> {
    let log = logs.open(role)?;
    let name = log.name();
    spawn_fleet_logged(exe, flags, worker_threads, &name, log).await
}

/// Longest ready line the simulator may print (its engines' addresses as JSON).
const MAX_READY_LINE: u64 = 1 << 20;

/// Starts `exe sim <flags>` with its output in `log`, reads its ready line from stdout (then
/// copies the rest of stdout into the log until the process closes it) and returns it and its
/// engines' addresses. `name` says which process it is in errors.
pub async fn spawn_fleet_logged(
    exe: &Path,
    flags: &[String],
    worker_threads: usize,
    name: &str,
    log: LogFile,
) -> Result<(Logged, Vec<EngineAddrs>), Error> {
    use tokio::io::AsyncWriteExt;

    let mut command = tokio::process::Command::new(exe);
    command
        .arg("sim")
        .args(flags)
        .env("TOKIO_WORKER_THREADS", worker_threads.to_string());
    let mut fleet = spawn_logged(&mut command, name, log, true)?;
    let stdout = fleet
        .child
        .0
        .stdout
        .take()
        .ok_or_else(|| Error::Setup("no simulator stdout".into()))?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    let read = (&mut reader)
        .take(MAX_READY_LINE)
        .read_line(&mut line)
        .await
        .map_err(|source| Error::Io {
            what: format!("read {name}'s ready line"),
            source,
        })?;
    if read == 0 {
        let why = fleet.check_running().err();
        return Err(why.unwrap_or_else(|| fleet.failed("closed its stdout before its ready line")));
    }
    let mut writer = fleet.log.writer()?;
    // The ready line belongs in the log too; a failed write only loses log lines.
    let _ = writer.write_all(line.as_bytes()).await;
    fleet.copy = Some(tokio::spawn(async move {
        // Until the child closes stdout (it exits): one fixed buffer, whatever it prints.
        let _ = tokio::io::copy(&mut reader, &mut writer).await;
        let _ = writer.flush().await;
    }));
    let engines = ready_engines(&line).map_err(|e| fleet.failed(&e))?;
    Ok((fleet, engines))
}

/// The engines in the simulator's ready line.
fn ready_engines(line: &str) -> Result<Vec<EngineAddrs>, String> {
    let ready: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| format!("printed `{}`, not its ready line: {e}", line.trim()))?;
    let text = |e: &serde_json::Value, field: &str| e[field].as_str().map(str::to_string);
    let engines: Vec<EngineAddrs> = ready["engines"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| {
                    Some(EngineAddrs {
                        http: text(e, "http")?,
                        kv_events: text(e, "kv_events"),
                        kv_replay: text(e, "kv_replay"),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    if engines.is_empty() {
        return Err(format!("no engines in its ready line `{}`", line.trim()));
    }
    Ok(engines)
}

/// A child process whose stdout and stderr go to a log file, named in errors about it.
pub struct Logged {
    pub child: Child,
    pub pid: u32,
    pub log: LogFile,
    /// Which process it is, for messages: `agent-precise-2`, `sglang-router cache_aware`.
    pub name: String,
    /// The task copying a piped stdout into the log, when there is one.
    copy: Option<tokio::task::JoinHandle<()>>,
}

// === impl Logged ===

impl Logged {
    /// Ok while it runs; once it has exited, an error with its status and the end of its log.
    pub fn check_running(&mut self) -> Result<(), Error> {
        match self.child.0.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.failed(&format!("exited early ({status})"))),
            Err(e) => Err(self.failed(&format!("cannot be waited for ({e})"))),
        }
    }

    /// Waits for it to exit and for all it printed to be in its log.
    pub async fn exited(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let status = self.child.0.wait().await?;
        if let Some(copy) = self.copy.take() {
            // A copy task that panicked has lost only log lines.
            let _ = copy.await;
        }
        Ok(status)
    }

    /// SIGTERM, then waits up to `within` for it to exit and its output to be in its log
    /// (it is killed when dropped if it has not).
    pub async fn stop(&mut self, within: std::time::Duration) {
        self.child.terminate();
        let _ = tokio::time::timeout(within, self.exited()).await;
    }

    /// An error about this process: its name, `what`, the end of its log.
    pub fn failed(&self, what: &str) -> Error {
        Error::Setup(format!("{} {what}{}", self.name, self.log.quote()))
    }
}

/// Spawns `command` with stdin closed and stderr (and stdout unless `pipe_stdout`) into
/// `log`; killed when dropped.
pub fn spawn_logged(
    command: &mut tokio::process::Command,
    name: &str,
    log: LogFile,
    pipe_stdout: bool,
) -> Result<Logged, Error> {
    let stdout = if pipe_stdout {
        Stdio::piped()
    } else {
        log.stdio()?
    };
    let child = command
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(log.stdio()?)
        // Log files are read as text: no colour codes (tracing-subscriber honours NO_COLOR).
        .env("NO_COLOR", "1")
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| Error::Io {
            what: format!("start {name} ({:?})", command.as_std().get_program()),
            source,
        })?;
    let child = Child(child);
    let pid = child
        .0
        .id()
        .ok_or_else(|| Error::Setup(format!("{name} exited at once")))?;
    Ok(Logged {
        child,
        pid,
        log,
        name: name.to_string(),
        copy: None,
    })
}

/// Polls `url` until it answers 2xx, for at most `within`; fails at once, quoting its log,
/// when `process` exits first.
pub(crate) async fn wait_child_ready(
    process: &mut Logged,
    client: &reqwest::Client,
    url: &str,
    within: std::time::Duration,
) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        process.check_running()?;
        if client
            .get(url)
            .timeout(std::time::Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(process.failed(&format!("did not answer {url} within {within:?}")));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "warmpath-bench-process-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn sh(script: &str) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("/bin/sh");
        c.args(["-c", script]);
        c
    }

    #[tokio::test]
    async fn an_early_exit_quotes_the_end_of_the_log() {
        let out = scratch("exit");
        let logs = Logs::create(&out).unwrap();
        let script =
            "i=0; while [ $i -lt 30 ]; do echo out $i; i=$((i+1)); done; echo oops >&2; exit 3";
        let mut p = spawn_logged(
            &mut sh(script),
            "agent-x-0",
            logs.open("agent-x").unwrap(),
            false,
        )
        .unwrap();
        assert!(!p.exited().await.unwrap().success());
        let msg = p.check_running().unwrap_err().to_string();
        let path = out.join("logs").join("agent-x-0.log");
        assert!(msg.starts_with("agent-x-0 exited early ("), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        // The last 20 lines: out 11 .. out 29 and the stderr line, not the earlier ones.
        assert!(
            msg.contains("out 11\n") && msg.ends_with("out 29\noops"),
            "{msg}"
        );
        assert!(!msg.contains("out 10\n"), "{msg}");
        std::fs::remove_dir_all(&out).unwrap();
    }

    #[tokio::test]
    async fn readiness_fails_at_once_when_the_process_exits() {
        let out = scratch("ready");
        let logs = Logs::create(&out).unwrap();
        let mut p = spawn_logged(
            &mut sh("echo cannot bind; exit 1"),
            "agent-y-0",
            logs.open("agent-y").unwrap(),
            false,
        )
        .unwrap();
        // Nothing listens there (bound, then released); the process's exit ends the wait.
        let url = format!("http://127.0.0.1:{}/ready", free_port().unwrap());
        let client = reqwest::Client::new();
        let within = std::time::Duration::from_secs(600);
        let err = wait_child_ready(&mut p, &client, &url, within)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("exited early") && err.ends_with("cannot bind"),
            "{err}"
        );
        std::fs::remove_dir_all(&out).unwrap();
    }

    #[tokio::test]
    async fn a_fleet_ready_line_is_read_and_the_rest_logged() {
        use std::os::unix::fs::PermissionsExt;
        let out = scratch("fleet");
        let logs = Logs::create(&out).unwrap();
        // Stands in for `warmpath sim`: its ready line, more stdout, some stderr.
        let exe = out.join("fake-sim");
        std::fs::write(
            &exe,
            "#!/bin/sh\necho '{\"ready\":true,\"engines\":[{\"http\":\"127.0.0.1:9\",\"kv_events\":null}]}'\necho later\necho warned >&2\n",
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = logs.open("sim").unwrap();
        let (mut fleet, engines) = spawn_fleet_logged(&exe, &[], 1, "sim-0", log)
            .await
            .unwrap();
        assert_eq!(
            engines,
            [EngineAddrs {
                http: "127.0.0.1:9".into(),
                kv_events: None,
                kv_replay: None
            }]
        );
        assert!(fleet.exited().await.unwrap().success());
        let text = std::fs::read_to_string(out.join("logs").join("sim-0.log")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let at = |l: &str| lines.iter().position(|x| x.starts_with(l));
        // stdout in its order; stderr, written directly, anywhere among it.
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            at("{\"ready\":true").unwrap() < at("later").unwrap(),
            "{text}"
        );
        assert!(at("warned").is_some(), "{text}");
        std::fs::remove_dir_all(&out).unwrap();
    }

    #[tokio::test]
    async fn a_fleet_that_prints_no_ready_line_is_an_error_with_its_log() {
        let out = scratch("noready");
        let logs = Logs::create(&out).unwrap();
        let exe = std::path::Path::new("/bin/false");
        let log = logs.open("sim").unwrap();
        let err = spawn_fleet_logged(exe, &[], 1, "sim-0", log)
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("sim-0 "), "{err}");
        assert!(err.contains("is empty"), "{err}");
        std::fs::remove_dir_all(&out).unwrap();
    }
}
