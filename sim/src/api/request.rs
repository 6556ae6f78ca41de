//! Parsing and validating completion and chat requests into what the engine needs.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{ApiError, ServedModel};
use warmpath_tokenizer::{Chat, ChatJson};

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

/// The fields of both request kinds that the simulator honours; others are accepted and
/// ignored, as vLLM does, but for those asking for what it cannot give (log probabilities, the
/// prompt echoed, several samples), which are refused by name rather than answered without.
#[derive(Debug, Deserialize)]
struct Body {
    model: Option<String>,
    prompt: Option<Prompt>,
    /// Chat members handed to the template as JSON (`warmpath_tokenizer::Chat` reads them as
    /// vLLM does).
    messages: Option<Box<RawValue>>,
    tools: Option<Box<RawValue>>,
    documents: Option<Box<RawValue>>,
    chat_template_kwargs: Option<Box<RawValue>>,
    continue_final_message: Option<bool>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    stop: Option<Stop>,
    #[serde(default)]
    ignore_eos: bool,
    n: Option<i64>,
    best_of: Option<i64>,
    min_tokens: Option<i64>,
    /// An integer on completions (any, 0 too, asks), a boolean on chat; null or `false` ask
    /// for none.
    logprobs: Option<serde_json::Value>,
    top_logprobs: Option<i64>,
    prompt_logprobs: Option<i64>,
    #[serde(default)]
    echo: bool,
    #[serde(default)]
    include_stop_str_in_output: bool,
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
    /// Tokens before which EOS cannot end the request (`min_tokens`).
    pub min_tokens: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub stop: Vec<String>,
    /// Keep a matched stop string in the text (vLLM's `include_stop_str_in_output`).
    pub include_stop: bool,
    pub ignore_eos: bool,
    pub extra: ExtraKeys,
}

/// Parses and validates `body` for `model`'s endpoint `kind`.
pub fn prepare(kind: Kind, body: &[u8], served: &ServedModel) -> Result<Prepared, ApiError> {
    let body: Body = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    let model = body.model.clone().unwrap_or_else(|| served.name.clone());
    let lora = served.resolve(&model)?;
    unsupported(&body)?;
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
    let min_tokens = min_tokens(body.min_tokens, requested)?;
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
        min_tokens,
        prompt,

        model,
        stream: body.stream,
        include_usage: body
            .stream_options
            .is_some_and(|o| o.include_usage.unwrap_or(true)),
        stop,
        include_stop: body.include_stop_str_in_output,
        ignore_eos: body.ignore_eos,
        extra: ExtraKeys {
            lora_name: lora,
            cache_salt: body.cache_salt,
        },
    })
}

/// Refuses, by parameter, what the simulator cannot answer as vLLM would: several samples a
/// request, log probabilities (it samples from no distribution), the prompt echoed back.
fn unsupported(body: &Body) -> Result<(), ApiError> {
    for (param, n) in [("n", body.n), ("best_of", body.best_of)] {
        if let Some(n) = n
            && n != 1
        {
            return Err(ApiError::bad_param(
                param,
                format!("{param}={n} is not supported; only {param}=1 is"),
            ));
        }
    }
    // Completions: any number asks (0 too: the chosen token's own); chat: `true` asks.
    let asks = |v: &serde_json::Value| {
        !matches!(v, serde_json::Value::Null | serde_json::Value::Bool(false))
    };
    let logprobs = [
        ("logprobs", body.logprobs.as_ref().is_some_and(asks)),
        ("top_logprobs", body.top_logprobs.is_some_and(|k| k != 0)),
        ("prompt_logprobs", body.prompt_logprobs.is_some()),
    ];
    if let Some((param, _)) = logprobs.into_iter().find(|(_, asked)| *asked) {
        return Err(ApiError::bad_param(
            param,
            format!(
                "{param} is not supported by the simulator: its tokens are drawn from no \
                 distribution, so it has no log probabilities to return"
            ),
        ));
    }
    if body.echo {
        return Err(ApiError::bad_param(
            "echo",
            "echo is not supported by the simulator; the prompt is not returned with the answer",
        ));
    }
    Ok(())
}

/// `min_tokens` as vLLM checks it: at least 0 and at most `max_tokens` when that is given.
fn min_tokens(min: Option<i64>, max: Option<i64>) -> Result<usize, ApiError> {
    let Some(min) = min else {
        return Ok(0);
    };
    if min < 0 {
        return Err(ApiError::bad_param(
            "min_tokens",
            format!("min_tokens must be greater than or equal to 0, got {min}."),
        ));
    }
    if let Some(max) = max
        && min > max
    {
        return Err(ApiError::bad_param(
            "min_tokens",
            format!("min_tokens must be less than or equal to max_tokens={max}, got {min}."),
        ));
    }
    Ok(usize::try_from(min).unwrap_or(usize::MAX))
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
    let json = ChatJson {
        messages: messages.get(),
        tools: body.tools.as_deref().map(RawValue::get),
        documents: body
            .documents
            .as_deref()
            .map(RawValue::get)
            .filter(|d| *d != "null"),
        chat_template_kwargs: body.chat_template_kwargs.as_deref().map(RawValue::get),
    };
    let mut chat = Chat::from_json(json, body.add_generation_prompt.unwrap_or(true))
        .map_err(|e| template_error(&e))?;
    chat.continue_final_message = body.continue_final_message.unwrap_or(false);
    let text = served
        .tokenizer()
        .render_chat(&chat)
        .map_err(|e| template_error(&e))?;
    served
        .encoder
        .encode(&text, body.add_special_tokens.unwrap_or(false))
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))
}

/// vLLM answers a chat template that raises, or messages it cannot give the template, with
/// 400 and the exception's own message (a template's `raise_exception` text as written).
pub(super) fn template_error(e: &warmpath_tokenizer::Error) -> ApiError {
    use warmpath_tokenizer::Error as E;
    match e {
        E::Template(message) | E::Request(message) => ApiError::bad_request(message.clone()),
        other => ApiError::bad_param("messages", other.to_string()),
    }
}
