//! Idle streams: many streamed requests held open at once through the agent, each to an
//! engine that stalls after its first token, to measure what one open stream costs the
//! agent in memory.
//!
//! Each stream is a plain TCP connection with one HTTP/1.1 request written by hand (a client
//! library would hold more than the agent does); a stream counts as held once its first SSE
//! event arrived, i.e. the agent routed it and is passing the engine's body through.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    task::JoinSet,
};

use warmpath_agent::pool::UpstreamProtocol;

use super::procfs;

/// Idle streams per stalling engine over h2c. The agent multiplexes an endpoint's requests
/// over one connection, and the simulator's HTTP/2 server (hyper's defaults) allows 200
/// concurrent streams on it; the rest would wait. Below that, so that least-loaded's spread
/// need not be exact.
const H2_STREAMS_PER_ENGINE: usize = 160;

/// Stalling engines for `streams` idle streams: over HTTP/1.1 one (every stream has its own
/// connection), over h2c enough that none is asked for more streams than its connection
/// carries.
pub fn stall_engines(streams: usize, upstream: UpstreamProtocol) -> usize {
    match upstream {
        UpstreamProtocol::Http1 => 1,
        UpstreamProtocol::H2 => streams.div_ceil(H2_STREAMS_PER_ENGINE).max(1),
    }
}

/// Descriptors one idle stream costs the agent: its client connection, plus over HTTP/1.1
/// its own engine connection (h2c multiplexes the streams over a few).
pub fn fds_per_stream(upstream: UpstreamProtocol) -> u64 {
    match upstream {
        UpstreamProtocol::Http1 => 2,
        UpstreamProtocol::H2 => 1,
    }
}

/// Model of the pool whose engine stalls.
pub const IDLE_MODEL: &str = "sim-idle";
/// Streams being opened at once.
const OPENING: usize = 256;
/// Longest one stream may take to open (connect, request, first event).
const OPEN_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest the descriptors may take to come back down once the streams are closed.
const SETTLE: Duration = Duration::from_secs(20);

/// What holding the streams cost.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    /// How the agent talked to the stalling engine: `http1` or `h2`.
    pub upstream: &'static str,
    pub asked: usize,
    pub held: usize,
    /// Streams that did not open (status, connection or timeout), by their first reason.
    pub failed: usize,
    pub first_failure: Option<String>,
    pub rss_before_kib: u64,
    pub rss_held_kib: u64,
    /// (RSS held - RSS before) / held.
    pub bytes_per_stream: f64,
    pub fds_before: procfs::Fds,
    pub fds_held: procfs::Fds,
    /// After the streams were closed and the descriptors settled.
    pub fds_after: procfs::Fds,
    /// The soak's own descriptors with the streams held (one per stream, plus its own),
    /// and its open-file limit: the client side must fit too.
    pub own_fds_held: usize,
    pub own_fd_limit: u64,
    pub open_seconds: f64,
}

/// Where the agent is and how to count its descriptors.
#[derive(Debug, Clone)]
pub struct Target {
    pub pid: u32,
    pub listen: std::net::SocketAddr,
    pub engine_ports: Vec<u16>,
}

impl Target {
    fn fds(&self) -> procfs::Fds {
        procfs::fds(self.pid, self.listen.port(), &self.engine_ports).unwrap_or_default()
    }

    fn rss(&self) -> u64 {
        procfs::rss_kib(self.pid).unwrap_or(0)
    }
}

