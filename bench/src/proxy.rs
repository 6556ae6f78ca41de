//! `warmpath bench proxy`: what the proxy adds. Latency p50/p99 of small requests direct to a
//! simulator vs through `warmpath agent` (and nginx as a plain L7 proxy, when installed),
//! requests/s per proxy core, and the routing decision's cost including tokenization of a
//! long chat prompt. Sim, agent and nginx run as separate processes; all on loopback.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use super::{
    Error,
    logs::Logs,
    proc_stat,
    process::{
        Logged, fleet_flags, free_port, self_exe, spawn_exe, spawn_logged, spawn_sim,
        wait_child_ready,
    },
    run::report::duration_quantiles,
};
use clap::Args;

/// How long a process of the bench may take to answer its readiness probe.
const READY_WITHIN: Duration = Duration::from_secs(5);

/// Options of `warmpath bench proxy`.
#[derive(Debug, Clone, Args)]
pub struct ProxyBenchArgs {
    /// Sequential requests per target and kind for the latency figures.
    #[arg(long, default_value_t = 3000)]
    pub requests: usize,
    /// Concurrent clients for the throughput figure.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Seconds of throughput runs per proxy, split over `--rounds`.
    #[arg(long, default_value_t = 8.0)]
    pub duration_s: f64,
    /// Throughput rounds: every proxy runs once per round, interleaved, so a noisy
    /// neighbour's burst lands on all of them alike; figures add up the rounds.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// Tokens of the chat prompt in the decision benchmark.
    #[arg(long, default_value_t = 8192)]
    pub chat_tokens: usize,
    /// Only the routing-decision benchmark (no processes started).
    #[arg(long)]
    pub decision_only: bool,
    /// Where the processes it starts (simulator, agents, nginx, peer routers) write their
    /// output: `<DIR>/logs/<role>-<n>.log` (default: `warmpath-bench/proxy` in the system's
    /// temporary directory).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// A target of the latency and throughput runs.
struct Target {
    name: &'static str,
    base: String,
    pid: Option<u32>,
}

/// `warmpath agent` (one data-path thread, one runtime thread for the rest) in front of the simulator at `sim_addr`, with
/// `extra` flags, once ready: (process, pid, listen port).
async fn start_agent(
    client: &reqwest::Client,
    sim_addr: &str,
    extra: &[&str],
    logs: &Logs,
) -> Result<(Logged, u16), Error> {
    let (listen, admin) = (free_port()?, free_port()?);
    let mut args: Vec<String> = [
        "agent".to_string(),
        "--listen".into(),
        format!("127.0.0.1:{listen}"),
        "--admin".into(),
        format!("127.0.0.1:{admin}"),
        "--endpoint".into(),
        format!("http://{sim_addr}"),
        // One data-path thread: figures per core.
        "--workers".into(),
        "1".into(),
    ]
    .into();
    args.extend(extra.iter().map(|a| a.to_string()));
    let mut agent = spawn_exe(&self_exe()?, &args, 1, "agent", logs)?;
    let ready = format!("http://127.0.0.1:{admin}/ready");
    wait_child_ready(&mut agent, client, &ready, READY_WITHIN).await?;
    Ok((agent, listen))
}

pub async fn run(args: ProxyBenchArgs) -> Result<(), Error> {
    if args.decision_only {
        decision(args.chat_tokens);
        return Ok(());
    }
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(256)
        .build()
        .map_err(|e| Error::Setup(e.to_string()))?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| super::logs::default_out("proxy"));
    let logs = Logs::create(&out)?;
    // The simulator answers as fast as it computes: modelled time is scaled to ~nothing.
    let mut flags = fleet_flags(1, "tiny", 0.00001);
    flags.extend(["--max-num-seqs", "1024"].map(String::from));
    let (sim, engines) = spawn_sim(&flags, 1, &logs).await?;
    let (sim_pid, sim_addr) = (sim.pid, engines[0].clone());
    let (agent, listen) = start_agent(&client, &sim_addr, &[], &logs).await?;
    // The same agent speaking h2c to the simulator (one multiplexed connection).
    let h2 = ["--upstream-protocol", "h2"];
    let (agent_h2, listen_h2) = start_agent(&client, &sim_addr, &h2, &logs).await?;
    let (agent_pid, agent_h2_pid) = (agent.pid, agent_h2.pid);
    let _processes = (sim, agent, agent_h2);
    let mut targets = vec![
        Target {
            name: "direct",
            base: format!("http://{sim_addr}"),
            // Its throughput row is the simulator's own (CPU: the simulator's).
            pid: Some(sim_pid),
        },
        Target {
            name: "warmpath",
            base: format!("http://127.0.0.1:{listen}"),
            pid: Some(agent_pid),
        },
        Target {
            name: "warmpath (h2 upstream)",
            base: format!("http://127.0.0.1:{listen_h2}"),
            pid: Some(agent_h2_pid),
        },
    ];
    let _nginx = match nginx(&sim_addr, &logs).await {
        Ok(Some((mut child, port, worker))) => {
            targets.push(Target {
                name: "nginx",
                base: format!("http://127.0.0.1:{port}"),
                pid: Some(worker),
            });
            let health = format!("http://127.0.0.1:{port}/health");
            wait_child_ready(&mut child, &client, &health, READY_WITHIN).await?;
            Some(child)
        }
        Ok(None) => {
            println!("(nginx not installed: `apt-get install nginx-light` adds its row)");
            None
        }
        Err(e) => {
            println!("(nginx did not start: {e})");
            None
        }
    };
    // Peer routers (PyPI wheels) in their cache-aware mode, when installed.
    let mut _peers = Vec::new();
    for peer in [super::peers::PEERS[1], super::peers::PEERS[2]] {
        if !peer.installed() {
            println!(
                "({} not installed: `pip install {}` adds its row)",
                peer.program, peer.program
            );
            continue;
        }
        let worker = super::peers::Worker {
            url: format!("http://{sim_addr}"),
            events: None,
            replay: None,
        };
        match peer
            .start_logged(&[worker], warmpath_sim::cli::DEFAULT_MODEL, &logs)
            .await
        {
            Ok((router, base)) => {
                targets.push(Target {
                    name: peer.program,
                    base,
                    pid: Some(router.pid),
                });
                _peers.push(router);
            }
            Err(e) => println!("({} did not start: {e})", peer.name),
        }
    }

