//! Where a pool's prompt tokens come from, per pool:
//!
//! - `Local`: an in-process HuggingFace tokenizer + chat template (default; the built-in one
//!   is the simulator's). No round trip.
//! - `Engine`: the engine's own `POST /tokenize` — exactly the engine's tokens, one loopback
//!   or in-cluster round trip per request (bounded by [`ENGINE_TIMEOUT`]; on failure the
//!   request routes without prefix information).
//!
//! A request whose tokens cannot be had is routed without keys and counted by reason in the
//! pool's [`UnkeyedCounts`].
//! - `Approximate`: no tokenizer at all: the prompt text cut into character chunks, 4 bytes per
//!   pseudo-token. These keys never match KV events; they feed the approximate policy's
//!   routing history only.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};

use super::{
    request::Request,
    unkeyed::{Unkeyed, UnkeyedCounts, UnkeyedReason},
    upstream::UpstreamClient,
};
use crate::kv_index::{RouterKey, request_keys};

/// Longest wait for an engine's `/tokenize`.
pub const ENGINE_TIMEOUT: Duration = Duration::from_millis(500);
/// Bytes of text per pseudo-token (approximate keys).
pub const APPROX_BYTES_PER_TOKEN: usize = 4;
/// Largest `/tokenize` answer read.
const MAX_TOKENIZE_BODY: usize = 16 * 1024 * 1024;

/// A pool's token source.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// The local tokenizer, with its per-segment cache.
    Local(Arc<warmpath_tokenizer::segments::SegmentTokenizer>),
    Engine,
    Approximate,
}

impl From<&crate::policy::compiled::Tokens> for TokenSource {
    fn from(t: &crate::policy::compiled::Tokens) -> Self {
        use crate::policy::compiled::Tokens;
        match t {
            Tokens::Local(tok) => TokenSource::Local(tok.clone()),
            Tokens::Engine => TokenSource::Engine,
            Tokens::Approximate => TokenSource::Approximate,
        }
    }
}

impl TokenSource {
    /// Its name in `/status`.
    pub fn name(&self) -> &'static str {
        match self {
            TokenSource::Local(_) => "Local",
            TokenSource::Engine => "Engine",
            TokenSource::Approximate => "Approximate",
        }
    }

    /// The request's key chain when it needs no round trip (`None`: the engine must be
    /// asked: [`TokenSource::engine_keys`]); empty, and counted in `unkeyed`, when the prompt
    /// cannot be tokenized.
    pub fn keys_now(
        &self,
        req: &Request<'_>,
        lora: Option<&str>,
        block_size: usize,
        unkeyed: &UnkeyedCounts,
    ) -> Option<Vec<RouterKey>> {
        let tokens = match self {
            TokenSource::Local(tok) => req.try_local_tokens(tok.as_ref()),
            TokenSource::Engine => Ok(req.prompt_ids()?),
            TokenSource::Approximate => req.text().map(|t| pseudo_tokens(&t)).ok_or_else(|| {
                Unkeyed::new(
                    UnkeyedReason::Prompt,
                    "no prompt text to cut into pseudo-tokens",
                )
            }),
        };
        Some(keys_or_count(tokens, block_size, req, lora, unkeyed))
    }

    /// The key chain [`TokenSource::keys_now`] could not give: the engine's `/tokenize` at the
    /// endpoint `engine` names (called at most once); empty, and counted in `unkeyed`, when
    /// that fails.
    pub async fn engine_keys(
        &self,
        req: &Request<'_>,
        lora: Option<&str>,
        block_size: usize,
        engine: impl FnOnce() -> Option<String>,
        client: &UpstreamClient,
        unkeyed: &UnkeyedCounts,
    ) -> Vec<RouterKey> {
        let tokens = match engine() {
            Some(authority) => engine_tokens(req, &authority, client).await,
            None => Err(Unkeyed::new(
                UnkeyedReason::NoEngine,
                "the pool has no endpoint to ask for /tokenize",
            )),
        };
        keys_or_count(tokens, block_size, req, lora, unkeyed)
    }
}

/// The key chain of `tokens`, or none (counted) when there are no tokens.
fn keys_or_count(
    tokens: Result<Vec<u32>, Unkeyed>,
    block_size: usize,
    req: &Request<'_>,
    lora: Option<&str>,
    unkeyed: &UnkeyedCounts,
) -> Vec<RouterKey> {
    match tokens {
        Ok(tokens) => request_keys(&tokens, block_size, &req.extras(lora)),
        Err(why) => {
            unkeyed.record(&why);
            Vec::new()
        }
    }
}

/// Text as pseudo-tokens: every 4 bytes packed into one u32.
pub fn pseudo_tokens(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(APPROX_BYTES_PER_TOKEN)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect()
}

async fn engine_tokens(
    req: &Request<'_>,
    authority: &str,
    client: &UpstreamClient,
) -> Result<Vec<u32>, Unkeyed> {
    let failed = |detail: String| Unkeyed::new(UnkeyedReason::EngineTokenize, detail);
    let body = req
        .tokenize_body()
        .ok_or_else(|| Unkeyed::new(UnkeyedReason::Prompt, "no prompt /tokenize can take"))?;
    let body = serde_json::to_vec(&body).map_err(|e| failed(e.to_string()))?;
    let http_req = http::Request::post(format!("http://{authority}/tokenize"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| failed(format!("{authority}/tokenize: {e}")))?;
    let fetch = async {
        let resp = client
            .request(http_req)
            .await
            .map_err(|e| failed(format!("{authority}/tokenize: {e}")))?;
        if !resp.status().is_success() {
            return Err(failed(format!(
                "{authority}/tokenize answered {}",
                resp.status()
            )));
        }
        let bytes = Limited::new(resp.into_body(), MAX_TOKENIZE_BODY)
            .collect()
            .await
            .map_err(|e| failed(format!("{authority}/tokenize: reading the answer: {e}")))?
            .to_bytes();
        #[derive(serde::Deserialize)]
        struct Answer {
            tokens: Vec<u32>,
        }
        serde_json::from_slice::<Answer>(&bytes)
            .map(|a| a.tokens)
            .map_err(|e| failed(format!("{authority}/tokenize: unreadable answer: {e}")))
    };
    match tokio::time::timeout(ENGINE_TIMEOUT, fetch).await {
        Ok(tokens) => tokens,
        Err(_) => Err(Unkeyed::new(
            UnkeyedReason::EngineTokenizeTimeout,
            format!("{authority}/tokenize took longer than {ENGINE_TIMEOUT:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_tokens_chain_shared_text_prefixes() {
        let a = pseudo_tokens(&"shared system prompt ".repeat(20));
        let b = pseudo_tokens(&format!("{}question", "shared system prompt ".repeat(20)));
        assert_eq!(a.len(), 105);
        let ka = request_keys(&a, 16, &Default::default());
        let kb = request_keys(&b, 16, &Default::default());
        assert_eq!(ka[..6], kb[..6]);
        assert_eq!(
            pseudo_tokens("abcde"),
            vec![u32::from_le_bytes(*b"abcd"), u32::from(b'e')]
        );
    }
}
