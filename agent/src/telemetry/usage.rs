//! Token counts from the engine's own `usage`, read as the response streams past.
//!
//! Non-streaming bodies: `usage` is near the end of the JSON object, so a bounded tail of the
//! body is kept and the last `"usage":` value parsed. Streams: each SSE event (`data: ...\n\n`)
//! is inspected; the usage chunk (`"choices":[]` with a usage object) carries the totals, and an
//! `{"error": ...}` event marks a failure inside the stream.
//!
//! When the proxy asked for usage on the client's behalf (`stream_options.include_usage`), the
//! [`SseTap`] also undoes that: the usage chunk is dropped and the `"usage":null` the engine
//! then adds to ordinary chunks is removed, so the client sees exactly what it asked for.
//! Events are only rewritten whole; an incomplete event waits (bounded) for the rest.

use bytes::{Bytes, BytesMut};
use memchr::memmem;
use serde::Deserialize;

/// Bytes of a non-streaming body kept to find `usage` in.
const JSON_TAIL: usize = 16 * 1024;
/// An SSE event longer than this is passed through unparsed (never buffered without bound).
const MAX_EVENT: usize = 1024 * 1024;

/// A substring searcher built once (its setup costs more than searching one small body).
type Searcher<F> = std::sync::LazyLock<F>;

/// The end of an SSE event.
static EVENT_END: Searcher<memmem::Finder<'static>> =
    Searcher::new(|| memmem::Finder::new(b"\n\n"));

/// Token counts of one request, as the engine reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

const USAGE_KEY: &[u8] = b"\"usage\":";

/// Where the last `"usage":` in `bytes` starts. Engines write usage last, so the search runs
/// backwards from the end, from one `g` to the next: JSON punctuation, which a forward
/// substring search would stop at all the time, is skipped in vector steps, and the keys
/// after usage (`prompt_tokens`, `total_tokens`, ...) have no `g`.
fn last_usage_key(bytes: &[u8]) -> Option<usize> {
    /// Where the `g` sits in the key.
    const G: usize = 4;
    memchr::memrchr_iter(b'g', bytes).find_map(|i| {
        let start = i.checked_sub(G)?;
        (bytes.get(start..start + USAGE_KEY.len()) == Some(USAGE_KEY)).then_some(start)
    })
}

/// The usage object starting at the value after the last `"usage":` in `bytes`.
fn last_usage(bytes: &[u8]) -> Option<TokenUsage> {
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
    Some(TokenUsage {
        prompt: wire.prompt_tokens,
        cached: wire
            .prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0),
        completion: wire.completion_tokens,
    })
}

