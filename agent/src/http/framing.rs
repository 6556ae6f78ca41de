//! Body framing, shared by both legs: how a message's body is delimited (`content-length`,
//! `chunked` or until close), read from its head's fields in one pass ([`FramingFields`]) and
//! decoded incrementally off a read buffer ([`Framing::decode`]). Chunk-size lines are read
//! by httparse ([`httparse::parse_chunk_size`]) under warmpath's own limits.

use bytes::{Bytes, BytesMut};

use super::headers::{Span, Spans, lists};
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
                        Chunk::Size => match chunk_size(&buf[..eol + 2])? {
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

/// A chunk-size line's size (`line` ends with its CRLF; extensions after `;` ignored). The
/// line is read by httparse; the limits are warmpath's: leading whitespace is skipped, and
/// the size has 1 to 15 hex digits (httparse alone takes 16, and an empty size as 0).
fn chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let bad = FramingError("bad chunk size");
    let lead = line.iter().take_while(|b| b.is_ascii_whitespace()).count();
    let line = &line[lead..];
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(bad);
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((_, n))) => Ok(n),
        _ => Err(bad),
    }
}

/// What a head's framing and connection fields say, read in one pass over its fields: the
/// one loop over `content-length`, `transfer-encoding`, `connection` and `expect` that both
/// legs use (each then decides by its own rules: a server refuses what a client reads until
/// close).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FramingFields {
    /// `content-length` (every such field agreed).
    pub length: Option<u64>,
    /// Whether the last `transfer-encoding` value ends in `chunked`; `None`: no such field.
    pub chunked: Option<bool>,
    /// Some `transfer-encoding` value does not end in `chunked`.
    pub other_coding: bool,
    /// `connection` lists `close`.
    pub close: bool,
    /// `connection` lists `keep-alive`.
    pub keep_alive: bool,
    /// The last `expect` field lists `100-continue`.
    pub expect_continue: bool,
}

/// A framing field that cannot be read: the message is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("invalid content-length")]
    BadLength,
    #[error("conflicting content-length fields")]
    ConflictingLength,
}

impl FramingFields {
    /// Reads the fields httparse parsed out of a head.
    pub fn read(fields: &[httparse::Header<'_>]) -> Result<Self, FieldError> {
        let mut out = Self::default();
        for h in fields {
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = content_length(h.value).ok_or(FieldError::BadLength)?;
                if out.length.is_some_and(|l| l != n) {
                    return Err(FieldError::ConflictingLength);
                }
                out.length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                let chunked = ends_chunked(h.value);
                out.chunked = Some(chunked);
                out.other_coding |= !chunked;
            } else if h.name.eq_ignore_ascii_case("connection") {
                out.close |= lists(h.value, b"close");
                out.keep_alive |= lists(h.value, b"keep-alive");
            } else if h.name.eq_ignore_ascii_case("expect") {
                out.expect_continue = lists(h.value, b"100-continue");
            }
        }
        Ok(out)
    }
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
    super::ascii::decimal(value.trim_ascii())
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
        assert_eq!(chunk_size(b"1a\r\n").unwrap(), 26);
        assert_eq!(chunk_size(b"0;ext=1\r\n").unwrap(), 0);
        assert_eq!(chunk_size(b" 1a \t;x\r\n").unwrap(), 26);
        assert!(chunk_size(b"\r\n").is_err());
        assert!(chunk_size(b"g\r\n").is_err());
        assert!(chunk_size(b"ffffffffffffffff\r\n").is_err());
        assert_eq!(content_length(b" 42 "), Some(42));
        assert_eq!(content_length(b"+42"), None);
        assert_eq!(content_length(b"4 2"), None);
        assert!(ends_chunked(b"gzip, Chunked"));
        assert!(!ends_chunked(b"chunked, gzip"));
        assert!(lists(b"keep-alive, Close", b"close"));
    }

    #[test]
    fn framing_fields_are_read_in_one_pass() {
        let h = |name, value| httparse::Header { name, value };
        let f = FramingFields::read(&[
            h("Content-Length", &b"5"[..]),
            h("content-length", b" 5"),
            h("Transfer-Encoding", b"gzip"),
            h("transfer-encoding", b"chunked"),
            h("Connection", b"keep-alive"),
            h("expect", b"100-continue"),
        ])
        .unwrap();
        assert_eq!(
            f,
            FramingFields {
                length: Some(5),
                chunked: Some(true),
                other_coding: true,
                close: false,
                keep_alive: true,
                expect_continue: true,
            }
        );
        let bad = [h("content-length", &b"5"[..]), h("content-length", b"6")];
        assert_eq!(
            FramingFields::read(&bad),
            Err(FieldError::ConflictingLength)
        );
        let bad = [h("content-length", &b"+5"[..])];
        assert_eq!(FramingFields::read(&bad), Err(FieldError::BadLength));
    }
}
