//! Answering a prepared request: SSE streaming exactly as vLLM frames it, or one JSON body.

use std::{sync::Arc, time::SystemTime};

use axum::{
    body::Body,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use tokio::sync::mpsc::UnboundedReceiver;

use super::{
    ApiError, ServedModel,
    assemble::Assembler,
    chunks::{ChunkHead, PromptDetails, Usage},
    request::{Kind, Prepared},
};
use crate::engine::sequence::{FinishReason, Output};

/// Per-request constants of every chunk.
#[derive(Debug)]
struct Ids {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
}

/// State of one response being produced.
#[derive(Debug)]
struct Responder {
    served: Arc<ServedModel>,
    rx: UnboundedReceiver<Output>,
    ids: Ids,
    asm: Assembler,
    prompt_tokens: usize,
    cached_tokens: usize,
    include_usage: bool,
    role_sent: bool,
    finish: Option<FinishReason>,
    eos_counted: bool,
}

/// Starts answering `req`, whose outputs arrive on `rx`.
pub async fn respond(
    served: Arc<ServedModel>,
    req: Prepared,
    rx: UnboundedReceiver<Output>,
) -> Response {
    let prefix = if req.kind == Kind::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let ids = Ids {
        id: format!("{prefix}-{:032x}", rand::random::<u128>()),
        created: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: req.model.clone(),
        kind: req.kind,
    };
    let responder = Responder {
        served,
        rx,
        ids,
        asm: Assembler::new(req.stop, req.min_tokens, req.include_stop),
        prompt_tokens: req.prompt.len(),
        cached_tokens: 0,
        include_usage: req.include_usage,
        role_sent: false,
        finish: None,
        eos_counted: false,
    };
    if req.stream {
        stream(responder)
    } else {
        // Awaited inside the handler: if the client goes away hyper drops this future, which
        // drops `rx`, which aborts the request in the engine.
        match responder.complete().await {
            Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
            Err(message) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
            }
        }
    }
}

