//! The framing decoder and the framing fields, against wire bytes written out by hand.

use super::{fields::content_length, *};

/// Decodes `wire` fed `piece` bytes at a time: the body, or the first error.
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

/// Decodes a chunked body off the front of `wire` in one piece: the body and the bytes
/// left after it, or the error.
fn chunked(wire: &[u8]) -> Result<(Vec<u8>, Vec<u8>), FramingError> {
    let mut f = Framing::Chunked(Chunk::Size);
    let mut buf = BytesMut::from(wire);
    let mut out = Vec::new();
    loop {
        match f.decode(&mut buf)? {
            Decoded::Data(d) => out.extend_from_slice(&d),
            Decoded::End => return Ok((out, buf.to_vec())),
            Decoded::More => return Err(FramingError("incomplete")),
        }
    }
}

fn h<'a>(name: &'a str, value: &'a [u8]) -> httparse::Header<'a> {
    httparse::Header { name, value }
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
fn a_bare_lf_in_chunk_framing_never_swallows_the_next_request() {
    let next = b"GET /next HTTP/1.1\r\nhost: x\r\n\r\n";
    // The well-formed body ends exactly where the next request starts.
    let (body, rest) = chunked(&[&b"2\r\nhi\r\n0\r\n\r\n"[..], next].concat()).unwrap();
    assert_eq!((&body[..], &rest[..]), (&b"hi"[..], &next[..]));
    // A bare LF anywhere in the framing is an error, never a line end that moves the body's
    // end (`0\r\n\n` would otherwise read the next request as trailer lines).
    for framing in [
        &b"2\r\nhi\r\n0\r\n\n"[..],
        b"2\nhi\r\n0\r\n\r\n",
        b"2\r\nhi\n0\r\n\r\n",
        b"2\r\nhi\r\n0\n\r\n",
        b"2\r\nhi\r\n0\r\nx-t: 1\n\r\n",
    ] {
        let wire = [framing, next].concat();
        assert!(
            chunked(&wire).is_err(),
            "{:?}",
            String::from_utf8_lossy(framing)
        );
    }
    // So is a bare CR or another control byte in a size or trailer line.
    for framing in [
        &b"2\rx\r\nhi\r\n0\r\n\r\n"[..],
        b"2;a\x00b\r\nhi\r\n0\r\n\r\n",
        b"2\r\nhi\r\n0\r\nx-t: a\rb\r\n\r\n",
    ] {
        assert!(chunked(framing).is_err(), "{framing:?}");
    }
    // HTAB is allowed (whitespace before an extension).
    assert_eq!(chunked(b"2\t;a=b\r\nhi\r\n0\r\n\r\n").unwrap().0, b"hi");
}

#[test]
fn chunk_lines_are_capped_however_they_arrive() {
    let ext = "x".repeat(MAX_CHUNK_LINE);
    // A line over the cap with its CRLF already buffered: refused, not accepted whole.
    let long = format!("2;{ext}\r\nhi\r\n0\r\n\r\n");
    assert_eq!(
        chunked(long.as_bytes()),
        Err(FramingError("chunk line too long"))
    );
    // The same without its CRLF yet: refused as soon as the cap is passed.
    let mut f = Framing::Chunked(Chunk::Size);
    let mut buf = BytesMut::from(format!("2;{ext}").as_bytes());
    assert!(f.decode(&mut buf).is_err());
    // A line of exactly the cap (CRLF included) is accepted.
    let fits = format!("2;{}\r\nhi\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE - 4));
    assert_eq!(chunked(fits.as_bytes()).unwrap().0, b"hi");
    // Trailer lines too, and the trailers as a whole (16 KiB).
    let trailer = format!("2\r\nhi\r\n0\r\nx-t: {ext}\r\n\r\n");
    assert!(chunked(trailer.as_bytes()).is_err());
    let line = format!("x-t: {}\r\n", "y".repeat(1000));
    let many = format!("2\r\nhi\r\n0\r\n{}\r\n", line.repeat(17));
    assert_eq!(
        chunked(many.as_bytes()),
        Err(FramingError("trailers too large"))
    );
}

#[test]
fn chunk_sizes_follow_the_grammar() {
    let size = |line: &[u8]| chunk_size(line);
    assert_eq!(size(b"1a\r\n"), Ok(26));
    assert_eq!(size(b"1A;ext=1\r\n"), Ok(26));
    assert_eq!(size(b"0;ext=1\r\n"), Ok(0));
    // Whitespace (BWS) is allowed between the size and an extension only.
    assert_eq!(size(b"1a \t;x\r\n"), Ok(26));
    for bad in [
        &b" 1a\r\n"[..],
        b"\t1a\r\n",
        b"1a \r\n",
        b"1a\t\r\n",
        b"1 a\r\n",
        b"\r\n",
        b";x\r\n",
        b"g\r\n",
        b"-1\r\n",
        b"+1\r\n",
        b"0x1a\r\n",
    ] {
        assert_eq!(size(bad), Err(FramingError("bad chunk size")), "{bad:?}");
    }
    // Fifteen hex digits fit; sixteen or more are refused before any arithmetic (no
    // overflow), leading zeros included.
    assert_eq!(size(b"fffffffffffffff\r\n"), Ok(0x0fff_ffff_ffff_ffff));
    assert!(size(b"ffffffffffffffff\r\n").is_err());
    assert!(size(b"0000000000000001\r\n").is_err());
    assert!(size(b"ffffffffffffffffffffffffffffffffff\r\n").is_err());
}

#[test]
fn content_lengths_parse_strictly() {
    assert_eq!(content_length(b"42"), Ok(42));
    assert_eq!(content_length(b"42, 42"), Ok(42));
    assert_eq!(content_length(b"42,42"), Ok(42));
    assert_eq!(
        content_length(b"42, 43"),
        Err(FieldError::ConflictingLength)
    );
    for bad in [
        &b""[..],
        b"+42",
        b"-42",
        b"4 2",
        b"0x2a",
        b"42,",
        b",42",
        b"42;",
        b"10000000000000000000",
    ] {
        assert_eq!(content_length(bad), Err(FieldError::BadLength), "{bad:?}");
    }
}

#[test]
fn framing_fields_are_read_in_one_pass() {
    let f = FramingFields::read(&[
        h("Host", b"x"),
        h("Content-Length", b"5"),
        h("content-length", b"5"),
        h("Connection", b"keep-alive"),
        h("expect", b"100-continue"),
    ])
    .unwrap();
    assert_eq!(
        f,
        FramingFields {
            length: Some(5),
            coding: None,
            close: false,
            keep_alive: true,
            expect_continue: true,
            hosts: 1,
        }
    );
    let bad = [h("content-length", b"5"), h("content-length", b"6")];
    assert_eq!(
        FramingFields::read(&bad),
        Err(FieldError::ConflictingLength)
    );
    let bad = [h("content-length", b"+5")];
    assert_eq!(FramingFields::read(&bad), Err(FieldError::BadLength));
    let hosts = [h("host", b"a"), h("HOST", b"b")];
    assert_eq!(FramingFields::read(&hosts).unwrap().hosts, 2);
}

#[test]
fn transfer_encoding_fields_are_one_list() {
    let coding = |fields: &[httparse::Header<'_>]| FramingFields::read(fields).unwrap().coding;
    let te = |v| h("Transfer-Encoding", v);
    assert_eq!(coding(&[]), None);
    assert_eq!(coding(&[te(b"chunked")]), Some(Coding::Chunked));
    assert_eq!(coding(&[te(b"Chunked")]), Some(Coding::Chunked));
    // Empty members are ignored.
    assert_eq!(coding(&[te(b", chunked,")]), Some(Coding::Chunked));
    // Several fields combine in order: `gzip` then `chunked` is gzip, chunked (not the last
    // field alone).
    assert_eq!(
        coding(&[te(b"gzip"), te(b"chunked")]),
        Some(Coding::Unsupported)
    );
    assert_eq!(coding(&[te(b"gzip, chunked")]), Some(Coding::Unsupported));
    assert_eq!(
        coding(&[te(b"chunked"), te(b"gzip")]),
        Some(Coding::NotChunked)
    );
    for not in [
        &[te(b"chunked, identity")][..],
        &[te(b"xchunked")],
        &[te(b"chunked;q=1")],
        &[te(b"identity")],
        &[te(b"")],
        &[te(b"chunked"), te(b"chunked")],
        &[te(b"chunked, chunked")],
    ] {
        assert_eq!(coding(not), Some(Coding::NotChunked), "{not:?}");
    }
}
