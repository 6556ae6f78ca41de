//! The intercepted row's load generator, a process of its own so that it sits where a client
//! pod does: in a pod's network namespace and a cgroup of its own (the kernel programs key
//! on the cgroup of the process that connects). `warmpath bench compare-client` (hidden)
//! moves itself into its cgroup, reads its job — its node's chains of the row's plan and the
//! Service URL its users dial — as one JSON line, says it is ready, and on `go` sends the
//! chains exactly as the other rows' in-process driver does ([`run_chain`]), printing one
//! line per request done and, last, every answered request's sample.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::{
    Chain, Error, Phase, Setup,
    drive::{Times, node_of_chain, run_chain},
};
use crate::{logs::Logs, run::report::Sample};

/// Longest job line: the row's plan (the demo's 512 prompts of ~8 KB are ~4 MB).
const MAX_JOB_LINE: u64 = 256 << 20;
/// Longest line a client prints (its samples, ~300 B each).
const MAX_EVENT_LINE: u64 = 64 << 20;
/// How long a client may take to read its job and say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// Beyond `--max-seconds`: how long a client may take to send its samples after its last
/// request ended.
const FINISH_MARGIN: Duration = Duration::from_secs(30);
/// How long a client that sent its samples may take to exit.
const EXIT_WITHIN: Duration = Duration::from_secs(5);

/// Options of the hidden `bench compare-client`.
#[derive(Debug, Clone, clap::Args)]
pub struct PodClientArgs {
    /// cgroup v2 directory this process moves itself into before anything else.
    #[arg(long)]
    pub cgroup: PathBuf,
}

/// What one client sends.
#[derive(Debug, Serialize, Deserialize)]
struct Job {
    url: String,
    chains: Vec<Chain>,
    time_scale: f64,
    max_seconds: f64,
}

/// One line from a client.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Event {
    /// Job read, HTTP client built: waiting for `go`.
    Ready,
    /// One more request done (answered, failed or out of time).
    Sent,
    /// Every chain's answered requests, in job order, and the wall seconds from `go`.
    Finished {
        wall_s: f64,
        samples: Vec<Vec<Sample>>,
    },
}