    println!(
        "warmpath bench proxy: {} sequential requests per target and kind, one keep-alive connection each",
        args.requests
    );
    println!();
    println!(
        "| target | non-streaming p50 | p99 | streaming p50 | p99 | added p50 (ns / st) | added p99 (ns / st) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut lat = Vec::new();
    for stream in [false, true] {
        lat.push(latencies(&client, &targets, args.requests, stream).await?);
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (i, t) in targets.iter().enumerate() {
        let (ns, st) = (&lat[0][i], &lat[1][i]);
        let (d_ns, d_st) = (&lat[0][0], &lat[1][0]);
        println!(
            "| {} | {:.0} us | {:.0} us | {:.0} us | {:.0} us | {:+.0} / {:+.0} us | {:+.0} / {:+.0} us |",
            t.name,
            us(ns.0),
            us(ns.1),
            us(st.0),
            us(st.1),
            us(ns.0) - us(d_ns.0),
            us(st.0) - us(d_st.0),
            us(ns.1) - us(d_ns.1),
            us(st.1) - us(d_st.1)
        );
    }
    println!();
    println!(
        "| proxy | concurrency | requests/s | proxy CPU (cores) | requests/s per proxy core | user CPU per request | kernel CPU per request |"
    );
    println!("|---|---|---|---|---|---|---|");
    let measured: Vec<&Target> = targets.iter().filter(|t| t.pid.is_some()).collect();
    let rounds = args.rounds.max(1);
    let mut per_round: Vec<Vec<Throughput>> = measured.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (t, runs) in measured.iter().zip(&mut per_round) {
            let secs = args.duration_s / rounds as f64;
            runs.push(throughput(&client, t, args.concurrency, secs).await);
        }
    }
    let totals: Vec<Throughput> = per_round
        .iter()
        .map(|runs| {
            let mut total = Throughput::default();
            runs.iter().for_each(|r| total.add(r));
            total
        })
        .collect();
    for (t, r) in measured.iter().zip(&totals) {
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.0} | {:.1} us | {:.1} us |",
            t.name,
            args.concurrency,
            r.requests / r.wall,
            (r.user + r.system) / r.wall,
            r.per_core(),
            r.user / r.requests.max(1.0) * 1e6,
            r.system / r.requests.max(1.0) * 1e6
        );
    }
    against_nginx(&measured, &per_round);
    decision(args.chat_tokens);
    if let Some(mut nginx) = _nginx {
        // A graceful stop lets the master take its worker down with it.
        nginx.stop(Duration::from_secs(5)).await;
    }
    println!("logs: {}", out.join("logs").display());
    Ok(())
}

