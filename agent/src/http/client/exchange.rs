//! One exchange on a connection: the request written (head and a small body in one write),
//! the response head read and its framing decided.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use super::{COALESCE_BODY, Conn, H1Body, H1Error, MAX_KEPT_WIRE, Outgoing, READ_CHUNK};
use crate::http::{
    MAX_HEAD, MAX_HEADERS,
    framing::{Chunk, FieldError, Framing, FramingFields, spans},
    headers::{Headers, Spans, hop_by_hop},
};

/// The request head (and a small body) as bytes on the wire.
pub(super) fn encode_request(authority: &str, req: &Outgoing<'_>, out: &mut Vec<u8>) {
    let small = req.body.len() <= COALESCE_BODY;
    out.clear();
    out.reserve(256 + if small { req.body.len() } else { 0 });
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(b"\r\ncontent-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(req.body.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in req.headers.iter() {
        if forwarded(name) {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
    if small {
        out.extend_from_slice(req.body);
    }
}

/// Response head, the connection, its body framing, and whether it may be reused.
pub(super) type Exchanged = (Head, Conn, Framing, bool);

/// Whether a client's request field goes on to the engine: not `host`, `content-length` or
/// `expect` (this leg writes its own, and the client's `expect` was answered by the server
/// leg), nor hop-by-hop fields.
pub fn forwarded(name: &[u8]) -> bool {
    !(name.eq_ignore_ascii_case(b"host")
        || name.eq_ignore_ascii_case(b"content-length")
        || name.eq_ignore_ascii_case(b"expect")
        || hop_by_hop(name))
}

/// A response head.
#[derive(Debug)]
pub(super) struct Head {
    pub status: http::StatusCode,
    pub headers: Headers,
}

/// An engine's response: its head, and its body to stream.
#[derive(Debug)]
pub struct H1Response {
    pub status: http::StatusCode,
    pub headers: Headers,
    pub body: H1Body,
}

/// Writes the request and reads the response head (skipping interim 1xx heads).
pub(super) async fn exchange(
    mut conn: Conn,
    authority: &str,
    req: Outgoing<'_>,
) -> Result<Exchanged, H1Error> {
    encode_request(authority, &req, &mut conn.wire);
    conn.io
        .write_all(&conn.wire)
        .await
        .map_err(H1Error::Write)?;
    if conn.wire.capacity() > MAX_KEPT_WIRE {
        // A large body is not kept alive with an idle connection.
        conn.wire = Vec::new();
    }
    if req.body.len() > COALESCE_BODY {
        conn.io.write_all(req.body).await.map_err(H1Error::Write)?;
    }
    // Whether any response byte (an interim head included) has come back.
    let mut answered = false;
    loop {
        if let Some((head, framing, reusable)) = parse_head(&mut conn.buf)? {
            if head.status.is_informational() {
                if head.status == http::StatusCode::SWITCHING_PROTOCOLS {
                    return Err(H1Error::invalid("unexpected 101 Switching Protocols"));
                }
                continue;
            }
            return Ok((head, conn, framing, reusable));
        }
        if conn.buf.len() >= MAX_HEAD {
            return Err(H1Error::invalid(format!(
                "response head larger than {MAX_HEAD} bytes"
            )));
        }
        match read_more(&mut conn).await {
            Ok(0) if !answered => return Err(H1Error::ClosedBeforeHead),
            Ok(0) => {
                return Err(H1Error::invalid(
                    "connection closed inside the response head",
                ));
            }
            Ok(_) => answered = true,
            Err(err) if !answered => return Err(H1Error::ResetBeforeHead(err)),
            Err(err) => return Err(H1Error::Io(err)),
        }
    }
}

async fn read_more(conn: &mut Conn) -> io::Result<usize> {
    std::future::poll_fn(|cx| poll_read_more(conn, cx)).await
}

pub(super) fn poll_read_more(conn: &mut Conn, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
    if conn.buf.capacity() - conn.buf.len() < READ_CHUNK / 4 {
        conn.buf.reserve(READ_CHUNK);
    }
    tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf)
}

/// Parses a complete response head off the front of `buf`: (head, framing, reusable), or
/// `None` when more bytes are needed.
pub(super) fn parse_head(buf: &mut BytesMut) -> Result<Option<(Head, Framing, bool)>, H1Error> {
    let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut parsed,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(err) => return Err(H1Error::invalid(err)),
    };
    let status = http::StatusCode::from_u16(parsed.code.unwrap_or(0)).map_err(H1Error::invalid)?;
    let http11 = parsed.version == Some(1);
    let fields = FramingFields::read(parsed.headers).map_err(|e| match e {
        FieldError::BadLength => H1Error::invalid("bad content-length"),
        FieldError::ConflictingLength => H1Error::invalid("conflicting content-length fields"),
    })?;
    // Chunked must be the last coding; anything else is read until close. HTTP/1.0 keeps
    // the connection only when asked to.
    let chunked = fields.chunked == Some(true);
    let mut close = fields.close || fields.other_coding || (!http11 && !fields.keep_alive);
    let length = fields.length;
    let framing = if status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED
    {
        Framing::Done
    } else if chunked {
        Framing::Chunked(Chunk::Size)
    } else if let Some(n) = length {
        if n == 0 {
            Framing::Done
        } else {
            Framing::Length(n)
        }
    } else {
        close = true;
        Framing::UntilClose
    };
    let mut fields = Spans::new();
    spans(buf, parsed.headers, &mut fields);
    let head = buf.split_to(len).freeze();
    let head = Head {
        status,
        headers: Headers::Raw {
            head,
            spans: fields,
        },
    };
    Ok(Some((head, framing, !close)))
}
