//! The soak's steady mixed load: requests at a fixed rate, at most a bounded number in
//! flight, each of one kind chosen by its sequence number, half of them on a fresh
//! connection.
//!
//! Out of every 20 requests: 8 streamed chat completions read to the end, 6 whole
//! completions, 2 streams the client drops after their first events (a cancellation
//! mid-stream), 1 body that is not JSON (400), 1 unknown model (404) and 2 streamed
//! completions with usage. The prompts (RAG-style: a long document, then a question) cycle
//! over a fixed set (documents x questions), so
//! every cache the agent keeps stops growing once it has seen them all.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::Semaphore;
use warmpath_agent::http::sse::{self, Piece, Splitter};
use warmpath_tokenizer::text::TextGen;

use crate::Error;

/// Model the soak's main pool serves.
pub const MODEL: &str = "sim-llama";
/// Longest a request may take before it is counted as unexpected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Output tokens of a stream the client cancels (long enough to still be running).
const CANCELLED_TOKENS: usize = 200;
/// Output tokens of every other request.
const OUTPUT_TOKENS: usize = 16;

/// What a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ChatStream,
    Whole,
    Cancelled,
    BadJson,
    UnknownModel,
    UsageStream,
}

impl Kind {
    /// The kind of request number `i`.
    pub fn of(i: u64) -> Self {
        match i % 20 {
            0..=7 => Self::ChatStream,
            8..=13 => Self::Whole,
            14 | 15 => Self::Cancelled,
            16 => Self::BadJson,
            17 => Self::UnknownModel,
            _ => Self::UsageStream,
        }
    }
}

/// Outcomes, counted as requests finish.
#[derive(Debug, Default)]
pub struct Tally {
    pub sent: AtomicU64,
    /// Answered in full (a stream up to `[DONE]`).
    pub ok: AtomicU64,
    /// Cancelled by the client as planned, after its first events.
    pub cancelled: AtomicU64,
    /// Refused as they should be: 400 for bad JSON, 404 for the unknown model.
    pub refused: AtomicU64,
    /// An engine's failure the proxy passed on (5xx, an error event): the failing endpoint.
    pub upstream_errors: AtomicU64,
    /// Anything else: a wrong status, a broken connection to the agent, a timeout.
    pub unexpected: AtomicU64,
    /// Not sent: the in-flight cap was reached (the agent is slower than the rate).
    pub shed: AtomicU64,
    /// What the first unexpected outcome was.
    pub first_unexpected: std::sync::Mutex<Option<String>>,
}

/// The tally's values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub sent: u64,
    pub ok: u64,
    pub cancelled: u64,
    pub refused: u64,
    pub upstream_errors: u64,
    pub unexpected: u64,
    pub shed: u64,
}

impl Tally {
    pub fn counts(&self) -> Counts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counts {
            sent: get(&self.sent),
            ok: get(&self.ok),
            cancelled: get(&self.cancelled),
            refused: get(&self.refused),
            upstream_errors: get(&self.upstream_errors),
            unexpected: get(&self.unexpected),
            shed: get(&self.shed),
        }
    }
}

/// The load's fixed settings.
#[derive(Debug)]
pub struct Load {
    /// `http://host:port` of the agent.
    pub base: String,
    /// Keep-alive connections.
    pub pooled: reqwest::Client,
    /// A new connection for every request.
    pub fresh: reqwest::Client,
    pub prompts: Vec<String>,
    pub tally: Arc<Tally>,
}

impl Load {
    pub fn new(
        base: String,
        documents: usize,
        document_chars: usize,
        questions: usize,
    ) -> Result<Self, Error> {
        let build = |idle: usize| {
            reqwest::Client::builder()
                .pool_max_idle_per_host(idle)
                .timeout(REQUEST_TIMEOUT)
                .tcp_nodelay(true)
                .build()
                .map_err(|e| Error::Setup(format!("HTTP client: {e}")))
        };
        Ok(Self {
            base,
            pooled: build(usize::MAX)?,
            fresh: build(0)?,
            prompts: prompts(documents, document_chars, questions),
            tally: Arc::new(Tally::default()),
        })
    }

