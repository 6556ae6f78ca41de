//! The client leg: warmpath's HTTP/1.1 to engines.
//!
//! A request is written and its response head read on the task that routes it. The response
//! body ([`H1Body`]) owns the connection and decodes its framing as it is polled; when the
//! body has been read to its end the connection goes back to the endpoint's idle list, and
//! when the body is dropped early the connection is closed (the engine sees the client go
//! away and aborts).
//!
//! Settings: at most [`MAX_IDLE_PER_ENDPOINT`] idle connections per endpoint, each kept
//! [`IDLE_TIMEOUT`]. A request that fails on a reused connection before any response byte
//! arrived is sent once more on a fresh connection (the engine closed the idle one; it never
//! saw the request).

use std::{
    collections::HashMap,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use hyper::body::Frame;
use parking_lot::Mutex;
use tokio::{io::AsyncWriteExt, net::TcpStream};

use super::{Decoded, Framing, FramingError, MAX_HEAD, MAX_HEADERS};
use crate::headers::{Headers, hop_by_hop};
use crate::proxy::workers::MAX_WORKERS;

/// Idle connections kept per endpoint (more are closed when they come back).
pub const MAX_IDLE_PER_ENDPOINT: usize = 1024;
/// Idle connections older than this are closed instead of reused.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Bodies up to this size are written together with the head (one write).
const COALESCE_BODY: usize = 32 * 1024;
/// Largest request buffer an idle connection keeps for its next request.
const MAX_KEPT_WIRE: usize = 64 * 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 16 * 1024;

/// Why an exchange with an engine failed.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    #[error("connect: {0}")]
    Connect(io::Error),
    #[error("connect: timed out after {0:?}")]
    ConnectTimeout(Duration),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("sending the request: {0}")]
    Write(io::Error),
    #[error("connection reset before any response byte: {0}")]
    ResetBeforeHead(io::Error),
    #[error("connection closed before the response head")]
    ClosedBeforeHead,
    #[error("connection closed before the body ended")]
    ClosedInBody,
    #[error("invalid response: {0}")]
    Invalid(String),
}

impl From<FramingError> for H1Error {
    fn from(err: FramingError) -> Self {
        Self::Invalid(err.to_string())
    }
}

impl H1Error {
    fn invalid(what: impl std::fmt::Display) -> Self {
        Self::Invalid(what.to_string())
    }
}

/// One connection and what has been read from it but not consumed yet.
#[derive(Debug)]
struct Conn {
    io: TcpStream,
    buf: BytesMut,
    /// The next request's bytes (kept, emptied, between requests: no allocation per request).
    wire: Vec<u8>,
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    /// Checked in at (coarse clock).
    since: Duration,
}

#[derive(Debug)]
struct Shared {
    /// Idle connections by the worker they are registered with: shard 0 for any runtime
    /// but the data-path workers', shard 1 + i for worker i (see [`set_worker`]). A
    /// connection is only used on the runtime whose poller it is registered with.
    idle: Box<[Mutex<IdleLists>]>,
    connect_timeout: Duration,
    idle_timeout: Duration,
}

/// Idle connections per endpoint, most recently used last.
#[derive(Debug)]
struct IdleLists {
    by_endpoint: HashMap<Arc<str>, Vec<Idle>, foldhash::fast::RandomState>,
    /// When expired connections (and the lists of endpoints that went away) were last dropped.
    swept: Duration,
}

/// The client: idle connections per endpoint authority (`host:port`).
#[derive(Debug, Clone)]
pub struct H1Client {
    shared: Arc<Shared>,
}

/// What is sent: the client's request line target and headers, forwarded as they are except
/// `host`, `content-length`, `expect` and hop-by-hop fields (this leg's own framing replaces
/// them; the client's `expect` was answered by the server leg).
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub method: &'a http::Method,
    pub target: &'a str,
    pub headers: &'a Headers,
    pub body: &'a Bytes,
}

// === impl H1Client ===

impl H1Client {
    /// A client with the default idle timeout ([`IDLE_TIMEOUT`]).
    pub fn new(connect_timeout: Duration) -> Self {
        Self::with_idle_timeout(connect_timeout, IDLE_TIMEOUT)
    }

