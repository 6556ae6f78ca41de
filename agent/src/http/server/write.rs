//! Writing an answer: its head together with the first body bytes when they are ready at
//! once, then each frame as it arrives, delimited by `content-length` when the body's size is
//! known, else `chunked` (until close for HTTP/1.0 clients). The client connection is watched
//! while the body streams.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt as _;
use hyper::body::Body as _;
use tokio::{
    io::AsyncWriteExt,
    net::tcp::{ReadHalf, WriteHalf},
};

use super::gone;
use crate::http::{
    Body, BoxError,
    headers::{HopByHop, hop_by_hop, lists},
    message::Answer,
};

/// Body frames up to this size are copied next to their framing (one write); larger ones
/// are written from where they are.
const COPY_FRAME: usize = 16 * 1024;

/// How a response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delimit {
    None,
    Length(u64),
    Chunked,
    Close,
}

/// Writes a response; whether the connection can take another request.
pub(super) async fn write_response(
    r: &mut ReadHalf<'_>,
    w: &mut WriteHalf<'_>,
    out: &mut Vec<u8>,
    resp: Answer,
    head_only: bool,
    http11: bool,
    keep_alive: bool,
) -> io::Result<bool> {
    let Answer {
        status,
        headers,
        extra,
        mut body,
    } = resp;
    let delimit = if head_only
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Delimit::None
    } else if let Some(n) = body.size_hint().exact() {
        Delimit::Length(n)
    } else if http11 {
        Delimit::Chunked
    } else {
        Delimit::Close
    };
    let asked_close = headers.connection_lists("close")
        || extra
            .iter()
            .any(|(n, v)| n == http::header::CONNECTION && lists(v.as_bytes(), b"close"));
    let keep = keep_alive && !asked_close && delimit != Delimit::Close;
    status_line(out, status);
    // The engine's connection-scoped fields stay on its leg; the agent's own are its own.
    let hop = HopByHop::of(&headers);
    let engine = headers.iter().map(|(n, v)| (n, v, hop.named(n)));
    let fields = engine.chain(
        extra
            .iter()
            .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes(), false)),
    );
    for (name, value, named) in fields {
        // A HEAD answer keeps the length the body would have had.
        let framing_field = name.eq_ignore_ascii_case(b"content-length") && !head_only;
        if framing_field || named || hop_by_hop(name) {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    match delimit {
        Delimit::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Delimit::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Delimit::None | Delimit::Close => {}
    }
    if !keep {
        out.extend_from_slice(b"connection: close\r\n");
    } else if !http11 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if delimit == Delimit::None {
        w.write_all(out).await?;
        return Ok(keep);
    }
    let mut sent = 0u64;
    // The first frame without waiting: a ready answer goes out with its head in one write.
    let mut next = std::future::poll_fn(|cx| Poll::Ready(poll_now(&mut body, cx))).await;
    loop {
        let ended = match next {
            Some(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    sent += data.len() as u64;
                    if let Delimit::Length(n) = delimit
                        && sent > n
                    {
                        return Err(io::Error::other("response body longer than its length"));
                    }
                    frame_data(w, out, data, delimit).await?;
                }
                body.is_end_stream()
            }
            // Cut short: the client sees a truncated body, never a clean end.
            Some(Some(Err(err))) => return Err(io::Error::other(err)),
            Some(None) => true,
            None => false,
        };
        if ended {
            if let Delimit::Length(n) = delimit
                && sent != n
            {
                return Err(io::Error::other("response body shorter than its length"));
            }
            if delimit == Delimit::Chunked {
                out.extend_from_slice(b"0\r\n\r\n");
            }
            w.write_all(out).await?;
            return Ok(keep);
        }
        if !out.is_empty() {
            w.write_all(out).await?;
            out.clear();
        }
        next = tokio::select! {
            biased;
            frame = body.frame() => Some(frame),
            () = gone(r) => return Err(io::ErrorKind::ConnectionAborted.into()),
        };
    }
}

/// Starts `out` afresh with a response's status line.
pub(super) fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// One poll of the body: `None` when it is not ready yet.
#[allow(clippy::type_complexity)]
fn poll_now(
    body: &mut Body,
    cx: &mut Context<'_>,
) -> Option<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
    match Pin::new(body).poll_frame(cx) {
        Poll::Ready(frame) => Some(frame),
        Poll::Pending => None,
    }
}

/// Appends a data frame to `out` in the connection's delimiting (large frames are written
/// straight from their buffer).
async fn frame_data(
    w: &mut WriteHalf<'_>,
    out: &mut Vec<u8>,
    data: Bytes,
    delimit: Delimit,
) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let chunked = delimit == Delimit::Chunked;
    if chunked {
        put_hex(out, data.len());
        out.extend_from_slice(b"\r\n");
    }
    if data.len() <= COPY_FRAME {
        out.extend_from_slice(&data);
    } else {
        w.write_all(out).await?;
        out.clear();
        w.write_all(&data).await?;
    }
    if chunked {
        out.extend_from_slice(b"\r\n");
    }
    Ok(())
}

/// Appends `n` in lowercase hexadecimal (a chunk size).
fn put_hex(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_are_lowercase_hex() {
        for n in [0usize, 1, 15, 16, 255, 4096, 0xdead_beef, usize::MAX] {
            let mut out = Vec::new();
            put_hex(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap(), format!("{n:x}"));
        }
    }
}