/// Opens `n` idle streams, measures, closes them and waits for the descriptors to settle.
pub async fn measure(target: &Target, n: usize, upstream: UpstreamProtocol) -> IdleReport {
    let (rss_before_kib, fds_before) = (target.rss(), target.fds());
    let start = Instant::now();
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    let mut first_failure = None;
    let mut opening = JoinSet::new();
    let mut next = 0;
    while next < n || !opening.is_empty() {
        while next < n && opening.len() < OPENING {
            opening.spawn(open(target.listen, next));
            next += 1;
        }
        match opening.join_next().await {
            Some(Ok(Ok(stream))) => held.push(stream),
            Some(Ok(Err(why))) => {
                failed += 1;
                first_failure.get_or_insert(why);
            }
            Some(Err(e)) => {
                failed += 1;
                first_failure.get_or_insert(format!("task: {e}"));
            }
            None => break,
        }
    }
    let open_seconds = start.elapsed().as_secs_f64();
    let (rss_held_kib, fds_held) = (target.rss(), target.fds());
    let own_fds_held = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let count = held.len();
    drop(held);
    let fds_after = settle(target, fds_before).await;
    IdleReport {
        upstream: upstream.as_str(),
        asked: n,
        held: count,
        failed,
        first_failure,
        rss_before_kib,
        rss_held_kib,
        bytes_per_stream: if count == 0 {
            0.0
        } else {
            rss_held_kib.saturating_sub(rss_before_kib) as f64 * 1024.0 / count as f64
        },
        fds_before,
        fds_held,
        fds_after,
        own_fds_held,
        own_fd_limit: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(0, |l| l.0),
        open_seconds,
    }
}

/// Waits (at most [`SETTLE`]) until no client connection is left and the other
/// descriptors are back to `before`'s; returns the last count.
pub async fn settle(target: &Target, before: procfs::Fds) -> procfs::Fds {
    let deadline = Instant::now() + SETTLE;
    loop {
        let now = target.fds();
        if (now.clients == 0 && now.other() <= before.other()) || Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One stream, held once its first event arrived.
async fn open(agent: std::net::SocketAddr, i: usize) -> Result<TcpStream, String> {
    tokio::time::timeout(OPEN_TIMEOUT, async {
        let mut s = TcpStream::connect(agent)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let body = format!(
            "{{\"model\":\"{IDLE_MODEL}\",\"prompt\":\"idle stream {i}\",\"max_tokens\":2,\"stream\":true}}"
        );
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: {agent}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(format!("{head}{body}").as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut got = Vec::with_capacity(1024);
        let mut buf = [0u8; 1024];
        loop {
            let n = s.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err(format!(
                    "closed before the first event: {:?}",
                    String::from_utf8_lossy(&got[..got.len().min(120)])
                ));
            }
            got.extend_from_slice(&buf[..n]);
            if !got.starts_with(b"HTTP/1.1 200") && got.len() >= 12 {
                let line = got.split(|&b| b == b'\r').next().unwrap_or(&[]);
                return Err(String::from_utf8_lossy(line).into_owned());
            }
            if body_started(&got) {
                return Ok(s);
            }
            if got.len() > 64 * 1024 {
                return Err("no event in the first 64 KiB".into());
            }
        }
    })
    .await
    .map_err(|_| format!("no first event within {OPEN_TIMEOUT:?}"))?
}

/// Whether the body has started: a `data:` line after the head.
fn body_started(got: &[u8]) -> bool {
    got.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .is_some_and(|end| got[end..].windows(5).any(|w| w == b"data:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_thousand_h2c_streams_go_to_engines_below_their_200_stream_limit() {
        assert_eq!(stall_engines(10_000, UpstreamProtocol::H2), 63);
        assert!(10_000usize.div_ceil(63) < 200);
        assert_eq!(stall_engines(500, UpstreamProtocol::H2), 4);
        assert_eq!(stall_engines(0, UpstreamProtocol::H2), 1);
        assert_eq!(stall_engines(10_000, UpstreamProtocol::Http1), 1);
        // 10,000 streams fit a 20,000 open-file limit over h2c only.
        assert_eq!(fds_per_stream(UpstreamProtocol::H2), 1);
        assert_eq!(fds_per_stream(UpstreamProtocol::Http1), 2);
    }

    #[test]
    fn a_stream_is_held_once_its_body_has_an_event() {
        assert!(!body_started(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        ));
        assert!(!body_started(b"HTTP/1.1 200 OK\r\nx-data: 1\r\n\r\n"));
        assert!(body_started(
            b"HTTP/1.1 200 OK\r\n\r\n2a\r\ndata: {\"choices\":[]}\n\n"
        ));
    }
}