/// (p50, p99) per target, requests interleaved across targets so noise hits all alike.
async fn latencies(
    client: &reqwest::Client,
    targets: &[Target],
    n: usize,
    stream: bool,
) -> Result<Vec<(Duration, Duration)>, Error> {
    let body = serde_json::json!({"model": warmpath_sim::cli::DEFAULT_MODEL, "prompt": "hello world", "max_tokens": if stream { 4 } else { 1 }, "stream": stream, "ignore_eos": true});
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(n); targets.len()];
    for i in 0..n + 200 {
        for (t, target) in targets.iter().enumerate() {
            let t0 = Instant::now();
            let resp = client
                .post(format!("{}/v1/completions", target.base))
                .json(&body)
                .send()
                .await
                .map_err(|e| Error::Setup(format!("{}: {e}", target.name)))?;
            let ok = resp.status().is_success();
            resp.bytes()
                .await
                .map_err(|e| Error::Setup(e.to_string()))?;
            if !ok {
                return Err(Error::Setup(format!("{} answered an error", target.name)));
            }
            if i >= 200 {
                samples[t].push(t0.elapsed());
            }
        }
    }
    Ok(samples
        .into_iter()
        .map(|s| {
            let [p50, p99] = duration_quantiles(s, [0.5, 0.99]);
            (p50, p99)
        })
        .collect())
}

/// A throughput run's totals; CPU is the target process's (NaN where unreadable).
#[derive(Debug, Default)]
struct Throughput {
    requests: f64,
    wall: f64,
    /// Seconds of user and kernel CPU the target used.
    user: f64,
    system: f64,
}

impl Throughput {
    fn add(&mut self, other: &Throughput) {
        self.requests += other.requests;
        self.wall += other.wall;
        self.user += other.user;
        self.system += other.system;
    }

    /// Requests per second of the target's CPU (NaN where CPU was unreadable).
    fn per_core(&self) -> f64 {
        self.requests / (self.user + self.system).max(1e-9)
    }
}

/// Each proxy's requests per core over nginx's, round by round. The rounds run the targets
/// back to back, so a round's ratio compares runs that met the same neighbours; the spread
/// of the ratios says whether a difference is more than this machine's noise.
fn against_nginx(measured: &[&Target], per_round: &[Vec<Throughput>]) {
    let Some(nginx) = measured.iter().position(|t| t.name == "nginx") else {
        return;
    };
    println!();
    println!(
        "| proxy | requests per core over nginx's, each round | mean | 95 % interval of the mean |"
    );
    println!("|---|---|---|---|");
    for (t, runs) in measured.iter().zip(per_round) {
        if t.name == "nginx" || t.name == "direct" {
            continue;
        }
        let ratios: Vec<f64> = runs
            .iter()
            .zip(&per_round[nginx])
            .map(|(a, b)| a.per_core() / b.per_core())
            .filter(|r| r.is_finite())
            .collect();
        let Some(summary) = RatioSummary::of(&ratios) else {
            continue;
        };
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let interval = summary.half_width.map_or("-".to_string(), |h| {
            format!("{:.3}-{:.3}x", summary.mean - h, summary.mean + h)
        });
        println!(
            "| {} | {} | {:.3}x | {interval} |",
            t.name,
            each.join(" "),
            summary.mean
        );
    }
}

/// The mean of per-round ratios and the half width of its 95 % confidence interval
/// (Student's t; none from a single round).
#[derive(Debug, Clone, Copy, PartialEq)]
struct RatioSummary {
    mean: f64,
    half_width: Option<f64>,
}

impl RatioSummary {
    fn of(ratios: &[f64]) -> Option<Self> {
        let n = ratios.len();
        if n == 0 {
            return None;
        }
        let mean = ratios.iter().sum::<f64>() / n as f64;
        let half_width = (n > 1).then(|| {
            let var = ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            t975(n - 1) * (var / n as f64).sqrt()
        });
        Some(Self { mean, half_width })
    }
}

/// The 97.5 % quantile of Student's t with `df` degrees of freedom: exact to three places up
/// to 10, then 1.96 + 2.5/df (within 0.015 of the exact value from 11 on).
fn t975(df: usize) -> f64 {
    const TABLE: [f64; 10] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    ];
    match df {
        0 => f64::INFINITY,
        1..=10 => TABLE[df - 1],
        _ => 1.96 + 2.5 / df as f64,
    }
}

