//! Steps 2 and 3 of a request: the handler. The request head and body arrive from the
//! server ([`crate::http::server::Handler`], or the h2c adapter in [`super::listener`]); the
//! tenant is resolved ([`crate::tenant`]); the path picks what answers (health, models, or a
//! completion to route); a completion is parsed, its pool found, its token keys and session
//! key built into the routing input ([`RequestCtx`]), and handed to [`super::forward`]. The
//! proxy's own error answers are recorded here ([`Attempt::record`]).

use std::{sync::Arc, time::Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use super::{
    ClientOrigin, PoolRuntime, Proxy, ProxyError, admission, clients, error,
    forward::forward,
    record::{Attempt, Ending},
    request,
};
use crate::{
    http::{Answer, Body, Refusal, RequestHead, message::full, server::Handler},
    policy::compiled::{PolicySet, RequestFacts, TenantRule},
    routing::{RequestCtx, StallShare},
    telemetry::Outcome,
};

impl Handler for Proxy {
    type Peer = ClientOrigin;

    fn max_body(&self) -> usize {
        self.max_body
    }

    fn read_timeout(&self) -> std::time::Duration {
        self.admission.limits().read_timeout
    }

    async fn call(
        &self,
        client: ClientOrigin,
        head: &RequestHead,
        body: Result<Bytes, Refusal>,
    ) -> Answer {
        let mut answer = respond(self, client, head, body.map_err(ProxyError::from)).await;
        // Draining: each kept-alive connection closes after its current answer, so that
        // clients reconnect (to the next agent, or fail open) instead of sending more here.
        if self.draining.load(std::sync::atomic::Ordering::Relaxed) {
            answer.extra.push((
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            ));
        }
        answer
    }

    fn refusal_body(&self, refusal: &Refusal) -> Bytes {
        error::body(refusal.status, &refusal.message, None)
    }
}

/// Answers a request whose body has been read (or could not be: `body` is the error).
pub(super) async fn respond(
    proxy: &Proxy,
    client: ClientOrigin,
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
    let policy = proxy.policy.current();
    let cgroup = client.intercepted.map(|i| i.cgroup_id);
    let (tenant, via) = policy
        .identity
        .resolve_client(Some(client.addr), cgroup, &parts.headers);
    let rule = policy.tenant(&tenant);
    let mut attempt = Attempt {
        start: Instant::now(),
        pool: proxy.pools[0].telemetry_id,
        tenant: proxy.telemetry.tenant(&tenant),
        queue: None,
        retries: 0,
        receipt: None,
        prediction: None,
        quota: None,
        client: client
            .intercepted
            .map(|i| clients::Learning::new(proxy.client_pods(), i.cgroup_id, i.vip)),
    };
    tracing::trace!(tenant = %tenant, ?via, "tenant");
    let unread_body = body.is_err();
    let routed = match body {
        // Admitted first: under overload the refusal costs no parsing, and the slot covers
        // tokenization as well as the engine's work.
        Ok(body) => match proxy
            .admission
            .admit_as(
                admission::Class {
                    tenant: attempt.tenant.id(),
                    priority: rule.priority,
                    weight: rule.weight,
                },
                &tenant,
            )
            .await
        {
            Ok(permit) => route(proxy, &policy, &rule, kind, parts, body, &mut attempt)
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

/// `GET /v1/models`: each pool's model and the adapters its ready engines serve, as vLLM's
/// cards (`created` is the answer's time, as vLLM's; clients such as async-openai require it).
fn models(proxy: &Proxy) -> http::Response<Body> {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut data = Vec::new();
    for p in &proxy.pools {
        let base = &p.pool.model;
        data.push(
            serde_json::json!({"id": base, "object": "model", "created": created,
            "owned_by": "warmpath", "root": base, "parent": null}),
        );
        let mut adapters: Vec<String> = p
            .pool
            .endpoints()
            .iter()
            .filter(|e| e.routable())
            .flat_map(|e| e.lora_info().served)
            .collect();
        adapters.sort();
        adapters.dedup();
        data.extend(adapters.into_iter().map(|a| {
            serde_json::json!({"id": a, "object": "model", "created": created,
            "owned_by": "warmpath", "root": a, "parent": base})
        }));
    }
    let v = serde_json::json!({"object": "list", "data": data});
    full(StatusCode::OK, "application/json", v.to_string())
}

/// The chosen pool's own cluster-wide concurrency (`pools[].clusterMaxConcurrent`), once the
/// pool is known; the agent's slot (stage one) is held meanwhile. The permit is held until the
/// answer's body ends; `None` when the pool has no stage.
async fn pool_stage(
    pool: &PoolRuntime,
    tenant: &TenantRule,
    attempt: &Attempt,
) -> Result<Option<admission::Permit>, ProxyError> {
    let Some(stage) = &pool.admission else {
        return Ok(None);
    };
    let class = admission::Class {
        tenant: attempt.tenant.id(),
        priority: tenant.priority,
        weight: tenant.weight,
    };
    stage.admit_as(class, &tenant.name).await
}

/// A request to route: its pool, the policy's action, token keys and session key, then
/// forwarded.
async fn route(
    proxy: &Proxy,
    policy: &PolicySet,
    tenant: &TenantRule,
    kind: Option<request::Kind>,
    parts: &RequestHead,
    body: Bytes,
    attempt: &mut Attempt,
) -> Result<Answer, ProxyError> {
    let mut strip_usage = false;
    let facts = |model| RequestFacts {
        model,
        path: parts.path(),
        headers: &parts.headers,
        tenant: &tenant.name,
    };
    let (chosen, ctx, body, stage) = match kind {
        Some(kind) => {
            let mut req = request::Request::read(kind, &body, &proxy.pools[0].pool.model)?;
            let prompt_bytes = req.prompt_bytes();
            if prompt_bytes > proxy.admission.limits().max_prompt_bytes {
                return Err(proxy.admission.refuse_prompt(prompt_bytes));
            }
            let (first, mut lora) = proxy
                .pool_for(&req.model)
                .ok_or_else(|| ProxyError::model_not_found(&req.model))?;
            let chosen = policy.choose(first, &facts(Some(&req.model)), || {
                proxy.pools[first].session.key(&parts.headers)
            });
            let pool = &proxy.pools[chosen.pool];
            attempt.pool = pool.telemetry_id;
            // What the engine is sent: the split's model (or, sent to a pool that serves
            // neither the model nor an adapter of that name, that pool's model), the
            // tenant's cache salt.
            let mut members: Vec<(&str, String)> = Vec::new();
            let served = |m: &str| {
                *pool.pool.model == *m
                    || pool
                        .pool
                        .endpoints()
                        .iter()
                        .any(|e| e.routable() && e.serves(m))
            };
            let model = chosen.model.as_deref().map(str::to_string).or_else(|| {
                (chosen.pool != first && !served(&req.model)).then(|| pool.pool.model.clone())
            });
            if let Some(model) = model {
                lora = (model != pool.pool.model).then(|| model.clone());
                members.push(("model", model));
            }
            if tenant.isolated {
                let salt = proxy.salt.isolated(&tenant.name, req.cache_salt.as_deref());
                members.push(("cache_salt", salt.clone()));
                req.cache_salt = Some(salt);
            }
            let edited = super::members::set_members(&body, &members);
            let forwarded = if proxy.inject_usage && !req.wants_usage() {
                strip_usage = true;
                request::ask_for_usage(&edited, req.include_usage)
            } else {
                edited
            };
            let block_size = pool.pool.block_size;
            let chosen_tokens = chosen.action.tokens.as_ref().map(super::TokenSource::from);
            let tokens = chosen_tokens.as_ref().unwrap_or(&pool.tokens);
            let keys = match tokens.keys_now(&req, lora.as_deref(), block_size, &pool.unkeyed) {
                Some(keys) => keys,
                // A round trip to the engine: boxed, so that the common path's future (moved
                // with every request) stays small.
                None => {
                    Box::pin(tokens.engine_keys(
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
            // The pool's stage before the quota: a request it refuses (429) or that times out
            // waiting charges nothing and holds no stream slot.
            let stage = pool_stage(pool, tenant, attempt).await?;
            if let Some(limits) = &tenant.quotas {
                // Prompt tokens as far as the keys tell (whole blocks); the engine's usage
                // corrects the charge when the request ends.
                let estimate = (keys.len() * block_size) as u64;
                let permit = proxy
                    .quotas
                    .admit(&tenant.name, limits, estimate, std::time::Instant::now())
                    .map_err(crate::policy::quota::QuotaRefusal::into_error)?;
                attempt.quota = Some(Arc::new(parking_lot::Mutex::new(permit)));
            }
            let session_rule = chosen.action.session.as_ref().unwrap_or(&pool.session);
            let ctx = RequestCtx {
                keys,
                session: session_rule.key(&parts.headers),
                lora,
                survival: pool.calibration.survival(),
                stall_share: StallShare::of(pool.pool.warm_share_seen()),
            };
            (chosen, ctx, forwarded, stage)
        }
        // Other paths pass through to the first pool's least-loaded endpoint, without prefix
        // information.
        None => {
            let chosen = policy.choose(0, &facts(None), || {
                proxy.pools[0].session.key(&parts.headers)
            });
            let pool = &proxy.pools[chosen.pool];
            let session_rule = chosen.action.session.as_ref().unwrap_or(&pool.session);
            let ctx = RequestCtx {
                session: session_rule.key(&parts.headers),
                ..RequestCtx::default()
            };
            let stage = pool_stage(pool, tenant, attempt).await?;
            (chosen, ctx, body, stage)
        }
    };
    let pool = &proxy.pools[chosen.pool];
    let mut answer = forward(
        proxy,
        pool,
        &chosen.action,
        &ctx,
        parts,
        body,
        attempt,
        strip_usage,
    )
    .await?;
    answer.body = admission::hold(answer.body, stage);
    Ok(answer)
}
