//! Response taps: token counts from the engine's own `usage`, read as the response streams
//! past.
//!
//! Non-streaming bodies: `usage` is near the end of the JSON object, so a bounded tail of the
//! body is kept and the last `"usage":` value parsed ([`usage`]). Streams: split into SSE
//! events ([`crate::http::sse`]), each inspected; the usage chunk (`"choices":[]` with a usage
//! object) carries the totals, and an `{"error": ...}` event marks a failure inside the stream.
//!
//! When the proxy asked for usage on the client's behalf (`stream_options.include_usage`), the
//! [`SseTap`] also undoes that: the usage chunk is dropped and the `"usage":null` the engine
//! then adds to ordinary chunks is removed, so the client sees exactly what it asked for.
//! Events are only rewritten whole; an incomplete event waits (bounded) for the rest.

mod usage;

use bytes::{Bytes, BytesMut};
use memchr::memmem;

use crate::{
    http::{
        Headers,
        sse::{self, DEFAULT_MAX_EVENT, Piece, Splitter},
    },
    telemetry::TokenUsage,
};
use usage::last_usage;

/// How one response body is observed: an SSE stream event by event, a successful JSON body
/// for its usage, anything else not at all.
#[derive(Debug)]
pub enum Tap {
    Sse(SseTap),
    Json(JsonTap),
    None,
}

// === impl Tap ===

impl Tap {
    /// The tap for an engine's response. (A rewritten stream's length is no longer the
    /// engine's: see [`Tap::rewrites`]; the engine's content-length is never forwarded.)
    pub fn for_response(status: http::StatusCode, headers: &Headers, strip_usage: bool) -> Self {
        let sse = headers
            .get("content-type")
            .is_some_and(|v| v.starts_with(b"text/event-stream"));
        if sse {
            Tap::Sse(SseTap::new(strip_usage))
        } else if status.is_success() {
            Tap::Json(JsonTap::default())
        } else {
            Tap::None
        }
    }

    /// Passes a data frame through; may hold bytes back (an incomplete SSE event) until the
    /// `last` frame.
    pub fn frame(&mut self, data: Bytes, last: bool) -> Bytes {
        match self {
            Tap::Sse(sse) => {
                let out = sse.frame(data);
                if last {
                    let rest = sse.finish();
                    if !rest.is_empty() {
                        return [out, rest].concat().into();
                    }
                }
                out
            }
            Tap::Json(json) => {
                json.observe(&data);
                data
            }
            Tap::None => data,
        }
    }

    /// At the end of the body: what was held back.
    pub fn finish(&mut self) -> Bytes {
        match self {
            Tap::Sse(sse) => sse.finish(),
            _ => Bytes::new(),
        }
    }

    /// The engine failed mid-body: a stream's last words (an error event with `status`'s
    /// code, the way vLLM ends a failed stream), or `None` when the body can only be cut
    /// short.
    pub fn fail(
        &mut self,
        status: http::StatusCode,
        message: impl FnOnce() -> String,
    ) -> Option<Bytes> {
        match self {
            Tap::Sse(sse) => Some(sse.fail_with(status, &message())),
            _ => None,
        }
    }

    /// Whether the body the client gets may differ in length from the engine's.
    pub fn rewrites(&self) -> bool {
        matches!(self, Tap::Sse(_))
    }

    /// What the body said: its usage, whether an error event ended it, whether it streamed.
    pub fn readings(&self) -> (Option<TokenUsage>, bool, bool) {
        match self {
            Tap::Sse(sse) => (sse.usage, sse.error_event, true),
            Tap::Json(json) => (json.usage(), false, false),
            Tap::None => (None, false, false),
        }
    }
}

/// Bytes of a non-streaming body kept to find `usage` in.
const JSON_TAIL: usize = 16 * 1024;
/// A substring searcher built once (its setup costs more than searching one small body).
type Searcher<F> = std::sync::LazyLock<F>;

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
    /// The stream's events (an incomplete one carried over to the next frame; an oversized
    /// one ends the splitting: the rest passes through untouched).
    split: Splitter,
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
            split: Splitter::new(DEFAULT_MAX_EVENT),
            usage: None,
            error_event: false,
            open_event: false,
        }
    }

    /// The end of a stream whose upstream failed: vLLM's in-stream error event, then `[DONE]`
    /// (after closing an event the client already got part of).
    pub fn fail(&mut self, message: &str) -> Bytes {
        self.fail_with(http::StatusCode::BAD_GATEWAY, message)
    }

    /// [`SseTap::fail`] with the error event's code (504: the engine went silent).
    pub fn fail_with(&mut self, status: http::StatusCode, message: &str) -> Bytes {
        self.split.clear();
        self.error_event = true;
        let body = super::error::body(status, message, None);
        let body = String::from_utf8_lossy(&body);
        let lead = if self.open_event { "\n\n" } else { "" };
        self.open_event = false;
        Bytes::from(format!("{lead}data: {body}\n\ndata: [DONE]\n\n"))
    }

    /// Takes one upstream frame; returns what goes to the client now (possibly empty).
    pub fn frame(&mut self, data: Bytes) -> Bytes {
        let out = self.pass(data);
        if !out.is_empty() {
            self.open_event = !sse::ends_event(&out);
        }
        out
    }

    fn pass(&mut self, data: Bytes) -> Bytes {
        let gave_up = self.split.gave_up();
        let complete = match self.split.push(data) {
            Piece::Events(complete) => complete,
            Piece::Raw(raw) => {
                if !gave_up {
                    tracing::debug!(
                        "SSE event over {DEFAULT_MAX_EVENT} bytes: passing the stream through"
                    );
                }
                return raw;
            }
        };
        if complete.is_empty() {
            return complete;
        }
        // Nothing to rewrite: inspect, pass as is (the frame itself when it held whole events).
        if !self.strip_usage {
            for event in sse::events(&complete) {
                self.inspect(event.body);
            }
            return complete;
        }
        let mut out = BytesMut::with_capacity(complete.len());
        let mut events = sse::events(&complete);
        for event in events.by_ref() {
            if self.inspect(event.body) {
                continue;
            }
            strip_null_usage(event.body, &mut out);
            out.extend_from_slice(event.terminator);
        }
        out.extend_from_slice(events.rest());
        out.freeze()
    }

    /// At the end of the stream: whatever was still pending (an unterminated event).
    pub fn finish(&mut self) -> Bytes {
        self.split.finish()
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
mod tests;
