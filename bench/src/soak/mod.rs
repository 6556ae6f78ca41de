//! `warmpath bench soak`: steady mixed load through a real agent (its own process) in front
//! of simulator fleets, watching the agent's resident memory and file descriptors; then
//! many idle streams held at once, to measure what one costs.
//!
//! Processes, all on loopback: a fleet of `--replicas` engines with KV events; one more
//! engine in its own process (the failing endpoint: 5 % of its answers are 500s, and it is
//! killed with SIGKILL every `--fail-every-seconds` and started again on the same ports
//! after `--down-seconds`); an engine that stalls every stream after its first token (model
//! `sim-idle`, its own pool); the agent, from a config file with those two pools. The load
//! ([`load`]) runs for `--minutes`, bounded in count by `--max-requests`; RSS and
//! descriptors are sampled every `--sample-seconds`; the figures ([`report`]) compare the end
//! with the end of warm-up.

mod idle;
mod load;
mod procfs;
mod report;

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

pub use idle::IdleReport;
pub use load::Counts;
pub use procfs::Fds;
pub use report::{Growth, Sample, SoakReport, render};

use warmpath_agent::pool::UpstreamProtocol;

use super::{
    Error,
    logs::Logs,
    process::{EngineAddrs, Logged, free_port, self_exe, spawn_exe, spawn_fleet, wait_child_ready},
};

/// The failing endpoint's role in log file names.
const FLAKY: &str = "sim-flaky";

/// Attempts at starting the failing endpoint again before the soak gives up.
const RESTART_TRIES: u32 = 10;

/// Options of `warmpath bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// Minutes of load.
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Seconds at the start of the load that are warm-up (default: a fifth of the load, 10
    /// to 60 s); memory is compared with its end.
    #[arg(long)]
    pub warmup_seconds: Option<f64>,
    /// Requests per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Requests in flight at most (more are not sent, and counted as shed).
    #[arg(long, default_value_t = 64)]
    pub max_in_flight: usize,
    /// Requests sent at most (default: the rate times the load's seconds).
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// Engines of the main fleet (plus the failing one).
    #[arg(long, default_value_t = 4)]
    pub replicas: u16,
    /// Documents the prompts are about, each asked `--questions` questions (the prompts
    /// cycle over these).
    #[arg(long, default_value_t = 20)]
    pub documents: usize,
    /// Tokens per document (about: 3.85 characters each).
    #[arg(long, default_value_t = 4000)]
    pub document_tokens: usize,
    #[arg(long, default_value_t = 10)]
    pub questions: usize,
    /// Seconds between kills of the failing endpoint (0: never killed).
    #[arg(long, default_value_t = 20.0)]
    pub fail_every_seconds: f64,
    /// Seconds the failing endpoint stays down.
    #[arg(long, default_value_t = 5.0)]
    pub down_seconds: f64,
    /// Idle streams held at once after the load (0: none).
    #[arg(long, default_value_t = 10_000)]
    pub idle_streams: usize,
    /// How the agent talks to the stalling engine: `h2` (h2c: the streams multiplexed over
    /// a few connections, one descriptor per stream in the agent) or `http1` (an engine
    /// connection per stream: two descriptors per stream).
    #[arg(long, value_enum, default_value_t = UpstreamProtocol::H2)]
    pub idle_upstream: UpstreamProtocol,
    #[arg(long, default_value_t = 1.0)]
    pub sample_seconds: f64,
    /// The agent's data-path threads (default: its own).
    #[arg(long)]
    pub workers: Option<usize>,
    /// The `warmpath` executable the agent and simulators run from (default: this one).
    #[arg(long)]
    pub exe: Option<PathBuf>,
    /// Write the report (with every sample) as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Where the processes it starts (simulators, the agent) write their output:
    /// `<DIR>/logs/<role>-<n>.log` (default: `warmpath-bench/soak` in the system's temporary
    /// directory).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Exit with an error when a goal is not met (memory growth, flatness, descriptors).
    #[arg(long)]
    pub check: bool,
}

impl SoakArgs {
    fn load_seconds(&self) -> f64 {
        (self.minutes * 60.0).max(1.0)
    }

