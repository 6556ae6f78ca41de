//! The framing and connection fields of a head, read in one pass: the one loop over
//! `content-length`, `transfer-encoding`, `connection`, `expect` and `host` that both legs
//! use. Each leg then decides by its own rules (a server answers 400 or 501 where a client
//! reports a bad response).

use crate::http::{ascii, headers::lists};

/// What a head's framing and connection fields say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FramingFields {
    /// `content-length` (every such field, and every member of a list in one, agreed).
    pub length: Option<u64>,
    /// Every `transfer-encoding` field, read as one list; `None`: no such field.
    pub coding: Option<Coding>,
    /// `connection` lists `close`.
    pub close: bool,
    /// `connection` lists `keep-alive`.
    pub keep_alive: bool,
    /// The last `expect` field lists `100-continue`.
    pub expect_continue: bool,
    /// How many `host` fields there are (counted up to 255).
    pub hosts: u8,
}

/// What the `transfer-encoding` fields of a head say, all of them read as one list in order
/// (RFC 9110 5.3: several fields are one comma-separated list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// `chunked`, alone: the one transfer coding this layer decodes.
    Chunked,
    /// `chunked` last, after codings this layer does not decode (`gzip`, ...).
    Unsupported,
    /// The list does not end in `chunked`, names it more than once, or is empty: the body's
    /// length cannot be known from it (RFC 9112 6.3).
    NotChunked,
}

/// A framing field that cannot be read: the message is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("invalid content-length")]
    BadLength,
    #[error("conflicting content-length fields")]
    ConflictingLength,
}

/// The `transfer-encoding` list, counted as it is read.
#[derive(Debug, Default)]
struct Codings {
    seen: bool,
    codings: u32,
    chunked: u32,
    last_chunked: bool,
}

impl Codings {
    fn add(&mut self, value: &[u8]) {
        self.seen = true;
        // Empty list members are allowed and ignored (RFC 9110 5.6.1).
        for coding in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
            if coding.is_empty() {
                continue;
            }
            let chunked = coding.eq_ignore_ascii_case(b"chunked");
            self.codings = self.codings.saturating_add(1);
            self.chunked = self.chunked.saturating_add(u32::from(chunked));
            self.last_chunked = chunked;
        }
    }

    fn coding(&self) -> Option<Coding> {
        self.seen
            .then_some(match (self.last_chunked, self.chunked, self.codings) {
                (true, 1, 1) => Coding::Chunked,
                (true, 1, _) => Coding::Unsupported,
                _ => Coding::NotChunked,
            })
    }
}

impl FramingFields {
    /// Reads the fields httparse parsed out of a head.
    pub fn read(fields: &[httparse::Header<'_>]) -> Result<Self, FieldError> {
        let mut out = Self::default();
        let mut codings = Codings::default();
        for h in fields {
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = content_length(h.value)?;
                if out.length.is_some_and(|l| l != n) {
                    return Err(FieldError::ConflictingLength);
                }
                out.length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                codings.add(h.value);
            } else if h.name.eq_ignore_ascii_case("connection") {
                out.close |= lists(h.value, b"close");
                out.keep_alive |= lists(h.value, b"keep-alive");
            } else if h.name.eq_ignore_ascii_case("expect") {
                out.expect_continue = lists(h.value, b"100-continue");
            } else if h.name.eq_ignore_ascii_case("host") {
                out.hosts = out.hosts.saturating_add(1);
            }
        }
        out.coding = codings.coding();
        Ok(out)
    }
}

/// A `content-length` value: digits only (no sign, no inner space). A list of equal values
/// (`5, 5`, which some intermediaries make of duplicate fields) is that value (RFC 9110 8.6
/// allows either this or a refusal); a list of differing values is a conflict.
pub(super) fn content_length(value: &[u8]) -> Result<u64, FieldError> {
    let mut length = None;
    for member in value.split(|&b| b == b',') {
        let n = ascii::decimal(member.trim_ascii()).ok_or(FieldError::BadLength)?;
        if length.is_some_and(|l| l != n) {
            return Err(FieldError::ConflictingLength);
        }
        length = Some(n);
    }
    length.ok_or(FieldError::BadLength)
}
