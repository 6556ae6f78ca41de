//! Simulator engines for end-to-end tests: real HTTP and ZeroMQ sockets on loopback, in this
//! process, started from the same flags as `warmpath sim`.

use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use warmpath_agent::http::sse::{self, DEFAULT_MAX_EVENT, Piece, Splitter};
use warmpath_sim::{cli::SimArgs, fleet::RunningEngine};

#[derive(Parser)]
struct Wrap {
    #[command(flatten)]
    sim: SimArgs,
}

/// Engines started for one test; their tasks end with the test's runtime.
#[derive(Debug)]
pub struct Fleet {
    pub engines: Vec<RunningEngine>,
}

impl Fleet {
    /// Starts engines from `warmpath sim` flags (`--port 0` style, loopback only).
    pub async fn start(flags: &[&str]) -> Self {
        Self::try_start(flags).await.expect("simulator starts")
    }

    /// Like `start`, returning the start-up error (e.g. a port still in use).
    pub async fn try_start(flags: &[&str]) -> Result<Self, warmpath_sim::cli::Error> {
        let args = Wrap::try_parse_from(std::iter::once("sim").chain(flags.iter().copied()))
            .expect("valid sim flags")
            .sim;
        let engines = warmpath_sim::cli::start(&args).await?;
        Ok(Self { engines })
    }

    /// `replicas` engines of the `tiny` profile publishing KV events, every port 0, plus
    /// `extra` flags (e.g. `--kv-replay-port 0`, faults).
    pub async fn tiny(replicas: u16, extra: &[&str]) -> Self {
        let replicas = replicas.to_string();
        let mut flags = vec![
            "--port",
            "0",
            "--replicas",
            &replicas,
            "--profile",
            "tiny",
            "--kv-events-port",
            "0",
        ];
        flags.extend_from_slice(extra);
        Self::start(&flags).await
    }

    /// Base URL of engine `i`.
    pub fn url(&self, i: usize) -> String {
        format!("http://{}", self.engines[i].http)
    }

    /// KV event endpoint of engine `i`.
    pub fn events(&self, i: usize) -> String {
        self.engines[i]
            .publisher
            .as_ref()
            .expect("events enabled")
            .events_endpoint
            .clone()
    }
}

/// What a streamed completion looked like to the client.
#[derive(Debug, Clone)]
pub struct Streamed {
    pub ttft: Duration,
    pub text: String,
    pub usage: Option<serde_json::Value>,
    pub chunks: usize,
    pub finish_reason: Option<String>,
}

/// POSTs a streaming completion and reads it to the end.
pub async fn stream_completion(
    client: &reqwest::Client,
    base: &str,
    body: serde_json::Value,
) -> Streamed {
    let start = Instant::now();
    let resp = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(resp.status(), 200, "stream status");
    let mut stream = resp.bytes_stream();
    let mut split = Splitter::new(DEFAULT_MAX_EVENT);
    let mut out = Streamed {
        ttft: Duration::ZERO,
        text: String::new(),
        usage: None,
        chunks: 0,
        finish_reason: None,
    };
    while let Some(bytes) = stream.next().await {
        let Piece::Events(done) = split.push(bytes.expect("stream bytes")) else {
            panic!("an SSE event over {DEFAULT_MAX_EVENT} bytes");
        };
        for event in sse::events(&done) {
            let line = std::str::from_utf8(event.body).expect("utf-8").trim();
            let data = line.strip_prefix("data: ").expect("SSE data line");
            if data == "[DONE]" {
                return out;
            }
            let v: serde_json::Value = serde_json::from_str(data).expect("chunk is JSON");
            if let Some(choice) = v["choices"].get(0) {
                let text = choice["text"].as_str().unwrap_or("");
                if !text.is_empty() && out.ttft.is_zero() {
                    out.ttft = start.elapsed();
                }
                out.text.push_str(text);
                out.chunks += 1;
                if let Some(r) = choice["finish_reason"].as_str() {
                    out.finish_reason = Some(r.to_string());
                }
            }
            if v["usage"].is_object() {
                out.usage = Some(v["usage"].clone());
            }
        }
    }
    panic!("stream ended without [DONE]");
}

/// Waits until `check` returns Some, polling every 10 ms, or panics after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The Prometheus text of `base/metrics` (panics with the URL on failure).
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    let url = format!("{base}/metrics");
    let resp = client
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    resp.text()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: no text body: {e}"))
}

/// A scraped Prometheus counter or gauge value (first series with that name).
pub async fn metric(client: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = metrics_text(client, base).await;
    sample(&text, name).unwrap_or_else(|| panic!("metric {name} missing"))
}

/// The value of the first series named `name` in Prometheus `text`, if there is one (for
/// waiting until a family appears).
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// GETs `url` and parses the JSON body (panics with the URL on failure).
pub async fn get_json(client: &reqwest::Client, url: &str) -> serde_json::Value {
    let resp = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    resp.json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}

/// A tokenizer directory (for `--tokenizer`): the built-in vocabulary with a real model's chat
/// template from `tokenizer/tests/data/templates/` and `specials` (bos/eos tokens) as its
/// `tokenizer_config.json`; removed on drop.
#[derive(Debug)]
pub struct TemplateDir(pub std::path::PathBuf);

impl TemplateDir {
    pub fn new(name: &str, template_file: &str, specials: serde_json::Value) -> Self {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let dir = std::env::temp_dir().join(format!("warmpath-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        std::fs::copy(
            format!("{root}/tokenizer/assets/default-tokenizer/tokenizer.json"),
            dir.join("tokenizer.json"),
        )
        .expect("the built-in tokenizer.json is committed");
        let template = std::fs::read_to_string(format!(
            "{root}/tokenizer/tests/data/templates/{template_file}"
        ))
        .expect("the template is committed");
        let mut config = specials;
        config["chat_template"] = template.into();
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string())
            .expect("tokenizer_config.json written");
        Self(dir)
    }

    /// The directory as a flag value.
    pub fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TemplateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
