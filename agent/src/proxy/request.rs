//! From a request body to what routing needs: the model, the prompt's tokens and its key chain.
//! Tokenization mirrors vLLM: completions add special tokens by default, chat prompts are
//! rendered with the chat template and do not.

use warmpath_sim::tokenizer::{ChatMessage, Tokenizer};

use super::error::ProxyError;
use crate::kv_index::{RequestExtras, RouterKey, request_keys};

/// Encodes text as a pool's tokenizer does (plain, or with the per-segment cache).
pub trait Encoder {
    /// The tokenizer whose chat template renders messages.
    fn template(&self) -> &Tokenizer;
    fn encode_text(&self, text: &str, add_special_tokens: bool) -> Option<Vec<u32>>;
}

impl Encoder for Tokenizer {
    fn template(&self) -> &Tokenizer {
        self
    }
    fn encode_text(&self, text: &str, add_special_tokens: bool) -> Option<Vec<u32>> {
        self.encode(text, add_special_tokens).ok()
    }
}

impl Encoder for warmpath_sim::tokenizer::segments::SegmentTokenizer {
    fn template(&self) -> &Tokenizer {
        self.tokenizer()
    }
    fn encode_text(&self, text: &str, add_special_tokens: bool) -> Option<Vec<u32>> {
        self.encode(text, add_special_tokens).ok()
    }
}

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

/// A request body read as JSON, with what every token source needs.
#[derive(Debug, Clone)]
pub struct Request {
    pub kind: Kind,
    pub obj: serde_json::Map<String, serde_json::Value>,
    pub model: String,
    pub stream: bool,
    pub include_usage: Option<bool>,
    pub cache_salt: Option<String>,
}

impl Request {
    /// Parses the body (400 on bad JSON or a non-string model). `default_model` fills an
    /// absent `model`, as vLLM does.
    pub fn read(kind: Kind, body: &[u8], default_model: &str) -> Result<Self, ProxyError> {
        let v: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| ProxyError::bad_request(format!("Invalid JSON body: {e}")))?;
        let serde_json::Value::Object(obj) = v else {
            return Err(ProxyError::bad_request(
                "The request body must be a JSON object.",
            ));
        };
        let model = match obj.get("model") {
            None | Some(serde_json::Value::Null) => default_model.to_string(),
            Some(serde_json::Value::String(m)) => m.clone(),
            Some(_) => return Err(ProxyError::bad_request("Field 'model' must be a string.")),
        };
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
        let cache_salt = obj
            .get("cache_salt")
            .and_then(|s| s.as_str())
            .map(str::to_string);
        Ok(Self {
            kind,
            obj,
            model,
            stream,
            include_usage,
            cache_salt,
        })
    }

    /// Whether the client will get a usage chunk without the proxy asking for one.
    pub fn wants_usage(&self) -> bool {
        !self.stream || self.include_usage == Some(true)
    }

    /// Extra key inputs: the adapter on every block, the salt on the first.
    pub fn extras(&self, lora: Option<&str>) -> RequestExtras {
        RequestExtras {
            lora_name: lora.map(str::to_string),
            cache_salt: self.cache_salt.clone(),
        }
    }

    /// Tokens as vLLM would compute them with `tokenizer`; `None` for a prompt the router
    /// cannot tokenize (odd shape, template failure) — it is still forwarded, routed without
    /// prefix information, and the engine answers with its own validation error.
    pub fn local_tokens(&self, tokenizer: &dyn Encoder) -> Option<Vec<u32>> {
        match self.kind {
            Kind::Completion => completion_tokens(&self.obj, tokenizer),
            Kind::Chat => chat_tokens(&self.obj, tokenizer),
        }
    }

    /// Token ids given directly as the prompt (completions), if so.
    pub fn prompt_ids(&self) -> Option<Vec<u32>> {
        match self.obj.get("prompt")? {
            serde_json::Value::Array(items) if items.first()?.is_number() => items
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect(),
            _ => None,
        }
    }

    /// The body of the engine's `POST /tokenize` for this prompt (vLLM's rules for special
    /// tokens and the chat template apply there).
    pub fn tokenize_body(&self) -> Option<serde_json::Value> {
        let mut out = serde_json::Map::new();
        out.insert("model".into(), self.model.clone().into());
        let copy = |out: &mut serde_json::Map<String, serde_json::Value>, k: &str| {
            if let Some(v) = self.obj.get(k) {
                out.insert(k.into(), v.clone());
            }
        };
        match self.kind {
            Kind::Completion => {
                let prompt = match self.obj.get("prompt")? {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Array(items) if items.len() == 1 => {
                        items[0].as_str()?.to_string()
                    }
                    _ => return None,
                };
                out.insert("prompt".into(), prompt.into());
                copy(&mut out, "add_special_tokens");
            }
            Kind::Chat => {
                copy(&mut out, "messages");
                copy(&mut out, "add_generation_prompt");
                copy(&mut out, "add_special_tokens");
                copy(&mut out, "chat_template_kwargs");
            }
        }
        Some(out.into())
    }

    /// The prompt as text (completions: the prompt; chat: role and content of each message),
    /// for approximate keys.
    pub fn text(&self) -> Option<String> {
        match self.kind {
            Kind::Completion => match self.obj.get("prompt")? {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Array(items) if items.len() == 1 => {
                    items[0].as_str().map(str::to_string)
                }
                _ => None,
            },
            Kind::Chat => {
                let mut text = String::new();
                for m in self.obj.get("messages")?.as_array()? {
                    text.push_str(m.get("role").and_then(|r| r.as_str()).unwrap_or(""));
                    text.push('\n');
                    match m.get("content") {
                        Some(serde_json::Value::String(s)) => text.push_str(s),
                        Some(serde_json::Value::Array(parts)) => {
                            for p in parts {
                                text.push_str(p.get("text").and_then(|t| t.as_str()).unwrap_or(""));
                            }
                        }
                        _ => {}
                    }
                    text.push('\n');
                }
                Some(text)
            }
        }
    }
}

