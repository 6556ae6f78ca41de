//! `warmpath bench run`: a seeded workload against any OpenAI-compatible endpoint (warmpath,
//! a peer router, a Service, a pod), with a live progress bar, a report (overall, per tenant,
//! per ladder step), a JSON result file and charts (SVG and PNG).

pub mod arrivals;
pub mod mooncake;
pub mod plan;
pub mod report;
pub mod text;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use arrivals::{ArrivalArgs, Schedule};
use futures::StreamExt;
use plan::{Session, WorkloadArgs};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use report::Sample;
use tokio::time::Instant;

use warmpath_agent::http::sse::{self, Piece, Splitter};

use super::Error;

/// Options of `warmpath bench run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Base URL of an OpenAI-compatible endpoint.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub target: String,
    /// Model to ask for (default: the first of the target's /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub arrivals: ArrivalArgs,
    /// Tenant mix, NAME=WEIGHT comma-separated: each session is one tenant's, sent with
    /// --tenant-header (a warmpath agent believes it only from trusted sources).
    #[arg(long, value_delimiter = ',', value_parser = parse_tenant)]
    pub tenants: Vec<(String, f64)>,
    #[arg(long, default_value = "x-warmpath-tenant")]
    pub tenant_header: String,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Stop after this many requests.
    #[arg(long, default_value_t = 10_000)]
    pub max_requests: usize,
    /// Stop after this many seconds (requests in flight are counted as errors).
    #[arg(long, default_value_t = 300.0)]
    pub max_seconds: f64,
    /// Engine /metrics URLs to read prefix-cache hits from (repeatable).
    #[arg(long = "engine-metrics", value_name = "URL")]
    pub engine_metrics: Vec<String>,
    /// YAML with `workload:` and `arrivals:` sections (replacing those flags).
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Chart path stem: STEM-ttft-cdf.svg/.png (and STEM-ladder.svg/.png with --ladder).
    #[arg(long, value_name = "STEM")]
    pub chart: Option<PathBuf>,
    /// Non-streaming requests: each answer arrives whole, so TTFT is the end-to-end time and
    /// there are no inter-token gaps.
    #[arg(long)]
    pub no_stream: bool,
}

fn parse_tenant(s: &str) -> Result<(String, f64), String> {
    let (name, w) = s.split_once('=').unwrap_or((s, "1"));
    let w: f64 = w
        .parse()
        .map_err(|_| format!("`{s}`: expected NAME=WEIGHT"))?;
    if !(w.is_finite() && w > 0.0) {
        return Err(format!("`{s}`: the weight must be > 0"));
    }
    warmpath_agent::tenant::check_name(name)?;
    Ok((name.to_string(), w))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RunFile {
    #[serde(default)]
    workload: WorkloadArgs,
    #[serde(default)]
    arrivals: ArrivalArgs,
}

/// The tenant of each session: a seeded weighted choice.
pub fn assign_tenants(n: usize, mix: &[(String, f64)], seed: u64) -> Vec<String> {
    if mix.is_empty() {
        return vec!["-".into(); n];
    }
    let total: f64 = mix.iter().map(|(_, w)| w).sum();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7e4a);
    (0..n)
        .map(|_| {
            let mut x = rng.random::<f64>() * total;
            for (name, w) in mix {
                if x < *w {
                    return name.clone();
                }
                x -= w;
            }
            mix[mix.len() - 1].0.clone()
        })
        .collect()
}

/// Shared by every session of a run.
struct Ctx {
    client: reqwest::Client,
    url: String,
    model: String,
    tenant_header: Option<String>,
    stream: bool,
    start: Instant,
    deadline: Instant,
    budget: AtomicUsize,
    progress: indicatif::ProgressBar,
}