    fn out_dir(&self) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| super::logs::default_out("soak"))
    }

    fn warmup(&self) -> f64 {
        self.warmup_seconds
            .unwrap_or_else(|| (self.load_seconds() / 5.0).clamp(10.0, 60.0))
            .min(self.load_seconds() / 2.0)
    }
}

/// Runs the soak, prints its table, writes its JSON.
pub async fn run(args: SoakArgs) -> Result<(), Error> {
    let report = soak(&args).await?;
    println!("{}", report::render(&report));
    println!("logs: {}", args.out_dir().join("logs").display());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::Setup(format!("report JSON: {e}")))?;
        std::fs::write(path, json).map_err(|source| Error::Io {
            what: format!("write {}", path.display()),
            source,
        })?;
    }
    let met = report.growth.is_some_and(|g| g.met()) && report.fds_back();
    if args.check && !met {
        return Err(Error::Setup("bench soak: a goal was not met".into()));
    }
    Ok(())
}

/// Runs the soak and returns what it measured. Every process it starts is stopped when it
/// returns, also on error.
pub async fn soak(args: &SoakArgs) -> Result<SoakReport, Error> {
    let idle_streams = raise_nofile(args.idle_streams, idle::fds_per_stream(args.idle_upstream));
    let exe = match &args.exe {
        Some(p) => p.clone(),
        None => self_exe()?,
    };
    let logs = Logs::create(&args.out_dir())?;
    let fleet_flags: Vec<String> = [
        "--port",
        "0",
        "--replicas",
        &args.replicas.max(1).to_string(),
        "--kv-events-port",
        "0",
        "--kv-replay-port",
        "0",
        "--profile",
        "tiny",
        "--num-gpu-blocks",
        "8192",
        "--seed",
        "7",
    ]
    .map(String::from)
    .to_vec();
    let (_fleet, engines) = spawn_fleet(&exe, &fleet_flags, 2, "sim", &logs).await?;
    let mut flaky = Flaky::start(exe.clone(), logs.clone()).await?;
    let stall_flags: Vec<String> = [
        "--model",
        idle::IDLE_MODEL,
        "--port",
        "0",
        "--profile",
        "tiny",
        "--fault-stall-after-tokens",
        "1",
        "--num-gpu-blocks",
        "16384",
        "--replicas",
        &idle::stall_engines(idle_streams, args.idle_upstream).to_string(),
    ]
    .map(String::from)
    .to_vec();
    let (_stall, stall) = spawn_fleet(&exe, &stall_flags, 1, "sim-stall", &logs).await?;
    let mut all = engines.clone();
    all.push(flaky.addrs.clone());
    let agent = Agent::start(&exe, &all, &stall, args.idle_upstream, args.workers, &logs).await?;
    let target = idle::Target {
        pid: agent.pid,
        listen: agent.listen,
        engine_ports: all.iter().chain(&stall).filter_map(port).collect(),
    };
    let fds_cold = procfs::fds(agent.pid, agent.listen.port(), &target.engine_ports)
        .ok_or_else(|| Error::Setup("the agent exited".into()))?;

    let load = Arc::new(load::Load::new(
        format!("http://{}", agent.listen),
        args.documents,
        (args.document_tokens as f64 * 3.85) as usize,
        args.questions,
    )?);
    let seconds = args.load_seconds();
    let max = args
        .max_requests
        .unwrap_or((args.rate * seconds).ceil() as u64 + 1);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let running = tokio::spawn(load.clone().run(args.rate, args.max_in_flight, end, max));
    let (every, down) = (args_fail(args), args.down_seconds);
    let chaos = tokio::spawn(async move {
        let kills = flaky.chaos(end, every, down).await;
        (flaky, kills)
    });
    let tally = load.tally.clone();
    let samples = sample(
        &target,
        &tally,
        start,
        seconds,
        args.sample_seconds,
        &running,
    )
    .await;
    let _ = running.await;
    // Our keep-alive connections to the agent go too: none of its clients is left.
    drop(load);
    let (flaky, kills) = chaos
        .await
        .map_err(|e| Error::Setup(format!("the failing endpoint's task: {e}")))?;
    let kills = kills?;
    let fds_after = idle::settle(&target, fds_cold).await;
    let idle = match idle_streams {
        0 => None,
        n => Some(idle::measure(&target, n, args.idle_upstream).await),
    };
    drop((flaky, agent));
    let warmup = args.warmup();
    Ok(SoakReport {
        load_seconds: seconds,
        warmup_seconds: warmup,
        rate: args.rate,
        requests: tally.counts(),
        first_unexpected: tally.first_unexpected.lock().ok().and_then(|f| f.clone()),
        endpoint_kills: kills,
        growth: Growth::of(&samples, warmup),
        peak_rss_kib: samples.iter().map(|s| s.rss_kib).max().unwrap_or(0),
        fds_cold,
        fds_peak: samples.iter().map(|s| s.fds.total).max().unwrap_or(0),
        fds_after,
        idle_requested: args.idle_streams,
        idle,
        samples,
    })
}

