//! The HTTP surface of one simulated engine: vLLM's OpenAI-compatible API, /metrics, and a
//! few simulator-only endpoints under /sim for tests.

mod assemble;
mod chunks;
mod error;
mod metrics;
mod misc;
mod request;
mod respond;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::{DefaultBodyLimit, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use error::ApiError;
pub use request::Kind;

use warmpath_tokenizer::{Tokenizer, segments::SegmentTokenizer};

use crate::engine::{EngineHandle, sequence::NewRequest};

/// Largest request body accepted.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// The response header naming the engine that answered (the address it is bound to,
/// `host:port`), on every response the router writes: behind any router a client can tell
/// which engine served it (the bench's rows without a route receipt). vLLM sends no such
/// header; it is the simulator's own.
pub const ENGINE_HEADER: &str = "x-sim-engine";

/// Injected faults (all off by default).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Added before a response starts.
    pub latency: Duration,
    /// Uniform extra latency in [0, jitter).
    pub jitter: Duration,
    /// Fraction of requests answered with HTTP 500.
    pub error_rate: f64,
    /// The engine dies after this many requests.
    pub crash_after: Option<u64>,
    /// Streams stop producing output after this many tokens (the client must give up).
    pub stall_after_tokens: Option<usize>,
    /// Requests are refused with 503 while this many are already waiting.
    pub max_waiting: Option<usize>,
}

/// One engine as the API serves it.
#[derive(Debug)]
pub struct ServedModel {
    pub name: String,
    pub loras: Vec<String>,
    pub max_model_len: usize,
    /// Encodes prompts: identical ids to its tokenizer, with shared segments and words cached
    /// (a simulated engine should not spend the host's CPU a GPU server spends elsewhere);
    /// one per fleet, so its caches are bounded once however many engines share it.
    pub encoder: Arc<SegmentTokenizer>,
    pub engine: EngineHandle,
    pub faults: Faults,
    pub created: u64,
    token_text: HashMap<u32, Box<str>>,
    requests: AtomicU64,
    /// Requests received over HTTP/1.x and HTTP/2 (`GET /sim/http`, for tests of clients'
    /// protocol choice).
    pub http1_requests: AtomicU64,
    pub http2_requests: AtomicU64,
    rng: Mutex<ChaCha8Rng>,
}

impl ServedModel {
    /// The tokenizer (chat templates, decoding, vocabulary).
    pub fn tokenizer(&self) -> &Tokenizer {
        self.encoder.tokenizer()
    }

    pub fn new(
        name: String,
        loras: Vec<String>,
        max_model_len: usize,
        encoder: Arc<SegmentTokenizer>,
        engine: EngineHandle,
        faults: Faults,
        seed: u64,
    ) -> Self {
        let tokenizer = encoder.tokenizer();
        let token_text = tokenizer
            .word_ids()
            .iter()
            .map(|id| {
                (
                    *id,
                    tokenizer
                        .decode(&[*id], true)
                        .unwrap_or_default()
                        .into_boxed_str(),
                )
            })
            .collect();
        Self {
            name,
            loras,
            max_model_len,
            encoder,
            engine,
            faults,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            token_text,
            requests: AtomicU64::new(0),
            http1_requests: AtomicU64::new(0),
            http2_requests: AtomicU64::new(0),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed ^ 0xfa17)),
        }
    }

    /// `Ok(None)` for the base model, `Ok(Some(lora))` for an adapter, 404 otherwise.
    pub fn resolve(&self, model: &str) -> Result<Option<String>, ApiError> {
        if model == self.name {
            Ok(None)
        } else if self.loras.iter().any(|l| l == model) {
            Ok(Some(model.to_string()))
        } else {
            Err(ApiError::model_not_found(model))
        }
    }

    /// Text of a generated token.
    pub fn token_text(&self, id: u32) -> std::borrow::Cow<'_, str> {
        match self.token_text.get(&id) {
            Some(t) => std::borrow::Cow::Borrowed(t),
            None => {
                std::borrow::Cow::Owned(self.tokenizer().decode(&[id], true).unwrap_or_default())
            }
        }
    }
}

/// The router for one engine.
pub fn router(served: Arc<ServedModel>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(misc::models))
        .route("/health", get(misc::health))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route("/reset_prefix_cache", post(misc::reset_prefix_cache))
        .route("/metrics", get(metrics::render))
        .route("/sim/cache", get(misc::cached_blocks))
        .route("/sim/http", get(misc::http_versions))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "Not Found").into_response() })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(
            served.clone(),
            misc::count_http_version,
        ))
        .with_state(served)
}

async fn completions(State(served): State<Arc<ServedModel>>, body: Bytes) -> Response {
    generate(served, Kind::Completion, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(State(served): State<Arc<ServedModel>>, body: Bytes) -> Response {
    generate(served, Kind::Chat, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn generate(served: Arc<ServedModel>, kind: Kind, body: Bytes) -> Result<Response, ApiError> {
    if !served.engine.stats().healthy {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "The engine is dead (EngineDeadError).",
        ));
    }
    let prepared = request::prepare(kind, &body, &served)?;
    inject_faults(&served).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    served
        .engine
        .submit(NewRequest {
            prompt: prepared.prompt.clone(),
            max_tokens: prepared.max_tokens,
            min_tokens: prepared.min_tokens,
            ignore_eos: prepared.ignore_eos,
            extra: prepared.extra.clone(),
            sink: tx,
        })
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(respond::respond(served, prepared, rx).await)
}

async fn inject_faults(served: &ServedModel) -> Result<(), ApiError> {
    let f = &served.faults;
    let n = served.requests.fetch_add(1, Ordering::Relaxed) + 1;
    if f.crash_after.is_some_and(|limit| n > limit) {
        served.engine.crash();
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "The engine is dead (EngineDeadError).",
        ));
    }
    if let Some(max) = f.max_waiting
        && served.engine.stats().waiting >= max
    {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The server is overloaded; retry later.",
        ));
    }
    let (fail, jitter) = {
        let mut rng = served.rng.lock().expect("never poisoned");
        let fail = f.error_rate > 0.0 && rng.random::<f64>() < f.error_rate;
        let jitter = if f.jitter.is_zero() {
            Duration::ZERO
        } else {
            f.jitter.mul_f64(rng.random::<f64>())
        };
        (fail, jitter)
    };
    if fail {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Injected fault: internal server error.",
        ));
    }
    let delay = f.latency + jitter;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    Ok(())
}
