//! The server leg: warmpath's HTTP/1.1 to applications.
//!
//! One task per client connection reads a request head and body, hands them to the
//! [`Handler`], and writes the response back: the head together with the first body bytes
//! when they are ready at once (one write for a whole non-streaming answer), then each frame
//! as it arrives (`content-length` when the body's size is known, else `chunked`; until close
//! for HTTP/1.0 clients). While the handler works and while the body streams, the connection
//! is watched: a client that goes away drops the handler's future and the body, and with them
//! the engine connection (the engine aborts the request).
//!
//! Requests are checked before anything is forwarded (the rules are in [`read`]): a
//! malformed head is 400, a head over [`MAX_HEAD`] bytes or [`MAX_HEADERS`] fields is 431,
//! framing that could be read two ways (`content-length` with `transfer-encoding`, a bare LF,
//! a final coding other than chunked, ...) is 400, codings before `chunked` are 501, a body
//! over the handler's limit is 413 (read no further; the connection closes), a head not
//! complete within [`Handler::read_timeout`] of its first byte (however it trickles in), or
//! a body stalled that long, is 408.
//! Every refusal is answered with the handler's body for it ([`Handler::refusal_body`]).
//! `Expect: 100-continue` is answered before the body is read. Pipelined requests are answered in order.

use std::{future::Future, io, task::Poll};

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpStream,
        tcp::{ReadHalf, WriteHalf},
    },
};

mod read;
mod sniff;
mod write;

use read::{Head, parse_request, read_body};
pub use sniff::{Rewind, Sniffed, sniff};
use write::{status_line, write_response};

use super::{
    MAX_HEAD,
    headers::{Headers, Spans},
    message::{Answer, Refusal, RequestHead},
};

/// Read buffer growth step.
pub(super) const READ_CHUNK: usize = 8 * 1024;
/// A request head that has started must be complete within this, and a body that stops
/// arriving for this long is given up (408): slow-request attacks hold no connection longer.
pub const DEFAULT_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the rest of a refused request is read (and dropped) before the connection
/// closes.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// What answers requests.
pub trait Handler: Send + Sync + 'static {
    /// What the handler knows of the client of a connection (its address, and whatever the
    /// accepting side learned), handed to every request on it.
    type Peer: Copy + Send + Sync + 'static;

    /// Largest request body accepted (413 beyond).
    fn max_body(&self) -> usize;

    /// How long a started request head, or a stalled body, is waited for.
    fn read_timeout(&self) -> std::time::Duration {
        DEFAULT_READ_TIMEOUT
    }

    /// Answers one request. `body` is the whole request body, or the refusal to answer when
    /// it could not be read (too large, malformed framing).
    fn call<'a>(
        &'a self,
        peer: Self::Peer,
        head: &'a RequestHead,
        body: Result<Bytes, Refusal>,
    ) -> impl Future<Output = Answer> + Send + 'a;

    /// The `application/json` body answering a request whose head could not be read (the
    /// server writes the status line and closes).
    fn refusal_body(&self, refusal: &Refusal) -> Bytes;
}

/// Serves HTTP/1.x on `stream` (whose first bytes are in `buf`) until the client closes, asks
/// to close, or breaks the protocol.
pub async fn serve<H: Handler>(
    mut stream: TcpStream,
    mut buf: BytesMut,
    peer: H::Peer,
    handler: &H,
) {
    if let Err(err) = connection(&mut stream, &mut buf, peer, handler).await {
        tracing::debug!(%err, "client connection ended");
    }
}

