//! Chat templates rendered as transformers renders them for vLLM
//! (`transformers.utils.chat_template_utils._compile_jinja_template` and
//! `render_jinja_template`), on minijinja + minijinja-contrib (as vLLM's Rust frontend does),
//! and the `tokenizer_config.json` details vLLM applies before tokenizing.
//!
//! The environment, setting by setting:
//! - `trim_blocks` and `lstrip_blocks` on; the source's one trailing newline dropped;
//! - loop controls (`{% break %}`, `{% continue %}`: jinja2's `loopcontrols` extension);
//! - `{% generation %}` blocks (transformers' assistant-mask tag) render their body;
//! - filter `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)` with
//!   Python's `json.dumps` output ([`pyjson`]);
//! - test `iterable` as jinja2's (`none` is not iterable); filters `string` and `trim`, and
//!   `{{ dict }}`, on Python's `str()` (`{'k': None}`, [`pyrepr`]);
//! - globals `raise_exception(message)` (the render fails with exactly that message) and
//!   `strftime_now(format)` ([`clock`]);
//! - Python methods on strings, lists and dicts (`.strip()`, `.split()`, `.startswith()`,
//!   `.items()`, `.get()`, ...) from minijinja-contrib's pycompat;
//! - a config's list of named templates: `tool_use` for a request with tools, else `default`
//!   (else the first), as transformers' `get_chat_template` picks;
//! - message contents in vLLM's content format for the template ([`format`]): one string, or
//!   for a template that loops over a message's content, a list of text parts;
//! - variables `messages`, `tools` and `documents` (none when absent), `add_generation_prompt`,
//!   the special tokens the config sets (`bos_token`, `eos_token`, `unk_token`, `pad_token`,
//!   `sep_token`, `cls_token`, `mask_token`, `additional_special_tokens`), then
//!   `chat_template_kwargs` over all of them; `none`, `true` and `false` print as Python's
//!   `None`, `True`, `False`.

mod clock;
mod format;
mod input;
mod pyjson;
mod pyrepr;

use std::sync::Arc;

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value, value::Kwargs};
use tokenizers::AddedToken;

pub use clock::{ChatClock, NOW_ENV};
pub use input::{Chat, ChatJson, ChatMessage};

use super::Error;

const TEMPLATE_NAME: &str = "chat";

/// The special-token attributes transformers passes to every template (`special_tokens_map`).
const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A compiled chat template plus the special tokens it may reference.
#[derive(Debug, Clone)]
pub(super) struct ChatTemplate {
    default: Compiled,
    /// A config's template named `tool_use` (the list form), rendered when a request has
    /// tools, as transformers' `get_chat_template` picks it.
    tool_use: Option<Compiled>,
    specials: Vec<(String, Value)>,
    eos_token: Option<String>,
}

/// One template, compiled, and how vLLM gives it message contents.
#[derive(Debug, Clone)]
struct Compiled {
    env: Arc<Environment<'static>>,
    source: Arc<str>,
    /// vLLM's "openai" content format ([`format`]): contents as lists of text parts.
    openai: bool,
}

impl Compiled {
    fn new(source: Arc<str>, clock: ChatClock) -> Result<Self, Error> {
        let text = without_generation_tags(&source);
        Ok(Self {
            openai: format::is_openai(&text),
            env: Arc::new(environment(text, clock)?),
            source,
        })
    }
}

