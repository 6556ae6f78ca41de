//! From a request body to what routing needs: the model, the prompt's tokens and its key chain.
//! Tokenization mirrors vLLM: completions add special tokens by default, chat prompts are
//! rendered with the chat template and do not.

use warmpath_sim::tokenizer::{ChatMessage, Tokenizer};

use super::error::ProxyError;
use crate::kv_index::{RequestExtras, RouterKey, request_keys};

/// Which endpoint family a request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// What routing takes from a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub model: String,
    pub keys: Vec<RouterKey>,
    pub prompt_tokens: usize,
    /// The LoRA adapter the request names (its `model`), if it is one.
    pub lora: Option<String>,
    /// `"stream": true`.
    pub stream: bool,
    /// `stream_options.include_usage` as the client set it (`None`: no `stream_options`;
    /// vLLM then sends no usage chunk).
    pub include_usage: Option<bool>,
}

impl Parsed {
    /// Whether the client will get a usage chunk without the proxy asking for one.
    pub fn wants_usage(&self) -> bool {
        !self.stream || self.include_usage == Some(true)
    }
}

/// The body with `stream_options.include_usage` turned on, so the stream ends with the
/// engine's token counts; the SSE tap removes them again before the client sees the stream.
pub fn ask_for_usage(body: &bytes::Bytes, include_usage: Option<bool>) -> bytes::Bytes {
    match include_usage {
        Some(true) => body.clone(),
        // No stream_options: add the member first (the cheap, common case).
        None => {
            let at = body.iter().position(|&b| b == b'{').map_or(0, |i| i + 1);
            let mut out = Vec::with_capacity(body.len() + 48);
            out.extend_from_slice(&body[..at]);
            out.extend_from_slice(br#""stream_options":{"include_usage":true},"#);
            out.extend_from_slice(&body[at..]);
            // `{}` would now end in `,}`: only a member-less object can, and it has no prompt.
            if body[at..]
                .iter()
                .all(|b| b.is_ascii_whitespace() || *b == b'}')
            {
                return body.clone();
            }
            out.into()
        }
        // Explicitly false: rewrite the member (rare).
        Some(false) => {
            let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(body) else {
                return body.clone();
            };
            if let Some(o) = v.get_mut("stream_options").and_then(|o| o.as_object_mut()) {
                o.insert("include_usage".into(), true.into());
            }
            serde_json::to_vec(&v).map_or_else(|_| body.clone(), Into::into)
        }
    }
}

/// Parses a JSON body and computes its key chain. The body itself is forwarded untouched.
pub fn parse(
    kind: Kind,
    body: &[u8],
    default_model: &str,
    tokenizer: &Tokenizer,
    block_size: usize,
) -> Result<Parsed, ProxyError> {
    parse_with_adapters(kind, body, default_model, tokenizer, block_size, &|_| false)
}

/// Like [`parse`]; a `model` for which `is_adapter` holds is a LoRA adapter, whose name joins
/// every block's key (as vLLM's block hashes include it).
pub fn parse_with_adapters(
    kind: Kind,
    body: &[u8],
    default_model: &str,
    tokenizer: &Tokenizer,
    block_size: usize,
    is_adapter: &dyn Fn(&str) -> bool,
) -> Result<Parsed, ProxyError> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ProxyError::bad_request(format!("Invalid JSON body: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| ProxyError::bad_request("The request body must be a JSON object."))?;
    let model = match obj.get("model") {
        None | Some(serde_json::Value::Null) => default_model.to_string(),
        Some(serde_json::Value::String(m)) => m.clone(),
        Some(_) => return Err(ProxyError::bad_request("Field 'model' must be a string.")),
    };
    let lora = (model != default_model && is_adapter(&model)).then(|| model.clone());
    let extras = RequestExtras {
        lora_name: lora.clone(),
        cache_salt: obj
            .get("cache_salt")
            .and_then(|s| s.as_str())
            .map(str::to_string),
    };
    let tokens = match kind {
        Kind::Completion => completion_tokens(obj, tokenizer),
        Kind::Chat => chat_tokens(obj, tokenizer),
    };
    // An unroutable prompt (odd shape, template failure) is still forwarded: the engine
    // answers with its own validation error; routing just gets no prefix information.
    let tokens = tokens.unwrap_or_default();
    let stream = obj.get("stream").and_then(|s| s.as_bool()).unwrap_or(false);
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.as_object())
        .map(|o| {
            // vLLM: include_usage defaults to true whenever stream_options is present.
            o.get("include_usage")
                .and_then(|b| b.as_bool())
                .unwrap_or(true)
        });
    Ok(Parsed {
        lora,
        stream,
        include_usage,
        model,
        keys: request_keys(&tokens, block_size, &extras),
        prompt_tokens: tokens.len(),
    })
}

fn completion_tokens(
    obj: &serde_json::Map<String, serde_json::Value>,
    tokenizer: &Tokenizer,
) -> Option<Vec<u32>> {
    let add_special = obj
        .get("add_special_tokens")
        .and_then(|b| b.as_bool())
        .unwrap_or(true);
    match obj.get("prompt")? {
        serde_json::Value::String(text) => tokenizer.encode(text, add_special).ok(),
        serde_json::Value::Array(items) => match items.first()? {
            serde_json::Value::Number(_) => items
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect(),
            serde_json::Value::String(text) if items.len() == 1 => {
                tokenizer.encode(text, add_special).ok()
            }
            _ => None,
        },
        _ => None,
    }
}

fn chat_tokens(
    obj: &serde_json::Map<String, serde_json::Value>,
    tokenizer: &Tokenizer,
) -> Option<Vec<u32>> {
    let messages: Vec<ChatMessage> = obj
        .get("messages")?
        .as_array()?
        .iter()
        .map(|m| {
            let role = m.get("role")?.as_str()?.to_string();
            let content = match m.get("content") {
                None | Some(serde_json::Value::Null) => String::new(),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Array(parts)) => parts
                    .iter()
                    .filter(|p| p.get("type").and_then(|t| t.as_str()) == Some("text"))
                    .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
                    .collect::<Vec<_>>()
                    .join("\n"),
                Some(_) => return None,
            };
            Some(ChatMessage { role, content })
        })
        .collect::<Option<_>>()?;
    let add_generation_prompt = obj
        .get("add_generation_prompt")
        .and_then(|b| b.as_bool())
        .unwrap_or(true);
    let text = tokenizer
        .apply_chat_template(&messages, add_generation_prompt)
        .ok()?;
    let add_special = obj
        .get("add_special_tokens")
        .and_then(|b| b.as_bool())
        .unwrap_or(false);
    tokenizer.encode(&text, add_special).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_what_the_simulator_hashes() {
        let tok = Tokenizer::builtin();
        let body = br#"{"model": "m", "prompt": "The quick brown fox jumps over the lazy dog again and again and again"}"#;
        let p = parse(Kind::Completion, body, "m", &tok, 4).unwrap();
        let ids = tok
            .encode(
                "The quick brown fox jumps over the lazy dog again and again and again",
                true,
            )
            .unwrap();
        assert_eq!(p.prompt_tokens, ids.len());
        assert_eq!(p.keys, request_keys(&ids, 4, &RequestExtras::default()));
        let chat = br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}]}"#;
        let c = parse(Kind::Chat, chat, "m", &tok, 4).unwrap();
        assert_eq!(c.model, "m");
        assert!(c.prompt_tokens > 4);
        let salted = parse(
            Kind::Completion,
            br#"{"prompt": [1,2,3,4,5,6,7,8], "cache_salt": "t"}"#,
            "m",
            &tok,
            4,
        )
        .unwrap();
        let plain = parse(
            Kind::Completion,
            br#"{"prompt": [1,2,3,4,5,6,7,8]}"#,
            "m",
            &tok,
            4,
        )
        .unwrap();
        assert_eq!(plain.keys.len(), 2);
        assert_ne!(salted.keys, plain.keys);
    }

    #[test]
    fn bad_bodies_are_400_odd_prompts_route_without_prefix() {
        let tok = Tokenizer::builtin();
        assert_eq!(
            parse(Kind::Completion, b"{nope", "m", &tok, 16)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            parse(Kind::Completion, b"[1]", "m", &tok, 16)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            parse(Kind::Completion, br#"{"model": 3}"#, "m", &tok, 16)
                .unwrap_err()
                .status,
            400
        );
        let odd = parse(Kind::Completion, br#"{"prompt": {"x": 1}}"#, "m", &tok, 16).unwrap();
        assert!(odd.keys.is_empty());
    }

    #[test]
    fn usage_is_asked_for_without_losing_the_request() {
        let tok = Tokenizer::builtin();
        for (body, wants) in [
            (&br#"{"prompt": "a", "stream": true}"#[..], false),
            (
                br#" { "prompt": "a", "stream": true, "stream_options": {"include_usage": false}}"#,
                false,
            ),
            (
                br#"{"prompt": "a", "stream": true, "stream_options": {}}"#,
                true,
            ),
            (br#"{"prompt": "a"}"#, true),
        ] {
            let p = parse(Kind::Completion, body, "m", &tok, 16).unwrap();
            assert_eq!(p.wants_usage(), wants, "{}", String::from_utf8_lossy(body));
            if p.wants_usage() {
                continue;
            }
            let asked = ask_for_usage(&bytes::Bytes::copy_from_slice(body), p.include_usage);
            let v: serde_json::Value = serde_json::from_slice(&asked).unwrap();
            assert_eq!(v["stream_options"]["include_usage"], true);
            assert_eq!(v["prompt"], "a");
        }
    }
}
