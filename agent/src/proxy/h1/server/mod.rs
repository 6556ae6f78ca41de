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
//! Requests are checked before anything is forwarded: a malformed head is 400, a head over
//! [`MAX_HEAD`] bytes or [`MAX_HEADERS`] fields is 431, `content-length` together with
//! `transfer-encoding` (request smuggling) or a coding other than chunked is 400, a body over
//! the handler's limit is 413 (read no further; the connection closes), a head not complete
//! within [`Handler::read_timeout`] of its first byte, or a body stalled that long, is 408.
//! Every error is an OpenAI error body. `Expect: 100-continue` is answered before the body is
//! read. Pipelined requests are answered in order.

use std::{future::Future, io, net::IpAddr, task::Poll};

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpStream,
        tcp::{ReadHalf, WriteHalf},
    },
};

mod sniff;
mod write;

pub use sniff::{Rewind, Sniffed, sniff};
use write::{status_line, write_response};

use super::{Decoded, Framing, MAX_HEAD, MAX_HEADERS};
use crate::headers::{Headers, Spans};
use crate::proxy::ProxyError;
use crate::proxy::message::{Answer, RequestHead};

/// Read buffer growth step.
const READ_CHUNK: usize = 8 * 1024;
/// A request head that has started must be complete within this, and a body that stops
/// arriving for this long is given up (408): slow-request attacks hold no connection longer.
pub const DEFAULT_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the rest of a refused request is read (and dropped) before the connection
/// closes.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// What answers requests.
pub trait Handler: Send + Sync + 'static {
    /// Largest request body accepted (413 beyond).
    fn max_body(&self) -> usize;

    /// How long a started request head, or a stalled body, is waited for.
    fn read_timeout(&self) -> std::time::Duration {
        DEFAULT_READ_TIMEOUT
    }

    /// Answers one request. `body` is the whole request body, or the error to answer when it
    /// could not be read (too large, malformed framing).
    fn call<'a>(
        &'a self,
        peer: IpAddr,
        head: &'a RequestHead,
        body: Result<Bytes, ProxyError>,
    ) -> impl Future<Output = Answer> + Send + 'a;
}

/// Serves HTTP/1.x on `stream` (whose first bytes are in `buf`) until the client closes, asks
/// to close, or breaks the protocol.
pub async fn serve<H: Handler>(
    mut stream: TcpStream,
    mut buf: BytesMut,
    peer: IpAddr,
    handler: &H,
) {
    if let Err(err) = connection(&mut stream, &mut buf, peer, handler).await {
        tracing::debug!(%err, "client connection ended");
    }
}

/// A parsed request head.
struct Head {
    parts: RequestHead,
    framing: Framing,
    keep_alive: bool,
    expect_continue: bool,
}