/// The message a template's `raise_exception` gave, carried to the render's caller.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Reads `chat_template` and the special tokens from a parsed `tokenizer_config.json`;
    /// the clock from [`NOW_ENV`] when set.
    pub(super) fn from_config(config: &serde_json::Value) -> Result<Option<Self>, Error> {
        let named = |items: &[serde_json::Value], name: &str| {
            items
                .iter()
                .find(|i| i["name"] == name)
                .and_then(|i| i["template"].as_str())
                .map(str::to_string)
        };
        let (template, tool_use) = match &config["chat_template"] {
            serde_json::Value::String(s) => (s.clone(), None),
            // The list form: [{"name": "default", "template": "..."}, {"name": "tool_use",
            // ...}, ...].
            serde_json::Value::Array(items) => {
                let default = named(items, "default")
                    .or_else(|| items.first()?["template"].as_str().map(str::to_string));
                match default {
                    Some(t) => (t, named(items, "tool_use")),
                    None => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let mut specials: Vec<(String, Value)> = SPECIAL_TOKENS
            .iter()
            .filter_map(|k| special_token(config, k).map(|t| (k.to_string(), Value::from(t))))
            .collect();
        if let Some(extra) = config["additional_special_tokens"].as_array() {
            let tokens: Vec<Value> = extra
                .iter()
                .filter_map(|t| token_text(t).map(Value::from))
                .collect();
            specials.push(("additional_special_tokens".into(), Value::from(tokens)));
        }
        let clock = ChatClock::from_env()?;
        let tool_use = match tool_use {
            Some(t) => Some(Compiled::new(t.into(), clock)?),
            None => None,
        };
        Ok(Some(Self {
            default: Compiled::new(template.into(), clock)?,
            tool_use,
            specials,
            eos_token: special_token(config, "eos_token"),
        }))
    }

    pub(super) fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The same template with `strftime_now` reading `clock`.
    pub(super) fn set_clock(&mut self, clock: ChatClock) -> Result<(), Error> {
        if let Some(t) = &mut self.tool_use {
            *t = Compiled::new(t.source.clone(), clock)?;
        }
        self.default = Compiled::new(self.default.source.clone(), clock)?;
        Ok(())
    }

    pub(super) fn render(&self, chat: &Chat) -> Result<String, Error> {
        if chat.add_generation_prompt && chat.continue_final_message {
            return Err(Error::Request(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                    .into(),
            ));
        }
        // transformers: `tool_use` when the request has tools (vLLM passes none without).
        let compiled = match &self.tool_use {
            Some(t) if !chat.tools.is_none() => t,
            _ => &self.default,
        };
        let template = compiled
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        let messages = if compiled.openai {
            chat.openai_messages()
        } else {
            chat.messages.clone()
        };
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(messages)),
            ("tools".into(), chat.tools.clone()),
            ("documents".into(), chat.documents.clone()),
            (
                "add_generation_prompt".into(),
                Value::from(chat.add_generation_prompt),
            ),
        ];
        ctx.extend(self.specials.iter().cloned());
        // Later entries win, as `{**special_tokens_map, **kwargs}` does.
        ctx.extend(chat.kwargs.iter().cloned());
        let rendered = template
            .render(Value::from_iter(ctx))
            .map_err(render_error)?;
        if chat.continue_final_message {
            return continue_final(rendered, chat, compiled.openai);
        }
        Ok(rendered)
    }
}

/// transformers' `continue_final_message`: the render cut right after the final message's
/// content — its last text part when the template was given parts — with its trailing
/// whitespace kept only if the template kept it.
fn continue_final(rendered: String, chat: &Chat, openai: bool) -> Result<String, Error> {
    let content = chat.final_content(openai).unwrap_or_default();
    let stripped = content.trim();
    let Some(at) = rendered.rfind(stripped) else {
        return Err(Error::Request(
            "continue_final_message is set but the final message does not appear in the chat \
             after applying the chat template"
                .into(),
        ));
    };
    let left = content.trim_start();
    let end = if rendered[at..].starts_with(left) {
        at + left.len()
    } else {
        at + stripped.len()
    };
    Ok(rendered[..end].to_string())
}

/// The chat templates transformers saves as files beside `tokenizer_config.json`, as its
/// loader reads them: `chat_template.jinja` (the default) and `additional_chat_templates/
/// NAME.jinja` (named ones), as one template when there is only the default, else the list
/// form `[{"name", "template"}, ...]`; `None` when there are no such files.
pub(super) fn template_files(
    dir: &std::path::Path,
    read: impl Fn(&std::path::Path) -> Result<String, Error>,
) -> Result<Option<serde_json::Value>, Error> {
    let mut named: Vec<(String, String)> = Vec::new();
    let default = dir.join("chat_template.jinja");
    if default.is_file() {
        named.push(("default".into(), read(&default)?));
    }
    let extra = dir.join("additional_chat_templates");
    if extra.is_dir() {
        let entries = std::fs::read_dir(&extra).map_err(|e| Error::Load {
            path: extra.display().to_string(),
            message: e.to_string(),
        })?;
        let mut files: Vec<std::path::PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jinja") && p.is_file())
            .collect();
        files.sort();
        for path in files {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            named.push((name, read(&path)?));
        }
    }
    Ok(match named.as_slice() {
        [] => None,
        [(name, template)] if name == "default" => Some(template.clone().into()),
        _ => Some(serde_json::Value::Array(
            named
                .into_iter()
                .map(|(name, template)| serde_json::json!({"name": name, "template": template}))
                .collect(),
        )),
    })
}

/// A render failure: a template's `raise_exception` message as it gave it, anything else as
/// minijinja describes it (with the template line).
fn render_error(e: JinjaError) -> Error {
    let mut source: Option<&dyn std::error::Error> = Some(&e);
    while let Some(s) = source {
        if let Some(raised) = s.downcast_ref::<Raised>() {
            return Error::Template(raised.0.clone());
        }
        source = s.source();
    }
    Error::Template(e.to_string())
}

