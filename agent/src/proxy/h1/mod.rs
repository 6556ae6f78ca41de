//! warmpath's own HTTP/1.1, on both legs of the data path: the client side to engines
//! ([`client`]) and the server side to applications ([`server`]). Each request is read,
//! routed, forwarded and answered on the task of its client connection: no connection task
//! per upstream, no channel between tasks, header values kept as slices of the bytes read
//! (no copy, no allocation per field).
//!
//! What both legs share lives here: body framing ([`Framing`]: `content-length`, `chunked`
//! or until close, decoded incrementally off a read buffer) and head limits.

pub mod client;
pub mod server;

use bytes::{Bytes, BytesMut};

use crate::headers::{Span, Spans, lists};

pub use client::{H1Body, H1Client, Outgoing};

/// Largest message head accepted (request or response).
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a message head.
pub const MAX_HEADERS: usize = 100;
/// Longest chunk-size or trailer line accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 4096;
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
            match state {
                Chunk::Data(_) => break,
                Chunk::DataEnd => {
                    if buf.len() < 2 {
                        break;
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(FramingError("chunk data not followed by CRLF"));
                    }
                    let _ = buf.split_to(2);
                    *self = Framing::Chunked(Chunk::Size);
                }
                Chunk::Size | Chunk::Trailers(_) => {
                    let Some(eol) = memchr::memmem::find(buf, b"\r\n") else {
                        if buf.len() > MAX_CHUNK_LINE {
                            return Err(FramingError("chunk line too long"));
                        }
                        break;
                    };
                    let next = match state {
                        Chunk::Size => match chunk_size(&buf[..eol])? {
                            0 => Framing::Chunked(Chunk::Trailers(0)),
                            n => Framing::Chunked(Chunk::Data(n)),
                        },
                        // Trailer fields are dropped; the empty line ends the body.
                        _ if eol == 0 => Framing::Done,
                        Chunk::Trailers(seen) if seen + eol > MAX_TRAILERS => {
                            return Err(FramingError("trailers too large"));
                        }
                        Chunk::Trailers(seen) => Framing::Chunked(Chunk::Trailers(seen + eol)),
                        _ => unreachable!("only size and trailer lines are read here"),
                    };
                    let _ = buf.split_to(eol + 2);
                    *self = next;
                }
            }
        }
        Ok(())
    }
}

/// A chunk-size line's size (extensions after `;` ignored).
fn chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let bad = FramingError("bad chunk size");
    let hex = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if hex.is_empty() || hex.len() > 15 {
        return Err(bad);
    }
    hex.iter().try_fold(0u64, |n, &b| {
        let d = (b as char).to_digit(16).ok_or(bad.clone())?;
        Ok(n << 4 | u64::from(d))
    })
}

/// Whether a `transfer-encoding` value ends in `chunked` (the only coding a body can be
/// delimited by).
fn ends_chunked(value: &[u8]) -> bool {
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// A `content-length` value.
fn content_length(value: &[u8]) -> Option<u64> {
    crate::ascii::decimal(value.trim_ascii())
}

/// Where each of `fields` (parsed by httparse out of `buf`) sits in `buf`, so the fields can
/// be read as slices of the head once it is split off the read buffer; into `out`, emptied
/// first.
fn spans(buf: &[u8], fields: &[httparse::Header<'_>], out: &mut Spans) {
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
mod tests {
    use super::*;

    fn all(framing: &mut Framing, wire: &[u8], piece: usize) -> Result<Vec<u8>, FramingError> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut rest = wire;
        loop {
            match framing.decode(&mut buf)? {
                Decoded::Data(d) => out.extend_from_slice(&d),
                Decoded::End => return Ok(out),
                Decoded::More if rest.is_empty() => {
                    framing.at_eof()?;
                    return Ok(out);
                }
                Decoded::More => {
                    let n = piece.min(rest.len());
                    buf.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                }
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_sizes() {
        let wire = b"3;x=y\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\ntrailer: t\r\n\r\n";
        for piece in 1..wire.len() {
            let mut f = Framing::Chunked(Chunk::Size);
            assert_eq!(all(&mut f, wire, piece).unwrap(), b"abc0123456789abcdef");
            assert!(f.is_done());
        }
        // The last data frame already knows the body ended when the terminator came with it.
        let mut f = Framing::Chunked(Chunk::Size);
        let mut buf = BytesMut::from(&b"2\r\nhi\r\n0\r\n\r\n"[..]);
        assert_eq!(f.decode(&mut buf).unwrap(), Decoded::Data("hi".into()));
        assert!(f.is_done() && buf.is_empty());
    }

    #[test]
    fn malformed_framing_is_an_error_that_stays() {
        for wire in [
            &b"zz\r\n"[..],
            b"2\r\nabXX",
            b"ffffffffffffffffff\r\n",
            b"\r\n",
        ] {
            let mut f = Framing::Chunked(Chunk::Size);
            assert!(all(&mut f, wire, wire.len()).is_err(), "{wire:?}");
        }
        let mut f = Framing::Chunked(Chunk::Size);
        let mut buf = BytesMut::from(&b"zz\r\n"[..]);
        assert!(f.decode(&mut buf).is_err());
        assert!(f.decode(&mut buf).is_err());
        let mut f = Framing::Length(9);
        assert!(all(&mut f, b"short", 5).is_err());
        let mut f = Framing::UntilClose;
        assert_eq!(all(&mut f, b"all of it", 4).unwrap(), b"all of it");
    }

    #[test]
    fn field_values_parse_strictly() {
        assert_eq!(chunk_size(b"1a").unwrap(), 26);
        assert_eq!(chunk_size(b"0;ext=1").unwrap(), 0);
        assert!(chunk_size(b"").is_err());
        assert!(chunk_size(b"g").is_err());
        assert_eq!(content_length(b" 42 "), Some(42));
        assert_eq!(content_length(b"+42"), None);
        assert_eq!(content_length(b"4 2"), None);
        assert!(ends_chunked(b"gzip, Chunked"));
        assert!(!ends_chunked(b"chunked, gzip"));
        assert!(lists(b"keep-alive, Close", b"close"));
    }
}
