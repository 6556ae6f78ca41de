//! The routing proxy: an OpenAI-compatible HTTP server (HTTP/1.1 keep-alive and h2c) that
//! picks an endpoint per request and streams the engine's response back.
//!
//! request -> body (size-limited) -> parse (model, tokens, keys) -> candidates (index + load)
//! -> rank (policy) -> speculate -> forward (retry before the first byte) -> stream back.

mod admin;
mod error;
mod h1;
pub mod message;
pub mod request;
mod scrape;
pub mod tokens;
mod upstream;
pub mod workers;

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Instant,
};

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use smallvec::SmallVec;
use tokio::net::TcpListener;

pub use admin::serve_admin;
pub use error::ProxyError;
pub use scrape::scrape_loop;
pub use scrape::{parse_adapters, parse_lora};
pub use tokens::TokenSource;
pub use upstream::UpstreamProtocol;
pub use workers::Workers;

use message::{Answer, RequestHead};

use crate::{
    headers::Headers,
    kv_index::KvIndex,
    pool::Pool,
    routing::{self, Candidate, History, Policy, RequestCtx, rank},
    telemetry::{
        DecisionReason, Outcome, PoolId, RequestRecord, Telemetry, Tenant,
        tenant::TenantPolicy,
        usage::{JsonTap, SseTap},
    },
};

/// Errors of streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every response.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// Largest request body accepted (413 beyond).
pub const DEFAULT_MAX_BODY: usize = 16 * 1024 * 1024;
/// Other endpoints tried when one fails before the first response byte.
pub const DEFAULT_RETRIES: usize = 2;
/// Header a client may send for session affinity.
pub const DEFAULT_SESSION_HEADER: &str = "x-session-id";

/// Where a request's session key comes from: a header, else a cookie.
#[derive(Debug, Clone)]
pub struct SessionSource {
    pub header: http::HeaderName,
    pub cookie: Option<String>,
}

impl Default for SessionSource {
    fn default() -> Self {
        Self {
            header: http::HeaderName::from_static(DEFAULT_SESSION_HEADER),
            cookie: None,
        }
    }
}

impl SessionSource {
    /// The session key of a request, if it carries one.
    pub fn key(&self, headers: &Headers) -> Option<String> {
        if let Some(v) = headers
            .get(self.header.as_str())
            .and_then(|v| std::str::from_utf8(v).ok())
        {
            return Some(v.to_string());
        }
        let name = self.cookie.as_deref()?;
        headers
            .get_all("cookie")
            .filter_map(|v| std::str::from_utf8(v).ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.trim_matches('"').to_string())
    }
}
/// Name of the pool configured by flags.
pub const DEFAULT_POOL: &str = "default";

/// One pool at run time: its endpoints and state, token source and session rule.
#[derive(Debug)]
pub struct PoolRuntime {
    pub name: String,
    pub pool: Pool,
    pub tokens: TokenSource,
    pub session: SessionSource,
    /// Routing history, for the approximate policy.
    history: Option<History>,
    telemetry_id: PoolId,
    /// Spreads `/tokenize` calls (engine token source) over the endpoints.
    tokenize_cursor: std::sync::atomic::AtomicUsize,
    /// HTTP/1.1 or h2c to the engines.
    pub protocol: upstream::UpstreamProtocol,
}

impl PoolRuntime {
    /// The endpoint asked to tokenize (engine token source): the next one in rotation.
    fn tokenize_target(&self) -> Option<&str> {
        let n = self.pool.endpoints.len();
        let i = self
            .tokenize_cursor
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (n > 0).then(|| self.pool.endpoints[i % n].authority.as_str())
    }
}

/// Everything a request needs.
#[derive(Debug)]
pub struct Proxy {
    /// Requests go to the pool whose model (or one of whose LoRA adapters) they name; the
    /// first pool takes requests without a model and other paths.
    pub pools: Vec<PoolRuntime>,
    pub index: Arc<KvIndex>,
    pub max_body: usize,
    pub retries: usize,
    /// Add x-warmpath-* headers explaining each decision.
    pub explain: bool,
    /// Ask streams for usage when the client did not (and strip it again), so token counts
    /// are always known.
    pub inject_usage: bool,
    pub telemetry: Arc<Telemetry>,
    pub tenants: TenantPolicy,
    upstreams: upstream::Upstreams,
}