fn args_fail(args: &SoakArgs) -> Option<Duration> {
    (args.fail_every_seconds > 0.0).then(|| Duration::from_secs_f64(args.fail_every_seconds))
}

fn port(e: &EngineAddrs) -> Option<u16> {
    e.http.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}

/// Samples the agent every `every` seconds while the load runs, with a progress line.
async fn sample(
    target: &idle::Target,
    tally: &load::Tally,
    start: Instant,
    seconds: f64,
    every: f64,
    running: &tokio::task::JoinHandle<()>,
) -> Vec<Sample> {
    let progress = indicatif::ProgressBar::new(seconds.ceil() as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} s {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut tick = tokio::time::interval(Duration::from_secs_f64(every.max(0.1)));
    let mut samples = Vec::new();
    while !running.is_finished() {
        tick.tick().await;
        let (Some(rss_kib), Some(fds)) = (
            procfs::rss_kib(target.pid),
            procfs::fds(target.pid, target.listen.port(), &target.engine_ports),
        ) else {
            break;
        };
        let c = tally.counts();
        let t = start.elapsed().as_secs_f64();
        if t <= seconds {
            samples.push(Sample {
                t,
                rss_kib,
                fds,
                requests: c.sent,
            });
        }
        progress.set_position(t.min(seconds) as u64);
        progress.set_message(format!(
            "RSS {:.1} MB, fds {}, {} requests ({} unexpected), {} shed",
            rss_kib as f64 * 1024.0 / 1e6,
            fds.total,
            c.sent,
            c.unexpected,
            c.shed
        ));
    }
    progress.finish_and_clear();
    samples
}

/// Descriptors the agent needs beside its idle streams: listeners, event sockets, the
/// engine connections its pool kept from the load (about 120 measured).
const FD_RESERVE: u64 = 256;

/// Raises this process's open-file limit (inherited by the processes it starts) so `idle`
/// streams fit: each costs the agent `per_stream` descriptors (its client connection, and
/// over HTTP/1.1 its engine connection), and this process one. Without the privilege to
/// raise the hard limit, as far as it goes. Returns the streams that fit.
fn raise_nofile(idle: usize, per_stream: u64) -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let per_stream = per_stream.max(1);
    let want = per_stream * idle as u64 + FD_RESERVE;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return idle;
    };
    if soft < want
        && setrlimit(Resource::RLIMIT_NOFILE, want, hard.max(want)).is_err()
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(soft, |l| l.0);
    let fit = (soft.saturating_sub(FD_RESERVE) / per_stream) as usize;
    if fit < idle {
        eprintln!(
            "bench soak: the open-file limit ({soft}, hard {hard}) allows {fit} idle streams, not {idle}"
        );
    }
    idle.min(fit)
}

/// The agent under test, stopped when dropped; its config directory removed with it.
struct Agent {
    _child: Logged,
    pid: u32,
    listen: std::net::SocketAddr,
    dir: PathBuf,
}

