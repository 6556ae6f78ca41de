//! Child processes of the benchmarks: this binary in another role (`warmpath sim`, `warmpath
//! agent`) or a peer (nginx), stopped when dropped.

use std::{path::Path, process::Stdio};

use tokio::io::{AsyncBufReadExt, BufReader};

use super::Error;

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

/// A free loopback port (bound, then released).
pub fn free_port() -> Result<u16, Error> {
    let io = |source| Error::Io {
        what: "bind 127.0.0.1:0".into(),
        source,
    };
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

/// Runs this binary with `args` and `worker_threads` tokio workers; returns it and its pid.
pub async fn spawn_self(args: &[String], worker_threads: usize) -> Result<(Child, u32), Error> {
    spawn_exe(&self_exe()?, args, worker_threads).await
}

/// Runs `exe` (a `warmpath` binary) with `args` and `worker_threads` tokio workers; returns
/// it and its pid.
pub async fn spawn_exe(
    exe: &Path,
    args: &[String],
    worker_threads: usize,
) -> Result<(Child, u32), Error> {
    let child = tokio::process::Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .env("TOKIO_WORKER_THREADS", worker_threads.to_string())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| Error::Io {
            what: format!("start warmpath {args:?}"),
            source,
        })?;
    let pid = child
        .id()
        .ok_or_else(|| Error::Setup(format!("warmpath {args:?} exited at once")))?;
    Ok((Child(child), pid))
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

/// Starts `warmpath sim <flags>` and waits for its ready line; returns the process, its pid
/// and the HTTP addresses of its engines.
pub async fn spawn_sim(
    flags: &[String],
    worker_threads: usize,
) -> Result<(Child, u32, Vec<String>), Error> {
    let (child, pid, engines) = spawn_fleet(&self_exe()?, flags, worker_threads).await?;
    Ok((child, pid, engines.into_iter().map(|e| e.http).collect()))
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

/// Starts `exe sim <flags>` and waits for its ready line; returns the process, its pid and
/// its engines' addresses.
pub async fn spawn_fleet(
    exe: &Path,
    flags: &[String],
    worker_threads: usize,
) -> Result<(Child, u32, Vec<EngineAddrs>), Error> {
    let mut args = vec!["sim".to_string()];
    args.extend_from_slice(flags);
    let (mut child, pid) = spawn_exe(exe, &args, worker_threads).await?;
    let stdout = child
        .0
        .stdout
        .take()
        .ok_or_else(|| Error::Setup("no simulator stdout".into()))?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .await
        .map_err(|source| Error::Io {
            what: "read the simulator's ready line".into(),
            source,
        })?;
    let ready: serde_json::Value = serde_json::from_str(&line)
        .map_err(|e| Error::Setup(format!("simulator ready line `{}`: {e}", line.trim())))?;
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
        return Err(Error::Setup(format!("no engines in `{}`", line.trim())));
    }
    Ok((child, pid, engines))
}

/// Polls `url` until it answers 2xx, for at most `within` (a debug build starts slowly).
pub(crate) async fn wait_ready(
    client: &reqwest::Client,
    url: &str,
    within: std::time::Duration,
) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Err(Error::Setup(format!("{url} never became ready")))
}
