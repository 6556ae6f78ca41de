//! Finding `usage` in an engine's JSON: the last `"usage":` key, searched backwards, and its
//! value read by a quick one-pass scan of the shape engines write (the full parser for
//! anything else).

use serde::Deserialize;

use crate::{http::ascii::decimal, telemetry::TokenUsage};

#[derive(Deserialize)]
pub(super) struct Wire {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
pub(super) struct Details {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

pub(super) const USAGE_KEY: &[u8] = b"\"usage\":";

/// Where the last `"usage":` in `bytes` starts. Engines write usage last, so the search runs
/// backwards from the end, from one `g` to the next: JSON punctuation, which a forward
/// substring search would stop at all the time, is skipped in vector steps, and the keys
/// after usage (`prompt_tokens`, `total_tokens`, ...) have no `g`.
pub(super) fn last_usage_key(bytes: &[u8]) -> Option<usize> {
    /// Where the `g` sits in the key.
    const G: usize = 4;
    memchr::memrchr_iter(b'g', bytes).find_map(|i| {
        let start = i.checked_sub(G)?;
        (bytes.get(start..start + USAGE_KEY.len()) == Some(USAGE_KEY)).then_some(start)
    })
}

/// The usage object starting at the value after the last `"usage":` in `bytes`.
pub(super) fn last_usage(bytes: &[u8]) -> Option<TokenUsage> {
    let at = last_usage_key(bytes)? + USAGE_KEY.len();
    let rest = &bytes[at..];
    if let Some(usage) = scan_usage(rest) {
        return usage;
    }
    // Whatever the quick scan does not follow (escapes, other value types) takes the full
    // parser.
    let wire = serde_json::Deserializer::from_slice(rest)
        .into_iter::<Option<Wire>>()
        .next()?
        .ok()??;
    let cached = wire.prompt_tokens_details.and_then(|d| d.cached_tokens);
    Some(TokenUsage {
        prompt: wire.prompt_tokens,
        cached_reported: cached.is_some(),
        cached: cached.unwrap_or(0),
        completion: wire.completion_tokens,
    })
}

/// A quick read of a usage value as engines write it: `null`, or an object of integer counts
/// with an optional `prompt_tokens_details` object (or null). `None`: not that shape, ask
/// the full parser. Every engine body goes through here, so it is kept to one pass.
pub(super) fn scan_usage(v: &[u8]) -> Option<Option<TokenUsage>> {
    let mut s = Scan { v, at: 0 };
    s.ws();
    if s.v[s.at..].starts_with(b"null") {
        return Some(None);
    }
    let mut usage = TokenUsage::default();
    s.object(|s, key| {
        match key {
            b"prompt_tokens" => usage.prompt = s.int()?,
            b"completion_tokens" => usage.completion = s.int()?,
            b"prompt_tokens_details" if s.peek()? == b'n' => s.literal(b"null")?,
            b"prompt_tokens_details" => s.object(|s, key| {
                match key {
                    b"cached_tokens" if s.peek()? == b'n' => s.literal(b"null")?,
                    b"cached_tokens" => {
                        usage.cached = s.int()?;
                        usage.cached_reported = true;
                    }
                    _ => s.scalar()?,
                }
                Some(())
            })?,
            _ => s.scalar()?,
        }
        Some(())
    })?;
    Some(Some(usage))
}

/// A cursor over JSON bytes for [`scan_usage`].
struct Scan<'a> {
    v: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    fn ws(&mut self) {
        while self.v.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.v.get(self.at).copied()
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        (self.peek()? == b).then(|| self.at += 1)
    }

    fn literal(&mut self, lit: &[u8]) -> Option<()> {
        self.ws();
        self.v[self.at..]
            .starts_with(lit)
            .then(|| self.at += lit.len())
    }

    /// `{ "key": value, ... }`, each value read by `member`.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            self.eat(b'"')?;
            let start = self.at;
            let len = self.v[start..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\')?;
            if self.v[start + len] != b'"' {
                return None;
            }
            self.at = start + len + 1;
            self.eat(b':')?;
            let key = &self.v[start..start + len];
            member(self, key)?;
            if self.eat(b',').is_none() {
                return self.eat(b'}');
            }
        }
    }

    /// A non-negative integer.
    fn int(&mut self) -> Option<u64> {
        self.ws();
        let digits = self.v[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let n = decimal(&self.v[self.at..self.at + digits])?;
        self.at += digits;
        Some(n)
    }

    /// A number, `true`, `false` or `null` that is not read.
    fn scalar(&mut self) -> Option<()> {
        self.ws();
        let len = self.v[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.'))
            .count();
        (len > 0).then(|| self.at += len)
    }
}