    /// Sends requests at `rate` per second until `end` or `max` requests, at most
    /// `max_in_flight` at a time, then waits (at most `REQUEST_TIMEOUT`) for those in flight.
    pub async fn run(self: Arc<Self>, rate: f64, max_in_flight: usize, end: Instant, max: u64) {
        let permits = Arc::new(Semaphore::new(max_in_flight));
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.001)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        for i in 0..max {
            tick.tick().await;
            if Instant::now() >= end {
                break;
            }
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                self.tally.shed.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            self.tally.sent.fetch_add(1, Ordering::Relaxed);
            let load = self.clone();
            tokio::spawn(async move {
                load.one(i).await;
                drop(permit);
            });
        }
        let all = u32::try_from(max_in_flight).unwrap_or(u32::MAX);
        let _ = tokio::time::timeout(REQUEST_TIMEOUT, permits.acquire_many(all)).await;
    }

    async fn one(&self, i: u64) {
        let kind = Kind::of(i);
        let client = if i.is_multiple_of(2) {
            &self.pooled
        } else {
            &self.fresh
        };
        let prompt = &self.prompts[(i as usize * 7) % self.prompts.len()];
        let outcome = send(client, &self.base, kind, prompt).await;
        let counter = match outcome {
            Outcome::Ok => &self.tally.ok,
            Outcome::Cancelled => &self.tally.cancelled,
            Outcome::Refused => &self.tally.refused,
            Outcome::Upstream => &self.tally.upstream_errors,
            Outcome::Unexpected(why) => {
                if let Ok(mut first) = self.tally.first_unexpected.lock() {
                    first.get_or_insert_with(|| format!("request {i} ({kind:?}): {why}"));
                }
                &self.tally.unexpected
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// `documents` seeded documents of `chars` characters, each with `questions` questions.
fn prompts(documents: usize, chars: usize, questions: usize) -> Vec<String> {
    let mut asked = TextGen::new(0x50a4);
    (0..documents.max(1))
        .flat_map(|d| {
            let doc = TextGen::new(0x50a4 ^ ((d as u64 + 1) * 7919)).text(chars);
            (0..questions.max(1))
                .map(|q| format!("{doc}\nQuestion {q}: {}", asked.text(120)))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[derive(Debug)]
enum Outcome {
    Ok,
    Cancelled,
    Refused,
    Upstream,
    Unexpected(String),
}

async fn send(client: &reqwest::Client, base: &str, kind: Kind, prompt: &str) -> Outcome {
    let (path, body) = match kind {
        Kind::ChatStream => (
            "chat/completions",
            serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": OUTPUT_TOKENS, "stream": true})
            .to_string(),
        ),
        Kind::Whole => (
            "completions",
            serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": OUTPUT_TOKENS})
                .to_string(),
        ),
        Kind::Cancelled => (
            "completions",
            serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": CANCELLED_TOKENS,
                "ignore_eos": true, "stream": true})
            .to_string(),
        ),
        Kind::BadJson => (
            "completions",
            format!("{{\"model\": \"{MODEL}\", \"prompt\": "),
        ),
        Kind::UnknownModel => (
            "completions",
            serde_json::json!({"model": "no-such-model", "prompt": prompt, "max_tokens": 4})
                .to_string(),
        ),
        Kind::UsageStream => (
            "completions",
            serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": OUTPUT_TOKENS,
                "stream": true, "stream_options": {"include_usage": true}})
            .to_string(),
        ),
    };
    let sent = client
        .post(format!("{base}/v1/{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => return Outcome::Unexpected(format!("send: {e}")),
    };
    let status = resp.status().as_u16();
    match (kind, status) {
        (Kind::BadJson, 400) | (Kind::UnknownModel, 404) => Outcome::Refused,
        (Kind::BadJson | Kind::UnknownModel, s) => Outcome::Unexpected(format!("status {s}")),
        (_, 500..=599) => Outcome::Upstream,
        (_, 200) => match kind {
            Kind::Whole => match resp.bytes().await {
                Ok(_) => Outcome::Ok,
                Err(e) => Outcome::Unexpected(format!("body: {e}")),
            },
            _ => read_stream(resp, kind == Kind::Cancelled).await,
        },
        (_, s) => Outcome::Unexpected(format!("status {s}")),
    }
}

/// Reads an SSE answer to `[DONE]`, or, for a cancellation, drops it after two events.
async fn read_stream(resp: reqwest::Response, cancel: bool) -> Outcome {
    let mut body = resp.bytes_stream();
    let mut split = Splitter::new(sse::DEFAULT_MAX_EVENT);
    let mut events = 0usize;
    while let Some(chunk) = body.next().await {
        let bytes = match chunk {
            Ok(b) => b,
            Err(e) => return Outcome::Unexpected(format!("stream: {e}")),
        };
        let Piece::Events(done) = split.push(bytes) else {
            return Outcome::Unexpected("an SSE event over the size limit".into());
        };
        for event in sse::events(&done) {
            let data = event.body.strip_prefix(b"data: ").unwrap_or(event.body);
            if data.starts_with(b"[DONE]") {
                return Outcome::Ok;
            }
            if data.starts_with(b"{\"error\"") {
                return Outcome::Upstream;
            }
            events += 1;
            if cancel && events >= 2 {
                return Outcome::Cancelled;
            }
        }
    }
    // Ended without [DONE]: the engine went away mid-stream.
    Outcome::Upstream
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_requests_hold_the_stated_mix() {
        let kinds: Vec<Kind> = (0..20).map(Kind::of).collect();
        let count = |k: Kind| kinds.iter().filter(|&&x| x == k).count();
        assert_eq!(
            [
                count(Kind::ChatStream),
                count(Kind::Whole),
                count(Kind::Cancelled),
                count(Kind::BadJson),
                count(Kind::UnknownModel),
                count(Kind::UsageStream)
            ],
            [8, 6, 2, 1, 1, 2]
        );
        assert_eq!(Kind::of(20), Kind::of(0));
    }

    #[test]
    fn prompts_are_a_fixed_set_sharing_each_document() {
        let a = prompts(3, 500, 4);
        assert_eq!(a.len(), 12);
        assert_eq!(a, prompts(3, 500, 4));
        let doc = |p: &str| p.split("\nQuestion").next().unwrap().to_string();
        assert_eq!(doc(&a[0]), doc(&a[3]));
        assert_ne!(doc(&a[0]), doc(&a[4]));
    }
}
