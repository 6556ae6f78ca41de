//! Reading a request: its head off the read buffer (framing fields checked: smuggling and
//! unknown codings refused), then its body, size-limited and timed.
//!
//! A head is refused, and the connection closed, when: it is over [`MAX_HEAD`] bytes or
//! [`MAX_HEADERS`] fields (431); a line ends in a bare LF, httparse cannot parse it (bare CR,
//! NUL or another control byte in a value, obs-fold, whitespace before a colon, ...), an
//! HTTP/1.1 request has no `host` or any request more than one (400); `content-length` is
//! not digits only or its values differ (400); `transfer-encoding` comes on an HTTP/1.0
//! request, together with `content-length`, or without `chunked` as its one final coding
//! (400); codings before a final `chunked` (`gzip, chunked`) are 501.

use std::io;

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use tokio::{
    io::AsyncWriteExt,
    net::tcp::{ReadHalf, WriteHalf},
};

use super::read_by;
use crate::http::{
    MAX_HEAD, MAX_HEADERS,
    framing::{Chunk, Coding, Decoded, FieldError, Framing, FramingFields, spans as field_spans},
    headers::{Headers, Spans, crlf_lines},
    message::{Refusal, RequestHead},
};

/// A parsed request head.
pub(super) struct Head {
    pub parts: RequestHead,
    pub framing: Framing,
    pub keep_alive: bool,
    pub expect_continue: bool,
}

/// Parses a request head off the front of `buf` (`None`: incomplete).
/// `spans` is the connection's list for the head's field spans (taken when complete).
pub(super) fn parse_request(
    buf: &mut BytesMut,
    spans: &mut Spans,
) -> Result<Option<Head>, Refusal> {
    let bad = |m: &str| Refusal::bad_request(format!("Malformed HTTP request: {m}."));
    let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!("The request has more than {MAX_HEADERS} header fields."),
            ));
        }
        Err(err) => return Err(bad(&err.to_string())),
    };
    if len > MAX_HEAD {
        return Err(Refusal::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("The request head exceeds {MAX_HEAD} bytes."),
        ));
    }
    if !crlf_lines(&buf[..len]) {
        return Err(bad("a line of the head ends in a bare LF"));
    }
    let method = http::Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| bad("invalid method"))?;
    let http11 = req.version == Some(1);
    let fields = FramingFields::read(req.headers).map_err(|e| match e {
        FieldError::BadLength => bad("invalid content-length"),
        FieldError::ConflictingLength => bad("conflicting content-length fields"),
    })?;
    match fields.hosts {
        0 if http11 => return Err(bad("no host field")),
        0 | 1 => {}
        _ => return Err(bad("more than one host field")),
    }
    let (close, keep) = (fields.close, fields.keep_alive);
    let expect_continue = http11 && fields.expect_continue;
    let framing = match (fields.coding, fields.length) {
        (None, Some(n)) if n > 0 => Framing::Length(n),
        (None, _) => Framing::Done,
        (Some(_), _) if !http11 => return Err(bad("transfer-encoding in an HTTP/1.0 request")),
        (Some(_), Some(_)) => return Err(bad("both content-length and transfer-encoding")),
        (Some(Coding::Chunked), None) => Framing::Chunked(Chunk::Size),
        (Some(Coding::Unsupported), None) => {
            return Err(Refusal::new(
                StatusCode::NOT_IMPLEMENTED,
                "Transfer codings other than chunked are not supported.",
            ));
        }
        (Some(Coding::NotChunked), None) => {
            return Err(bad("chunked is not the final transfer coding"));
        }
    };
    let target_at = req.path.unwrap_or("/").as_ptr() as usize - buf.as_ptr() as usize;
    let target_len = req.path.unwrap_or("/").len();
    field_spans(buf, req.headers, spans);
    let spans = std::mem::take(spans);
    let head = buf.split_to(len).freeze();
    let version = if http11 {
        http::Version::HTTP_11
    } else {
        http::Version::HTTP_10
    };
    let target = head.slice(target_at..target_at + target_len);
    let parts = RequestHead::new(method, target, version, Headers::Raw { head, spans })
        .ok_or_else(|| bad("invalid request target"))?;
    Ok(Some(Head {
        parts,
        framing,
        keep_alive: if http11 { !close } else { keep && !close },
        expect_continue,
    }))
}

/// Reads the request body. `Err` inside: the error to answer (the connection then closes).
pub(super) async fn read_body(
    r: &mut ReadHalf<'_>,
    w: &mut WriteHalf<'_>,
    buf: &mut BytesMut,
    mut framing: Framing,
    expect_continue: bool,
    max: usize,
    timeout: std::time::Duration,
) -> io::Result<Result<Bytes, Refusal>> {
    let too_large = || {
        Ok(Err(Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Request body exceeds {max} bytes."),
        )))
    };
    if framing.remaining().is_some_and(|n| n > max as u64) {
        return too_large();
    }
    if expect_continue && !framing.is_done() && buf.is_empty() {
        w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    // A declared length is known to fit (checked above): one allocation for the whole body
    // once it arrives in pieces.
    let declared = framing.remaining().unwrap_or(0) as usize;
    let mut body = BytesMut::new();
    loop {
        match framing.decode(buf) {
            // The common case: the whole body in one piece, taken without a copy.
            Ok(Decoded::Data(d)) if body.is_empty() && framing.is_done() => return Ok(Ok(d)),
            Ok(Decoded::Data(d)) => {
                if body.len() + d.len() > max {
                    return too_large();
                }
                if body.capacity() == 0 {
                    body.reserve(declared.max(d.len()));
                }
                body.extend_from_slice(&d);
            }
            Ok(Decoded::End) => return Ok(Ok(body.freeze())),
            Ok(Decoded::More) => {
                let deadline = tokio::time::Instant::now() + timeout;
                match read_by(r, buf, Some(deadline)).await? {
                    Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Some(_) => {}
                    None => {
                        return Ok(Err(Refusal::new(
                            StatusCode::REQUEST_TIMEOUT,
                            format!("The request body stalled for {timeout:?}."),
                        )));
                    }
                }
            }
            Err(err) => {
                return Ok(Err(Refusal::bad_request(format!(
                    "Malformed request body: {err}."
                ))));
            }
        }
    }
}
