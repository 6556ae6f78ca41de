//! The small endpoints: models, health, tokenize/detokenize, prefix-cache reset, and the
//! simulator's cache listing for tests.

use std::sync::Arc;

use axum::{
    Json,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, ServedModel};

pub async fn models(State(s): State<Arc<ServedModel>>) -> Json<serde_json::Value> {
    let card = |id: &str, parent: Option<&str>| {
        json!({"id": id, "object": "model", "created": s.created, "owned_by": "vllm",
               "root": parent.map_or(id.to_string(), |_| id.to_string()), "parent": parent,
               "max_model_len": s.max_model_len, "permission": []})
    };
    let mut data = vec![card(&s.name, None)];
    data.extend(s.loras.iter().map(|l| card(l, Some(&s.name))));
    Json(json!({"object": "list", "data": data}))
}

pub async fn health(State(s): State<Arc<ServedModel>>) -> StatusCode {
    if s.engine.stats().healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

#[derive(Deserialize)]
struct TokenizeBody {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Box<serde_json::value::RawValue>>,
    tools: Option<Box<serde_json::value::RawValue>>,
    chat_template_kwargs: Option<Box<serde_json::value::RawValue>>,
    continue_final_message: Option<bool>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
}

pub async fn tokenize(State(s): State<Arc<ServedModel>>, body: Bytes) -> Response {
    let result = (|| {
        let body: TokenizeBody = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
        if let Some(m) = &body.model {
            s.resolve(m)?;
        }
        let (text, default_special) = match (&body.prompt, &body.messages) {
            (Some(p), _) => (p.clone(), true),
            (None, Some(messages)) => {
                let json = warmpath_tokenizer::ChatJson {
                    messages: messages.get(),
                    tools: body.tools.as_deref().map(|t| t.get()),
                    documents: None,
                    chat_template_kwargs: body.chat_template_kwargs.as_deref().map(|k| k.get()),
                };
                let rendered = warmpath_tokenizer::Chat::from_json(
                    json,
                    body.add_generation_prompt.unwrap_or(true),
                )
                .and_then(|mut chat| {
                    chat.continue_final_message = body.continue_final_message.unwrap_or(false);
                    s.tokenizer().render_chat(&chat)
                })
                .map_err(|e| super::request::template_error(&e))?;
                (rendered, false)
            }
            (None, None) => {
                return Err(ApiError::bad_request(
                    "Either 'prompt' or 'messages' is required.",
                ));
            }
        };
        let tokens = s
            .encoder
            .encode(&text, body.add_special_tokens.unwrap_or(default_special))
            .map_err(|e| ApiError::bad_param("prompt", e.to_string()))?;
        Ok(json!({"count": tokens.len(), "max_model_len": s.max_model_len, "tokens": tokens}))
    })();
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

pub async fn detokenize(State(s): State<Arc<ServedModel>>, body: Bytes) -> Response {
    let body: DetokenizeBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return ApiError::bad_request(format!("Invalid request body: {e}")).into_response();
        }
    };
    match s.tokenizer().decode(&body.tokens, false) {
        Ok(prompt) => Json(json!({"prompt": prompt})).into_response(),
        Err(e) => ApiError::bad_param("tokens", e.to_string()).into_response(),
    }
}

pub async fn reset_prefix_cache(State(s): State<Arc<ServedModel>>) -> Response {
    match s.engine.reset_prefix_cache().await {
        Ok(true) => StatusCode::OK.into_response(),
        Ok(false) => {
            ApiError::bad_request("Prefix cache is in use by running requests; not reset.")
                .into_response()
        }
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `GET /sim/cache`: every cached block per tier, as the int and the bytes form events carry.
pub async fn cached_blocks(State(s): State<Arc<ServedModel>>) -> Response {
    let list = |hashes: &[crate::engine::BlockHash]| -> Vec<serde_json::Value> {
        hashes
            .iter()
            .map(|h| json!({"hash_int": crate::events::hash_to_u64(h), "hash_hex": hex::encode(h)}))
            .collect()
    };
    match s.engine.cached_blocks().await {
        Ok(cached) => Json(json!({
            "block_size": s.engine.config().block_size,
            "blocks": list(&cached.gpu),
            "cpu_blocks": list(&cached.cpu),
        }))
        .into_response(),
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Counts each request by HTTP version (see `GET /sim/http`).
pub async fn count_http_version(
    State(s): State<Arc<ServedModel>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let counter = if req.version() == axum::http::Version::HTTP_2 {
        &s.http2_requests
    } else {
        &s.http1_requests
    };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    next.run(req).await
}

/// `{"http1": n, "http2": m}`: requests received per HTTP version.
pub async fn http_versions(State(s): State<Arc<ServedModel>>) -> Response {
    use std::sync::atomic::Ordering::Relaxed;
    Json(json!({
        "http1": s.http1_requests.load(Relaxed),
        "http2": s.http2_requests.load(Relaxed),
    }))
    .into_response()
}