fn stream(responder: Responder) -> Response {
    let body = futures::stream::unfold(Some(responder), |state| async move {
        let mut r = state?;
        let mut buf = Vec::with_capacity(512);
        let done = r.next_events(&mut buf).await;
        Some((
            Ok::<_, std::convert::Infallible>(Bytes::from(buf)),
            (!done).then_some(r),
        ))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .expect("static headers are valid")
}

impl Responder {
    /// Waits for output and writes every event available now into `buf`. True at the end.
    async fn next_events(&mut self, buf: &mut Vec<u8>) -> bool {
        if self.stalled() {
            // Injected stall: never another byte. The client gives up, hyper drops this
            // stream, `rx` goes with it and the engine aborts the request.
            std::future::pending::<()>().await;
        }
        let mut next = self.rx.recv().await;
        loop {
            let done = self.on_stream_output(next, buf);
            if done || self.stalled() {
                return done;
            }
            match self.rx.try_recv() {
                Ok(o) => next = Some(o),
                Err(_) => return false,
            }
        }
    }

    fn on_stream_output(&mut self, output: Option<Output>, buf: &mut Vec<u8>) -> bool {
        match output {
            Some(Output::Prefilled { cached_tokens }) => {
                self.cached_tokens = cached_tokens;
                if self.ids.kind == Kind::Chat && !self.role_sent {
                    self.role_sent = true;
                    self.write_chunk(buf, Some(""), None, true);
                }
                false
            }
            Some(Output::Token(id)) => {
                let piece = self.served.token_text(id);
                let delta = self.asm.push(&piece).to_string();
                if !delta.is_empty() {
                    self.write_chunk(buf, Some(&delta), None, false);
                }
                if self.asm.stopped_by.is_some() {
                    self.finish(buf, FinishReason::Stop);
                    return true;
                }
                false
            }
            Some(Output::Finished(reason)) => {
                let rest = self.asm.flush().to_string();
                if !rest.is_empty() {
                    self.write_chunk(buf, Some(&rest), None, false);
                }
                self.eos_counted = reason == FinishReason::Stop;
                self.finish(buf, reason);
                true
            }
            Some(Output::Failed(message)) => {
                write_error(
                    buf,
                    &ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message),
                );
                true
            }
            None => {
                write_error(
                    buf,
                    &ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "engine stopped before the request finished",
                    ),
                );
                true
            }
        }
    }

    /// Injected fault: stop producing output mid-stream (the client must give up).
    fn stalled(&self) -> bool {
        self.served
            .faults
            .stall_after_tokens
            .is_some_and(|k| self.asm.tokens >= k)
    }

    fn finish(&mut self, buf: &mut Vec<u8>, reason: FinishReason) {
        self.finish = Some(reason);
        self.write_chunk(buf, Some(""), Some(reason), false);
        if self.include_usage {
            self.write_usage_chunk(buf);
        }
        buf.extend_from_slice(b"data: [DONE]\n\n");
    }

    fn usage(&self) -> Usage {
        let completion = self.asm.tokens + usize::from(self.eos_counted);
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: completion,
            total_tokens: self.prompt_tokens + completion,
            prompt_tokens_details: PromptDetails {
                cached_tokens: self.cached_tokens,
            },
        }
    }

    fn write_chunk(
        &self,
        buf: &mut Vec<u8>,
        text: Option<&str>,
        finish: Option<FinishReason>,
        role: bool,
    ) {
        let usage = self.include_usage.then_some(None);
        let stop_reason = finish.and(self.asm.stopped_by.as_deref());
        buf.extend_from_slice(b"data: ");
        let head = ChunkHead {
            id: &self.ids.id,
            created: self.ids.created,
            model: &self.ids.model,
            finish,
            stop_reason,
            usage,
        };
        let result = match self.ids.kind {
            Kind::Completion => {
                serde_json::to_writer(&mut *buf, &head.completion(text.unwrap_or("")))
            }
            Kind::Chat => serde_json::to_writer(&mut *buf, &head.chat(text, role)),
        };
        result.expect("chunks are plain data");
        buf.extend_from_slice(b"\n\n");
    }

    fn write_usage_chunk(&self, buf: &mut Vec<u8>) {
        let usage = self.usage();
        buf.extend_from_slice(b"data: ");
        let object = if self.ids.kind == Kind::Chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        serde_json::to_writer(
            &mut *buf,
            &serde_json::json!({"id": self.ids.id, "object": object, "created": self.ids.created,
                "model": self.ids.model, "choices": [], "usage": usage}),
        )
        .expect("plain data");
        buf.extend_from_slice(b"\n\n");
    }

    /// Non-streaming: collect everything, then one JSON body.
    async fn complete(mut self) -> Result<Bytes, String> {
        loop {
            match self.rx.recv().await {
                Some(Output::Prefilled { cached_tokens }) => self.cached_tokens = cached_tokens,
                Some(Output::Token(id)) => {
                    let piece = self.served.token_text(id);
                    self.asm.push(&piece);
                    if self.asm.stopped_by.is_some() {
                        self.finish = Some(FinishReason::Stop);
                        break;
                    }
                }
                Some(Output::Finished(reason)) => {
                    self.asm.flush();
                    self.eos_counted = reason == FinishReason::Stop;
                    self.finish = Some(reason);
                    break;
                }
                Some(Output::Failed(message)) => return Err(message),
                None => return Err("engine stopped before the request finished".into()),
            }
        }
        let body = super::chunks::full_response(
            &self.ids.id,
            self.ids.created,
            &self.ids.model,
            self.ids.kind,
            self.asm.text(),
            self.finish,
            self.asm.stopped_by.as_deref(),
            &self.usage(),
        );
        Ok(Bytes::from(body))
    }
}

fn write_error(buf: &mut Vec<u8>, err: &ApiError) {
    buf.extend_from_slice(b"data: ");
    buf.extend_from_slice(&err.body());
    buf.extend_from_slice(b"\n\ndata: [DONE]\n\n");
}
