//! Tokenization that reuses work across requests: the text is cut at added (special) tokens —
//! chat templates put one between every message — and each piece's tokens are cached.
//!
//! This is exact, not an approximation: HuggingFace tokenizers split the input at added
//! tokens *before* normalizing and pre-tokenizing, so every piece is tokenized on its own
//! anyway. It is only enabled when every added token is matched verbatim (no lstrip/rstrip/
//! single-word rules, not normalized) and `add_special_tokens` only prepends a fixed prefix
//! (checked once at start); otherwise [`SegmentTokenizer::encode`] is plain encoding. A shared
//! system prompt is then tokenized once, and each request pays for its new messages only.
//!
//! The cache holds at most [`MAX_CACHED_TOKENS`] tokens (FIFO eviction); pieces shorter than
//! [`MIN_SEGMENT_BYTES`] are not worth caching.
//!
//! Below the segments, for GPT-2 byte-level BPE tokenizers (`Tokenizer::is_gpt2_byte_level`)
//! and ASCII text, a segment the cache has not seen is split into pre-tokens by hand
//! ([`super::pretok`]) and each pre-token's ids come from a word cache (at most
//! [`MAX_CACHED_WORDS`] words in two generations: when the young one is full it becomes the
//! old one, and words found in the old one move back — so the words in use survive, with no
//! cliff where everything is re-encoded at once). BPE encodes pre-tokens independently,
//! so this is exact too; the regex and bookkeeping it skips are most of a cold encode.

use std::{collections::VecDeque, sync::Arc};

use super::{Error, Tokenizer};
use parking_lot::Mutex;

/// Maps keyed by a 64-bit hash already (xxh3): the key is its own hash.
type FastMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// The identity hasher of [`FastMap`].
#[derive(Debug, Default, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Tokens kept in the cache (16 MiB of ids).
pub const MAX_CACHED_TOKENS: usize = 4 << 20;
/// Pieces shorter than this are encoded every time.
pub const MIN_SEGMENT_BYTES: usize = 256;
/// Pre-tokens kept in the word cache (a few MiB).
pub const MAX_CACHED_WORDS: usize = 1 << 16;

#[derive(Debug, Default)]
struct Cache {
    map: std::collections::HashMap<u128, Arc<[u32]>>,
    order: VecDeque<(u128, usize)>,
    tokens: usize,
}

/// Pre-token (keyed by its xxh3, kept for the equality check) -> its ids, in two
/// generations of at most `MAX_CACHED_WORDS / 2` words each.
#[derive(Debug, Default)]
struct WordCache {
    young: FastMap<(Box<str>, Box<[u32]>)>,
    old: FastMap<(Box<str>, Box<[u32]>)>,
}

impl WordCache {
    /// Appends the ids of `word` to `out`, computed by `encode` on a miss.
    fn extend<E>(
        &mut self,
        word: &str,
        out: &mut Vec<u32>,
        encode: impl FnOnce() -> Result<Vec<u32>, E>,
    ) -> Result<(), E> {
        let key = xxhash_rust::xxh3::xxh3_64(word.as_bytes());
        if let Some((w, ids)) = self.young.get(&key)
            && **w == *word
        {
            out.extend_from_slice(ids);
            return Ok(());
        }
        let entry = match self.old.remove(&key) {
            Some(e) if *e.0 == *word => e,
            _ => (word.into(), encode()?.into()),
        };
        out.extend_from_slice(&entry.1);
        if self.young.len() >= MAX_CACHED_WORDS / 2 {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, entry);
        Ok(())
    }
}

/// Added tokens and a single-pass searcher for them: leftmost match first, the longest of
/// those starting there (how the tokenizers crate splits on added tokens).
#[derive(Debug)]
struct Specials {
    finder: aho_corasick::AhoCorasick,
    ids: Vec<u32>,
    /// The first bytes added tokens start with, when there are at most three (Llama 3's all
    /// start with `<`): a text without them has none, found by one `memchr`.
    first: Option<Vec<u8>>,
}

impl Specials {
    fn new(tokens: impl Iterator<Item = (String, u32)>) -> Option<Self> {
        let (contents, ids): (Vec<String>, Vec<u32>) = tokens.unzip();
        let finder = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(&contents)
            .ok()?;
        let mut first: Vec<u8> = contents.iter().filter_map(|c| c.bytes().next()).collect();
        first.sort_unstable();
        first.dedup();
        Some(Self {
            finder,
            ids,
            first: (first.len() <= 3).then_some(first),
        })
    }

    /// Whether `text` may hold an added token.
    fn may_occur(&self, text: &str) -> bool {
        let t = text.as_bytes();
        match self.first.as_deref() {
            Some([]) => false,
            Some([a]) => memchr::memchr(*a, t).is_some(),
            Some([a, b]) => memchr::memchr2(*a, *b, t).is_some(),
            Some([a, b, c]) => memchr::memchr3(*a, *b, *c, t).is_some(),
            _ => true,
        }
    }
}