impl Proxy {
    /// A proxy without pools yet (see [`Proxy::add_pool`]).
    pub fn new(index: Arc<KvIndex>, telemetry: Arc<Telemetry>, tenants: TenantPolicy) -> Self {
        Self {
            pools: Vec::new(),
            index,
            max_body: DEFAULT_MAX_BODY,
            retries: DEFAULT_RETRIES,
            explain: false,
            inject_usage: true,
            telemetry,
            tenants,
            upstreams: upstream::Upstreams::new(),
        }
    }

    /// Adds a pool (speaking HTTP/1.1 to its engines; see [`PoolRuntime::protocol`]).
    pub fn add_pool(
        &mut self,
        name: &str,
        pool: Pool,
        tokens: TokenSource,
        session: SessionSource,
    ) -> &mut PoolRuntime {
        let history = (pool.policy.kind == Policy::Approximate
            || pool.policy.weights.history > 0.0)
            .then(|| History::new(pool.endpoints.len()));
        let telemetry_id = self.telemetry.register_pool(name, &pool.model);
        self.pools.push(PoolRuntime {
            name: name.to_string(),
            pool,
            tokens,
            session,
            history,
            telemetry_id,
            tokenize_cursor: std::sync::atomic::AtomicUsize::new(0),
            protocol: upstream::UpstreamProtocol::default(),
        });
        self.pools.last_mut().expect("a pool was just pushed")
    }

    /// The pool serving `model`, and the LoRA adapter when `model` names one.
    fn pool_for(&self, model: &str) -> Option<(&PoolRuntime, Option<String>)> {
        if let Some(p) = self.pools.iter().find(|p| p.pool.model == model) {
            return Some((p, None));
        }
        self.pools
            .iter()
            .find(|p| p.pool.endpoints.iter().any(|e| e.serves(model)))
            .map(|p| (p, Some(model.to_string())))
    }
}

/// Serves the proxy on `listener` until the task is dropped: each connection accepted is
/// served on one of `workers`.
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>, workers: Arc<Workers>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(err) => {
                tracing::warn!(%err, "accept failed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        workers.serve(stream, peer, proxy.clone());
    }
}

/// Serves one client connection: HTTP/1.x on warmpath's own server ([`h1::server`]), h2c
/// (prior knowledge) on hyper's.
async fn connection(mut stream: tokio::net::TcpStream, peer: SocketAddr, proxy: Arc<Proxy>) {
    let mut buf = bytes::BytesMut::with_capacity(8 * 1024);
    match h1::server::sniff(&mut stream, &mut buf).await {
        Ok(h1::server::Sniffed::Http1) => {
            h1::server::serve(stream, buf, peer.ip(), proxy.as_ref()).await;
        }
        Ok(h1::server::Sniffed::H2) => {
            let io = h1::server::Rewind::new(buf.freeze(), stream);
            let service = service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(handle(&proxy, peer.ip(), req).await) }
            });
            let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(io), service)
                .await;
            if let Err(err) = served {
                tracing::debug!(%err, "client connection ended");
            }
        }
        Ok(h1::server::Sniffed::Closed) => {}
        Err(err) => tracing::debug!(%err, "client connection ended"),
    }
}

impl h1::server::Handler for Proxy {
    fn max_body(&self) -> usize {
        self.max_body
    }

    fn call<'a>(
        &'a self,
        peer: IpAddr,
        head: &'a RequestHead,
        body: Result<Bytes, ProxyError>,
    ) -> impl std::future::Future<Output = Answer> + Send + 'a {
        respond(self, peer, head, body)
    }
}