async fn connection<H: Handler>(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    peer: H::Peer,
    handler: &H,
) -> io::Result<()> {
    let (mut r, mut w) = stream.split();
    let mut out = Vec::with_capacity(4096);
    // Field spans of the request heads, one list reused (no allocation per request).
    let mut spans = Spans::new();
    loop {
        // Set when a head arrives in pieces: the rest must come within the read timeout.
        let mut head_started: Option<tokio::time::Instant> = None;
        // Bytes of the buffer parsed already without a complete head. The head is parsed
        // again only once a line has ended since: one parse per line, not per read, of a
        // head sent a byte at a time.
        let mut scanned = 0;
        let head = loop {
            let parsed = if memchr::memchr(b'\n', &buf[scanned..]).is_some() {
                scanned = buf.len();
                parse_request(buf, &mut spans)
            } else {
                Ok(None)
            };
            match parsed {
                Ok(Some(head)) => break head,
                Ok(None) if buf.len() >= MAX_HEAD => {
                    let err = Refusal::new(
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        format!("The request head exceeds {MAX_HEAD} bytes."),
                    );
                    return reject(&mut r, &mut w, &mut out, handler, err).await;
                }
                Ok(None) => {}
                Err(err) => return reject(&mut r, &mut w, &mut out, handler, err).await,
            }
            // An idle keep-alive connection waits without a timer; a started head does not.
            let deadline = (!buf.is_empty()).then(|| {
                *head_started.get_or_insert_with(tokio::time::Instant::now) + handler.read_timeout()
            });
            match read_by(&mut r, buf, deadline).await? {
                // Between requests: a normal close. Inside a head: nothing to answer.
                Some(0) => return Ok(()),
                Some(_) => {}
                None => {
                    let err = Refusal::new(
                        StatusCode::REQUEST_TIMEOUT,
                        format!(
                            "The request head did not arrive within {:?}.",
                            handler.read_timeout()
                        ),
                    );
                    return reject(&mut r, &mut w, &mut out, handler, err).await;
                }
            }
        };
        let Head {
            parts,
            framing,
            mut keep_alive,
            expect_continue,
        } = head;
        let http11 = parts.version == http::Version::HTTP_11;
        let head_only = parts.method == http::Method::HEAD;
        let body = read_body(
            &mut r,
            &mut w,
            buf,
            framing,
            expect_continue,
            handler.max_body(),
            handler.read_timeout(),
        )
        .await?;
        // The rest of a refused body was never read: the connection cannot go on.
        let unread = body.is_err();
        keep_alive &= !unread;
        let resp = {
            // Pinned where it is built: the handler's future is large, and `select!` would
            // copy it twice per request.
            let mut call = std::pin::pin!(handler.call(peer, &parts, body));
            let mut gone = std::pin::pin!(gone(&mut r));
            std::future::poll_fn(|cx| match call.as_mut().poll(cx) {
                Poll::Ready(resp) => Poll::Ready(Some(resp)),
                Poll::Pending => gone.as_mut().poll(cx).map(|()| None),
            })
            .await
        };
        let Some(resp) = resp else {
            return Ok(());
        };
        let keep = write_response(
            &mut r, &mut w, &mut out, resp, head_only, http11, keep_alive,
        )
        .await?;
        if let Headers::Raw { spans: used, .. } = parts.headers {
            spans = used;
        }
        if !keep {
            let _ = w.shutdown().await;
            if unread {
                linger(&mut r).await;
            }
            return Ok(());
        }
    }
}

/// Answers a request that could not be read, and closes.
async fn reject<H: Handler>(
    r: &mut ReadHalf<'_>,
    w: &mut WriteHalf<'_>,
    out: &mut Vec<u8>,
    handler: &H,
    err: Refusal,
) -> io::Result<()> {
    tracing::debug!(%err, "malformed request");
    let body = handler.refusal_body(&err);
    status_line(out, err.status);
    out.extend_from_slice(
        b"content-type: application/json\r\nconnection: close\r\ncontent-length: ",
    );
    out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(&body);
    w.write_all(out).await?;
    w.shutdown().await?;
    linger(r).await;
    Ok(())
}

/// After answering a request whose input was not all read, and closing the sending side:
/// reads and drops what the client still sends, for up to [`LINGER`], so it can finish
/// writing and read the answer (closing at once would reset the connection under it).
async fn linger(r: &mut ReadHalf<'_>) {
    // On the heap: an array here would sit in every connection's future.
    let mut scratch = vec![0u8; 8192];
    let drain = async {
        while let Ok(n) = r.read(&mut scratch).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Reads more into `buf`: the bytes read (0: closed), or `None` when `deadline` passed first.
pub(super) async fn read_by(
    r: &mut ReadHalf<'_>,
    buf: &mut BytesMut,
    deadline: Option<tokio::time::Instant>,
) -> io::Result<Option<usize>> {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    match deadline {
        None => r.read_buf(buf).await.map(Some),
        Some(at) => match tokio::time::timeout_at(at, r.read_buf(buf)).await {
            Ok(n) => n.map(Some),
            Err(_) => Ok(None),
        },
    }
}

/// Resolves when the client closes (or resets) the connection. Bytes of a pipelined request
/// are left for later: the connection is then alive.
pub(super) async fn gone(r: &mut ReadHalf<'_>) {
    let mut b = [0u8; 1];
    match r.peek(&mut b).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