/// A quick read of a usage value as engines write it: `null`, or an object of integer counts
/// with an optional `prompt_tokens_details` object (or null). `None`: not that shape, ask
/// the full parser. Every engine body goes through here, so it is kept to one pass.
fn scan_usage(v: &[u8]) -> Option<Option<TokenUsage>> {
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
                    b"cached_tokens" => usage.cached = s.int()?,
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
        let n = crate::ascii::decimal(&self.v[self.at..self.at + digits])?;
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

/// Watches a non-streaming JSON body: keeps (shares, never copies) the last frames that add
/// up to at least [`JSON_TAIL`] bytes. A body in one frame, the common case, holds no list.
#[derive(Debug, Default)]
pub struct JsonTap {
    last: Bytes,
    earlier: std::collections::VecDeque<Bytes>,
    held: usize,
}

impl JsonTap {
    pub fn observe(&mut self, chunk: &Bytes) {
        let before = std::mem::replace(&mut self.last, chunk.clone());
        if !before.is_empty() {
            self.earlier.push_back(before);
        }
        self.held += chunk.len();
        while let Some(first) = self.earlier.front()
            && self.held - first.len() >= JSON_TAIL
        {
            self.held -= first.len();
            self.earlier.pop_front();
        }
    }

    pub fn usage(&self) -> Option<TokenUsage> {
        if self.earlier.is_empty() {
            return last_usage(&self.last);
        }
        let joined: Vec<u8> = self
            .earlier
            .iter()
            .chain([&self.last])
            .flat_map(|b| b.iter().copied())
            .collect();
        last_usage(&joined)
    }
}

/// Watches (and, when usage was injected, rewrites) an SSE stream.
#[derive(Debug)]
pub struct SseTap {
    strip_usage: bool,
    /// An incomplete event carried over to the next frame.
    pending: BytesMut,
    /// Set after an oversized event: pass the rest through untouched.
    gave_up: bool,
    pub usage: Option<TokenUsage>,
    pub error_event: bool,
    /// What went to the client last ended inside an event.
    open_event: bool,
}

impl SseTap {
    /// `strip_usage`: the client did not ask for usage; remove what the proxy asked for.
    pub fn new(strip_usage: bool) -> Self {
        Self {
            strip_usage,
            pending: BytesMut::new(),
            gave_up: false,
            usage: None,
            error_event: false,
            open_event: false,
        }
    }

    /// The end of a stream whose upstream failed: vLLM's in-stream error event, then `[DONE]`
    /// (after closing an event the client already got part of).
    pub fn fail(&mut self, message: &str) -> Bytes {
        self.pending.clear();
        self.error_event = true;
        let body = serde_json::json!({"error": {"message": message, "type": "BadGatewayError",
            "param": null, "code": 502}});
        let lead = if self.open_event { "\n\n" } else { "" };
        self.open_event = false;
        Bytes::from(format!("{lead}data: {body}\n\ndata: [DONE]\n\n"))
    }

    /// Takes one upstream frame; returns what goes to the client now (possibly empty).
    pub fn frame(&mut self, data: Bytes) -> Bytes {
        let out = self.pass(data);
        if !out.is_empty() {
            self.open_event = !out.ends_with(b"\n\n");
        }
        out
    }

    fn pass(&mut self, data: Bytes) -> Bytes {
        if self.gave_up {
            return data;
        }
        // Fast path: whole events in one frame and nothing to rewrite — inspect, pass as is.
        if self.pending.is_empty() && data.ends_with(b"\n\n") && !self.strip_usage {
            for event in events(&data) {
                self.inspect(event);
            }
            return data;
        }
        self.pending.extend_from_slice(&data);
        static EVENT_END_REV: Searcher<memmem::FinderRev<'static>> =
            Searcher::new(|| memmem::FinderRev::new(b"\n\n"));
        let Some(end) = EVENT_END_REV.rfind(&self.pending).map(|i| i + 2) else {
            if self.pending.len() > MAX_EVENT {
                tracing::debug!("SSE event over {MAX_EVENT} bytes: passing the stream through");
                self.gave_up = true;
                return self.pending.split().freeze();
            }
            return Bytes::new();
        };
        let complete = self.pending.split_to(end).freeze();
        if !self.strip_usage {
            for event in events(&complete) {
                self.inspect(event);
            }
            return complete;
        }
        let mut out = BytesMut::with_capacity(complete.len());
        for event in events(&complete) {
            if self.inspect(event) {
                continue;
            }
            strip_null_usage(event, &mut out);
            out.extend_from_slice(b"\n\n");
        }
        out.freeze()
    }

    /// At the end of the stream: whatever was still pending (an unterminated event).
    pub fn finish(&mut self) -> Bytes {
        self.pending.split().freeze()
    }

    /// Reads one event; true when it is the usage-only chunk the proxy asked for.
    fn inspect(&mut self, event: &[u8]) -> bool {
        let Some(json) = event.strip_prefix(b"data: ") else {
            return false;
        };
        if json.starts_with(b"{\"error\"") {
            self.error_event = true;
            return false;
        }
        static USAGE_OBJECT: Searcher<memmem::Finder<'static>> =
            Searcher::new(|| memmem::Finder::new(b"\"usage\":{"));
        if USAGE_OBJECT.find(json).is_none() {
            return false;
        }
        if let Some(u) = last_usage(json) {
            self.usage = Some(u);
        }
        static NO_CHOICES: Searcher<memmem::Finder<'static>> =
            Searcher::new(|| memmem::Finder::new(b"\"choices\":[]"));
        self.strip_usage && NO_CHOICES.find(json).is_some()
    }
}

/// The events (without their `\n\n` terminator) of a buffer of complete events.
fn events(buf: &[u8]) -> EventIter<'_> {
    EventIter { buf, at: 0 }
}

