//! Body framing, shared by both legs: how a message's body is delimited (`content-length`,
//! `chunked` or until close), read from its head's fields in one pass ([`FramingFields`]) and
//! decoded incrementally off a read buffer ([`Framing::decode`]). Chunk-size lines are read
//! by httparse ([`httparse::parse_chunk_size`]) under warmpath's own, stricter limits.
//!
//! Chunked framing is read strictly, so that no two readers of the same bytes can disagree
//! on where a body ends: every line (chunk size, trailer, the empty last line) ends in CRLF,
//! and a bare LF or CR, or any other control byte but HTAB, is an error; a chunk size is 1 to
//! 15 hex digits with no whitespace before it, and whitespace after it only before a `;`
//! extension; a line is at most [`MAX_CHUNK_LINE`] bytes, however it arrived.

use bytes::{Bytes, BytesMut};

mod fields;

pub use fields::{Coding, FieldError, FramingFields};

use super::headers::{Span, Spans};

/// Longest chunk-size or trailer line accepted in a chunked body, its CRLF included.
pub const MAX_CHUNK_LINE: usize = 4096;
/// Trailer bytes accepted after the last chunk (they are dropped).
const MAX_TRAILERS: usize = 16 * 1024;

/// How the rest of a body is delimited, and how far it has been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes to go.
    Length(u64),
    Chunked(Chunk),
    /// Until the peer closes (responses without a length only).
    UntilClose,
    Done,
}

/// Where a chunked decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk's data: bytes to go.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one (bytes of trailers so far).
    Trailers(usize),
}

/// One step of decoding.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes (the framing may have ended with them: see [`Framing::is_done`]).
    Data(Bytes),
    /// The buffer holds no more of the body: read more.
    More,
    /// The body ended.
    End,
}

/// A framing error: the message is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FramingError(&'static str);

// === impl Framing ===

impl Framing {
    pub fn is_done(&self) -> bool {
        *self == Framing::Done
    }

    /// Bytes still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Framing::Length(n) => Some(*n),
            Framing::Done => Some(0),
            _ => None,
        }
    }

    /// Decodes the next piece of the body off the front of `buf`. Errors leave `buf` and the
    /// state as they were (the same error comes again).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, FramingError> {
        self.settle(buf)?;
        let limit = match *self {
            Framing::Done => return Ok(Decoded::End),
            Framing::Length(n) | Framing::Chunked(Chunk::Data(n)) => n,
            Framing::UntilClose => u64::MAX,
            Framing::Chunked(_) => return Ok(Decoded::More),
        };
        if buf.is_empty() {
            return Ok(Decoded::More);
        }
        let n = (buf.len() as u64).min(limit) as usize;
        let data = buf.split_to(n).freeze();
        let left = limit - n as u64;
        *self = match *self {
            Framing::Length(_) if left == 0 => Framing::Done,
            Framing::Length(_) => Framing::Length(left),
            Framing::Chunked(_) if left == 0 => Framing::Chunked(Chunk::DataEnd),
            Framing::Chunked(_) => Framing::Chunked(Chunk::Data(left)),
            other => other,
        };
        // Past the chunk's CRLF and the terminating chunk too, when they are already here, so
        // the body is known to have ended with its last data.
        let _ = self.settle(buf);
        Ok(Decoded::Data(data))
    }

    /// The peer closed: the end of an until-close body, an error for any other.
    pub fn at_eof(&mut self) -> Result<(), FramingError> {
        match *self {
            Framing::UntilClose | Framing::Done => {
                *self = Framing::Done;
                Ok(())
            }
            _ => Err(FramingError("connection closed before the body ended")),
        }
    }

    /// Advances through chunk framing that carries no payload (sizes, CRLFs, trailers) as far
    /// as the buffer allows.
    fn settle(&mut self, buf: &mut BytesMut) -> Result<(), FramingError> {
        while let Framing::Chunked(state) = *self {
            let next = match state {
                Chunk::Data(_) => break,
                Chunk::DataEnd => {
                    if buf.first().is_some_and(|&b| b != b'\r')
                        || buf.get(1).is_some_and(|&b| b != b'\n')
                    {
                        return Err(FramingError("chunk data not followed by CRLF"));
                    }
                    if buf.len() < 2 {
                        break;
                    }
                    let _ = buf.split_to(2);
                    Framing::Chunked(Chunk::Size)
                }
                Chunk::Size => {
                    let Some(len) = chunk_line(buf)? else {
                        break;
                    };
                    let next = match chunk_size(&buf[..len])? {
                        0 => Framing::Chunked(Chunk::Trailers(0)),
                        n => Framing::Chunked(Chunk::Data(n)),
                    };
                    let _ = buf.split_to(len);
                    next
                }
                Chunk::Trailers(seen) => {
                    let Some(len) = chunk_line(buf)? else {
                        break;
                    };
                    if seen + len > MAX_TRAILERS {
                        return Err(FramingError("trailers too large"));
                    }
                    let _ = buf.split_to(len);
                    // Trailer fields are dropped; the empty line ends the body.
                    if len == 2 {
                        Framing::Done
                    } else {
                        Framing::Chunked(Chunk::Trailers(seen + len))
                    }
                }
            };
            *self = next;
        }
        Ok(())
    }
}