/// Parses a JSON body and computes its key chain with a local tokenizer. The body itself is
/// forwarded untouched.
pub fn parse(
    kind: Kind,
    body: &[u8],
    default_model: &str,
    tokenizer: &Tokenizer,
    block_size: usize,
) -> Result<Parsed, ProxyError> {
    let req = Request::read(kind, body, default_model)?;
    let tokens = req.local_tokens(tokenizer).unwrap_or_default();
    Ok(Parsed {
        keys: request_keys(&tokens, block_size, &req.extras(None)),
        prompt_tokens: tokens.len(),
        stream: req.stream,
        include_usage: req.include_usage,
        model: req.model,
    })
}

fn completion_tokens(
    obj: &serde_json::Map<String, serde_json::Value>,
    tokenizer: &dyn Encoder,
) -> Option<Vec<u32>> {
    let add_special = obj
        .get("add_special_tokens")
        .and_then(|b| b.as_bool())
        .unwrap_or(true);
    match obj.get("prompt")? {
        serde_json::Value::String(text) => tokenizer.encode_text(text, add_special),
        serde_json::Value::Array(items) => match items.first()? {
            serde_json::Value::Number(_) => items
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect(),
            serde_json::Value::String(text) if items.len() == 1 => {
                tokenizer.encode_text(text, add_special)
            }
            _ => None,
        },
        _ => None,
    }
}

fn chat_tokens(
    obj: &serde_json::Map<String, serde_json::Value>,
    tokenizer: &dyn Encoder,
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
        .template()
        .apply_chat_template(&messages, add_generation_prompt)
        .ok()?;
    let add_special = obj
        .get("add_special_tokens")
        .and_then(|b| b.as_bool())
        .unwrap_or(false);
    tokenizer.encode_text(&text, add_special)
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
