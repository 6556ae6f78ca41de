//! Steps 2 and 3 of a request: the handler. The request head and body arrive from the
//! server ([`crate::http::server::Handler`], or the h2c adapter in [`super::listener`]); the
//! tenant is resolved ([`crate::tenant`]); the path picks what answers (health, models, or a
//! completion to route); a completion is parsed, its pool found, its token keys and session
//! key built into the routing input ([`RequestCtx`]), and handed to [`super::forward`]. The
//! proxy's own error answers are recorded here ([`Attempt::record`]).

use std::{net::IpAddr, time::Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use super::{
    Proxy, ProxyError, admission, error,
    forward::forward,
    record::{Attempt, Ending},
    request,
};
use crate::{
    http::{Answer, Body, Refusal, RequestHead, message::full, server::Handler},
    routing::RequestCtx,
    telemetry::Outcome,
};

impl Handler for Proxy {
    fn max_body(&self) -> usize {
        self.max_body
    }

    fn read_timeout(&self) -> std::time::Duration {
        self.admission.limits().read_timeout
    }

    fn call<'a>(
        &'a self,
        peer: IpAddr,
        head: &'a RequestHead,
        body: Result<Bytes, Refusal>,
    ) -> impl std::future::Future<Output = Answer> + Send + 'a {
        respond(self, peer, head, body.map_err(ProxyError::from))
    }

    fn refusal_body(&self, refusal: &Refusal) -> Bytes {
        error::body(refusal.status, &refusal.message, None)
    }
}

/// Answers a request whose body has been read (or could not be: `body` is the error).
pub(super) async fn respond(
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
    let unread_body = body.is_err();
    let routed = match body {
        // Admitted first: under overload the refusal costs no parsing, and the slot covers
        // tokenization as well as the engine's work.
        Ok(body) => match proxy.admission.admit().await {
            Ok(permit) => route(proxy, kind, parts, body, &mut attempt)
                .await
                .map(|mut answer| {
                    answer.body = admission::hold(answer.body, permit);
                    answer
                }),
            Err(err) => Err(err),
        },
        Err(err) => Err(err),
    };
    match routed {
        Ok(resp) => resp,
        Err(err) => {
            attempt.record(
                &proxy.telemetry,
                Ending {
                    pod: None,
                    outcome: Outcome::of_status(err.status),
                    usage: None,
                    ttft: None,
                    at: Instant::now(),
                    streamed: false,
                },
            );
            let unread_body = unread_body && err.status == StatusCode::PAYLOAD_TOO_LARGE;
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

/// A request to route: its pool, token keys and session key, then forwarded.
async fn route(
    proxy: &Proxy,
    kind: Option<request::Kind>,
    parts: &RequestHead,
    body: Bytes,
    attempt: &mut Attempt,
) -> Result<Answer, ProxyError> {
    let mut strip_usage = false;
    let (pool, ctx, body) = match kind {
        Some(kind) => {
            let req = request::Request::read(kind, &body, &proxy.pools[0].pool.model)?;
            let prompt_bytes = req.prompt_bytes();
            if prompt_bytes > proxy.admission.limits().max_prompt_bytes {
                return Err(proxy.admission.refuse_prompt(prompt_bytes));
            }
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
            let keys = match pool
                .tokens
                .keys_now(&req, lora.as_deref(), block_size, &pool.unkeyed)
            {
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
                        &pool.unkeyed,
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
    forward(proxy, pool, &ctx, parts, body, attempt, strip_usage).await
}