impl Agent {
    async fn start(
        exe: &std::path::Path,
        engines: &[EngineAddrs],
        stall: &[EngineAddrs],
        stall_protocol: UpstreamProtocol,
        workers: Option<usize>,
        logs: &Logs,
    ) -> Result<Self, Error> {
        let (listen, admin) = (free_port()?, free_port()?);
        let endpoint = |e: &EngineAddrs| serde_json::json!({"url": format!("http://{}", e.http), "kvEvents": e.kv_events, "kvReplay": e.kv_replay});
        let mut proxy = serde_json::Map::new();
        if let Some(w) = workers {
            proxy.insert("workers".into(), w.into());
        }
        let config = serde_json::json!({
            "version": 1,
            "listen": format!("127.0.0.1:{listen}"),
            "admin": format!("127.0.0.1:{admin}"),
            "proxy": proxy,
            "pools": [
                {"name": "main", "model": load::MODEL, "endpoints": engines.iter().map(endpoint).collect::<Vec<_>>()},
                {"name": "idle", "model": idle::IDLE_MODEL, "policy": {"preset": "least-loaded"},
                 "upstreamProtocol": stall_protocol.as_str(),
                 "endpoints": stall.iter().map(|e| serde_json::json!({"url": format!("http://{}", e.http)})).collect::<Vec<_>>()},
            ],
        });
        let dir =
            std::env::temp_dir().join(format!("warmpath-soak-{}-{listen}", std::process::id()));
        let io = |what: String| move |source| Error::Io { what, source };
        std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
        let file = dir.join("agent.json");
        std::fs::write(&file, config.to_string())
            .map_err(io(format!("write {}", file.display())))?;
        let args = [
            "agent".to_string(),
            "--config".into(),
            file.display().to_string(),
        ];
        let mut child = spawn_exe(exe, &args, 1, "agent", logs)?;
        let ready = format!("http://127.0.0.1:{admin}/ready");
        let client = reqwest::Client::new();
        let waited = wait_child_ready(&mut child, &client, &ready, Duration::from_secs(60)).await;
        let agent = Self {
            pid: child.pid,
            _child: child,
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], listen)),
            dir,
        };
        // Its config directory goes (with `agent`) also when it never became ready.
        waited.map(|()| agent)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The failing endpoint: one engine in its own process, on fixed ports so it comes back
/// where the agent expects it.
struct Flaky {
    exe: PathBuf,
    flags: Vec<String>,
    child: Option<Logged>,
    addrs: EngineAddrs,
    logs: Logs,
}

impl Flaky {
    async fn start(exe: PathBuf, logs: Logs) -> Result<Self, Error> {
        let (http, events, replay) = (free_port()?, free_port()?, free_port()?);
        let flags: Vec<String> = [
            "--port",
            &http.to_string(),
            "--kv-events-port",
            &events.to_string(),
            "--kv-replay-port",
            &replay.to_string(),
            "--profile",
            "tiny",
            "--num-gpu-blocks",
            "8192",
            "--seed",
            "8",
            "--fault-error-rate",
            "0.05",
        ]
        .map(String::from)
        .to_vec();
        let (child, engines) = spawn_fleet(&exe, &flags, 1, FLAKY, &logs).await?;
        let addrs = engines
            .into_iter()
            .next()
            .ok_or_else(|| Error::Setup("the failing endpoint has no engine".into()))?;
        Ok(Self {
            exe,
            flags,
            child: Some(child),
            addrs,
            logs,
        })
    }

    /// Until `end`: SIGKILL every `every`, start again after `down`. Returns the kills; the
    /// engine is running when it returns.
    async fn chaos(
        &mut self,
        end: Instant,
        every: Option<Duration>,
        down: f64,
    ) -> Result<u64, Error> {
        let Some(every) = every else { return Ok(0) };
        let down = Duration::from_secs_f64(down.max(0.0));
        let mut kills = 0;
        loop {
            let at = Instant::now() + every;
            if at + down >= end {
                return Ok(kills);
            }
            tokio::time::sleep_until(at.into()).await;
            if let Some(mut flaky) = self.child.take() {
                let _ = flaky.child.0.start_kill();
                let _ = flaky.exited().await;
                kills += 1;
            }
            tokio::time::sleep(down).await;
            self.child = Some(self.restart().await?);
        }
    }

    /// Starts the engine again on its ports (a few tries: they may take a moment to free).
    async fn restart(&self) -> Result<Logged, Error> {
        let mut tries = 0;
        loop {
            // Each start (and try) in a log of its own: `sim-flaky-<n>.log`.
            match spawn_fleet(&self.exe, &self.flags, 1, FLAKY, &self.logs).await {
                Ok((child, _)) => return Ok(child),
                Err(e) if tries >= RESTART_TRIES => return Err(e),
                Err(_) => tries += 1,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