/// Closed-loop requests through a proxy for `secs`, and the CPU its process used meanwhile.
async fn throughput(
    client: &reqwest::Client,
    target: &Target,
    concurrency: usize,
    secs: f64,
) -> Throughput {
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let cpu0 = target.pid.and_then(proc_stat::cpu_times);
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, done) = (
                client.clone(),
                format!("{}/v1/completions", target.base),
                done.clone(),
            );
            tokio::spawn(async move {
                let body = serde_json::json!({"model": warmpath_sim::cli::DEFAULT_MODEL, "prompt": "hello world", "max_tokens": 1});
                while Instant::now() < end {
                    if let Ok(r) = client.post(&url).json(&body).send().await
                        && r.bytes().await.is_ok()
                    {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let wall = t0.elapsed().as_secs_f64();
    let (user, system) = match (cpu0, target.pid.and_then(proc_stat::cpu_times)) {
        (Some(a), Some(b)) => (
            b.user.saturating_sub(a.user).as_secs_f64(),
            b.system.saturating_sub(a.system).as_secs_f64(),
        ),
        _ => (f64::NAN, f64::NAN),
    };
    Throughput {
        requests: done.load(Ordering::Relaxed) as f64,
        wall,
        user,
        system,
    }
}

/// nginx in front of the simulator, one worker, upstream keep-alive; (process, port, worker pid).
async fn nginx(sim: &str, logs: &Logs) -> Result<Option<(Logged, u16, u32)>, Error> {
    let Some(bin) = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        return Ok(None);
    };
    let dir = std::env::temp_dir().join(format!("warmpath-bench-nginx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        what: "nginx dir".into(),
        source,
    })?;
    let port = free_port()?;
    let conf = format!(
        "worker_processes 1;\npid {d}/nginx.pid;\nerror_log stderr;\nevents {{ worker_connections 4096; }}\n\
         http {{\n access_log off;\n client_body_temp_path {d};\n proxy_temp_path {d};\n\
         upstream sim {{ server {sim}; keepalive 256; }}\n\
         server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://sim; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }} }}\n}}\n",
        d = dir.display()
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).map_err(|source| Error::Io {
        what: "nginx conf".into(),
        source,
    })?;
    let mut command = tokio::process::Command::new(bin);
    command
        .arg("-c")
        .arg(&conf_path)
        .args(["-g", "daemon off;"]);
    let log = logs.open("nginx")?;
    let name = log.name();
    let child = spawn_logged(&mut command, &name, log, false)?;
    let master = child.pid;
    // Its one worker is the process doing the proxying.
    let mut worker = None;
    for _ in 0..200 {
        if let Ok(children) =
            std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
        {
            worker = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok());
        }
        if worker.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let worker = worker.ok_or_else(|| child.failed("started no worker process"))?;
    Ok(Some((child, port, worker)))
}

/// The routing decision for a long chat prompt: parse, render, tokenize, key, rank.
fn decision(tokens: usize) {
    use warmpath_agent::{
        proxy::request::{Kind, parse},
        routing::{Candidate, EndpointId, Policy, RequestCtx, rank},
    };
    let tok = warmpath_tokenizer::Tokenizer::builtin();
    let text = warmpath_tokenizer::text::TextGen::new(11).text((tokens as f64 * 3.85) as usize);
    let body = serde_json::json!({"model": "m", "messages": [{"role": "system", "content": text}, {"role": "user", "content": "Summarise."}]}).to_string();
    let candidates: Vec<Candidate> = (0..8)
        .map(|i| Candidate {
            id: EndpointId(i),
            affinity: i as u64,
            matched_blocks: i * 10,
            prefix_trusted: true,
            in_flight: 1,
            queued_prefill_blocks: 0,
            kv_usage: 0.0,
            history_blocks: 0,
            lora: warmpath_agent::routing::LoraState::NotApplicable,
            excluded: false,
            timing: Default::default(),
            kv: None,
            idle_for: std::time::Duration::ZERO,
        })
        .collect();
    let rotation = std::sync::atomic::AtomicUsize::new(0);
    let decide = |keys| {
        std::hint::black_box(rank(
            Policy::Precise,
            &RequestCtx {
                keys,
                ..RequestCtx::default()
            },
            &candidates,
            &rotation,
        ));
    };
    let quantiles = |samples: Vec<Duration>| {
        // The first 20 decisions warm caches and are not counted.
        let [p50, p99] = duration_quantiles(samples.into_iter().skip(20), [0.5, 0.99]);
        (p50.as_secs_f64() * 1e6, p99.as_secs_f64() * 1e6)
    };
    let chat_body = |system: &str, user: &str| {
        serde_json::json!({"model": "m", "messages": [{"role": "system", "content": system},
            {"role": "user", "content": user}]})
        .to_string()
    };
    // What the proxy runs: parse, render, tokenize through the segment tokenizer, key, rank.
    let seg = warmpath_tokenizer::segments::SegmentTokenizer::new(std::sync::Arc::new(tok.clone()));
    let agent_decision = |body: &str| {
        let t0 = Instant::now();
        let req = warmpath_agent::proxy::request::Request::read(Kind::Chat, body.as_bytes(), "m")
            .expect("well-formed body");
        let tokens = req.local_tokens(&seg).unwrap_or_default();
        decide(warmpath_agent::kv_index::request_keys(
            &tokens,
            16,
            &req.extras(None),
        ));
        t0.elapsed()
    };
    // 1. Every prompt new (a different 8k-token system prompt each time), through the agent's
    //    tokenizer: the segment cache cannot help, the word cache (warm after the first
    //    prompts, as in steady state) can.
    let bodies: Vec<String> = (0..520u64)
        .map(|i| {
            let system = warmpath_tokenizer::text::TextGen::new(1000 + i)
                .text((tokens as f64 * 3.85) as usize);
            chat_body(&system, "Summarise.")
        })
        .collect();
    let samples: Vec<Duration> = bodies.iter().map(|b| agent_decision(b)).collect();
    let first = samples[0].as_secs_f64() * 1e6;
    let new_prompts = quantiles(samples);
    // 2. The same with the `tokenizers` crate alone (no segment or word cache).
    let mut samples = Vec::with_capacity(520);
    let mut blocks = 0;
    for _ in 0..520 {
        let t0 = Instant::now();
        let parsed = parse(Kind::Chat, body.as_bytes(), "m", &tok, 16).expect("well-formed body");
        blocks = parsed.keys.len();
        decide(parsed.keys);
        samples.push(t0.elapsed());
    }
    let cold = quantiles(samples);
    // 2. The shape prefix caching is for: the same long system prompt, a new user message on
    //    every request; the per-segment cache tokenizes the system prompt once.
    let mut words = warmpath_tokenizer::text::TextGen::new(12);
    let samples: Vec<Duration> = (0..520)
        .map(|_| agent_decision(&chat_body(&text, &words.text(250))))
        .collect();
    let warm = quantiles(samples);
    println!();
    println!("| routing decision | prompt tokens | blocks | p50 | p99 |");
    println!("|---|---|---|---|---|");
    println!(
        "| chat, every prompt new (agent: segment + word caches) | ~{tokens} | {blocks} | {:.0} us | {:.0} us |",
        new_prompts.0, new_prompts.1
    );
    println!(
        "| chat, the very first prompt (empty word cache) | ~{tokens} | {blocks} | {first:.0} us | - |"
    );
    println!(
        "| chat, every prompt new, `tokenizers` crate alone | ~{tokens} | {blocks} | {:.0} us | {:.0} us |",
        cold.0, cold.1
    );
    println!(
        "| chat, shared system prompt + new 64-token user message (segment cache) | ~{} | {blocks} | {:.0} us | {:.0} us |",
        tokens + 64,
        warm.0,
        warm.1
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_summary_gives_the_t_interval_of_the_mean() {
        let s = RatioSummary::of(&[1.0, 1.02, 0.98, 1.0]).unwrap();
        assert!((s.mean - 1.0).abs() < 1e-12);
        // s = sqrt(0.0008 / 3), t(3) = 3.182: half width 3.182 * s / 2.
        let expected = 3.182 * (0.0008f64 / 3.0).sqrt() / 2.0;
        assert!((s.half_width.unwrap() - expected).abs() < 1e-12);
        assert_eq!(
            RatioSummary::of(&[1.1]),
            Some(RatioSummary {
                mean: 1.1,
                half_width: None
            })
        );
        assert_eq!(RatioSummary::of(&[]), None);
    }

    #[test]
    fn t_quantiles_are_close_to_the_exact_ones() {
        // Exact values for 12, 20 and 30 degrees of freedom.
        for (df, exact) in [(12, 2.179), (20, 2.086), (30, 2.042)] {
            assert!((t975(df) - exact).abs() < 0.015, "{df}");
        }
        assert!(t975(1) > t975(2) && t975(10) > t975(11) && t975(11) > 1.96);
    }
}