    pub fn with_idle_timeout(connect_timeout: Duration, idle_timeout: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                idle: (0..=MAX_WORKERS)
                    .map(|_| {
                        Mutex::new(IdleLists {
                            by_endpoint: HashMap::default(),
                            swept: coarse_now(),
                        })
                    })
                    .collect(),
                connect_timeout,
                idle_timeout,
            }),
        }
    }

    /// Sends `req` to `authority` and reads the response head; the body streams from the
    /// returned response.
    pub async fn send(
        &self,
        authority: &Arc<str>,
        req: Outgoing<'_>,
    ) -> Result<H1Response, H1Error> {
        if let Some(conn) = self.checkout(authority) {
            match exchange(conn, authority, req).await {
                Ok(parts) => return Ok(self.response(authority, req.method, parts)),
                // The engine had closed the idle connection: nothing came back, so it never
                // ran this request.
                Err(
                    H1Error::Write(_) | H1Error::ResetBeforeHead(_) | H1Error::ClosedBeforeHead,
                ) => {}
                Err(err) => return Err(err),
            }
        }
        let conn = self.connect(authority).await?;
        let parts = exchange(conn, authority, req).await?;
        Ok(self.response(authority, req.method, parts))
    }

    /// Idle connections held now (all endpoints).
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.shared
            .idle
            .iter()
            .map(|shard| {
                shard
                    .lock()
                    .by_endpoint
                    .values()
                    .map(Vec::len)
                    .sum::<usize>()
            })
            .sum()
    }

    /// The endpoint's most recently used idle connection, if one is young enough.
    fn checkout(&self, authority: &str) -> Option<Conn> {
        let mut idle = self.shared.shard().lock();
        let list = idle.by_endpoint.get_mut(authority)?;
        let c = list.pop()?;
        if coarse_now().saturating_sub(c.since) < self.shared.idle_timeout {
            return Some(c.conn);
        }
        // The newest is too old: so are the others.
        list.clear();
        None
    }

    async fn connect(&self, authority: &str) -> Result<Conn, H1Error> {
        let timeout = self.shared.connect_timeout;
        let io = match tokio::time::timeout(timeout, TcpStream::connect(authority)).await {
            Ok(Ok(io)) => io,
            Ok(Err(err)) => return Err(H1Error::Connect(err)),
            Err(_) => return Err(H1Error::ConnectTimeout(timeout)),
        };
        let _ = io.set_nodelay(true);
        Ok(Conn {
            io,
            buf: BytesMut::with_capacity(READ_CHUNK),
            wire: Vec::new(),
        })
    }

    fn response(
        &self,
        authority: &Arc<str>,
        method: &http::Method,
        (head, conn, framing, reusable): Exchanged,
    ) -> H1Response {
        let framing = if method == http::Method::HEAD {
            Framing::Done
        } else {
            framing
        };
        let mut body = H1Body {
            conn: Some(conn),
            framing,
            home: reusable.then(|| (self.shared.clone(), authority.clone())),
        };
        if body.framing.is_done() {
            body.finish();
        }
        H1Response {
            status: head.status,
            headers: head.headers,
            body,
        }
    }
}

impl Shared {
    /// This thread's idle lists.
    fn shard(&self) -> &Mutex<IdleLists> {
        &self.idle[WORKER.get().map_or(0, |i| i + 1)]
    }

    /// A connection whose response was read to its end comes back for the next request.
    /// Every third of the idle timeout, a check-in also drops this thread's expired
    /// connections to every endpoint, so the connections of endpoints no longer used do not
    /// stay open.
    fn checkin(&self, authority: &Arc<str>, conn: Conn) {
        let now = coarse_now();
        let mut idle = self.shard().lock();
        if now.saturating_sub(idle.swept) >= self.idle_timeout / 3 {
            idle.swept = now;
            let timeout = self.idle_timeout;
            idle.by_endpoint.retain(|_, list| {
                list.retain(|c| now.saturating_sub(c.since) < timeout);
                !list.is_empty()
            });
        }
        let entry = Idle { conn, since: now };
        match idle.by_endpoint.get_mut(authority) {
            Some(list) if list.len() < MAX_IDLE_PER_ENDPOINT => list.push(entry),
            Some(_) => {}
            None => {
                idle.by_endpoint.insert(authority.clone(), vec![entry]);
            }
        }
    }
}

thread_local! {
    /// The data-path worker this thread is, if it is one.
    static WORKER: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Marks this thread as data-path worker `i` (< [`MAX_WORKERS`]): its engine connections
/// are pooled apart from every other thread's.
pub fn set_worker(i: usize) {
    WORKER.set(Some(i.min(MAX_WORKERS - 1)));
}

/// The monotonic clock at tick resolution (a few milliseconds): ample for idle ages, and
/// without the timestamp-counter read of a precise clock on every check-out and check-in.
fn coarse_now() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .map(Duration::from)
        .unwrap_or_default()
}