fn full(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> http::Response<Body> {
    let mut resp = http::Response::new(
        Full::new(body.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    resp
}

/// A request from hyper's server (h2c): its body read (size-limited), then answered.
async fn handle(proxy: &Proxy, peer: IpAddr, req: http::Request<Incoming>) -> http::Response<Body> {
    let (parts, body) = req.into_parts();
    let body = Limited::new(body, proxy.max_body)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                ProxyError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("Request body exceeds {} bytes.", proxy.max_body),
                )
            } else {
                ProxyError::bad_request(format!("Could not read the request body: {e}"))
            }
        });
    respond(proxy, peer, &parts.into(), body).await.into_http()
}

/// Answers a request whose body has been read (or could not be: `body` is the error).
async fn respond(
    proxy: &Proxy,
    peer: IpAddr,
    parts: &RequestHead,
    body: Result<Bytes, ProxyError>,
) -> Answer {
    let kind = match (&parts.method, parts.path()) {
        (&Method::GET, "/health") => return full(StatusCode::OK, "text/plain", "").into(),
        (&Method::GET, "/v1/models") => return models(proxy).into(),
        (&Method::POST, "/v1/completions") => Some(request::Kind::Completion),
        (&Method::POST, "/v1/chat/completions") => Some(request::Kind::Chat),
        _ => None,
    };
    let (tenant, via) = proxy.tenants.resolve(Some(peer), &parts.headers);
    let mut attempt = Attempt {
        start: Instant::now(),
        pool: proxy.pools[0].telemetry_id,
        tenant: proxy.telemetry.tenant(&tenant),
        queue: None,
        retries: 0,
    };
    tracing::trace!(tenant = %tenant, ?via, "tenant");
    let routed = match body {
        Ok(body) => route(proxy, kind, parts, body, &mut attempt).await,
        Err(err) => Err(err),
    };
    match routed {
        Ok(resp) => resp,
        Err(err) => {
            let now = Instant::now();
            proxy.telemetry.record(
                &attempt.tenant,
                &RequestRecord {
                    pool: attempt.pool,
                    pod: None,
                    outcome: Outcome::of_status(err.status),
                    usage: None,
                    retries: attempt.retries,
                    queue: attempt.queue,
                    ttft: None,
                    duration: now.saturating_duration_since(attempt.start),
                    at: now,
                    streamed: false,
                },
            );
            let unread_body = err.status == StatusCode::PAYLOAD_TOO_LARGE;
            let mut resp = Answer::from(err.into_response());
            if unread_body {
                // The rest of the body was never read: this connection cannot be reused.
                resp.extra.push((
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                ));
            }
            resp
        }
    }
}

fn models(proxy: &Proxy) -> http::Response<Body> {
    let mut data = Vec::new();
    for p in &proxy.pools {
        let base = &p.pool.model;
        data.push(
            serde_json::json!({"id": base, "object": "model", "owned_by": "warmpath",
            "root": base, "parent": null}),
        );
        let mut adapters: Vec<String> = p
            .pool
            .endpoints
            .iter()
            .flat_map(|e| e.lora_info().served)
            .collect();
        adapters.sort();
        adapters.dedup();
        data.extend(adapters.into_iter().map(|a| {
            serde_json::json!({"id": a, "object": "model", "owned_by": "warmpath", "root": a, "parent": base})
        }));
    }
    let v = serde_json::json!({"object": "list", "data": data});
    full(StatusCode::OK, "application/json", v.to_string())
}

/// One request's bookkeeping on its way through the proxy.
#[derive(Debug)]
struct Attempt {
    start: Instant,
    /// The pool the request belongs to (the first pool until its model is known).
    pool: PoolId,
    tenant: Arc<Tenant>,
    /// Body complete -> first upstream request.
    queue: Option<std::time::Duration>,
    retries: u32,
}

