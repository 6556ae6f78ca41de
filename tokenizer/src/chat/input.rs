//! What a chat template is given: a request's messages, tools and documents, reshaped as vLLM
//! reshapes them before `apply_chat_template` (`vllm/entrypoints/chat_utils.py`):
//!
//! - `content` becomes one string: a string as is, `null` or absent as `""`, a list of parts as
//!   its text parts (`text`, `input_text`, `output_text`, `refusal`, bare strings) joined with
//!   `"\n"` (vLLM's "string" content format); for a template of the "openai" content format
//!   ([`super::format`]), a list of `{"type": "text", "text": ...}` parts instead
//!   ([`Chat::openai_messages`]). Other parts (images, audio, ...) are skipped
//!   and counted in [`Chat::non_text_parts`]: their placeholder tokens are not rendered here.
//! - A message keeps `role`, `content`, `name` (a string), `tool_calls` (assistant, when not
//!   null) with each call's `function.arguments` decoded from its JSON string into an object
//!   (`""`/null: `{}`), `tool_call_id` (tool), `reasoning` and `reasoning_content` (assistant:
//!   either sets both); other members are dropped.
//! - `tools` as vLLM's `model_dump()` writes them: `type` (default `"function"`), then
//!   `function` with `name`, `description` and `parameters` (null when absent) before any
//!   other member.
//!
//! Maps keep their members' order (Python dicts do; templates print them with `tojson`).

use minijinja::Value;

use crate::Error;

/// One chat message in its simplest form: a role and text content.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// A chat request's template inputs (see the module docs for how each is read).
#[derive(Debug, Clone)]
pub struct Chat {
    pub(super) messages: Vec<Value>,
    /// Each message's content as the client sent it (for vLLM's "openai" content format).
    raw_contents: Vec<Value>,
    pub(super) tools: Value,
    pub(super) documents: Value,
    /// `chat_template_kwargs`: extra template variables (override the others, as in vLLM).
    pub(super) kwargs: Vec<(String, Value)>,
    /// Append the assistant turn's header (vLLM's default: true).
    pub add_generation_prompt: bool,
    /// Leave the last message open so the model continues it (vLLM: false by default).
    pub continue_final_message: bool,
    non_text_parts: usize,
}

/// The request members a chat render reads, as raw JSON text (each `None` when absent).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatJson<'a> {
    pub messages: &'a str,
    pub tools: Option<&'a str>,
    pub documents: Option<&'a str>,
    pub chat_template_kwargs: Option<&'a str>,
}

impl Chat {
    /// Plain role/content messages.
    pub fn from_messages(messages: &[ChatMessage], add_generation_prompt: bool) -> Self {
        let raw_contents: Vec<Value> = messages
            .iter()
            .map(|m| Value::from(m.content.as_str()))
            .collect();
        let messages = messages
            .iter()
            .zip(&raw_contents)
            .map(|(m, content)| {
                Value::from_iter([
                    ("role", Value::from(m.role.as_str())),
                    ("content", content.clone()),
                ])
            })
            .collect();
        Self {
            messages,
            raw_contents,
            tools: Value::from(()),
            documents: Value::from(()),
            kwargs: Vec::new(),
            add_generation_prompt,
            continue_final_message: false,
            non_text_parts: 0,
        }
    }

