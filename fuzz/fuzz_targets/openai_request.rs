//! OpenAI request bodies through the token-source pipeline: `proxy::request::Request::read`,
//! the prompt tokenized with the built-in tokenizer (chat template rendered for chat), the
//! key chain, the approximate source, the engine `/tokenize` body and the usage rewrite.
//!
//! Input: a flags byte (bit 0: chat, else completion; bits 1..: block size - 1), the body.
//!
//! Properties: a refused body is a 400; the per-segment token cache gives the tokens the plain
//! tokenizer gives; `parse` agrees with the steps it is made of; the chain has one key per
//! full block and a prefix's chain is a prefix of it; approximate keys cover the prompt text
//! at 4 bytes a token; the `/tokenize` body names the model; a streaming body rewritten to ask
//! for usage reads back with usage asked for and everything else as before.

#![no_main]

use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use warmpath_agent::{
    kv_index::request_keys,
    proxy::{
        TokenSource,
        request::{Kind, Request, ask_for_usage, parse},
        tokens::{APPROX_BYTES_PER_TOKEN, pseudo_tokens},
    },
};
use warmpath_tokenizer::{Tokenizer, segments::SegmentTokenizer};

static TOKENIZER: LazyLock<Arc<Tokenizer>> = LazyLock::new(|| Arc::new(Tokenizer::builtin()));
/// Shared across inputs, as in the agent: its caches must stay transparent (and bounded).
/// Where requests routed without keys are counted (the proxy keeps one per pool).
static UNKEYED: LazyLock<warmpath_agent::proxy::unkeyed::UnkeyedCounts> =
    LazyLock::new(|| warmpath_agent::proxy::unkeyed::UnkeyedCounts::new("fuzz"));
static SEGMENTS: LazyLock<Arc<SegmentTokenizer>> =
    LazyLock::new(|| Arc::new(SegmentTokenizer::new(TOKENIZER.clone())));

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let kind = if flags & 1 == 1 {
        Kind::Chat
    } else {
        Kind::Completion
    };
    let block_size = usize::from(flags >> 1) + 1;
    let req = match Request::read(kind, body, "default-model") {
        Ok(req) => req,
        Err(err) => {
            assert_eq!(err.status, http::StatusCode::BAD_REQUEST, "{err:?}");
            assert!(parse(kind, body, "default-model", &TOKENIZER, block_size).is_err());
            return;
        }
    };
    let plain = req.local_tokens(TOKENIZER.as_ref());
    let local = TokenSource::Local(SEGMENTS.clone());
    let cached = req.local_tokens(SEGMENTS.as_ref());
    assert_eq!(plain, cached, "the segment cache changed the tokens");
    let tokens = plain.unwrap_or_default();
    let keys = request_keys(&tokens, block_size, &req.extras(None));
    assert_eq!(
        keys.len(),
        tokens.len() / block_size,
        "one key per full block"
    );
    let half = keys.len() / 2;
    assert_eq!(
        request_keys(&tokens[..half * block_size], block_size, &req.extras(None)),
        keys[..half],
        "a prefix's chain is a prefix of the chain"
    );
    assert_eq!(
        local.keys_now(&req, None, block_size, &UNKEYED),
        Some(keys.clone())
    );

    let parsed = parse(kind, body, "default-model", &TOKENIZER, block_size)
        .expect("parse accepts what Request::read accepts");
    assert_eq!(parsed.keys, keys);
    assert_eq!(parsed.prompt_tokens, tokens.len());
    assert_eq!(parsed.model, req.model);
    assert_eq!(
        (parsed.stream, parsed.include_usage),
        (req.stream, req.include_usage)
    );

    let approx = TokenSource::Approximate.keys_now(&req, None, block_size, &UNKEYED);
    let text = req.text();
    let pseudo = text.as_deref().map(pseudo_tokens).unwrap_or_default();
    if let Some(text) = &text {
        assert_eq!(pseudo.len(), text.len().div_ceil(APPROX_BYTES_PER_TOKEN));
    }
    assert_eq!(approx.map(|k| k.len()), Some(pseudo.len() / block_size));

    if let Some(v) = req.tokenize_body() {
        assert_eq!(
            v.get("model").and_then(|m| m.as_str()),
            Some(req.model.as_ref())
        );
    }

    if req.stream && !req.wants_usage() {
        let original = Bytes::copy_from_slice(body);
        let asked = ask_for_usage(&original, req.include_usage);
        let again = Request::read(kind, &asked, "default-model")
            .unwrap_or_else(|e| panic!("the usage rewrite broke the body: {e:?}: {asked:?}"));
        // A body that is not UTF-8 is left as it is (no JSON parser rewrites it; the engine
        // refuses it anyway).
        if std::str::from_utf8(body).is_ok() {
            assert_eq!(
                again.include_usage,
                Some(true),
                "usage asked for: {asked:?}"
            );
        }
        assert_eq!((&again.model, again.stream), (&req.model, req.stream));
        assert_eq!(again.cache_salt, req.cache_salt);
        assert_eq!(
            again.local_tokens(TOKENIZER.as_ref()),
            cached,
            "the prompt's tokens"
        );
    }
});
