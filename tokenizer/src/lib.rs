//! Tokenisation shared by the simulator and the router: HuggingFace `tokenizer.json` (+ the
//! chat template and added tokens from `tokenizer_config.json`), or the built-in default.
//!
//! The default is a byte-level BPE tokenizer trained by this project (see `train.rs`) and
//! embedded in the binary, so simulator and router agree out of the box with no download.

mod chat;
mod pretok;
pub mod segments;
pub mod text;
pub mod train;

use std::{collections::HashSet, path::Path, str::FromStr};

pub use chat::{Chat, ChatClock, ChatJson, ChatMessage, NOW_ENV};

/// End of text / EOS of the built-in tokenizer.
pub const EOS: &str = "<|endoftext|>";
/// Beginning of text / BOS of the built-in tokenizer.
pub const BOS: &str = "<|begin_of_text|>";
/// ChatML turn start.
pub const IM_START: &str = "<|im_start|>";
/// ChatML turn end.
pub const IM_END: &str = "<|im_end|>";

const DEFAULT_TOKENIZER_JSON: &str = include_str!("../assets/default-tokenizer/tokenizer.json");
const DEFAULT_TOKENIZER_CONFIG: &str =
    include_str!("../assets/default-tokenizer/tokenizer_config.json");

/// Tokenizer errors, with the file or step that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {message}")]
    Load { path: String, message: String },
    #[error("tokenization failed: {0}")]
    Encode(String),
    /// The template failed to compile or render; a template's `raise_exception` message is
    /// given as the template wrote it.
    #[error("chat template: {0}")]
    Template(String),
    /// The chat request's messages, tools or options cannot be given to a template.
    #[error("chat request: {0}")]
    Request(String),
    #[error("this tokenizer has no chat template")]
    NoChatTemplate,
}

/// A loaded tokenizer plus what vLLM takes from `tokenizer_config.json`.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat: Option<chat::ChatTemplate>,
    eos_id: Option<u32>,
    /// Ids whose text is a plain word with a leading space: what the simulator "generates".
    word_ids: Vec<u32>,
    /// Vocabulary size including added tokens (the crate rebuilds the vocabulary to count it).
    vocab_size: usize,
}

impl Tokenizer {
    /// The embedded default tokenizer.
    pub fn builtin() -> Self {
        Self::from_parts(
            DEFAULT_TOKENIZER_JSON,
            Some(DEFAULT_TOKENIZER_CONFIG),
            "<builtin>",
        )
        .expect("the embedded tokenizer is valid (checked by unit tests)")
    }

    /// The built-in vocabulary with another `tokenizer_config.json` (a real model's chat
    /// template, special and added tokens): templates exercised without the model's
    /// multi-megabyte `tokenizer.json` (tests, the simulator's template checks).
    pub fn builtin_with_config(tokenizer_config: &str) -> Result<Self, Error> {
        Self::from_parts(
            DEFAULT_TOKENIZER_JSON,
            Some(tokenizer_config),
            "<builtin>/tokenizer_config.json",
        )
    }