pub async fn run(args: RunArgs) -> Result<(), Error> {
    let (workload, arrivals) = match &args.file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
                what: format!("read {}", path.display()),
                source,
            })?;
            let f: RunFile = serde_norway::from_str(&text)
                .map_err(|e| Error::Setup(format!("{}: {e}", path.display())))?;
            (f.workload, f.arrivals)
        }
        None => (args.workload.clone(), args.arrivals.clone()),
    };
    let sessions = workload
        .sessions(args.seed)
        .map_err(|e| Error::Setup(e.to_string()))?;
    let tenants = assign_tenants(sessions.len(), &args.tenants, args.seed);
    let schedule = arrivals
        .schedule(&sessions, args.seed)
        .map_err(Error::Setup)?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| Error::Setup(e.to_string()))?;
    let target = args.target.trim_end_matches('/').to_string();
    let model = match &args.model {
        Some(m) => m.clone(),
        None => first_model(&client, &target).await?,
    };
    let planned: usize = sessions
        .iter()
        .map(|s| s.turns.len())
        .sum::<usize>()
        .min(args.max_requests);
    println!(
        "bench run: {:?} workload, {} sessions, {} requests, {} -> {target} (model {model})",
        workload.workload,
        sessions.len(),
        planned,
        match &schedule {
            Schedule::Closed(n) => format!("closed loop x{n}"),
            Schedule::Open(_) if !arrivals.ladder.is_empty() => format!(
                "ladder {:?} req/s x {} s",
                arrivals.ladder, arrivals.step_seconds
            ),
            Schedule::Open(_) if sessions.iter().all(|s| s.at.is_some()) =>
                "trace timestamps".into(),
            Schedule::Open(_) => format!("Poisson {} /s", arrivals.rate),
        }
    );
    let before = engine_prefix(&client, &args.engine_metrics).await;
    let progress = indicatif::ProgressBar::new(planned as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} requests {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        url: format!("{target}/v1/completions"),
        model,
        tenant_header: (!args.tenants.is_empty()).then(|| args.tenant_header.clone()),
        stream: !args.no_stream,
        start,
        deadline: start + Duration::from_secs_f64(args.max_seconds),
        budget: AtomicUsize::new(args.max_requests),
        progress,
    });
    let sessions = Arc::new(sessions);
    let tenants = Arc::new(tenants);
    let mut handles = Vec::new();
    match schedule {
        Schedule::Open(times) => {
            for (i, (at, step)) in times.into_iter().enumerate() {
                let (ctx, sessions, tenants) = (ctx.clone(), sessions.clone(), tenants.clone());
                handles.push(tokio::spawn(async move {
                    if tokio::time::timeout_at(
                        ctx.deadline,
                        tokio::time::sleep_until(ctx.start + at),
                    )
                    .await
                    .is_err()
                    {
                        return Vec::new();
                    }
                    run_session(&ctx, &sessions[i], &tenants[i], step).await
                }));
            }
        }
        Schedule::Closed(n) => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..n {
                let (ctx, sessions, tenants, next) =
                    (ctx.clone(), sessions.clone(), tenants.clone(), next.clone());
                handles.push(tokio::spawn(async move {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= sessions.len() || Instant::now() >= ctx.deadline {
                            return out;
                        }
                        out.extend(run_session(&ctx, &sessions[i], &tenants[i], 0).await);
                    }
                }));
            }
        }
    }
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(
            h.await
                .map_err(|e| Error::Setup(format!("a session task failed: {e}")))?,
        );
    }
    ctx.progress.finish_and_clear();
    let wall = start.elapsed().as_secs_f64();
    let mut rep = report::report(&samples, wall, &arrivals.steps());
    let after = engine_prefix(&client, &args.engine_metrics).await;
    rep.engine_prefix_hit_ratio = match (before, after) {
        (Some((h0, q0)), Some((h1, q1))) if q1 > q0 => Some((h1 - h0) / (q1 - q0)),
        _ => None,
    };
    println!("\n{}", report::render(&rep));
    if let Some(path) = &args.json {
        let json = serde_json::json!({"report": rep, "samples": samples});
        write(
            path,
            &serde_json::to_string_pretty(&json).map_err(|e| Error::Setup(e.to_string()))?,
        )?;
        println!("results: {}", path.display());
    }
    if let Some(stem) = &args.chart {
        let mut ttfts: Vec<f64> = samples.iter().filter(|s| s.ok).map(|s| s.ttft).collect();
        ttfts.sort_by(f64::total_cmp);
        let mut series = vec![("all".to_string(), ttfts)];
        if rep.tenants.len() > 1 {
            for t in rep.tenants.keys() {
                let mut v: Vec<f64> = samples
                    .iter()
                    .filter(|s| s.ok && &s.tenant == t)
                    .map(|s| s.ttft)
                    .collect();
                v.sort_by(f64::total_cmp);
                series.push((format!("tenant {t}"), v));
            }
        }
        for ext in ["svg", "png"] {
            let path = with_suffix(stem, &format!("-ttft-cdf.{ext}"));
            super::chart::ttft_cdf(&path, &series)?;
            println!("chart: {}", path.display());
            if !rep.steps.is_empty() {
                let path = with_suffix(stem, &format!("-ladder.{ext}"));
                let points: Vec<(f64, f64, f64)> = rep
                    .steps
                    .iter()
                    .map(|s| {
                        (
                            s.offered_rate,
                            s.stats.ttft_s.p90,
                            s.stats.output_tokens_per_s,
                        )
                    })
                    .collect();
                super::chart::ladder(&path, &points)?;
                println!("chart: {}", path.display());
            }
        }
    }
    Ok(())
}

