//! The client of `bench ebpf`'s request parts, a process of its own so that it can sit in a
//! pod's network namespace and its own cgroup (the kernel programs key on the cgroup of the
//! connecting process): `warmpath bench ebpf-client` (hidden) reads one request per line on
//! stdin and answers each with one line on stdout, one at a time, each request on a new
//! connection (so each passes through connect(), where interception and steering decide).

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::setup::Netns;
use crate::{Error, logs::Logs, run::Completion};

/// Longest request line the client reads (a prompt of a few thousand tokens is ~10 KB).
const MAX_LINE: u64 = 4 << 20;
/// Longest one request may take before the client reports it failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Options of the hidden `bench ebpf-client`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// cgroup v2 directory this process moves itself into before anything else.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
}

/// One request to make.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ask {
    pub url: String,
    pub prompt: String,
    pub max_tokens: usize,
    pub stream: bool,
}

/// How it went (seconds).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Answer {
    pub ok: bool,
    pub ttft: f64,
    pub e2e: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// The client role's main loop: until stdin closes.
pub async fn run(args: ClientArgs) -> Result<(), Error> {
    if let Some(dir) = &args.cgroup {
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).map_err(
            |source| Error::Io {
                what: format!("move into {}", dir.display()),
                source,
            },
        )?;
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .tcp_nodelay(true)
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| Error::Setup(format!("HTTP client: {e}")))?;
    let mut input = BufReader::new(tokio::io::stdin());
    let mut out = tokio::io::stdout();
    let io = |what: &str| {
        let what = what.to_string();
        move |source| Error::Io { what, source }
    };
    loop {
        let mut line = String::new();
        let n = (&mut input)
            .take(MAX_LINE)
            .read_line(&mut line)
            .await
            .map_err(io("read a request"))?;
        if n == 0 {
            return Ok(());
        }
        let ask: Ask =
            serde_json::from_str(&line).map_err(|e| Error::Setup(format!("request line: {e}")))?;
        let req = Completion {
            client: &client,
            url: &ask.url,
            model: warmpath_sim::cli::DEFAULT_MODEL,
            prompt: &ask.prompt,
            max_tokens: ask.max_tokens,
            header: None,
        };
        let sample = if ask.stream {
            req.stream().await
        } else {
            req.whole().await
        };
        let answer = sample.map_or_else(Answer::default, |(s, _)| Answer {
            ok: s.ok,
            ttft: s.ttft,
            e2e: s.e2e,
            prompt_tokens: s.prompt_tokens,
            cached_tokens: s.cached_tokens,
        });
        let mut text = serde_json::to_string(&answer)
            .map_err(|e| Error::Setup(format!("answer line: {e}")))?;
        text.push('\n');
        out.write_all(text.as_bytes())
            .await
            .map_err(io("write an answer"))?;
        out.flush().await.map_err(io("write an answer"))?;
    }
}

// === the parent's side ===

/// A running client (killed when dropped).
/// A client role of this binary started in a pod's network namespace ([`spawn_in_pod`]).
pub(crate) struct PodChild {
    pub child: tokio::process::Child,
    pub stdin: tokio::process::ChildStdin,
    pub stdout: tokio::process::ChildStdout,
    /// Its log's name, for errors.
    pub name: String,
    pub log: std::path::PathBuf,
}

/// `warmpath bench SUBCOMMAND --cgroup CGROUP` (a client role of this binary) in the network
/// namespace at `netns` (`nsenter --net`), one worker thread, piped stdin and stdout, stderr
/// in the next `<role>-<n>.log`; killed when dropped.
pub(crate) fn spawn_in_pod(
    netns: &std::path::Path,
    subcommand: &str,
    cgroup: &std::path::Path,
    role: &str,
    logs: &Logs,
) -> Result<PodChild, Error> {
    let log = logs.open(role)?;
    let name = log.name();
    let mut cmd = tokio::process::Command::new("nsenter");
    cmd.arg(format!("--net={}", netns.display()))
        .arg("--")
        .arg(crate::process::self_exe()?)
        .args(["bench", subcommand, "--cgroup"])
        .arg(cgroup)
        .env("TOKIO_WORKER_THREADS", "1")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(log.stdio()?)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| Error::Io {
        what: format!("start {name}"),
        source,
    })?;
    let missing = || Error::Setup(format!("{name}: no pipes"));
    let stdin = child.stdin.take().ok_or_else(missing)?;
    let stdout = child.stdout.take().ok_or_else(missing)?;
    Ok(PodChild {
        child,
        stdin,
        stdout,
        name,
        log: log.path,
    })
}

pub struct Client {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    name: String,
}

impl Client {
    /// This binary's client role in `ns`, moving itself into `cgroup`; stderr in the next
    /// `<role>-<n>.log`.
    pub fn start(
        ns: &Netns,
        cgroup: &std::path::Path,
        role: &str,
        logs: &Logs,
    ) -> Result<Self, Error> {
        let PodChild {
            child,
            stdin,
            stdout,
            name,
            ..
        } = spawn_in_pod(&ns.path(), "ebpf-client", cgroup, role, logs)?;
        Ok(Self {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            name,
        })
    }

    /// Makes one request and waits (at most the client's own timeout and a margin) for how
    /// it went.
    pub async fn ask(&mut self, ask: &Ask) -> Result<Answer, Error> {
        let mut line =
            serde_json::to_string(ask).map_err(|e| Error::Setup(format!("request line: {e}")))?;
        line.push('\n');
        let gone = |what: &str| Error::Setup(format!("{} {what}", self.name));
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| gone(&format!("took no request: {e}")))?;
        let within = REQUEST_TIMEOUT + Duration::from_secs(10);
        let answer = tokio::time::timeout(within, self.lines.next_line())
            .await
            .map_err(|_| gone("did not answer"))?
            .map_err(|e| gone(&format!("answer: {e}")))?
            .ok_or_else(|| gone("exited"))?;
        serde_json::from_str(&answer).map_err(|e| gone(&format!("answered `{answer}`: {e}")))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