async fn route(
    proxy: &Proxy,
    kind: Option<request::Kind>,
    parts: &RequestHead,
    body: Bytes,
    attempt: &mut Attempt,
) -> Result<Answer, ProxyError> {
    // The body was read before the request was handed over.
    let body_done = attempt.start;
    let mut strip_usage = false;
    let (pool, ctx, body) = match kind {
        Some(kind) => {
            let req = request::Request::read(kind, &body, &proxy.pools[0].pool.model)?;
            let (pool, lora) = proxy
                .pool_for(&req.model)
                .ok_or_else(|| ProxyError::model_not_found(&req.model))?;
            attempt.pool = pool.telemetry_id;
            let forwarded = if proxy.inject_usage && !req.wants_usage() {
                strip_usage = true;
                request::ask_for_usage(&body, req.include_usage)
            } else {
                body.clone()
            };
            let block_size = pool.pool.block_size;
            let keys = match pool.tokens.keys_now(&req, lora.as_deref(), block_size) {
                Some(keys) => keys,
                // A round trip to the engine: boxed, so that the common path's future (moved
                // with every request) stays small.
                None => {
                    Box::pin(pool.tokens.engine_keys(
                        &req,
                        lora.as_deref(),
                        block_size,
                        || pool.tokenize_target(),
                        proxy.upstreams.client(pool.protocol),
                    ))
                    .await
                }
            };
            let ctx = RequestCtx {
                keys,
                session: pool.session.key(&parts.headers),
                lora,
            };
            (pool, ctx, forwarded)
        }
        // Other paths pass through to the first pool's least-loaded endpoint, without prefix
        // information.
        None => {
            let pool = &proxy.pools[0];
            let ctx = RequestCtx {
                session: pool.session.key(&parts.headers),
                ..RequestCtx::default()
            };
            (pool, ctx, body)
        }
    };
    forward(
        proxy,
        pool,
        &ctx,
        parts,
        body,
        attempt,
        body_done,
        strip_usage,
    )
    .await
}