fn with_suffix(stem: &std::path::Path, suffix: &str) -> PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn write(path: &std::path::Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        what: format!("write {}", path.display()),
        source,
    })
}

async fn first_model(client: &reqwest::Client, target: &str) -> Result<String, Error> {
    let fail = |e: String| Error::Setup(format!("GET {target}/v1/models: {e} (or pass --model)"));
    let v: serde_json::Value = client
        .get(format!("{target}/v1/models"))
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?
        .json()
        .await
        .map_err(|e| fail(e.to_string()))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| fail("no models listed".into()))
}

/// Summed (hits, queries) of `vllm:prefix_cache_*` over the engines' pages.
async fn engine_prefix(client: &reqwest::Client, pages: &[String]) -> Option<(f64, f64)> {
    if pages.is_empty() {
        return None;
    }
    let mut total = (0.0, 0.0);
    for url in pages {
        let text = client.get(url).send().await.ok()?.text().await.ok()?;
        let sum = |name: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        total.0 += sum("vllm:prefix_cache_hits_total");
        total.1 += sum("vllm:prefix_cache_queries_total");
    }
    Some(total)
}

/// Runs one session's turns in order; the conversation grows with the model's answers.
async fn run_session(ctx: &Ctx, session: &Session, tenant: &str, step: usize) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut context = String::new();
    for turn in &session.turns {
        if !turn.think.is_zero()
            && tokio::time::timeout_at(ctx.deadline, tokio::time::sleep(turn.think))
                .await
                .is_err()
        {
            break;
        }
        if ctx
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
            .is_err()
        {
            break;
        }
        let prompt = if turn.append {
            context.push_str(&turn.text);
            context.clone()
        } else {
            turn.text.clone()
        };
        let sent = ctx.start.elapsed().as_secs_f64();
        let result = tokio::time::timeout_at(
            ctx.deadline,
            one_request(ctx, &prompt, turn.max_tokens, tenant),
        )
        .await;
        let (mut sample, answer) = match result {
            Ok(Some(r)) => r,
            _ => (failed(), String::new()),
        };
        sample.tenant = tenant.to_string();
        sample.step = step;
        sample.start = sent;
        ctx.progress.inc(1);
        let ok = sample.ok;
        out.push(sample);
        if !ok {
            break;
        }
        if turn.append {
            context.push_str(&answer);
        }
    }
    out
}

fn failed() -> Sample {
    Sample {
        tenant: String::new(),
        step: 0,
        ok: false,
        start: 0.0,
        ttft: 0.0,
        e2e: 0.0,
        itl: Vec::new(),
        prompt_tokens: 0,
        cached_tokens: 0,
        output_tokens: 0,
        available_tokens: None,
        captured_tokens: None,
        predicted_ttft_ms: None,
        pod: None,
        held_ms: None,
        session: None,
    }
}

/// One completion, streamed (TTFT at the first content, gaps between content chunks) or
/// not (`--no-stream`), with its usage.
async fn one_request(
    ctx: &Ctx,
    prompt: &str,
    max_tokens: usize,
    tenant: &str,
) -> Option<(Sample, String)> {
    let req = Completion {
        client: &ctx.client,
        url: &ctx.url,
        model: &ctx.model,
        prompt,
        max_tokens,
        header: ctx.tenant_header.as_deref().map(|h| (h, tenant)),
    };
    if ctx.stream {
        req.stream().await
    } else {
        req.whole().await
    }
}

