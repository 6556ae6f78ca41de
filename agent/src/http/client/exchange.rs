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
    framing::{Chunk, Coding, FieldError, Framing, FramingFields, spans},
    headers::{Headers, HopByHop, Spans, crlf_lines, hop_by_hop},
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
    let hop = HopByHop::of(req.headers);
    for (name, value) in req.headers.iter() {
        if forwarded(name) && !hop.named(name) {
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
/// leg), nor hop-by-hop fields. The fields a request's `connection` field names are hop-by-hop
/// too: see [`HopByHop`], which [`encode_request`] and [`forwarded_map`] also apply.
pub fn forwarded(name: &[u8]) -> bool {
    !(name.eq_ignore_ascii_case(b"host")
        || name.eq_ignore_ascii_case(b"content-length")
        || name.eq_ignore_ascii_case(b"expect")
        || hop_by_hop(name))
}

/// The client's request fields that go on to an engine, as an `http` map (for hyper's h2
/// client): [`forwarded`] ones, less those the request's `connection` field names.
pub fn forwarded_map(headers: &Headers) -> http::HeaderMap {
    let hop = HopByHop::of(headers);
    headers.to_map(|n| {
        let n = n.as_str().as_bytes();
        forwarded(n) && !hop.named(n)
    })
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
    if len > MAX_HEAD {
        return Err(H1Error::invalid(format!(
            "response head larger than {MAX_HEAD} bytes"
        )));
    }
    if !crlf_lines(&buf[..len]) {
        return Err(H1Error::invalid("a line of the head ends in a bare LF"));
    }
    let status = http::StatusCode::from_u16(parsed.code.unwrap_or(0)).map_err(H1Error::invalid)?;
    let http11 = parsed.version == Some(1);
    let fields = FramingFields::read(parsed.headers).map_err(|e| match e {
        FieldError::BadLength => H1Error::invalid("bad content-length"),
        FieldError::ConflictingLength => H1Error::invalid("conflicting content-length fields"),
    })?;
    // Framing that two readers could take two ways is an error, not a guess (RFC 9112 6.3
    // reads `transfer-encoding` over `content-length`, and a final coding other than
    // chunked until close, but calls such responses ones to handle as errors): the response
    // becomes a 502 and its connection is closed.
    let chunked = match fields.coding {
        None => false,
        Some(_) if !http11 => {
            return Err(H1Error::invalid(
                "transfer-encoding in an HTTP/1.0 response",
            ));
        }
        Some(_) if fields.length.is_some() => {
            return Err(H1Error::invalid(
                "both content-length and transfer-encoding",
            ));
        }
        Some(Coding::Chunked) => true,
        Some(Coding::Unsupported | Coding::NotChunked) => {
            return Err(H1Error::invalid(
                "a transfer coding other than chunked alone",
            ));
        }
    };
    // HTTP/1.0 keeps the connection only when asked to.
    let mut close = fields.close || (!http11 && !fields.keep_alive);
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