/// The request head (and a small body) as bytes on the wire.
fn encode_request(authority: &str, req: &Outgoing<'_>, out: &mut Vec<u8>) {
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
type Exchanged = (Head, Conn, Framing, bool);

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
struct Head {
    status: http::StatusCode,
    headers: Headers,
}

/// An engine's response: its head, and its body to stream.
#[derive(Debug)]
pub struct H1Response {
    pub status: http::StatusCode,
    pub headers: Headers,
    pub body: H1Body,
}

/// Writes the request and reads the response head (skipping interim 1xx heads).
async fn exchange(
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

fn poll_read_more(conn: &mut Conn, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
    if conn.buf.capacity() - conn.buf.len() < READ_CHUNK / 4 {
        conn.buf.reserve(READ_CHUNK);
    }
    tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf)
}

/// Parses a complete response head off the front of `buf`: (head, framing, reusable), or
/// `None` when more bytes are needed.
fn parse_head(buf: &mut BytesMut) -> Result<Option<(Head, Framing, bool)>, H1Error> {
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
    let mut length = None;
    let mut chunked = false;
    let mut close = !http11;
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = super::content_length(h.value)
                .ok_or_else(|| H1Error::invalid("bad content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(H1Error::invalid("conflicting content-length fields"));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked must be the last coding; anything else is read until close.
            chunked = super::ends_chunked(h.value);
            close |= !chunked;
        } else if h.name.eq_ignore_ascii_case("connection") {
            if super::lists(h.value, b"close") {
                close = true;
            } else if !http11 && super::lists(h.value, b"keep-alive") {
                close = false;
            }
        }
    }
    let framing = if status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED
    {
        Framing::Done
    } else if chunked {
        Framing::Chunked(super::Chunk::Size)
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
    let mut spans = crate::headers::Spans::new();
    super::spans(buf, parsed.headers, &mut spans);
    let head = buf.split_to(len).freeze();
    let head = Head {
        status,
        headers: Headers::Raw { head, spans },
    };
    Ok(Some((head, framing, !close)))
}

/// A response body read straight off the engine's connection.
#[derive(Debug)]
pub struct H1Body {
    conn: Option<Conn>,
    framing: Framing,
    /// Where the connection goes back when the body ended cleanly (absent: not reusable).
    home: Option<(Arc<Shared>, Arc<str>)>,
}

// === impl H1Body ===

impl H1Body {
    /// The body ended: the connection goes home if it can be reused.
    fn finish(&mut self) {
        self.framing = Framing::Done;
        if let (Some(conn), Some((shared, authority))) = (self.conn.take(), self.home.take())
            // Bytes past the response mean the engine is confused: do not reuse.
            && conn.buf.is_empty()
        {
            shared.checkin(&authority, conn);
        }
    }

    /// The body cannot go on: the connection is closed, the error reported once.
    fn fail(&mut self, err: H1Error) -> H1Error {
        self.conn = None;
        self.home = None;
        self.framing = Framing::Done;
        err
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, H1Error>>> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match self.framing.decode(&mut conn.buf) {
                Ok(Decoded::Data(data)) => {
                    if self.framing.is_done() {
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(data)));
                }
                Ok(Decoded::End) => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => {}
                Err(err) => return Poll::Ready(Some(Err(self.fail(err.into())))),
            }
            match std::task::ready!(poll_read_more(conn, cx)) {
                Ok(0) => match self.framing.at_eof() {
                    Ok(()) => {
                        // Until-close bodies: the connection is spent.
                        self.conn = None;
                        return Poll::Ready(None);
                    }
                    Err(_) => return Poll::Ready(Some(Err(self.fail(H1Error::ClosedInBody)))),
                },
                Ok(_) => {}
                Err(err) => return Poll::Ready(Some(Err(self.fail(err.into())))),
            }
        }
    }
}