/// The environment transformers compiles templates in (see the module docs), holding
/// `text`: a template's source with its `{% generation %}` tags already turned into blocks.
fn environment(text: String, clock: ChatClock) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_formatter(python_formatter);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
        },
    );
    env.add_function(
        "strftime_now",
        move |format: String| -> Result<String, JinjaError> {
            clock
                .strftime_now(&format)
                .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, e.to_string()))
        },
    );
    env.add_filter("tojson", tojson);
    env.add_test("iterable", python_iterable);
    env.add_filter("string", |value: Value| pyrepr::str_of(&value));
    env.add_filter("trim", python_trim);
    env.add_template_owned(TEMPLATE_NAME, text)
        .map_err(|e| Error::Template(e.to_string()))?;
    Ok(env)
}

/// `value is iterable` as jinja2 tests it (Python's `iter(value)` succeeds): `none` is not
/// (minijinja's own test says it is, and `tools is iterable and tools | length > 0` then
/// fails on a request without tools), an undefined value is (jinja2's `Undefined` iterates
/// as empty), and so are strings, lists and maps.
fn python_iterable(value: &Value) -> bool {
    match value.kind() {
        minijinja::value::ValueKind::None => false,
        minijinja::value::ValueKind::Undefined => true,
        _ => value.try_iter().is_ok(),
    }
}

/// `value | trim(chars)` as jinja2's: `str(value).strip(chars)`, so a list of content parts
/// trims its Python form (Gemma 4 trims a system message's content, a list in vLLM's
/// "openai" content format); strings as minijinja's own filter trims them.
fn python_trim(value: Value, chars: Option<String>) -> String {
    let text = pyrepr::str_of(&value);
    match chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)).to_string(),
        // Python's str.isspace() also holds for the separators U+001C..U+001F.
        None => text
            .trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
            .to_string(),
    }
}

/// `value | tojson(...)`: Python's `json.dumps` (see [`pyjson`]).
fn tojson(
    value: Value,
    args: minijinja::value::Rest<Value>,
    kwargs: Kwargs,
) -> Result<String, JinjaError> {
    let options = pyjson::Options::from_args(&args, &kwargs)?;
    kwargs.assert_all_used()?;
    pyjson::dumps(&value, &options)
}

/// Output of `{{ ... }}` as jinja2 prints Python values: `None`, `True`, `False`, floats by
/// `repr`, dicts and lists as Python's `str()` ([`pyrepr`]); everything else as minijinja
/// prints it.
fn python_formatter(
    out: &mut minijinja::Output<'_>,
    state: &minijinja::State<'_, '_>,
    value: &Value,
) -> Result<(), JinjaError> {
    use minijinja::value::ValueKind;
    let text = match value.kind() {
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_string(),
        ValueKind::Map | ValueKind::Seq => pyrepr::str_of(value),
        ValueKind::Number if !value.is_integer() => pyrepr::str_of(value),
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(&text).map_err(JinjaError::from)
}

/// The source with transformers' `{% generation %}` / `{% endgeneration %}` tags (which
/// only record where assistant text is) turned into an always-true `if` block, so the body
/// renders and the tags' whitespace control (`{%-`, `-%}`) still applies.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = split_modifier_start(inner);
        let (body, trail) = split_modifier_end(body);
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_modifier_start(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some('-' | '+') => (&s[..1], &s[1..]),
        _ => ("", s),
    }
}

fn split_modifier_end(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some('-' | '+') => (&s[..s.len() - 1], &s[s.len() - 1..]),
        _ => (s, ""),
    }
}

/// A special token's text: a string or an AddedToken object `{"content": ...}`.
fn token_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        _ => None,
    }
}

fn special_token(config: &serde_json::Value, key: &str) -> Option<String> {
    token_text(&config[key])
}

/// vLLM merges `added_tokens_decoder` from `tokenizer_config.json` into the tokenizer before
/// use; tokens already known to `tokenizer.json` are left as they are.
pub(super) fn merge_added_tokens(
    tokenizer: &mut tokenizers::Tokenizer,
    config: &serde_json::Value,
) {
    let Some(decoder) = config["added_tokens_decoder"].as_object() else {
        return;
    };
    let mut entries: Vec<(u32, &serde_json::Value)> = decoder
        .iter()
        .filter_map(|(id, v)| id.parse().ok().map(|id| (id, v)))
        .collect();
    entries.sort_by_key(|(id, _)| *id);
    for (_, token) in entries {
        let Some(content) = token["content"].as_str() else {
            continue;
        };
        if tokenizer.token_to_id(content).is_some() {
            continue;
        }
        let special = token["special"].as_bool().unwrap_or(false);
        let added = AddedToken::from(content.to_string(), special);
        if special {
            tokenizer.add_special_tokens(&[added]);
        } else {
            tokenizer.add_tokens(&[added]);
        }
    }
}

#[cfg(test)]
mod tests;