/// A tokenizer with a per-segment cache.
#[derive(Debug)]
pub struct SegmentTokenizer {
    tokenizer: Arc<Tokenizer>,
    /// Added tokens to split at; `None` when splitting would not be exact.
    specials: Option<Specials>,
    /// What `add_special_tokens = true` prepends; `None` when it does more than prepend.
    bos: Option<Vec<u32>>,
    cache: Mutex<Cache>,
    /// Pre-token -> ids, for GPT-2 byte-level tokenizers; keyed by the pre-token's xxh3.
    words: Option<Mutex<WordCache>>,
}

impl SegmentTokenizer {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let added = tokenizer.added_tokens();
        let specials = added
            .iter()
            .all(|(content, _, plain)| *plain && !content.is_empty())
            .then(|| Specials::new(added.into_iter().map(|(c, id, _)| (c, id))))
            .flatten();
        // add_special_tokens must only prepend: probe with a text whose tokens we know.
        let bos = (|| {
            let with = tokenizer.encode("probe text", true).ok()?;
            let without = tokenizer.encode("probe text", false).ok()?;
            let n = with.len().checked_sub(without.len())?;
            (with[n..] == without[..]).then(|| with[..n].to_vec())
        })();
        let words = tokenizer
            .is_gpt2_byte_level()
            .then(|| Mutex::new(WordCache::default()));
        let mut this = Self {
            tokenizer,
            specials,
            bos,
            cache: Mutex::new(Cache::default()),
            words,
        };
        if !this.splits_exactly() {
            this.specials = None;
        }
        // The probes' pieces are not worth keeping.
        *this.cache.lock() = Cache::default();
        this
    }

    /// Whether encoding piece by piece gives the tokenizer's own ids around added tokens. It
    /// does not when the pre-tokenizer treats the start of the input apart: a Metaspace
    /// pre-tokenizer with `prepend_scheme: "first"` (transformers' non-legacy Llama / Mistral
    /// conversions) prepends `▁` to a piece only at offset 0 of the whole text, so `user`
    /// after `<|im_start|>` is `user` there and `▁user` alone. Probed once, at start.
    fn splits_exactly(&self) -> bool {
        let Some(special) = self.tokenizer.added_tokens().into_iter().next() else {
            return true;
        };
        let s = special.0;
        let probes = [
            format!("{s}user\nhello there{s}\n{s}assistant\n"),
            format!("a b{s} c{s}d\te {s}"),
            format!("{s}{s} x y"),
        ];
        probes.iter().all(|p| {
            [false, true].into_iter().all(|special| {
                matches!(
                    (self.encode(p, special), self.tokenizer.encode(p, special)),
                    (Ok(a), Ok(b)) if a == b
                )
            })
        })
    }

    /// The tokenizer itself (chat templates, decoding).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Token ids of `text`, identical to [`Tokenizer::encode`].
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, Error> {
        let (Some(specials), Some(bos)) = (&self.specials, &self.bos) else {
            return self.tokenizer.encode(text, add_special_tokens);
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 8);
        if add_special_tokens {
            out.extend_from_slice(bos);
        }
        let mut pos = 0;
        if specials.may_occur(text) {
            for m in specials.finder.find_iter(text) {
                if m.start() > pos {
                    self.piece(&text[pos..m.start()], &mut out)?;
                }
                out.push(specials.ids[m.pattern().as_usize()]);
                pos = m.end();
            }
        }
        if pos < text.len() {
            self.piece(&text[pos..], &mut out)?;
        }
        Ok(out)
    }

    fn piece(&self, piece: &str, out: &mut Vec<u32>) -> Result<(), Error> {
        if piece.len() < MIN_SEGMENT_BYTES {
            return self.encode_plain(piece, out);
        }
        let key = xxhash_rust::xxh3::xxh3_128(piece.as_bytes());
        if let Some(ids) = self.cache.lock().map.get(&key).cloned() {
            out.extend_from_slice(&ids);
            return Ok(());
        }
        let start = out.len();
        self.encode_plain(piece, out)?;
        let ids: Arc<[u32]> = out[start..].into();
        let mut c = self.cache.lock();
        if ids.len() <= MAX_CACHED_TOKENS && c.map.insert(key, ids.clone()).is_none() {
            c.tokens += ids.len();
            c.order.push_back((key, ids.len()));
            while c.tokens > MAX_CACHED_TOKENS {
                let Some((old, n)) = c.order.pop_front() else {
                    break;
                };
                c.map.remove(&old);
                c.tokens -= n;
            }
        }
        Ok(())
    }

    /// Appends the ids of `text` (no special tokens): through the word cache when it applies.
    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) -> Result<(), Error> {
        let Some(words) = self.words.as_ref().filter(|_| text.is_ascii()) else {
            out.extend(self.tokenizer.encode(text, false)?);
            return Ok(());
        };
        let mut words = words.lock();
        let mut failed = None;
        super::pretok::gpt2_pieces(text, |word| {
            if failed.is_none()
                && let Err(e) = words.extend(word, out, || self.tokenizer.encode_pretoken(word))
            {
                failed = Some(e);
            }
        });
        failed.map_or(Ok(()), Err)
    }

    /// Tokens currently cached.
    pub fn cached_tokens(&self) -> usize {
        self.cache.lock().tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatMessage, text::TextGen};

    #[test]
    fn word_cache_keeps_words_in_use_and_stays_bounded() {
        let mut cache = WordCache::default();
        let mut misses = 0;
        let mut ids = |c: &mut WordCache, w: &str| {
            let mut out = Vec::new();
            c.extend(w, &mut out, || {
                misses += 1;
                Ok::<_, ()>(vec![w.len() as u32])
            })
            .unwrap();
            out
        };
        for i in 0..(MAX_CACHED_WORDS * 2) {
            assert_eq!(ids(&mut cache, " hot"), vec![4]);
            ids(&mut cache, &format!(" w{i}"));
            assert!(cache.young.len() + cache.old.len() <= MAX_CACHED_WORDS);
        }
        // " hot" was encoded once; every other word once each.
        assert_eq!(misses, 1 + MAX_CACHED_WORDS * 2);
    }

    #[test]
    fn a_metaspace_first_tokenizer_is_not_split_at_added_tokens() {
        // HuggingFace tokenizers (make_metaspace.py): with prepend_scheme "first", `user`
        // right after `<|im_start|>` is not `▁user`, so piece-by-piece encoding would differ;
        // the probe at start turns splitting off. With "always" it is exact, and stays on.
        let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/metaspace");
        let text = "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\nthe \
                    quick brown fox<|im_end|>\n<|im_start|>user\nbilling?<|im_end|>\n";
        for (scheme, splits) in [("first", false), ("always", true)] {
            let dir = std::path::Path::new(data).join(scheme);
            let tok = Arc::new(Tokenizer::from_dir(&dir).unwrap());
            let seg = SegmentTokenizer::new(tok.clone());
            assert_eq!(seg.specials.is_some(), splits, "{scheme}");
            for special in [false, true] {
                assert_eq!(
                    seg.encode(text, special).unwrap(),
                    tok.encode(text, special).unwrap(),
                    "{scheme}"
                );
            }
        }
        // What splitting would have given with "first": another id for `user`.
        let tok = Tokenizer::from_dir(&std::path::Path::new(data).join("first")).unwrap();
        let whole = tok.encode("<|im_start|>user", false).unwrap();
        let alone = tok.encode("user", false).unwrap();
        assert_ne!(&whole[1..], &alone[..]);
    }

    #[test]
    fn segmented_encoding_equals_plain_encoding() {
        let tok = Arc::new(Tokenizer::builtin());
        let seg = SegmentTokenizer::new(tok.clone());
        assert!(
            seg.specials.is_some() && seg.bos.is_some(),
            "the built-in tokenizer segments"
        );
        let mut text = TextGen::new(3);
        for i in 0..40 {
            let system = text.text(200 + i * 97);
            let messages = vec![
                ChatMessage {
                    role: "system".into(),
                    content: system.clone(),
                },
                ChatMessage {
                    role: "user".into(),
                    content: text.text(40 + i),
                },
                ChatMessage {
                    role: "assistant".into(),
                    content: format!("  {} \n", text.text(30)),
                },
                ChatMessage {
                    role: "user".into(),
                    content: text.text(300),
                },
            ];
            for generation in [true, false] {
                let rendered = tok.apply_chat_template(&messages, generation).unwrap();
                for special in [false, true] {
                    assert_eq!(
                        seg.encode(&rendered, special).unwrap(),
                        tok.encode(&rendered, special).unwrap(),
                        "case {i}"
                    );
                }
            }
            // Completions: plain text, with and without BOS; and specials inside user text.
            let raw = format!("{system} <|im_end|>tail{}", text.text(50));
            assert_eq!(
                seg.encode(&raw, true).unwrap(),
                tok.encode(&raw, true).unwrap()
            );
        }
        assert!(seg.cached_tokens() > 0);
        // Hits return the same ids.
        let rendered = tok
            .apply_chat_template(
                &[ChatMessage {
                    role: "user".into(),
                    content: "x ".repeat(400),
                }],
                true,
            )
            .unwrap();
        let a = seg.encode(&rendered, false).unwrap();
        assert_eq!(a, seg.encode(&rendered, false).unwrap());
        assert_eq!(a, tok.encode(&rendered, false).unwrap());
    }
}
