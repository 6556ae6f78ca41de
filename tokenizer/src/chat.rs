//! Chat templates (Jinja, rendered with minijinja as vLLM's Rust frontend does) and the
//! `tokenizer_config.json` details vLLM applies before tokenizing.

use std::sync::Arc;

use minijinja::{Environment, Error as JinjaError, ErrorKind, context};
use serde::{Deserialize, Serialize};
use tokenizers::AddedToken;

use super::Error;

const TEMPLATE_NAME: &str = "chat";

/// One chat message as the template sees it (content already flattened to text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// A compiled chat template plus the special tokens it may reference.
#[derive(Debug, Clone)]
pub(super) struct ChatTemplate {
    env: Arc<Environment<'static>>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Reads `chat_template`, `bos_token`, `eos_token` from a parsed `tokenizer_config.json`.
    pub(super) fn from_config(config: &serde_json::Value) -> Result<Option<Self>, Error> {
        let template = match &config["chat_template"] {
            serde_json::Value::String(s) => s.clone(),
            // The list form: [{"name": "default", "template": "..."}, ...].
            serde_json::Value::Array(items) => match items
                .iter()
                .find(|i| i["name"] == "default")
                .or_else(|| items.first())
                .and_then(|i| i["template"].as_str())
            {
                Some(t) => t.to_string(),
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, template)
            .map_err(|e| Error::Template(e.to_string()))?;
        Ok(Some(Self {
            env: Arc::new(env),
            bos_token: special_token(config, "bos_token"),
            eos_token: special_token(config, "eos_token"),
        }))
    }

    pub(super) fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub(super) fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_deref().unwrap_or(""),
                eos_token => self.eos_token.as_deref().unwrap_or(""),
            })
            .map_err(|e| Error::Template(e.to_string()))
    }
}

/// `bos_token` may be a string or an AddedToken object `{"content": ...}`.
fn special_token(config: &serde_json::Value, key: &str) -> Option<String> {
    match &config[key] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        _ => None,
    }
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