struct EventIter<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Iterator for EventIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = &self.buf[self.at..];
        let end = EVENT_END.find(rest)?;
        self.at += end + 2;
        Some(&rest[..end])
    }
}

/// Copies `event` without the `,"usage":null` (or `"usage":null,`) the injected option added.
fn strip_null_usage(event: &[u8], out: &mut BytesMut) {
    let mut rest = event;
    static NULL_USAGE: Searcher<memmem::Finder<'static>> =
        Searcher::new(|| memmem::Finder::new(b"\"usage\":null"));
    while let Some(i) = NULL_USAGE.find(rest) {
        let (before, after) = (&rest[..i], &rest[i + b"\"usage\":null".len()..]);
        if let Some(b) = before.strip_suffix(b",") {
            out.extend_from_slice(b);
            rest = after;
        } else if let Some(a) = after.strip_prefix(b",") {
            out.extend_from_slice(before);
            rest = a;
        } else {
            out.extend_from_slice(before);
            rest = after;
        }
    }
    out.extend_from_slice(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    const USAGE: &str = r#"data: {"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}"#;

    fn stream() -> String {
        format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"text\":\"a\"}}],\"usage\":null}}\n\n\
             data: {{\"id\":\"c\",\"choices\":[{{\"text\":\"b\"}}],\"usage\":null}}\n\n{USAGE}\n\ndata: [DONE]\n\n"
        )
    }

    fn run(tap: &mut SseTap, input: &str, split: usize) -> String {
        let b = input.as_bytes();
        let mut out = Vec::new();
        for chunk in b.chunks(split.max(1)) {
            out.extend_from_slice(&tap.frame(Bytes::copy_from_slice(chunk)));
        }
        out.extend_from_slice(&tap.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn injected_usage_is_read_then_removed_at_any_frame_split() {
        let expect = "data: {\"id\":\"c\",\"choices\":[{\"text\":\"a\"}]}\n\n\
                      data: {\"id\":\"c\",\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n";
        for split in [1, 2, 7, 33, 64, 1000] {
            let mut tap = SseTap::new(true);
            assert_eq!(run(&mut tap, &stream(), split), expect, "split {split}");
            assert_eq!(
                tap.usage,
                Some(TokenUsage {
                    prompt: 7,
                    cached: 4,
                    completion: 3
                })
            );
        }
    }

    #[test]
    fn requested_usage_passes_through_unchanged() {
        for split in [1, 5, 1000] {
            let mut tap = SseTap::new(false);
            assert_eq!(run(&mut tap, &stream(), split), stream());
            assert_eq!(tap.usage.map(|u| u.completion), Some(3));
        }
    }

    #[test]
    fn error_events_and_unterminated_tails_are_kept() {
        let mut tap = SseTap::new(true);
        let s = "data: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\npartial";
        assert_eq!(run(&mut tap, s, 4), s);
        assert!(tap.error_event);
        assert_eq!(tap.usage, None);
    }

    #[test]
    fn a_failed_upstream_ends_the_stream_with_an_error_event() {
        let mut tap = SseTap::new(false);
        let _ = tap.frame(Bytes::from_static(
            b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"cho",
        ));
        let end = String::from_utf8(tap.fail("pod went away").to_vec()).unwrap();
        // The partial event was held back, never sent: the error event starts clean.
        assert!(end.starts_with("data: {\"error\":{"), "{end}");
        assert!(end.ends_with("\n\ndata: [DONE]\n\n"), "{end}");
        assert!(tap.error_event);
        // After an oversized event went through unparsed, the client holds an open event.
        let mut open = SseTap::new(true);
        let _ = open.frame(Bytes::from(vec![b'x'; MAX_EVENT + 1]));
        assert!(open.fail("x").starts_with(b"\n\ndata: {\"error\""));
    }

    #[test]
    fn oversized_event_is_passed_through_not_buffered() {
        let mut tap = SseTap::new(true);
        let big = vec![b'x'; MAX_EVENT + 10];
        let mut out = tap.frame(Bytes::from(big.clone())).to_vec();
        out.extend_from_slice(&tap.frame(Bytes::from_static(b"\n\n")));
        assert_eq!(out.len(), big.len() + 2);
        assert!(tap.pending.is_empty());
    }

    #[test]
    fn the_quick_usage_scan_agrees_with_the_parser() {
        for v in [
            r#"{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":null}"#,
            r#"{ "prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 16} } ,"x":1}"#,
            r#"{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":null,"audio_tokens":0}}"#,
            r#"{}"#,
            r#"null,"x":1"#,
            r#"{"prompt_tokens":5,"completion_tokens":2.0}"#,
            r#"{"prompt_tokens":5,"extra":{"deep":[1]},"completion_tokens":2}"#,
            r#"{"prompt_tokens":5,"we\u0069rd":1,"completion_tokens":2}"#,
            r#"{"prompt_tokens":-5}"#,
            r#"{"prompt_tokens":5"#,
        ] {
            let full = serde_json::Deserializer::from_slice(v.as_bytes())
                .into_iter::<Option<Wire>>()
                .next()
                .and_then(Result::ok)
                .map(|w| {
                    w.map(|w| TokenUsage {
                        prompt: w.prompt_tokens,
                        cached: w
                            .prompt_tokens_details
                            .and_then(|d| d.cached_tokens)
                            .unwrap_or(0),
                        completion: w.completion_tokens,
                    })
                });
            if let Some(quick) = scan_usage(v.as_bytes()) {
                assert_eq!(Some(quick), full, "{v}");
            }
            let body = format!(r#"{{"choices":[],"usage":{v}"#);
            assert_eq!(last_usage(body.as_bytes()), full.flatten(), "{v}");
        }
        // The common shapes take the quick path.
        assert!(scan_usage(br#"{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}"#).is_some());
    }

    #[test]
    fn json_tail_finds_usage_of_any_body_size() {
        let body = format!(
            r#"{{"choices":[{{"text":"{}"}}],"usage":{{"prompt_tokens":5,"completion_tokens":2}},"x":null}}"#,
            "y".repeat(40_000)
        );
        for split in [3, 4096, 100_000] {
            let mut tap = JsonTap::default();
            for c in body.as_bytes().chunks(split) {
                tap.observe(&Bytes::copy_from_slice(c));
            }
            assert!(tap.held < JSON_TAIL + split);
            assert_eq!(
                tap.usage(),
                Some(TokenUsage {
                    prompt: 5,
                    cached: 0,
                    completion: 2
                })
            );
        }
        assert_eq!(JsonTap::default().usage(), None);
    }

    #[test]
    fn the_last_usage_is_found_wherever_it_is() {
        let usage = |p: u64| format!(r#""usage":{{"prompt_tokens":{p},"completion_tokens":1}}"#);
        // Last of two; only one, far from the end behind text full of `g`; at the very start.
        let bodies = [
            (format!("{{{},{},\"x\":1}}", usage(1), usage(2)), 2),
            (
                format!("{{{},\"pad\":\"{}\"}}", usage(3), "g\"usag".repeat(400)),
                3,
            ),
            (format!("{}}}", usage(4)), 4),
        ];
        for (body, prompt) in bodies {
            assert_eq!(
                last_usage(body.as_bytes()).map(|u| u.prompt),
                Some(prompt),
                "{body}"
            );
        }
        assert_eq!(last_usage(b"{\"usage\""), None);
        assert_eq!(last_usage(b"g"), None);
        assert_eq!(last_usage(b""), None);
    }

    proptest::proptest! {
        /// The backwards search agrees with a plain search for the last occurrence, on text
        /// made of pieces of the key.
        #[test]
        fn the_key_search_finds_the_last_occurrence(
            pieces in proptest::collection::vec(
                proptest::sample::select(vec!["\"usage\":", "\"usa", "ge\":", "g", "\"", ":", "x", "usage"]),
                0..40,
            )
        ) {
            let text = pieces.concat();
            let naive = text
                .as_bytes()
                .windows(USAGE_KEY.len())
                .rposition(|w| w == USAGE_KEY);
            proptest::prop_assert_eq!(last_usage_key(text.as_bytes()), naive);
        }
    }
}
