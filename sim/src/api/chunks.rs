//! The JSON objects of vLLM's OpenAI-compatible responses, field for field.

use serde::Serialize;

use super::request::Kind;
use crate::engine::sequence::FinishReason;

/// The token counts of a response (`usage`), as vLLM reports them.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_tokens_details: PromptDetails,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct PromptDetails {
    pub cached_tokens: usize,
}

/// One streamed chunk: the envelope both endpoints share, around their one choice. `B` is
/// the choice's endpoint-specific part (`Text` or `ChatDelta`).
#[derive(Serialize)]
pub struct Chunk<'a, B> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a, B>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

#[derive(Serialize)]
struct Choice<'a, B> {
    index: u32,
    /// Flattened so its field sits between `index` and `logprobs`, where vLLM puts it.
    #[serde(flatten)]
    body: B,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<&'a str>,
}

/// A completion choice's part: the text.
#[derive(Serialize)]
pub struct Text<'a> {
    text: &'a str,
}

/// A chat choice's part: the delta.
#[derive(Serialize)]
pub struct ChatDelta<'a> {
    delta: Delta<'a>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

/// What a chunk of either endpoint carries besides its choice's own part.
pub struct ChunkHead<'a> {
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
    pub finish: Option<FinishReason>,
    pub stop_reason: Option<&'a str>,
    pub usage: Option<Option<Usage>>,
}

impl<'a> ChunkHead<'a> {
    /// A `/v1/completions` chunk.
    pub fn completion(self, text: &'a str) -> Chunk<'a, Text<'a>> {
        self.chunk("text_completion", Text { text })
    }

    /// A `/v1/chat/completions` chunk; `role` marks the first one.
    pub fn chat(self, content: Option<&'a str>, role: bool) -> Chunk<'a, ChatDelta<'a>> {
        let delta = Delta {
            role: role.then_some("assistant"),
            content,
        };
        self.chunk("chat.completion.chunk", ChatDelta { delta })
    }

    fn chunk<B>(self, object: &'static str, body: B) -> Chunk<'a, B> {
        Chunk {
            id: self.id,
            object,
            created: self.created,
            model: self.model,
            choices: [Choice {
                index: 0,
                body,
                logprobs: None,
                finish_reason: self.finish.map(FinishReason::as_str),
                stop_reason: self.stop_reason,
            }],
            usage: self.usage,
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

#[cfg(test)]
mod tests {
    use serde_json::to_string;

    use super::*;

    fn head(finish: Option<FinishReason>) -> ChunkHead<'static> {
        ChunkHead {
            id: "cmpl-1",
            created: 7,
            model: "m",
            finish,
            stop_reason: None,
            usage: None,
        }
    }

    #[test]
    fn chunks_keep_vllms_field_order() {
        assert_eq!(
            to_string(&head(None).completion("hi")).unwrap(),
            r#"{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":null,"stop_reason":null}]}"#
        );
        assert_eq!(
            to_string(&head(None).chat(Some("hi"), true)).unwrap(),
            r#"{"id":"cmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"logprobs":null,"finish_reason":null,"stop_reason":null}]}"#
        );
        let mut last = head(Some(FinishReason::Length));
        last.usage = Some(None);
        assert_eq!(
            to_string(&last.chat(None, false)).unwrap(),
            r#"{"id":"cmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":null}"#
        );
    }
}