    /// Loads `dir/tokenizer.json` and, when present, `dir/tokenizer_config.json`, with the
    /// chat templates transformers saves beside them (`chat_template.jinja`,
    /// `additional_chat_templates/NAME.jinja`), which take the config's place as they do
    /// when transformers loads the directory.
    pub fn from_dir(dir: &Path) -> Result<Self, Error> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|e| Error::Load {
                path: path.display().to_string(),
                message: e.to_string(),
            })
        };
        let json = read(&dir.join("tokenizer.json"))?;
        let config_path = dir.join("tokenizer_config.json");
        let config = config_path
            .is_file()
            .then(|| read(&config_path))
            .transpose()?;
        let origin = dir.display().to_string();
        let mut config = Self::parse_config(config.as_deref(), &origin)?;
        if let Some(templates) = chat::template_files(dir, read)? {
            if config.is_null() {
                config = serde_json::json!({});
            }
            if let Some(object) = config.as_object_mut() {
                object.insert("chat_template".into(), templates);
            }
        }
        Self::from_config(&json, &config, &origin)
    }

    fn from_parts(json: &str, config: Option<&str>, origin: &str) -> Result<Self, Error> {
        Self::from_config(json, &Self::parse_config(config, origin)?, origin)
    }

    /// A `tokenizer_config.json`'s text parsed (`Null` when there is none).
    fn parse_config(config: Option<&str>, origin: &str) -> Result<serde_json::Value, Error> {
        config.map_or(Ok(serde_json::Value::Null), |c| {
            serde_json::from_str(c).map_err(|e| Error::Load {
                path: origin.to_string(),
                message: format!("tokenizer_config.json: {e}"),
            })
        })
    }

    fn from_config(json: &str, config: &serde_json::Value, origin: &str) -> Result<Self, Error> {
        let load_err = |message: String| Error::Load {
            path: origin.to_string(),
            message,
        };
        let mut inner =
            tokenizers::Tokenizer::from_str(json).map_err(|e| load_err(e.to_string()))?;
        chat::merge_added_tokens(&mut inner, config);
        let chat = chat::ChatTemplate::from_config(config).map_err(|e| load_err(e.to_string()))?;
        let eos_id = chat
            .as_ref()
            .and_then(|c| c.eos_token())
            .and_then(|t| inner.token_to_id(t));
        let word_ids = word_ids(&inner);
        let vocab_size = inner.get_vocab_size(true);
        Ok(Self {
            inner,
            chat,
            eos_id,
            word_ids,
            vocab_size,
        })
    }

    /// Token ids of `text`; `add_special_tokens` as vLLM uses it (true for completions, false
    /// for rendered chat prompts, whose template adds BOS itself).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, Error> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Encode(e.to_string()))
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, Error> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Encode(e.to_string()))
    }

    /// Renders plain role/content messages to the prompt text the engine tokenizes.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        self.render_chat(&Chat::from_messages(messages, add_generation_prompt))
    }

    /// Renders a chat request (messages, tools, documents, template kwargs) as vLLM does.
    pub fn render_chat(&self, chat: &Chat) -> Result<String, Error> {
        self.chat
            .as_ref()
            .ok_or(Error::NoChatTemplate)?
            .render(chat)
    }

    /// Where the template's `strftime_now` reads the time (default: the local clock, or
    /// [`NOW_ENV`] when set at load).
    pub fn set_chat_clock(&mut self, clock: ChatClock) -> Result<(), Error> {
        match &mut self.chat {
            Some(chat) => chat.set_clock(clock),
            None => Ok(()),
        }
    }

    /// The added tokens (specials such as chat-template markers): `(content, id, plain)`,
    /// where `plain` means matched verbatim anywhere (no lstrip/rstrip/single-word matching,
    /// not normalized) — the condition under which text can be split at them exactly.
    pub fn added_tokens(&self) -> Vec<(String, u32, bool)> {
        let mut out: Vec<(String, u32, bool)> = self
            .inner
            .get_added_tokens_decoder()
            .iter()
            .map(|(id, t)| {
                (
                    t.content.clone(),
                    *id,
                    !t.single_word && !t.lstrip && !t.rstrip && !t.normalized,
                )
            })
            .collect();
        out.sort_by_key(|t| t.1);
        out
    }

    /// Ids of one GPT-2 pre-token (a piece of the byte-level pre-tokenizer's split, without
    /// added tokens in it): its bytes mapped to GPT-2's byte characters and BPE-encoded by the
    /// model — exactly what encoding does to each piece, without the pipeline around it.
    /// Meaningful only when [`is_gpt2_byte_level`](Self::is_gpt2_byte_level) holds.
    pub fn encode_pretoken(&self, piece: &str) -> Result<Vec<u32>, Error> {
        use tokenizers::Model;
        let table = byte_chars();
        let mapped: String = piece.bytes().map(|b| table[usize::from(b)]).collect();
        self.inner
            .get_model()
            .tokenize(&mapped)
            .map(|tokens| tokens.into_iter().map(|t| t.id).collect())
            .map_err(|e| Error::Encode(e.to_string()))
    }

    /// Whether encoding is GPT-2 byte-level BPE: no normalizer, the `ByteLevel` pre-tokenizer
    /// with its GPT-2 regex and no prefix space, and deterministic BPE (no dropout). Text is
    /// then split into regex pieces that are BPE-encoded independently, so a caller may
    /// split the same way and cache each piece's ids (see [`segments`]).
    pub fn is_gpt2_byte_level(&self) -> bool {
        use tokenizers::{ModelWrapper, PreTokenizerWrapper};
        let pre = matches!(
            self.inner.get_pre_tokenizer(),
            Some(PreTokenizerWrapper::ByteLevel(b)) if b.use_regex && !b.add_prefix_space
        );
        let bpe = matches!(self.inner.get_model(), ModelWrapper::BPE(m) if m.dropout.is_none());
        pre && bpe && self.inner.get_normalizer().is_none()
    }

    /// The EOS token id, if the tokenizer declares one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Ids that decode to a single plain word with a leading space (never empty).
    pub fn word_ids(&self) -> &[u32] {
        &self.word_ids
    }
}

/// GPT-2's reversible byte -> character map (openai/gpt-2 encoder.py `bytes_to_unicode`):
/// printable Latin-1 bytes map to themselves, the other 68 to U+0100 onwards in byte order.
fn byte_chars() -> &'static [char; 256] {
    static TABLE: std::sync::OnceLock<[char; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        let mut table = ['\0'; 256];
        let mut next = 0x100u32;
        for b in 0..=255u8 {
            table[usize::from(b)] = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).expect("U+0100..U+0143 are characters")
            };
        }
        table
    })
}

fn word_ids(inner: &tokenizers::Tokenizer) -> Vec<u32> {
    let specials: HashSet<u32> = inner.get_added_tokens_decoder().keys().copied().collect();
    let mut ids: Vec<u32> = (0..inner.get_vocab_size(true) as u32)
        .filter(|id| !specials.contains(id))
        .filter(|id| {
            inner.decode(&[*id], true).is_ok_and(|t| {
                t.len() > 2 && t.starts_with(' ') && t[1..].chars().all(|c| c.is_ascii_lowercase())
            })
        })
        .collect();
    if ids.is_empty() {
        // Unusual vocabularies: fall back to anything that is not special.
        ids = (0..inner.get_vocab_size(true) as u32)
            .filter(|id| !specials.contains(id))
            .collect();
    }
    ids
}

#[cfg(test)]
mod tests;