    /// Reads the request's members as vLLM does; a malformed one is [`Error::Request`].
    pub fn from_json(json: ChatJson<'_>, add_generation_prompt: bool) -> Result<Self, Error> {
        let raw: Vec<Value> = parse(json.messages, "messages")?;
        let mut non_text_parts = 0;
        let messages = raw
            .iter()
            .enumerate()
            .map(|(i, m)| {
                message(m, &mut non_text_parts).map_err(|e| at(&format!("messages[{i}]"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tools = match json.tools {
            Some(t) if t.trim() != "null" => {
                let tools: Vec<Value> = parse(t, "tools")?;
                let tools = tools
                    .iter()
                    .enumerate()
                    .map(|(i, t)| tool(t).map_err(|e| at(&format!("tools[{i}]"), e)))
                    .collect::<Result<Vec<_>, _>>()?;
                Value::from(tools)
            }
            _ => Value::from(()),
        };
        let documents = match json.documents {
            Some(d) => parse::<Value>(d, "documents")?,
            None => Value::from(()),
        };
        let kwargs = match json.chat_template_kwargs {
            Some(k) if k.trim() != "null" => {
                let map: Value = parse(k, "chat_template_kwargs")?;
                let keys: Vec<Value> = match map.kind() {
                    minijinja::value::ValueKind::Map => map.try_iter().map_err(template)?.collect(),
                    _ => {
                        return Err(Error::Request(
                            "chat_template_kwargs must be an object".into(),
                        ));
                    }
                };
                keys.into_iter()
                    .map(|k| {
                        let v = map.get_item(&k).map_err(template)?;
                        Ok((k.as_str().unwrap_or_default().to_string(), v))
                    })
                    .collect::<Result<Vec<_>, Error>>()?
            }
            _ => Vec::new(),
        };
        let raw_contents = raw.iter().map(|m| member(m, "content")).collect();
        Ok(Self {
            messages,
            raw_contents,
            tools,
            documents,
            kwargs,
            add_generation_prompt,
            continue_final_message: false,
            non_text_parts,
        })
    }

    /// The messages as vLLM gives them to a template of the "openai" content format
    /// ([`super::format`]): each content a list of `{"type": "text", "text": ...}` parts — a
    /// string one part, null none, a bare string part left a string; parts that are not text
    /// skipped, as in the "string" format.
    pub(super) fn openai_messages(&self) -> Vec<Value> {
        self.messages
            .iter()
            .zip(&self.raw_contents)
            .map(|(m, raw)| {
                let keys: Vec<Value> = m.try_iter().map(Iterator::collect).unwrap_or_default();
                Value::from_iter(keys.into_iter().map(|k| {
                    let v = if k.as_str() == Some("content") {
                        openai_content(raw)
                    } else {
                        m.get_item(&k).unwrap_or_default()
                    };
                    (k, v)
                }))
            })
            .collect()
    }

    /// Content parts that are not text (images, audio, ...): skipped in the render, where vLLM
    /// would place the model's placeholder tokens for them.
    pub fn non_text_parts(&self) -> usize {
        self.non_text_parts
    }

    /// The last message's content (for `continue_final_message`).
    pub(super) fn final_content(&self, openai: bool) -> Option<String> {
        if openai {
            // transformers continues the last text block of a list of parts.
            let parts = openai_content(self.raw_contents.last()?);
            let last = parts.try_iter().ok()?.last()?;
            let text = if last.as_str().is_some() {
                last
            } else {
                last.get_attr("text").ok()?
            };
            return text.as_str().map(str::to_string);
        }
        let last = self.messages.last()?;
        let content = last.get_attr("content").ok()?;
        content.as_str().map(str::to_string)
    }
}

fn parse<T: serde::de::DeserializeOwned>(json: &str, what: &str) -> Result<T, Error> {
    serde_json::from_str(json).map_err(|e| Error::Request(format!("{what}: {e}")))
}

fn at(path: &str, e: Error) -> Error {
    match e {
        Error::Request(m) => Error::Request(format!("{path}.{m}")),
        other => other,
    }
}

fn template(e: minijinja::Error) -> Error {
    Error::Request(e.to_string())
}

fn is_map(v: &Value) -> bool {
    v.kind() == minijinja::value::ValueKind::Map
}

/// A member of a map (undefined when absent).
fn member(v: &Value, key: &str) -> Value {
    v.get_attr(key).unwrap_or(Value::UNDEFINED)
}

fn message(m: &Value, non_text: &mut usize) -> Result<Value, Error> {
    if !is_map(m) {
        return Err(Error::Request("a message must be an object".into()));
    }
    let role = member(m, "role");
    let Some(role_str) = role.as_str() else {
        return Err(Error::Request("role: must be a string".into()));
    };
    let raw_content = member(m, "content");
    // A string is kept as it is (a shared value, not a copy): the common case.
    let content = match raw_content.kind() {
        minijinja::value::ValueKind::String => raw_content,
        _ => Value::from(content(&raw_content, non_text)?),
    };
    let mut out: Vec<(&str, Value)> = vec![("role", role.clone()), ("content", content)];
    match role_str {
        "assistant" => {
            let calls = member(m, "tool_calls");
            if !calls.is_undefined() && !calls.is_none() {
                let calls: Vec<Value> = calls
                    .try_iter()
                    .map_err(|_| Error::Request("tool_calls: must be a list".into()))?
                    .enumerate()
                    .map(|(i, c)| tool_call(&c).map_err(|e| at(&format!("tool_calls[{i}]"), e)))
                    .collect::<Result<_, _>>()?;
                out.push(("tool_calls", Value::from(calls)));
            }
            let reasoning = [member(m, "reasoning"), member(m, "reasoning_content")]
                .into_iter()
                .find(|r| r.is_true());
            if let Some(r) = reasoning {
                out.push(("reasoning", r.clone()));
                out.push(("reasoning_content", r));
            }
        }
        "tool" => {
            let id = member(m, "tool_call_id");
            if !id.is_undefined() {
                out.push(("tool_call_id", id));
            }
        }
        _ => {}
    }
    let name = member(m, "name");
    if name.as_str().is_some() {
        out.push(("name", name));
    }
    Ok(Value::from_iter(out))
}

/// vLLM's "openai" content format of one message's content (already checked by [`content`]).
fn openai_content(c: &Value) -> Value {
    let part = |text: Value| Value::from_iter([("type", Value::from("text")), ("text", text)]);
    match c.kind() {
        minijinja::value::ValueKind::String => Value::from(vec![part(c.clone())]),
        minijinja::value::ValueKind::Seq => Value::from(
            c.try_iter()
                .into_iter()
                .flatten()
                .filter_map(|p| match part_text(&p) {
                    Ok(PartText::Bare(t)) => Some(t),
                    Ok(PartText::Text(t)) => Some(part(t)),
                    _ => None,
                })
                .collect::<Vec<_>>(),
        ),
        _ => Value::from(Vec::<Value>::new()),
    }
}

/// What vLLM reads from one part of a list of contents.
enum PartText {
    /// A bare string.
    Bare(Value),
    /// A text part's `text` (`text`, `input_text`, `output_text`) or a refusal's `refusal`.
    Text(Value),
    /// A part that is not text (an image, audio, ...).
    NotText,
    /// A refusal without a string.
    Empty,
}

fn part_text(part: &Value) -> Result<PartText, Error> {
    if part.as_str().is_some() {
        return Ok(PartText::Bare(part.clone()));
    }
    match member(part, "type").as_str() {
        Some("text" | "input_text" | "output_text") => {
            let text = member(part, "text");
            if text.as_str().is_none() {
                return Err(Error::Request(
                    "content: a text part needs a string 'text'".into(),
                ));
            }
            Ok(PartText::Text(text))
        }
        Some("refusal") => {
            let refusal = member(part, "refusal");
            Ok(if refusal.as_str().is_some() {
                PartText::Text(refusal)
            } else {
                PartText::Empty
            })
        }
        Some(_) => Ok(PartText::NotText),
        None => Err(Error::Request(
            "content: a part needs a string 'type'".into(),
        )),
    }
}

/// vLLM's "string" content format.
fn content(c: &Value, non_text: &mut usize) -> Result<String, Error> {
    use minijinja::value::ValueKind;
    match c.kind() {
        ValueKind::Undefined | ValueKind::None => Ok(String::new()),
        ValueKind::String => Ok(c.as_str().unwrap_or_default().to_string()),
        ValueKind::Seq => {
            let mut texts: Vec<String> = Vec::new();
            for part in c.try_iter().map_err(template)? {
                match part_text(&part)? {
                    PartText::Bare(t) | PartText::Text(t) => {
                        texts.push(t.as_str().unwrap_or_default().to_string());
                    }
                    PartText::NotText => *non_text += 1,
                    PartText::Empty => {}
                }
            }
            Ok(texts.join("\n"))
        }
        other => Err(Error::Request(format!(
            "content: must be a string or a list of parts, not {other}"
        ))),
    }
}

/// A tool call with `function.arguments` decoded from its JSON string.
fn tool_call(c: &Value) -> Result<Value, Error> {
    if !is_map(c) {
        return Err(Error::Request("a tool call must be an object".into()));
    }
    let entries = map_entries(c)?;
    let out = entries.into_iter().map(|(k, v)| {
        if k.as_str() == Some("function") && is_map(&v) {
            let function = map_entries(&v)?
                .into_iter()
                .map(|(fk, fv)| {
                    if fk.as_str() != Some("arguments") {
                        return Ok((fk, fv));
                    }
                    let decoded = match fv.as_str() {
                        Some("") => Value::from_iter(std::iter::empty::<(String, Value)>()),
                        Some(s) => parse::<Value>(s, "function.arguments")?,
                        None if fv.is_none() => {
                            Value::from_iter(std::iter::empty::<(String, Value)>())
                        }
                        None => fv,
                    };
                    Ok((fk, decoded))
                })
                .collect::<Result<Vec<_>, Error>>()?;
            Ok((k, Value::from_iter(function)))
        } else {
            Ok((k, v))
        }
    });
    Ok(Value::from_iter(out.collect::<Result<Vec<_>, Error>>()?))
}

/// A tool as vLLM's `ChatCompletionToolsParam.model_dump()` writes it.
fn tool(t: &Value) -> Result<Value, Error> {
    if !is_map(t) {
        return Err(Error::Request("a tool must be an object".into()));
    }
    let function = member(t, "function");
    if !is_map(&function) {
        return Err(Error::Request("function: must be an object".into()));
    }
    if member(&function, "name").as_str().is_none() {
        return Err(Error::Request("function.name: must be a string".into()));
    }
    let declared = ["name", "description", "parameters"];
    let mut f: Vec<(Value, Value)> = declared
        .iter()
        .map(|k| {
            let v = member(&function, k);
            (
                Value::from(*k),
                if v.is_undefined() { Value::from(()) } else { v },
            )
        })
        .collect();
    f.extend(
        map_entries(&function)?
            .into_iter()
            .filter(|(k, _)| !declared.contains(&k.as_str().unwrap_or_default())),
    );
    let kind = member(t, "type");
    let mut out: Vec<(Value, Value)> = vec![
        (
            Value::from("type"),
            if kind.is_undefined() {
                Value::from("function")
            } else {
                kind
            },
        ),
        (Value::from("function"), Value::from_iter(f)),
    ];
    out.extend(
        map_entries(t)?
            .into_iter()
            .filter(|(k, _)| !matches!(k.as_str(), Some("type" | "function"))),
    );
    Ok(Value::from_iter(out))
}

fn map_entries(v: &Value) -> Result<Vec<(Value, Value)>, Error> {
    v.try_iter()
        .map_err(template)?
        .map(|k| {
            let val = v.get_item(&k).map_err(template)?;
            Ok((k, val))
        })
        .collect()
}
