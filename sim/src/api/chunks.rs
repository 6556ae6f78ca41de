//! The JSON objects of vLLM's OpenAI-compatible responses, field for field.

use serde::Serialize;

use super::{request::Kind, respond::Usage};
use crate::engine::sequence::FinishReason;

#[derive(Serialize)]
pub struct CompletionChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [CompletionChoice<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

#[derive(Serialize)]
struct CompletionChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<&'a str>,
}

impl<'a> CompletionChunk<'a> {
    pub fn new(
        id: &'a str,
        created: u64,
        model: &'a str,
        text: &'a str,
        finish: Option<FinishReason>,
        stop_reason: Option<&'a str>,
        usage: Option<Option<Usage>>,
    ) -> Self {
        Self {
            id,
            object: "text_completion",
            created,
            model,
            choices: [CompletionChoice {
                index: 0,
                text,
                logprobs: None,
                finish_reason: finish.map(FinishReason::as_str),
                stop_reason,
            }],
            usage,
        }
    }
}

#[derive(Serialize)]
pub struct ChatChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [ChatChoice<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<&'a str>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

impl<'a> ChatChunk<'a> {
    #[allow(clippy::too_many_arguments)] // one per field of the wire object
    pub fn new(
        id: &'a str,
        created: u64,
        model: &'a str,
        content: Option<&'a str>,
        role: bool,
        finish: Option<FinishReason>,
        stop_reason: Option<&'a str>,
        usage: Option<Option<Usage>>,
    ) -> Self {
        Self {
            id,
            object: "chat.completion.chunk",
            created,
            model,
            choices: [ChatChoice {
                index: 0,
                delta: Delta {
                    role: role.then_some("assistant"),
                    content,
                },
                logprobs: None,
                finish_reason: finish.map(FinishReason::as_str),
                stop_reason,
            }],
            usage,
        }
    }
}

/// The non-streaming response body.
#[allow(clippy::too_many_arguments)] // one per field of the wire object
pub fn full_response(
    id: &str,
    created: u64,
    model: &str,
    kind: Kind,
    text: &str,
    finish: Option<FinishReason>,
    stop_reason: Option<&str>,
    usage: &Usage,
) -> Vec<u8> {
    let finish = finish.map(FinishReason::as_str);
    let value = match kind {
        Kind::Completion => serde_json::json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish,
                         "stop_reason": stop_reason, "prompt_logprobs": null}],
            "usage": usage,
        }),
        Kind::Chat => serde_json::json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0,
                         "message": {"role": "assistant", "content": text, "tool_calls": []},
                         "logprobs": null, "finish_reason": finish, "stop_reason": stop_reason}],
            "usage": usage, "prompt_logprobs": null,
        }),
    };
    serde_json::to_vec(&value).expect("plain data")
}
