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

use std::{collections::HashMap, io, sync::Arc, time::Duration};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::net::TcpStream;

mod body;
mod exchange;

pub use body::H1Body;
use exchange::{Exchanged, exchange};
pub use exchange::{H1Response, forwarded, forwarded_map};

use super::{framing::Framing, framing::FramingError, headers::Headers, worker::MAX_WORKERS};

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
pub(super) struct Conn {
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
pub(super) struct Shared {
    /// Idle connections by the worker they are registered with: shard 0 for any runtime
    /// but the data-path workers', shard 1 + i for worker i (see [`super::worker`]). A
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
/// `host`, `content-length`, `expect`, hop-by-hop fields and those `connection` names (this
/// leg's own framing replaces them; the client's `expect` was answered by the server leg).
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
        &self.idle[super::worker::shard()]
    }

    /// A connection whose response was read to its end comes back for the next request.
    /// Every third of the idle timeout, a check-in also drops this thread's expired
    /// connections to every endpoint, so the connections of endpoints no longer used do not
    /// stay open.
    pub(super) fn checkin(&self, authority: &Arc<str>, conn: Conn) {
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

/// The monotonic clock at tick resolution (a few milliseconds): ample for idle ages, and
/// without the timestamp-counter read of a precise clock on every check-out and check-in.
#[cfg(not(test))]
fn coarse_now() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .map(Duration::from)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;

/// Under test, tokio's clock (from this thread's first reading), so tests can pause and
/// advance it.
#[cfg(test)]
fn coarse_now() -> Duration {
    thread_local! {
        static BASE: tokio::time::Instant = tokio::time::Instant::now();
    }
    BASE.with(|base| tokio::time::Instant::now().saturating_duration_since(*base))
}