/// One `/v1/completions` request (`ignore_eos`) and where it goes. Shared by `bench run` and
/// `bench compare`.
pub(crate) struct Completion<'a> {
    pub client: &'a reqwest::Client,
    pub url: &'a str,
    pub model: &'a str,
    pub prompt: &'a str,
    pub max_tokens: usize,
    /// A header to send (the tenant's), if any.
    pub header: Option<(&'a str, &'a str)>,
}

// === impl Completion ===

impl Completion<'_> {
    /// Not streamed: the answer arrives whole, so TTFT is the end-to-end time. `None` on an
    /// error status or an unreadable body.
    pub(crate) async fn whole(&self) -> Option<(Sample, String)> {
        let t0 = std::time::Instant::now();
        let resp = self.post(self.body()).await?;
        let mut s = failed();
        read_receipt(&mut s, resp.headers());
        let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.ok()?).ok()?;
        s.e2e = t0.elapsed().as_secs_f64();
        s.ttft = s.e2e;
        read_usage(&mut s, &v["usage"]);
        let answer = v["choices"][0]["text"].as_str()?.to_string();
        s.ok = true;
        Some((s, answer))
    }

    /// Streamed, usage asked for: TTFT at the first content, gaps between content chunks,
    /// usage, and the generated text. `None` on an error status or an error inside the stream.
    pub(crate) async fn stream(&self) -> Option<(Sample, String)> {
        let t0 = std::time::Instant::now();
        let mut body = self.body();
        body["stream"] = true.into();
        body["stream_options"] = serde_json::json!({"include_usage": true});
        let resp = self.post(body).await?;
        let mut s = failed();
        read_receipt(&mut s, resp.headers());
        let mut stream = resp.bytes_stream();
        let mut split = Splitter::new(sse::DEFAULT_MAX_EVENT);
        let mut answer = String::new();
        let mut last: Option<std::time::Instant> = None;
        let mut done = false;
        while let Some(chunk) = stream.next().await {
            let Piece::Events(read) = split.push(chunk.ok()?) else {
                return None;
            };
            for event in sse::events(&read) {
                let Some(data) = event.body.strip_prefix(b"data: ") else {
                    continue;
                };
                if data == b"[DONE]" {
                    done = true;
                    continue;
                }
                let v: serde_json::Value = serde_json::from_slice(data).ok()?;
                if v.get("error").is_some() {
                    return None;
                }
                if let Some(text) = v["choices"][0]["text"].as_str().filter(|t| !t.is_empty()) {
                    let now = std::time::Instant::now();
                    match last {
                        None => s.ttft = (now - t0).as_secs_f64(),
                        Some(prev) => s.itl.push((now - prev).as_secs_f64()),
                    }
                    last = Some(now);
                    answer.push_str(text);
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    read_usage(&mut s, u);
                }
            }
        }
        s.e2e = t0.elapsed().as_secs_f64();
        if last.is_none() {
            s.ttft = s.e2e;
        }
        s.ok = done;
        Some((s, answer))
    }

    /// The body both forms start from.
    fn body(&self) -> serde_json::Value {
        serde_json::json!({"model": self.model, "prompt": self.prompt,
            "max_tokens": self.max_tokens, "ignore_eos": true})
    }

    /// POSTs `body` (with the header, if any); `None` on a transport error or an error status.
    async fn post(&self, body: serde_json::Value) -> Option<reqwest::Response> {
        let mut req = self.client.post(self.url).json(&body);
        if let Some((name, value)) = self.header {
            req = req.header(name, value);
        }
        let resp = req.send().await.ok()?;
        resp.status().is_success().then_some(resp)
    }
}

/// A response's `usage` object into the sample's token counts.
fn read_usage(s: &mut Sample, u: &serde_json::Value) {
    s.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
    s.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
    s.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
}

