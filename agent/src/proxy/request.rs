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
}

/// Parses a JSON body and computes its key chain. The body itself is forwarded untouched.
pub fn parse(
    kind: Kind,
    body: &[u8],
    default_model: &str,
    tokenizer: &Tokenizer,
    block_size: usize,
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
    let extras = RequestExtras {
        lora_name: None,
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
    Ok(Parsed {
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
}
