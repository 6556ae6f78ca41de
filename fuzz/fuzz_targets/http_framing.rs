//! Body framing as both HTTP/1.1 legs decode it (`http::framing::Framing::decode`), on a body
//! that arrives in pieces of fuzzed sizes.
//!
//! Properties: the outcome (body bytes, where it ended, what was left after it, or that it is
//! malformed) does not depend on how the bytes were split; errors stay (the same error again,
//! buffer untouched); consumed bytes never exceed the input; a `content-length` body is the
//! input's first bytes; a decoded chunked body, chunked again, decodes to itself.
//!
//! Input: `[length u16 LE (0: chunked)][n][n piece sizes][the wire bytes]`.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use warmpath_agent::http::framing::{Chunk, Decoded, Framing};

struct Input<'a> {
    /// Chunked, or this many bytes of `content-length` (0: chunked).
    length: u16,
    /// Sizes of the pieces the input arrives in (cycled; 0 counts as 1).
    pieces: &'a [u8],
    wire: &'a [u8],
}

impl<'a> Input<'a> {
    fn read(data: &'a [u8]) -> Option<Self> {
        let [a, b, n, rest @ ..] = data else {
            return None;
        };
        let n = usize::from(*n).min(rest.len());
        Some(Self {
            length: u16::from_le_bytes([*a, *b]),
            pieces: &rest[..n],
            wire: &rest[n..],
        })
    }
}

#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The body ended; these bytes followed it.
    Done(Vec<u8>),
    /// The input ended first.
    Short,
    Malformed,
}

fn decode(framing: Framing, wire: &[u8], pieces: &[u8]) -> (Vec<u8>, End) {
    let mut framing = framing;
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    let mut rest = wire;
    let mut sizes = pieces.iter().map(|&p| usize::from(p.max(1))).cycle();
    loop {
        match framing.decode(&mut buf) {
            Ok(Decoded::Data(d)) => {
                assert!(
                    !d.is_empty() || framing.is_done(),
                    "empty data before the end"
                );
                body.extend_from_slice(&d);
            }
            Ok(Decoded::End) => {
                assert!(framing.is_done());
                let mut after = buf.to_vec();
                after.extend_from_slice(rest);
                return (body, End::Done(after));
            }
            Ok(Decoded::More) if rest.is_empty() => {
                assert!(
                    framing.at_eof().is_err(),
                    "only until-close bodies end at EOF"
                );
                return (body, End::Short);
            }
            Ok(Decoded::More) => {
                let n = sizes.next().unwrap_or(usize::MAX).min(rest.len());
                buf.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
            }
            Err(err) => {
                let (state, held) = (framing, buf.clone());
                assert_eq!(framing.decode(&mut buf), Err(err), "errors stay");
                assert_eq!((framing, &buf), (state, &held), "an error changes nothing");
                return (body, End::Malformed);
            }
        }
    }
}

/// `body` as chunks of the given sizes, then the last chunk.
fn chunked(body: &[u8], pieces: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut sizes = pieces.iter().map(|&p| usize::from(p.max(1))).cycle();
    let mut rest = body;
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(usize::MAX).min(rest.len());
        out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = Input::read(data) else {
        return;
    };
    let framing = match input.length {
        0 => Framing::Chunked(Chunk::Size),
        n => Framing::Length(u64::from(n)),
    };
    let whole = decode(framing, input.wire, &[]);
    let split = decode(framing, input.wire, input.pieces);
    let bytewise = decode(framing, input.wire, &[1]);
    assert_eq!(whole, split, "the outcome depends on the read sizes");
    assert_eq!(whole, bytewise, "the outcome depends on the read sizes");
    let (body, end) = whole;
    if let End::Done(after) = &end {
        assert!(
            body.len() + after.len() <= input.wire.len(),
            "consumed more than the input"
        );
        assert_eq!(&input.wire[input.wire.len() - after.len()..], &after[..]);
    }
    if let Framing::Length(_) = framing {
        let n = usize::from(input.length);
        match end {
            End::Done(_) => assert_eq!(&body[..], &input.wire[..n]),
            End::Short => assert!(input.wire.len() < n && body == input.wire),
            End::Malformed => panic!("a content-length body of {n} cannot be malformed"),
        }
    } else if matches!(end, End::Done(_)) {
        let again = chunked(&body, input.pieces);
        let (body2, end2) = decode(Framing::Chunked(Chunk::Size), &again, input.pieces);
        assert_eq!(
            (body2, end2),
            (body, End::Done(Vec::new())),
            "re-chunked body"
        );
    }
});