/// A warmpath agent's route receipt headers (with `--explain`) into the sample; other
/// targets send none, and the sample has no receipt. The answering engine's address comes
/// from the receipt or, without one, from the simulator's `x-sim-engine`.
fn read_receipt(s: &mut Sample, headers: &reqwest::header::HeaderMap) {
    let text = |name: &str| headers.get(name)?.to_str().ok();
    let tokens = |name: &str| text(name)?.parse::<u64>().ok();
    s.available_tokens = tokens("x-warmpath-available-tokens");
    s.captured_tokens = tokens("x-warmpath-captured-tokens");
    let ms = |name: &str| {
        text(name)?
            .parse::<f64>()
            .ok()
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
    };
    s.predicted_ttft_ms = ms("x-warmpath-predicted-ttft-ms");
    s.held_ms = match (ms("x-warmpath-cold-yield-ms"), ms("x-warmpath-stagger-ms")) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    };
    // The agent's pick; behind a router without receipts, the engine's own name for itself
    // (the simulator's header, where the router forwards it).
    s.pod = text("x-warmpath-pod")
        .or_else(|| text(warmpath_sim::api::ENGINE_HEADER))
        .map(str::to_owned);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_mix_follows_the_weights() {
        let mix = vec![("a".to_string(), 3.0), ("b".to_string(), 1.0)];
        let t = assign_tenants(4000, &mix, 1);
        let a = t.iter().filter(|x| *x == "a").count() as f64 / 4000.0;
        assert!((0.72..0.78).contains(&a), "{a}");
        assert_eq!(t, assign_tenants(4000, &mix, 1));
        assert!(assign_tenants(3, &[], 1).iter().all(|x| x == "-"));
        assert!(parse_tenant("a=0").is_err());
        assert_eq!(parse_tenant("team-a").unwrap(), ("team-a".to_string(), 1.0));
    }

    #[test]
    fn the_receipt_headers_fill_the_sample_and_nonsense_is_left_out() {
        use reqwest::header::{HeaderMap, HeaderValue};
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-warmpath-available-tokens", "320"),
            ("x-warmpath-captured-tokens", "160"),
            ("x-warmpath-predicted-ttft-ms", "41.5"),
            ("x-warmpath-cold-yield-ms", "12.5"),
            ("x-warmpath-stagger-ms", "2.0"),
            ("x-warmpath-pod", "127.0.0.1:8001"),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        let mut s = Sample::default();
        read_receipt(&mut s, &h);
        assert_eq!(
            (s.available_tokens, s.captured_tokens),
            (Some(320), Some(160))
        );
        assert_eq!(s.predicted_ttft_ms, Some(41.5));
        assert_eq!(s.held_ms, Some(14.5));
        assert_eq!(s.pod.as_deref(), Some("127.0.0.1:8001"));
        // Held by the stagger alone; a negative or unparsable figure is no figure.
        h.remove("x-warmpath-cold-yield-ms");
        read_receipt(&mut s, &h);
        assert_eq!(s.held_ms, Some(2.0));
        h.insert("x-warmpath-stagger-ms", HeaderValue::from_static("-1"));
        h.insert(
            "x-warmpath-predicted-ttft-ms",
            HeaderValue::from_static("soon"),
        );
        read_receipt(&mut s, &h);
        assert_eq!((s.held_ms, s.predicted_ttft_ms), (None, None));
        // A peer router sends none of them.
        let mut s = Sample::default();
        read_receipt(&mut s, &HeaderMap::new());
        assert_eq!(
            (s.available_tokens, s.captured_tokens, s.held_ms, s.pod),
            (None, None, None, None)
        );
        // Behind a peer that forwards the simulator's header, the engine names itself; the
        // agent's pick, where there is one, comes first.
        h.insert("x-sim-engine", HeaderValue::from_static("127.0.0.1:8002"));
        let mut s = Sample::default();
        read_receipt(&mut s, &h);
        assert_eq!(s.pod.as_deref(), Some("127.0.0.1:8001"));
        let mut s = Sample::default();
        let mut peer = HeaderMap::new();
        peer.insert("x-sim-engine", HeaderValue::from_static("127.0.0.1:8002"));
        read_receipt(&mut s, &peer);
        assert_eq!(s.pod.as_deref(), Some("127.0.0.1:8002"));
        assert_eq!((s.available_tokens, s.held_ms), (None, None));
    }
}
