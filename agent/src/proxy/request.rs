//! From a request body to what routing needs: the model, the prompt's tokens and its key chain.
//! Tokenization mirrors vLLM: completions add special tokens by default, chat prompts are
//! rendered with the chat template and do not.

use std::borrow::Cow;

use serde_json::value::RawValue;
use warmpath_tokenizer::{Chat, ChatJson, Tokenizer};

use super::{
    error::ProxyError,
    unkeyed::{Unkeyed, UnkeyedReason},
};
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

impl Encoder for warmpath_tokenizer::segments::SegmentTokenizer {
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
        // No stream_options member: add one first (the cheap, common case).
        None if !may_hold_options(body) => {
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
        // Explicitly false, or a member that is no object (`null`: a member added first
        // would be overridden by it, the last occurrence counting), or a key that may be
        // spelt with escapes: rewrite the member (rare).
        _ => {
            let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(body) else {
                return body.clone();
            };
            if let Some(o) = v.as_object_mut() {
                match o.get_mut("stream_options").and_then(|s| s.as_object_mut()) {
                    Some(s) => {
                        s.insert("include_usage".into(), true.into());
                    }
                    None => {
                        o.insert(
                            "stream_options".into(),
                            serde_json::json!({"include_usage": true}),
                        );
                    }
                }
            }
            serde_json::to_vec(&v).map_or_else(|_| body.clone(), Into::into)
        }
    }
}

/// Whether a body may hold a `stream_options` member: the key as written, or any `\u`
/// escape (which could spell it).
fn may_hold_options(body: &[u8]) -> bool {
    memchr::memmem::find(body, b"stream_options").is_some()
        || memchr::memmem::find(body, b"\\u").is_some()
}

/// The request fields routing reads, as raw JSON slices of the body: everything else is
/// skipped without being built, and a field is only decoded when a token source asks for it.
/// A repeated member counts as its last occurrence (as Python's `json` reads it for vLLM).
#[derive(Debug, Clone, Copy, Default)]
struct Fields<'a> {
    model: Option<&'a RawValue>,
    stream: Option<&'a RawValue>,
    stream_options: Option<&'a RawValue>,
    cache_salt: Option<&'a RawValue>,
    prompt: Option<&'a RawValue>,
    messages: Option<&'a RawValue>,
    add_special_tokens: Option<&'a RawValue>,
    add_generation_prompt: Option<&'a RawValue>,
    continue_final_message: Option<&'a RawValue>,
    chat_template_kwargs: Option<&'a RawValue>,
    tools: Option<&'a RawValue>,
    documents: Option<&'a RawValue>,
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Fields<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Fields<'a>, M::Error> {
                let mut out = Fields::default();
                while let Some(Text(key)) = map.next_key::<Text<'de>>()? {
                    let slot = match key.as_ref() {
                        "model" => &mut out.model,
                        "stream" => &mut out.stream,
                        "stream_options" => &mut out.stream_options,
                        "cache_salt" => &mut out.cache_salt,
                        "prompt" => &mut out.prompt,
                        "messages" => &mut out.messages,
                        "add_special_tokens" => &mut out.add_special_tokens,
                        "add_generation_prompt" => &mut out.add_generation_prompt,
                        "continue_final_message" => &mut out.continue_final_message,
                        "chat_template_kwargs" => &mut out.chat_template_kwargs,
                        "tools" => &mut out.tools,
                        "documents" => &mut out.documents,
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = Some(map.next_value::<&'de RawValue>()?);
                }
                Ok(out)
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// A JSON string, borrowed from the body unless it has escapes (serde's own `Cow` always
/// copies).
#[derive(Debug, serde::Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// A raw member as `T`, if it is one.
fn typed<'a, T: serde::Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
    serde_json::from_str(raw?.get()).ok()
}

/// A raw member as a `Value` (the odd shapes: decoded only when met).
fn value(raw: Option<&RawValue>) -> Option<serde_json::Value> {
    typed(raw)
}

/// A request body read as JSON, with what every token source needs; borrows the body.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub kind: Kind,
    fields: Fields<'a>,
    pub model: Cow<'a, str>,
    pub stream: bool,
    pub include_usage: Option<bool>,
    pub cache_salt: Option<String>,
}