/// Ranks, then tries endpoints best first until one answers (only failures before the first
/// response byte are retried).
#[allow(clippy::too_many_arguments)]
async fn forward(
    proxy: &Proxy,
    runtime: &PoolRuntime,
    ctx: &RequestCtx,
    parts: &RequestHead,
    body: Bytes,
    attempt: &mut Attempt,
    body_done: Instant,
    strip_usage: bool,
) -> Result<Answer, ProxyError> {
    let pool = &runtime.pool;
    let history = runtime.history.as_ref().map(|h| h.lookup(&ctx.keys));
    let approximate = pool.policy.kind == Policy::Approximate;
    let mut matches = Vec::new();
    if !approximate {
        proxy.index.lookup(&ctx.keys, &mut matches);
    }
    // On the stack for pools of up to `routing::INLINE` endpoints.
    let mut candidates: SmallVec<[Candidate; routing::INLINE]> = pool
        .endpoints
        .iter()
        .map(|e| {
            let source = e.source;
            let history_blocks = history
                .as_ref()
                .and_then(|h| h.iter().find(|(id, _)| *id == e.id))
                .map_or(0, |(_, b)| *b);
            let (matched_blocks, prefix_trusted) = match approximate {
                true => (history_blocks, true),
                false => (
                    source
                        .and_then(|s| matches.iter().find(|m| m.source == s.0))
                        .map_or(0, |m| m.blocks),
                    source.is_some_and(|s| proxy.index.trusted(s)),
                ),
            };
            Candidate {
                id: e.id,
                matched_blocks,
                prefix_trusted,
                in_flight: e.in_flight(),
                queued_prefill_blocks: pool.work_ahead(e),
                kv_usage: e.kv_usage(),
                history_blocks,
                lora: e.lora_state(ctx.lora.as_deref()),
                // A LoRA request only goes where the adapter is served.
                excluded: ctx.lora.as_deref().is_some_and(|l| !e.serves(l)),
            }
        })
        .collect();
    // Built only when an attempt fails (an error's message is a heap string).
    let mut last_error = None;
    for n in 0..=proxy.retries {
        let Some(decision) = rank(pool.policy, ctx, &candidates, &pool.rotation) else {
            break;
        };
        let chosen = decision.ranked[0];
        let endpoint = &pool.endpoints[chosen.0];
        let uncached = ctx.keys.len().saturating_sub(decision.prefix_blocks) as u64;
        attempt.retries = n as u32;
        if n == 0 {
            // Once per request: retries are the same prefill, not more of it.
            pool.note_prefill(uncached);
            proxy.telemetry.record_decision(
                runtime.telemetry_id,
                decision_reason(pool.policy.kind, decision.prefix_blocks),
                decision.prefix_blocks,
            );
        }
        let now = Instant::now();
        if let Some(source) = endpoint.source {
            proxy.index.speculate(source, &ctx.keys, now);
        }
        if let Some(history) = &runtime.history {
            history.record(chosen, &ctx.keys, now);
        }
        tracing::debug!(endpoint = %endpoint.authority, prefix_blocks = decision.prefix_blocks, score = decision.score, blocks = ctx.keys.len(), first_key = ctx.keys.first().map_or(0, |k| k.0), "routing decision");
        let guard = endpoint.start(uncached);
        if n == 0 {
            attempt.queue = Some(now.saturating_duration_since(body_done));
        }
        let sent = proxy
            .upstreams
            .send(
                runtime.protocol,
                &endpoint.label,
                h1::Outgoing {
                    method: &parts.method,
                    target: parts.target(),
                    headers: &parts.headers,
                    body: &body,
                },
            )
            .await;
        match sent {
            Ok(resp) if resp.status != StatusCode::SERVICE_UNAVAILABLE => {
                // Framing and hop-by-hop fields are each leg's own: the writers leave the
                // engine's out.
                let mut extra = Vec::new();
                if proxy.explain {
                    let mut set = |k: &'static str, v: String| {
                        if let Ok(v) = http::HeaderValue::from_str(&v) {
                            extra.push((http::HeaderName::from_static(k), v));
                        }
                    };
                    set("x-warmpath-pod", endpoint.authority.clone());
                    set(
                        "x-warmpath-prefix-blocks",
                        decision.prefix_blocks.to_string(),
                    );
                    set("x-warmpath-score", format!("{:.3}", decision.score));
                }
                let sse = resp
                    .headers
                    .get("content-type")
                    .is_some_and(|v| v.starts_with(b"text/event-stream"));
                // (A rewritten stream's length is no longer the engine's: the body's size
                // hint says so, and the engine's content-length is never forwarded.)
                let tap = if sse {
                    upstream::Tap::Sse(SseTap::new(strip_usage))
                } else if resp.status.is_success() {
                    upstream::Tap::Json(JsonTap::default())
                } else {
                    upstream::Tap::None
                };
                let observer = upstream::Observer {
                    telemetry: proxy.telemetry.clone(),
                    tenant: attempt.tenant.clone(),
                    pool: runtime.telemetry_id,
                    pod: (chosen.0 as u16, endpoint.label.clone()),
                    start: attempt.start,
                    queue: attempt.queue,
                    retries: attempt.retries,
                    status: resp.status,
                    tap,
                };
                return Ok(Answer {
                    status: resp.status,
                    headers: resp.headers,
                    extra,
                    body: upstream::Tracked::boxed(resp.body, guard, observer),
                });
            }
            Ok(_) => {
                endpoint.note_failure();
                last_error = Some(ProxyError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{} is overloaded (503).", endpoint.authority),
                ));
            }
            Err(err) => {
                endpoint.note_failure();
                tracing::warn!(endpoint = %endpoint.authority, %err, "upstream request failed before a response; trying the next endpoint");
                last_error = Some(ProxyError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("{} failed: {err}", endpoint.authority),
                ));
            }
        }
        candidates[chosen.0].excluded = true;
    }
    Err(last_error.unwrap_or_else(|| {
        ProxyError::new(StatusCode::SERVICE_UNAVAILABLE, "No endpoint is available.")
    }))
}

/// Why a pick was made, for the decisions counter.
fn decision_reason(policy: Policy, prefix_blocks: usize) -> DecisionReason {
    match policy {
        Policy::RoundRobin => DecisionReason::RoundRobin,
        Policy::Session => DecisionReason::Session,
        Policy::LeastLoaded => DecisionReason::Load,
        Policy::Precise | Policy::Approximate if prefix_blocks > 0 => DecisionReason::Prefix,
        Policy::Precise | Policy::Approximate => DecisionReason::Load,
    }
}