/// The length of the chunk-size or trailer line at the front of `buf`, its CRLF included
/// (`None`: not all here yet). A line longer than [`MAX_CHUNK_LINE`], one that ends in a bare
/// LF, or one holding a control byte other than HTAB (a bare CR, NUL, ...) is an error.
fn chunk_line(buf: &[u8]) -> Result<Option<usize>, FramingError> {
    let window = &buf[..buf.len().min(MAX_CHUNK_LINE)];
    let Some(lf) = memchr::memchr(b'\n', window) else {
        if buf.len() >= MAX_CHUNK_LINE {
            return Err(FramingError("chunk line too long"));
        }
        return Ok(None);
    };
    if lf == 0 || buf[lf - 1] != b'\r' {
        return Err(FramingError("chunk line ends in a bare LF"));
    }
    if buf[..lf - 1]
        .iter()
        .any(|&b| b.is_ascii_control() && b != b'\t')
    {
        return Err(FramingError("control character in a chunk line"));
    }
    Ok(Some(lf + 1))
}

/// A chunk-size line's size (`line` ends with its CRLF and holds no control byte but HTAB;
/// extensions after `;` are ignored). The number is read by httparse; the grammar is
/// RFC 9112's, stricter than httparse alone: 1 to 15 hex digits (httparse takes 16, and an
/// empty size as 0; 15 always fit in a `u64`), nothing before them, and after them either
/// the CRLF or optional whitespace then `;`.
fn chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let bad = FramingError("bad chunk size");
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(bad);
    }
    let after = &line[digits..];
    let ws = after
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    match after.get(ws) {
        Some(b';') => {}
        Some(b'\r') if ws == 0 => {}
        _ => return Err(bad),
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((_, n))) => Ok(n),
        _ => Err(bad),
    }
}

/// Where each of `fields` (parsed by httparse out of `buf`) sits in `buf`, so the fields can
/// be read as slices of the head once it is split off the read buffer; into `out`, emptied
/// first.
pub fn spans(buf: &[u8], fields: &[httparse::Header<'_>], out: &mut Spans) {
    let base = buf.as_ptr() as usize;
    // Heads are at most MAX_HEAD bytes (plus one read): offsets fit in u32.
    let at = |s: &[u8]| ((s.as_ptr() as usize - base) as u32, s.len() as u32);
    out.clear();
    out.extend(fields.iter().map(|f| Span {
        name: at(f.name.as_bytes()),
        value: at(f.value),
    }));
}

#[cfg(test)]
mod tests;
