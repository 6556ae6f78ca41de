//! HTTP/1.1 at the byte level, for conformance tests: a fake engine on raw TCP that records
//! the exact bytes of every request it is sent and answers with scripted bytes, the agent
//! started in front of it from `warmpath agent` flags, and a reader of responses off a raw
//! client socket.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use parking_lot::Mutex;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use warmpath_agent::agent::Routing;

/// Longest wait for any one step (a response, a connection to close).
pub const STEP: Duration = Duration::from_secs(10);
/// Largest request or response a test reads (the fake engine, the client reader).
const MAX_MESSAGE: usize = 1 << 20;

/// A scripted engine answer: its bytes, and whether the engine closes the connection after
/// writing them.
#[derive(Debug, Clone)]
pub struct Scripted {
    pub bytes: Vec<u8>,
    pub close: bool,
}

/// An engine on raw TCP. Requests to `/v1/...` are recorded byte for byte and answered with
/// the next scripted answer (or the default one); side requests (`/metrics`, `/v1/models`
/// scrapes) get a 404 and are not recorded.
#[derive(Debug)]
pub struct FakeEngine {
    pub addr: std::net::SocketAddr,
    state: Arc<Mutex<EngineState>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct EngineState {
    seen: Vec<Vec<u8>>,
    script: VecDeque<Scripted>,
    default: Scripted,
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeEngine {
    /// Starts the engine; `default` answers every recorded request no script is left for.
    pub async fn start(default: Scripted) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind on loopback");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let state = Arc::new(Mutex::new(EngineState {
            seen: Vec::new(),
            script: VecDeque::new(),
            default,
        }));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(engine_connection(conn, shared.clone()));
            }
        });
        Self { addr, state, task }
    }

    /// The answers to the next recorded requests, in order.
    pub fn script(&self, answers: impl IntoIterator<Item = Scripted>) {
        self.state.lock().script = answers.into_iter().collect();
    }

    /// The requests recorded since the last call, oldest first (emptied).
    pub fn take_seen(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.state.lock().seen)
    }
}

/// One engine connection: reads requests (the agent always frames them by
/// `content-length`), records and answers them, until the agent closes or a script says to.
async fn engine_connection(mut conn: TcpStream, state: Arc<Mutex<EngineState>>) {
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_request(&mut conn, &mut buf).await else {
            return;
        };
        let side = !request.starts_with(b"POST /v1/");
        let answer = if side {
            Scripted {
                bytes: b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
                close: false,
            }
        } else {
            let mut s = state.lock();
            s.seen.push(request);
            s.script.pop_front().unwrap_or_else(|| s.default.clone())
        };
        if conn.write_all(&answer.bytes).await.is_err() || answer.close {
            return;
        }
    }
}

/// The next whole request (head and `content-length` body) off `conn`; `None` at a close, an
/// error, or a request this reader cannot frame.
async fn read_request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let length = header(head, "content-length").map_or(Some(0), |v| v.parse().ok())?;
            let total = end + 4 + length;
            if buf.len() >= total {
                return Some(buf.drain(..total).collect());
            }
        }
        if buf.len() > MAX_MESSAGE || read_some(conn, buf).await? == 0 {
            return None;
        }
    }
}

async fn read_some(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    let mut chunk = [0u8; 8192];
    let n = conn.read(&mut chunk).await.ok()?;
    buf.extend_from_slice(&chunk[..n]);
    Some(n)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The first value of field `name` (any case) in a head's text.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Starts the agent (ports 0, one worker) in front of `engine` alone, plus `extra` flags.
pub async fn agent_for(engine: &FakeEngine, extra: &[&str]) -> Routing {
    let mut flags: Vec<String> = ["--workers", "1", "--endpoint"].map(String::from).to_vec();
    flags.push(format!("http://{}", engine.addr));
    flags.extend(extra.iter().map(|s| s.to_string()));
    crate::agent::start(flags).await
}

/// A response as a client read it off the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status line, without its CRLF.
    pub status_line: String,
    /// The fields, as (lowercased name, value), in order.
    pub fields: Vec<(String, String)>,
    /// The body, its chunked framing (if any) removed.
    pub body: Vec<u8>,
}

impl Response {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads responses off a client connection, keeping what it read past each one.
#[derive(Debug)]
pub struct ResponseReader {
    buf: Vec<u8>,
}

impl Default for ResponseReader {
    fn default() -> Self {
        Self::new()
    }
}

impl ResponseReader {
    pub fn new() -> Self {
        Self { buf: Vec::new() }
    }

    /// The next response (`head_only`: the answer to a HEAD request), or `None` when the
    /// connection closed cleanly before any byte of one. Panics on a malformed response or
    /// a step over [`STEP`].
    pub async fn next(&mut self, conn: &mut TcpStream, head_only: bool) -> Option<Response> {
        let end = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break end;
            }
            if self.fill(conn).await == 0 {
                assert!(
                    self.buf.is_empty(),
                    "closed inside a response head: {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
                return None;
            }
        };
        let head = String::from_utf8(self.buf[..end].to_vec()).expect("an ASCII head");
        self.buf.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default().to_string();
        let fields: Vec<(String, String)> = lines
            .map(|l| {
                let (n, v) = l.split_once(':').expect("a field line has a colon");
                (n.to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        let mut resp = Response {
            status_line,
            fields,
            body: Vec::new(),
        };
        let code = resp.status_line.get(9..12).unwrap_or_default();
        if head_only || code.starts_with('1') || code == "204" || code == "304" {
            return Some(resp);
        }
        if resp.field("transfer-encoding") == Some("chunked") {
            resp.body = self.chunked(conn).await;
        } else if let Some(n) = resp.field("content-length") {
            let n: usize = n.parse().expect("a numeric content-length");
            while self.buf.len() < n {
                assert!(self.fill(conn).await > 0, "closed inside a body");
            }
            resp.body = self.buf.drain(..n).collect();
        } else {
            while self.fill(conn).await > 0 {}
            resp.body = std::mem::take(&mut self.buf);
        }
        Some(resp)
    }

    /// Whether the connection closes (EOF) with nothing more to read.
    pub async fn closes(&mut self, conn: &mut TcpStream) -> bool {
        self.buf.is_empty() && self.fill(conn).await == 0
    }

    async fn chunked(&mut self, conn: &mut TcpStream) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let line = self.line(conn).await;
            let size = usize::from_str_radix(line.split(';').next().unwrap_or(""), 16)
                .expect("a hex chunk size");
            if size == 0 {
                while !self.line(conn).await.is_empty() {}
                return body;
            }
            while self.buf.len() < size + 2 {
                assert!(self.fill(conn).await > 0, "closed inside a chunk");
            }
            body.extend(self.buf.drain(..size));
            assert_eq!(self.buf.drain(..2).collect::<Vec<_>>(), b"\r\n");
        }
    }

    async fn line(&mut self, conn: &mut TcpStream) -> String {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return line;
            }
            assert!(self.fill(conn).await > 0, "closed inside a chunk line");
        }
    }

    /// Reads more (0: closed; a reset counts as a close).
    async fn fill(&mut self, conn: &mut TcpStream) -> usize {
        assert!(self.buf.len() <= MAX_MESSAGE, "response too large");
        let mut chunk = [0u8; 8192];
        let n = tokio::time::timeout(STEP, conn.read(&mut chunk))
            .await
            .expect("the agent answers or closes in time")
            .unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }
}