/// The client role: one job, then exit.
pub async fn run(args: PodClientArgs) -> Result<(), Error> {
    std::fs::write(
        args.cgroup.join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .map_err(|source| Error::Io {
        what: format!("move into {}", args.cgroup.display()),
        source,
    })?;
    let mut input = BufReader::new(tokio::io::stdin());
    let line = read_line(&mut input, MAX_JOB_LINE)
        .await?
        .ok_or_else(|| Error::Setup("no job on stdin".into()))?;
    let job: Job =
        serde_json::from_str(&line).map_err(|e| Error::Setup(format!("job line: {e}")))?;
    // As the other rows' driver (`drive::http_client`), and never through a proxy from the
    // environment: the VIP exists only in the pod's namespace.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .no_proxy()
        .build()
        .map_err(|e| Error::Setup(format!("HTTP client: {e}")))?;
    let mut out = tokio::io::stdout();
    write_event(&mut out, &Event::Ready).await?;
    let go = read_line(&mut input, 64).await?;
    if go.as_deref().map(str::trim) != Some("go") {
        return Err(Error::Setup(format!("expected `go`, read {go:?}")));
    }
    let start = tokio::time::Instant::now();
    let times = Times {
        start,
        deadline: start + Duration::from_secs_f64(job.max_seconds.max(0.0)),
        scale: job.time_scale,
    };
    let (tx, mut sent) = tokio::sync::mpsc::unbounded_channel::<()>();
    let tasks: Vec<_> = job
        .chains
        .into_iter()
        .map(|chain| {
            let (client, url, tx) = (client.clone(), job.url.clone(), tx.clone());
            tokio::spawn(async move {
                run_chain(&client, &url, &chain, times, || {
                    let _ = tx.send(());
                })
                .await
            })
        })
        .collect();
    drop(tx);
    // Ends when every chain has ended (each held a sender).
    while sent.recv().await.is_some() {
        write_event(&mut out, &Event::Sent).await?;
    }
    let mut samples = Vec::with_capacity(tasks.len());
    for t in tasks {
        samples.push(
            t.await
                .map_err(|e| Error::Setup(format!("a chain's task failed: {e}")))?,
        );
    }
    let wall_s = start.elapsed().as_secs_f64();
    write_event(&mut out, &Event::Finished { wall_s, samples }).await
}

/// One line of at most `max` bytes; `None` at the end of input.
async fn read_line(
    input: &mut (impl AsyncBufRead + Unpin),
    max: u64,
) -> Result<Option<String>, Error> {
    let mut line = String::new();
    let n = input
        .take(max)
        .read_line(&mut line)
        .await
        .map_err(|source| Error::Io {
            what: "read a line".into(),
            source,
        })?;
    Ok((n > 0).then_some(line))
}

async fn write_event(out: &mut tokio::io::Stdout, event: &Event) -> Result<(), Error> {
    let mut text =
        serde_json::to_string(event).map_err(|e| Error::Setup(format!("event line: {e}")))?;
    text.push('\n');
    let io = |source| Error::Io {
        what: "write to stdout".into(),
        source,
    };
    out.write_all(text.as_bytes()).await.map_err(io)?;
    out.flush().await.map_err(io)
}

// === the parent's side ===

/// A running client (killed when dropped).
#[derive(Debug)]
pub(super) struct PodClient {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    out: BufReader<tokio::process::ChildStdout>,
    name: String,
    log: PathBuf,
}

impl PodClient {
    /// This binary's client role in the network namespace at `netns` (`nsenter --net`),
    /// moving itself into `cgroup`; its stderr in the next `<role>-<n>.log`.
    pub(super) fn start(
        netns: &std::path::Path,
        cgroup: &std::path::Path,
        role: &str,
        logs: &Logs,
    ) -> Result<Self, Error> {
        let crate::ebpf::client::PodChild {
            child,
            stdin,
            stdout,
            name,
            log,
        } = crate::ebpf::client::spawn_in_pod(netns, "compare-client", cgroup, role, logs)?;
        Ok(Self {
            child,
            stdin,
            out: BufReader::new(stdout),
            name,
            log,
        })
    }

    fn failed(&self, what: &str) -> Error {
        Error::Setup(format!(
            "{} {what} (its log: {})",
            self.name,
            self.log.display()
        ))
    }

    async fn send(&mut self, line: &str) -> Result<(), Error> {
        let mut text = line.to_string();
        text.push('\n');
        match self.stdin.write_all(text.as_bytes()).await {
            Ok(()) => self
                .stdin
                .flush()
                .await
                .map_err(|e| self.failed(&format!("took no input: {e}"))),
            Err(e) => Err(self.failed(&format!("took no input: {e}"))),
        }
    }

    /// Its next line, by `until`.
    async fn event(&mut self, until: tokio::time::Instant) -> Result<Event, Error> {
        let line = tokio::time::timeout_at(until, read_line(&mut self.out, MAX_EVENT_LINE))
            .await
            .map_err(|_| self.failed("did not answer in time"))??
            .ok_or_else(|| self.failed("exited early"))?;
        serde_json::from_str(&line).map_err(|e| self.failed(&format!("printed `{line}`: {e}")))
    }

    /// Waits (bounded) for it to exit after its last line.
    async fn exited(&mut self) {
        if tokio::time::timeout(EXIT_WITHIN, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
        }
    }
}

/// Sends `plan` through `clients`, client `n` sending the chains of node `n` (users are
/// pinned to nodes as in the other rows) to `url`, all starting at the same moment; each
/// client's answered requests and the longest client's wall seconds.
pub(super) async fn drive(
    clients: &mut [PodClient],
    plan: &[Chain],
    url: &str,
    args: &Setup,
    phase: &Phase,
) -> Result<(Vec<Vec<Sample>>, f64), Error> {
    let nodes = clients.len();
    let mut jobs: Vec<Vec<Chain>> = vec![Vec::new(); nodes];
    for chain in plan {
        jobs[node_of_chain(chain, nodes)].push(chain.clone());
    }
    let turns: Vec<usize> = jobs
        .iter()
        .map(|j| j.iter().map(|c| c.turns.len()).sum())
        .collect();
    for (client, chains) in clients.iter_mut().zip(jobs) {
        let job = Job {
            url: url.to_string(),
            chains,
            time_scale: args.time_scale,
            max_seconds: args.max_seconds,
        };
        let line = serde_json::to_string(&job).map_err(|e| Error::Setup(e.to_string()))?;
        client.send(&line).await?;
    }
    let ready_by = tokio::time::Instant::now() + READY_WITHIN;
    for client in clients.iter_mut() {
        match client.event(ready_by).await? {
            Event::Ready => {}
            other => return Err(client.failed(&format!("sent {other:?} before it was ready"))),
        }
    }
    for client in clients.iter_mut() {
        client.send("go").await?;
    }
    let finish_by =
        tokio::time::Instant::now() + Duration::from_secs_f64(args.max_seconds) + FINISH_MARGIN;
    let runs = clients
        .iter_mut()
        .zip(turns)
        .map(|(client, turns)| async move {
            // At most one line per request, then the samples.
            for _ in 0..=turns {
                match client.event(finish_by).await? {
                    Event::Sent => phase.inc(),
                    Event::Finished { wall_s, samples } => {
                        client.exited().await;
                        return Ok((wall_s, samples.into_iter().flatten().collect::<Vec<_>>()));
                    }
                    Event::Ready => return Err(client.failed("said it was ready twice")),
                }
            }
            Err(client.failed(&format!("sent more than its {turns} requests")))
        });
    let done = futures::future::try_join_all(runs).await?;
    let wall = done.iter().map(|(w, _)| *w).fold(0.0, f64::max);
    Ok((done.into_iter().map(|(_, s)| s).collect(), wall))
}