impl<'a> Request<'a> {
    /// Parses the body (400 on bad JSON or a non-string model). `default_model` fills an
    /// absent `model`, as vLLM does.
    pub fn read(kind: Kind, body: &'a [u8], default_model: &str) -> Result<Self, ProxyError> {
        let fields: Fields<'a> = serde_json::from_slice(body).map_err(|e| {
            if e.classify() == serde_json::error::Category::Data {
                ProxyError::bad_request("The request body must be a JSON object.")
            } else {
                ProxyError::bad_request(format!("Invalid JSON body: {e}"))
            }
        })?;
        let model = match fields.model.map(RawValue::get) {
            None | Some("null") => Cow::Owned(default_model.to_string()),
            Some(_) => typed::<Text<'a>>(fields.model)
                .map(|t| t.0)
                .ok_or_else(|| ProxyError::bad_request("Field 'model' must be a string."))?,
        };
        let stream = typed::<bool>(fields.stream).unwrap_or(false);
        let include_usage = value(fields.stream_options)
            .as_ref()
            .and_then(|o| o.as_object())
            .map(|o| {
                // vLLM: include_usage defaults to true whenever stream_options is present.
                o.get("include_usage")
                    .and_then(|b| b.as_bool())
                    .unwrap_or(true)
            });
        let cache_salt = typed::<String>(fields.cache_salt);
        Ok(Self {
            kind,
            fields,
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

    /// The size of what would be tokenized: the `prompt` and `messages` members as JSON
    /// bytes (known from the parse, nothing decoded), so a size bound applies before any
    /// tokenization or engine round trip.
    pub fn prompt_bytes(&self) -> usize {
        let len = |raw: Option<&RawValue>| raw.map_or(0, |r| r.get().len());
        len(self.fields.prompt) + len(self.fields.messages)
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
        self.try_local_tokens(tokenizer).ok()
    }

    /// [`Request::local_tokens`], saying why when there are none.
    pub fn try_local_tokens(&self, tokenizer: &dyn Encoder) -> Result<Vec<u32>, Unkeyed> {
        match self.kind {
            Kind::Completion => completion_tokens(&self.fields, tokenizer),
            Kind::Chat => chat_tokens(&self.fields, tokenizer),
        }
    }

    /// Token ids given directly as the prompt (completions), if so.
    pub fn prompt_ids(&self) -> Option<Vec<u32>> {
        match prompt(self.fields.prompt)? {
            Prompt::Ids(ids) => Some(ids),
            Prompt::Text(_) => None,
        }
    }

    /// The body of the engine's `POST /tokenize` for this prompt (vLLM's rules for special
    /// tokens and the chat template apply there).
    pub fn tokenize_body(&self) -> Option<serde_json::Value> {
        let mut out = serde_json::Map::new();
        out.insert("model".into(), self.model.as_ref().into());
        let copy = |out: &mut serde_json::Map<String, serde_json::Value>, k: &str, raw| {
            if let Some(v) = value(raw) {
                out.insert(k.into(), v);
            }
        };
        let f = &self.fields;
        match self.kind {
            Kind::Completion => {
                let Prompt::Text(prompt) = prompt(f.prompt)? else {
                    return None;
                };
                out.insert("prompt".into(), prompt.as_ref().into());
                copy(&mut out, "add_special_tokens", f.add_special_tokens);
            }
            Kind::Chat => {
                copy(&mut out, "messages", f.messages);
                copy(&mut out, "add_generation_prompt", f.add_generation_prompt);
                copy(&mut out, "continue_final_message", f.continue_final_message);
                copy(&mut out, "add_special_tokens", f.add_special_tokens);
                copy(&mut out, "chat_template_kwargs", f.chat_template_kwargs);
                copy(&mut out, "tools", f.tools);
            }
        }
        Some(out.into())
    }

    /// The prompt as text (completions: the prompt; chat: role and content of each message),
    /// for approximate keys.
    pub fn text(&self) -> Option<String> {
        match self.kind {
            Kind::Completion => match prompt(self.fields.prompt)? {
                Prompt::Text(s) => Some(s.into_owned()),
                Prompt::Ids(_) => None,
            },
            Kind::Chat => {
                let mut text = String::new();
                for m in value(self.fields.messages)?.as_array()? {
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

/// A completion prompt routing can use: one text, or token ids.
enum Prompt<'a> {
    Text(Cow<'a, str>),
    Ids(Vec<u32>),
}

/// The prompt, when it is a string, a one-string list, or a list of token ids.
fn prompt(raw: Option<&RawValue>) -> Option<Prompt<'_>> {
    let raw = raw?;
    match raw.get().as_bytes().first()? {
        b'"' => typed::<Text<'_>>(Some(raw)).map(|t| Prompt::Text(t.0)),
        b'[' => {
            if let Some(ids) = typed::<Vec<u32>>(Some(raw)) {
                return (!ids.is_empty()).then_some(Prompt::Ids(ids));
            }
            let [one] = typed::<[Text<'_>; 1]>(Some(raw))?;
            Some(Prompt::Text(one.0))
        }
        _ => None,
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
        model: req.model.into_owned(),
    })
}

fn completion_tokens(f: &Fields<'_>, tokenizer: &dyn Encoder) -> Result<Vec<u32>, Unkeyed> {
    match prompt(f.prompt) {
        Some(Prompt::Ids(ids)) => Ok(ids),
        Some(Prompt::Text(text)) => {
            let add_special = typed::<bool>(f.add_special_tokens).unwrap_or(true);
            encode(tokenizer, &text, add_special)
        }
        None => Err(Unkeyed::new(
            UnkeyedReason::Prompt,
            "the prompt is not a string, one string or a list of token ids",
        )),
    }
}

fn encode(tokenizer: &dyn Encoder, text: &str, add_special: bool) -> Result<Vec<u32>, Unkeyed> {
    tokenizer.encode_text(text, add_special).ok_or_else(|| {
        Unkeyed::new(
            UnkeyedReason::Tokenizer,
            format!("the tokenizer failed on a {} byte prompt", text.len()),
        )
    })
}

/// The chat template rendered over the request's messages, tools, documents and
/// `chat_template_kwargs` (reshaped as vLLM does: `warmpath_tokenizer::Chat`), then tokenized.
fn chat_tokens(f: &Fields<'_>, tokenizer: &dyn Encoder) -> Result<Vec<u32>, Unkeyed> {
    let Some(messages) = f.messages else {
        return Err(Unkeyed::new(UnkeyedReason::ChatRequest, "no 'messages'"));
    };
    let add_generation_prompt = typed::<bool>(f.add_generation_prompt).unwrap_or(true);
    let json = ChatJson {
        messages: messages.get(),
        tools: f.tools.map(RawValue::get),
        documents: f.documents.map(RawValue::get).filter(|d| *d != "null"),
        chat_template_kwargs: f.chat_template_kwargs.map(RawValue::get),
    };
    // Non-text parts (images, audio) are skipped, as the simulator does; a multimodal vLLM
    // puts placeholder tokens there, so only the blocks before the first one can match.
    let mut chat = Chat::from_json(json, add_generation_prompt)?;
    chat.continue_final_message = typed::<bool>(f.continue_final_message).unwrap_or(false);
    let text = tokenizer.template().render_chat(&chat)?;
    let add_special = typed::<bool>(f.add_special_tokens).unwrap_or(false);
    encode(tokenizer, &text, add_special)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bodies with the token ids and keys computed outside warmpath: HuggingFace `tokenizers`
    /// on the built-in tokenizer.json, the chat template rendered by jinja2, and the key
    /// scheme implemented again in Python (tests/python/make_request_key_fixture.py).
    #[test]
    fn tokens_and_keys_match_an_independently_computed_fixture() {
        #[derive(serde::Deserialize)]
        struct Case {
            name: String,
            kind: String,
            body: String,
            block_size: usize,
            token_ids: Vec<u32>,
            keys: Vec<u64>,
        }
        let cases: Vec<Case> = serde_json::from_str(include_str!("fixtures/request_keys.json"))
            .expect("the committed fixture is valid JSON");
        let tok = Tokenizer::builtin();
        for c in &cases {
            let kind = match c.kind.as_str() {
                "chat" => Kind::Chat,
                _ => Kind::Completion,
            };
            let body = c.body.as_bytes();
            let ids = Request::read(kind, body, "m").unwrap().local_tokens(&tok);
            assert_eq!(ids.as_ref(), Some(&c.token_ids), "{}: token ids", c.name);
            let p = parse(kind, body, "m", &tok, c.block_size).unwrap();
            assert_eq!(p.model, "m", "{}", c.name);
            assert_eq!(p.prompt_tokens, c.token_ids.len(), "{}", c.name);
            let want: Vec<RouterKey> = c.keys.iter().copied().map(RouterKey).collect();
            assert_eq!(p.keys, want, "{}: keys", c.name);
        }
        // The fixture exercises cache_salt (the same ids salted differ at every block), so the
        // key equality above pins what a salt does, not only the unsalted scheme.
        let keys = |name: &str| &cases.iter().find(|c| c.name == name).unwrap().keys;
        assert_eq!(keys("completion_ids").len(), 2);
        assert!(
            keys("completion_ids")
                .iter()
                .zip(keys("completion_ids_salted"))
                .all(|(a, b)| a != b)
        );
    }

    /// The built-in vocabulary with a real template from tokenizer/tests/data, the clock of
    /// that folder's transformers renders.
    fn real_template(file: &str, specials: &str) -> Tokenizer {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tokenizer/tests/data");
        let template = std::fs::read_to_string(format!("{dir}/templates/{file}")).unwrap();
        let config = format!(
            "{{\"chat_template\": {}, {specials}}}",
            serde_json::to_string(&template).unwrap()
        );
        let mut tok = Tokenizer::builtin_with_config(&config).unwrap();
        tok.set_chat_clock(warmpath_tokenizer::ChatClock::fixed("2024-07-06T15:04:05").unwrap())
            .unwrap();
        tok
    }

    /// transformers' render of one fixture case (tokenizer/tests/data/chat_renders.json).
    fn transformers_render(template: &str, case: &str) -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tokenizer/tests/data/chat_renders.json"
        );
        let fixture: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let render = fixture["renders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["template"] == template && r["case"] == case)
            .unwrap();
        render["rendered"].as_str().unwrap().to_string()
    }

    #[test]
    fn chat_with_tools_renders_a_real_template_as_transformers_does() {
        // Llama 3.2 calls strftime_now and renders tools with tojson(indent=4): before, this
        // request got no keys (`unknown function: strftime_now`).
        let tok = real_template(
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            r#""bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>""#,
        );
        let body = r#"{"model": "m", "messages": [
            {"role": "system", "content": "Use tools when useful."},
            {"role": "user", "content": "Weather in Zürich for two days?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call12345", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"days\": 2}"}}]},
            {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5}"}],
          "tools": [{"type": "function", "function": {"name": "get_weather",
                "description": "Current weather in a city, in °C", "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                "days": {"type": "integer", "minimum": 1, "maximum": 0.5e1}}, "required": ["city"]}}},
            {"function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}, "type": "function"}]}"#;
        let req = Request::read(Kind::Chat, body.as_bytes(), "m").unwrap();
        let want = tok
            .encode(&transformers_render("llama-3.2", "tools"), false)
            .unwrap();
        assert_eq!(req.try_local_tokens(&tok), Ok(want));
    }

    #[test]
    fn requests_without_keys_say_why() {
        let why = |kind, body: &str, tok: &Tokenizer| {
            Request::read(kind, body.as_bytes(), "m")
                .unwrap()
                .try_local_tokens(tok)
                .unwrap_err()
        };
        let mistral = real_template(
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            r#""bos_token": "<s>", "eos_token": "</s>""#,
        );
        let twice = r#"{"messages": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]}"#;
        let e = why(Kind::Chat, twice, &mistral);
        assert_eq!(e.reason, UnkeyedReason::Template);
        assert!(
            e.detail
                .ends_with("conversation roles must alternate user/assistant/user/assistant/..."),
            "{}",
            e.detail
        );
        let tok = Tokenizer::builtin();
        let bad = r#"{"messages": [{"role": "user", "content": 7}]}"#;
        assert_eq!(
            why(Kind::Chat, bad, &tok).reason,
            UnkeyedReason::ChatRequest
        );
        assert_eq!(
            why(Kind::Chat, "{}", &tok).reason,
            UnkeyedReason::ChatRequest
        );
        let odd = r#"{"prompt": {"x": 1}}"#;
        assert_eq!(
            why(Kind::Completion, odd, &tok).reason,
            UnkeyedReason::Prompt
        );
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
    fn fields_read_as_vllm_reads_them() {
        let tok = Tokenizer::builtin();
        // A repeated member counts as its last occurrence; unknown members are skipped.
        let r = Request::read(
            Kind::Completion,
            br#"{"prompt": "a", "extra": {"deep": [1, {"x": null}]}, "prompt": [5, 6, 7], "model": "m2"}"#,
            "m",
        )
        .unwrap();
        assert_eq!(r.model, "m2");
        assert_eq!(r.local_tokens(&tok), Some(vec![5, 6, 7]));
        assert_eq!(r.prompt_ids(), Some(vec![5, 6, 7]));
        // A one-string list is that string; other lists and shapes are not routable prompts.
        let one = Request::read(Kind::Completion, br#"{"prompt": ["hi there"]}"#, "m").unwrap();
        assert_eq!(one.text().as_deref(), Some("hi there"));
        assert_eq!(one.local_tokens(&tok), tok.encode("hi there", true).ok());
        for odd in [
            &br#"{"prompt": ["a", "b"]}"#[..],
            br#"{"prompt": [1.5]}"#,
            br#"{"prompt": []}"#,
        ] {
            let r = Request::read(Kind::Completion, odd, "m").unwrap();
            assert_eq!(
                r.local_tokens(&tok),
                None,
                "{}",
                String::from_utf8_lossy(odd)
            );
        }
        // Chat: null content is empty, only text parts count, a numeric content is unroutable.
        let chat = |body: &[u8]| {
            Request::read(Kind::Chat, body, "m")
                .unwrap()
                .local_tokens(&tok)
        };
        assert_eq!(
            chat(br#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "hi"}]}]}"#),
            chat(br#"{"messages": [{"role": "user", "content": "hi"}]}"#),
        );
        assert!(chat(br#"{"messages": [{"role": "user", "content": null}]}"#).is_some());
        assert_eq!(
            chat(br#"{"messages": [{"role": "user", "content": 3}]}"#),
            None
        );
        // Errors name the problem.
        let err = |body: &[u8]| {
            Request::read(Kind::Completion, body, "m")
                .unwrap_err()
                .message
        };
        assert_eq!(err(b"[1]"), "The request body must be a JSON object.");
        assert!(err(b"{nope").starts_with("Invalid JSON body"));
        assert_eq!(err(br#"{"model": 3}"#), "Field 'model' must be a string.");
        assert_eq!(
            Request::read(Kind::Completion, br#"{"model": null}"#, "m")
                .unwrap()
                .model,
            "m"
        );
    }

    #[test]
    fn prompt_bytes_count_the_members_tokenization_reads() {
        let r = |kind, body: &[u8]| Request::read(kind, body, "m").unwrap().prompt_bytes();
        assert_eq!(r(Kind::Completion, br#"{"prompt": "abc", "x": "long"}"#), 5);
        assert_eq!(r(Kind::Completion, br#"{"prompt": [1, 2]}"#), 6);
        let chat = br#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        assert_eq!(
            r(Kind::Chat, chat),
            r#"[{"role": "user", "content": "hi"}]"#.len()
        );
        assert_eq!(r(Kind::Completion, b"{}"), 0);
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

    #[test]
    fn usage_is_asked_for_over_a_later_or_escaped_stream_options() {
        // Found by fuzzing (openai_request): a member added first was overridden by the
        // body's own, so the stream ended without usage.
        let tok = Tokenizer::builtin();
        for body in [
            &br#"{"prompt": "a", "stream": true, "stream_options": null}"#[..],
            br#"{"prompt": "a", "stream": true, "stream_options": 5}"#,
            br#"{"prompt": "a", "stream": true, "stream\u005foptions": null}"#,
            br#"{"prompt": "a", "stream": true, "stream_options": {"include_usage": false}, "stream_options": null}"#,
        ] {
            let p = parse(Kind::Completion, body, "m", &tok, 16).unwrap();
            assert!(!p.wants_usage(), "{}", String::from_utf8_lossy(body));
            let asked = ask_for_usage(&bytes::Bytes::copy_from_slice(body), p.include_usage);
            let again = parse(Kind::Completion, &asked, "m", &tok, 16).unwrap();
            assert_eq!(again.include_usage, Some(true), "{}", String::from_utf8_lossy(&asked));
            assert_eq!((again.prompt_tokens, again.keys), (p.prompt_tokens, p.keys));
        }
    }
}