async fn connection<H: Handler>(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    peer: IpAddr,
    handler: &H,
) -> io::Result<()> {
    let (mut r, mut w) = stream.split();
    let mut out = Vec::with_capacity(4096);
    // Field spans of the request heads, one list reused (no allocation per request).
    let mut spans = Spans::new();
    loop {
        // Set when a head arrives in pieces: the rest must come within the read timeout.
        let mut head_started: Option<tokio::time::Instant> = None;
        let head = loop {
            match parse_request(buf, &mut spans) {
                Ok(Some(head)) => break head,
                Ok(None) if buf.len() >= MAX_HEAD => {
                    let err = ProxyError::new(
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        format!("The request head exceeds {MAX_HEAD} bytes."),
                    );
                    return reject(&mut r, &mut w, &mut out, err).await;
                }
                Ok(None) => {}
                Err(err) => return reject(&mut r, &mut w, &mut out, err).await,
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
                    let err = ProxyError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        format!(
                            "The request head did not arrive within {:?}.",
                            handler.read_timeout()
                        ),
                    );
                    return reject(&mut r, &mut w, &mut out, err).await;
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
async fn reject(
    r: &mut ReadHalf<'_>,
    w: &mut WriteHalf<'_>,
    out: &mut Vec<u8>,
    err: ProxyError,
) -> io::Result<()> {
    tracing::debug!(%err, "malformed request");
    let body = err.body();
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
async fn read_by(
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
async fn gone(r: &mut ReadHalf<'_>) {
    let mut b = [0u8; 1];
    match r.peek(&mut b).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

/// Parses a request head off the front of `buf` (`None`: incomplete).
/// `spans` is the connection's list for the head's field spans (taken when complete).
fn parse_request(buf: &mut BytesMut, spans: &mut Spans) -> Result<Option<Head>, ProxyError> {
    let bad = |m: &str| ProxyError::bad_request(format!("Malformed HTTP request: {m}."));
    let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(ProxyError::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!("The request has more than {MAX_HEADERS} header fields."),
            ));
        }
        Err(err) => return Err(bad(&err.to_string())),
    };
    let method = http::Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| bad("invalid method"))?;
    let http11 = req.version == Some(1);
    let mut length = None;
    let mut chunked = None;
    let mut close = false;
    let mut keep = false;
    let mut expect_continue = false;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = super::content_length(h.value).ok_or_else(|| bad("invalid content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(bad("conflicting content-length fields"));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = Some(super::ends_chunked(h.value));
        } else if h.name.eq_ignore_ascii_case("connection") {
            close |= super::lists(h.value, b"close");
            keep |= super::lists(h.value, b"keep-alive");
        } else if h.name.eq_ignore_ascii_case("expect") {
            expect_continue = http11 && super::lists(h.value, b"100-continue");
        }
    }
    let framing = match (chunked, length) {
        (Some(_), Some(_)) => return Err(bad("both content-length and transfer-encoding")),
        (Some(true), None) => Framing::Chunked(super::Chunk::Size),
        (Some(false), None) => return Err(bad("transfer-encoding other than chunked")),
        (None, Some(n)) if n > 0 => Framing::Length(n),
        (None, _) => Framing::Done,
    };
    let target_at = req.path.unwrap_or("/").as_ptr() as usize - buf.as_ptr() as usize;
    let target_len = req.path.unwrap_or("/").len();
    super::spans(buf, req.headers, spans);
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
async fn read_body(
    r: &mut ReadHalf<'_>,
    w: &mut WriteHalf<'_>,
    buf: &mut BytesMut,
    mut framing: Framing,
    expect_continue: bool,
    max: usize,
    timeout: std::time::Duration,
) -> io::Result<Result<Bytes, ProxyError>> {
    let too_large = || {
        Ok(Err(ProxyError::new(
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
                        return Ok(Err(ProxyError::new(
                            StatusCode::REQUEST_TIMEOUT,
                            format!("The request body stalled for {timeout:?}."),
                        )));
                    }
                }
            }
            Err(err) => {
                return Ok(Err(ProxyError::bad_request(format!(
                    "Malformed request body: {err}."
                ))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    use std::time::Duration;

    use http_body_util::{BodyExt, Full};
    use tokio::net::TcpListener;

    use super::*;

    /// Answers with the body's length; `/hang` never answers (and notes when it is dropped).
    struct Echo {
        started: Arc<AtomicBool>,
        dropped: Arc<AtomicBool>,
    }

    struct NoteDrop(Arc<AtomicBool>);
    impl Drop for NoteDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    impl Handler for Echo {
        fn max_body(&self) -> usize {
            1024
        }
        fn read_timeout(&self) -> Duration {
            Duration::from_millis(200)
        }
        fn call<'a>(
            &'a self,
            _peer: IpAddr,
            head: &'a RequestHead,
            body: Result<Bytes, ProxyError>,
        ) -> impl Future<Output = Answer> + Send + 'a {
            let note = NoteDrop(self.dropped.clone());
            let started = self.started.clone();
            async move {
                let body = match body {
                    Ok(b) => b,
                    Err(e) => return e.into_response().into(),
                };
                if head.path() == "/hang" {
                    let _note = note;
                    started.store(true, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                }
                let text = format!("{} bytes", body.len());
                http::Response::new(
                    Full::new(Bytes::from(text))
                        .map_err(|never| match never {})
                        .boxed_unsync(),
                )
                .into()
            }
        }
    }

    /// Waits (bounded) until `flag` is set.
    async fn until(flag: &AtomicBool, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !flag.load(Ordering::SeqCst) {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn start() -> (String, Arc<AtomicBool>, Arc<AtomicBool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (started, dropped) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let handler = Arc::new(Echo {
            started: started.clone(),
            dropped: dropped.clone(),
        });
        tokio::spawn(async move {
            loop {
                let (mut s, peer) = listener.accept().await.unwrap();
                let handler = handler.clone();
                tokio::spawn(async move {
                    let mut buf = BytesMut::new();
                    if let Ok(Sniffed::Http1) = sniff(&mut s, &mut buf).await {
                        serve(s, buf, peer.ip(), handler.as_ref()).await;
                    }
                });
            }
        });
        (addr, started, dropped)
    }

    async fn read_all(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn started_heads_and_stalled_bodies_time_out_idle_connections_do_not() {
        let (addr, _, _) = start().await;
        // Idle past the timeout, then a whole request: answered.
        let mut idle = TcpStream::connect(&addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        idle.write_all(b"POST / HTTP/1.1\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi")
            .await
            .unwrap();
        let got = read_all(&mut idle).await;
        assert!(
            got.starts_with("HTTP/1.1 200 OK") && got.ends_with("2 bytes"),
            "{got}"
        );
        // A head that stops half-way: 408.
        let mut slow = TcpStream::connect(&addr).await.unwrap();
        slow.write_all(b"POST / HTTP/1.1\r\ncontent-le")
            .await
            .unwrap();
        let got = read_all(&mut slow).await;
        assert!(got.starts_with("HTTP/1.1 408 "), "{got}");
        assert!(got.contains("did not arrive within"), "{got}");
        // A body that stops half-way: 408.
        let mut stalled = TcpStream::connect(&addr).await.unwrap();
        stalled
            .write_all(b"POST / HTTP/1.1\r\ncontent-length: 10\r\n\r\nhalf")
            .await
            .unwrap();
        let got = read_all(&mut stalled).await;
        assert!(got.starts_with("HTTP/1.1 408 "), "{got}");
        assert!(got.contains("stalled"), "{got}");
    }

    #[tokio::test]
    async fn a_client_that_goes_away_drops_its_request() {
        let (addr, started, dropped) = start().await;
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /hang HTTP/1.1\r\n\r\n").await.unwrap();
        // The handler is running (and hangs); the client leaves.
        until(&started, "the handler never started").await;
        assert!(!dropped.load(Ordering::SeqCst));
        drop(s);
        until(&dropped, "the handler was never dropped").await;
    }

    #[tokio::test]
    async fn chunked_bodies_over_the_limit_are_413_and_the_answer_is_readable() {
        let (addr, _, _) = start().await;
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let chunk = format!("{:x}\r\n{}\r\n", 600, "x".repeat(600));
        s.write_all(
            format!("POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n{chunk}{chunk}{chunk}")
                .as_bytes(),
        )
        .await
        .unwrap();
        let got = read_all(&mut s).await;
        assert!(got.starts_with("HTTP/1.1 413 "), "{got}");
        assert!(got.contains("connection: close"), "{got}");
    }
}
