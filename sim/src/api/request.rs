//! Parsing and validating completion and chat requests into what the engine needs.

use serde::Deserialize;

use super::{ApiError, ServedModel};
use warmpath_tokenizer::ChatMessage;

use crate::engine::kv_cache::ExtraKeys;

/// Which endpoint a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

/// The fields of both request kinds that the simulator honours; others are accepted and
/// ignored, as vLLM does.
#[derive(Debug, Deserialize)]
struct Body {
    model: Option<String>,
    prompt: Option<Prompt>,
    messages: Option<Vec<Message>>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    stop: Option<Stop>,
    #[serde(default)]
    ignore_eos: bool,
    n: Option<i64>,
    cache_salt: Option<String>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
}

/// A validated request.
#[derive(Debug)]
pub struct Prepared {
    pub kind: Kind,
    pub model: String,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub extra: ExtraKeys,
}

/// Parses and validates `body` for `model`'s endpoint `kind`.
pub fn prepare(kind: Kind, body: &[u8], served: &ServedModel) -> Result<Prepared, ApiError> {
    let body: Body = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    let model = body.model.clone().unwrap_or_else(|| served.name.clone());
    let lora = served.resolve(&model)?;
    if let Some(n) = body.n
        && n != 1
    {
        return Err(ApiError::bad_param(
            "n",
            format!("n={n} is not supported; only n=1 is"),
        ));
    }
    if let Some(salt) = &body.cache_salt
        && salt.is_empty()
    {
        return Err(ApiError::bad_param(
            "cache_salt",
            "Parameter 'cache_salt' must be a non-empty string if provided.",
        ));
    }
    let prompt = match kind {
        Kind::Completion => completion_prompt(&body, served)?,
        Kind::Chat => chat_prompt(&body, served)?,
    };
    let max_len = served.max_model_len;
    let requested = body.max_completion_tokens.or(body.max_tokens);
    if let Some(m) = requested
        && m < 1
    {
        return Err(ApiError::bad_param(
            "max_tokens",
            format!("max_tokens must be at least 1, got {m}."),
        ));
    }
    if prompt.len() >= max_len
        || requested.is_some_and(|m| prompt.len() as i64 + m > max_len as i64)
    {
        let completion = requested.unwrap_or(0);
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {max_len} tokens. However, you requested {} tokens ({} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.",
            prompt.len() as i64 + completion,
            prompt.len()
        )));
    }
    let stop = match body.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    }
    .into_iter()
    .filter(|s| !s.is_empty())
    .collect();
    Ok(Prepared {
        kind,
        max_tokens: requested.map_or(max_len - prompt.len(), |m| m as usize),
        prompt,

        model,
        stream: body.stream,
        include_usage: body
            .stream_options
            .is_some_and(|o| o.include_usage.unwrap_or(true)),
        stop,
        ignore_eos: body.ignore_eos,
        extra: ExtraKeys {
            lora_name: lora,
            cache_salt: body.cache_salt,
        },
    })
}

fn completion_prompt(body: &Body, served: &ServedModel) -> Result<Vec<u32>, ApiError> {
    let add_special = body.add_special_tokens.unwrap_or(true);
    let encode = |text: &str| {
        served
            .encoder
            .encode(text, add_special)
            .map_err(|e| ApiError::bad_param("prompt", e.to_string()))
    };
    let tokens = match &body.prompt {
        None => return Err(ApiError::bad_param("prompt", "Field 'prompt' is required.")),
        Some(Prompt::Text(t)) => encode(t)?,
        Some(Prompt::Tokens(t)) => t.clone(),
        Some(Prompt::Texts(v)) if v.len() == 1 => encode(&v[0])?,
        Some(Prompt::TokenLists(v)) if v.len() == 1 => v[0].clone(),
        Some(_) => {
            return Err(ApiError::bad_param(
                "prompt",
                "Batched prompts are not supported by the simulator; send one prompt per request.",
            ));
        }
    };
    if tokens.is_empty() {
        return Err(ApiError::bad_param("prompt", "The prompt cannot be empty."));
    }
    let vocab = served.tokenizer().vocab_size() as u32;
    if let Some(bad) = tokens.iter().find(|t| **t >= vocab) {
        return Err(ApiError::bad_param(
            "prompt",
            format!("Token id {bad} is out of vocabulary (size {vocab})."),
        ));
    }
    Ok(tokens)
}

fn chat_prompt(body: &Body, served: &ServedModel) -> Result<Vec<u32>, ApiError> {
    let Some(messages) = &body.messages else {
        return Err(ApiError::bad_param(
            "messages",
            "Field 'messages' is required.",
        ));
    };
    let messages: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage {
            role: m.role.clone(),
            content: match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => parts
                    .iter()
                    .filter(|p| p.kind == "text")
                    .filter_map(|p| p.text.as_deref())
                    .collect::<Vec<_>>()
                    .join("\n"),
            },
        })
        .collect();
    let text = served
        .tokenizer()
        .apply_chat_template(&messages, body.add_generation_prompt.unwrap_or(true))
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
    served
        .encoder
        .encode(&text, body.add_special_tokens.unwrap_or(false))
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))
}