impl hyper::body::Body for H1Body {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        self.get_mut()
            .poll_data(cx)
            .map(|d| d.map(|d| d.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.framing.is_done()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.framing.remaining() {
            Some(n) => hyper::body::SizeHint::with_exact(n),
            None => hyper::body::SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A one-connection server that answers each request with the next canned response
    /// (raw bytes, written in pieces to exercise partial reads), then closes.
    async fn server(
        responses: Vec<Vec<&'static [u8]>>,
    ) -> (Arc<str>, tokio::task::JoinHandle<Vec<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: Arc<str> = listener.local_addr().unwrap().to_string().into();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for pieces in responses {
                let mut req = Vec::new();
                let mut b = [0u8; 4096];
                while memchr::memmem::find(&req, b"\r\n\r\n").is_none() {
                    let n = s.read(&mut b).await.unwrap();
                    assert!(n > 0);
                    req.extend_from_slice(&b[..n]);
                }
                seen.push(req);
                for p in pieces {
                    s.write_all(p).await.unwrap();
                    s.flush().await.unwrap();
                    tokio::task::yield_now().await;
                }
            }
            seen
        });
        (addr, task)
    }

    async fn get(client: &H1Client, addr: &Arc<str>) -> Result<(u16, Vec<u8>), H1Error> {
        let headers = Headers::default();
        let body = Bytes::new();
        let resp = client
            .send(
                addr,
                Outgoing {
                    method: &http::Method::GET,
                    target: "/x",
                    headers: &headers,
                    body: &body,
                },
            )
            .await?;
        let status = resp.status.as_u16();
        let data = resp.body.collect().await?.to_bytes();
        Ok((status, data.to_vec()))
    }

    #[tokio::test]
    async fn every_framing_decodes_and_the_connection_is_reused() {
        let (addr, server) = server(vec![
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel", b"lo"],
            vec![
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=y\r\nabc\r",
                b"\n0\r\ntrailer: t\r\n\r\n",
            ],
            vec![b"HTTP/1.1 204 No Content\r\n\r\n"],
            vec![b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil", b" close"],
        ])
        .await;
        let client = H1Client::new(Duration::from_secs(2));
        assert_eq!(get(&client, &addr).await.unwrap(), (200, b"hello".to_vec()));
        assert_eq!(client.idle(), 1);
        assert_eq!(get(&client, &addr).await.unwrap(), (200, b"abc".to_vec()));
        assert_eq!(get(&client, &addr).await.unwrap(), (204, vec![]));
        let last = tokio::spawn({
            let (client, addr) = (client.clone(), addr.clone());
            async move { get(&client, &addr).await }
        });
        let seen = server.await.unwrap();
        assert_eq!(last.await.unwrap().unwrap(), (200, b"until close".to_vec()));
        // Until-close bodies never come back.
        assert_eq!(client.idle(), 0);
        assert_eq!(seen.len(), 4);
        let first = String::from_utf8(seen[0].clone()).unwrap();
        assert!(
            first.starts_with("GET /x HTTP/1.1\r\nhost: 127.0.0.1:"),
            "{first}"
        );
        assert!(first.contains("content-length: 0\r\n"), "{first}");
    }

    #[tokio::test]
    async fn idle_connections_expire_and_gone_endpoints_lose_theirs() {
        let answer = &b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"[..];
        let (a, _server_a) = server(vec![vec![answer]]).await;
        let (b, _server_b) = server(vec![vec![answer]]).await;
        let client =
            H1Client::with_idle_timeout(Duration::from_secs(2), Duration::from_millis(100));
        assert_eq!(get(&client, &a).await.unwrap(), (200, b"ok".to_vec()));
        assert_eq!(client.idle(), 1);
        // Time passes (the expiry is measured in real time).
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(get(&client, &b).await.unwrap(), (200, b"ok".to_vec()));
        // Checking b's connection in swept a's expired one away.
        assert_eq!(client.idle(), 1);
        assert!(!client.shared.idle[0].lock().by_endpoint.contains_key(&*a));
    }

    #[tokio::test]
    async fn a_stale_idle_connection_is_replaced_and_bad_heads_are_errors() {
        // The first connection answers once and closes: the second request finds it dead,
        // and goes out again on a fresh connection (accepted by the same listener).
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: Arc<str> = listener.local_addr().unwrap().to_string().into();
        tokio::spawn(async move {
            for answer in [
                &b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na"[..],
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nb",
                b"HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n",
                b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            ] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut b = [0u8; 4096];
                let _ = s.read(&mut b).await.unwrap();
                s.write_all(answer).await.unwrap();
            }
        });
        let client = H1Client::new(Duration::from_secs(2));
        assert_eq!(get(&client, &addr).await.unwrap(), (200, b"a".to_vec()));
        assert_eq!(get(&client, &addr).await.unwrap(), (200, b"b".to_vec()));
        assert!(matches!(
            get(&client, &addr).await,
            Err(H1Error::Invalid(_))
        ));
        assert!(matches!(
            get(&client, &addr).await,
            Err(H1Error::ClosedInBody)
        ));
        assert!(matches!(
            get(&client, &addr).await,
            Err(H1Error::Invalid(_))
        ));
    }
}
