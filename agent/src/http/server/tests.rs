//! The server leg against real sockets: timeouts, a client going away, oversized bodies.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use std::time::Duration;
use tokio::sync::Notify;

use http_body_util::{BodyExt, Full};
use tokio::net::TcpListener;

use super::*;
use crate::http::framing::Framing;

/// Answers with the body's length; `/hang` never answers (and notes when it is dropped).
struct Echo {
    started: Arc<Flag>,
    dropped: Arc<Flag>,
}

struct NoteDrop(Arc<Flag>);
impl Drop for NoteDrop {
    fn drop(&mut self) {
        self.0.raise();
    }
}

impl Handler for Echo {
    type Peer = std::net::IpAddr;

    fn max_body(&self) -> usize {
        1024
    }
    fn read_timeout(&self) -> Duration {
        Duration::from_millis(200)
    }
    fn refusal_body(&self, refusal: &Refusal) -> Bytes {
        Bytes::from(refusal.message.clone())
    }
    fn call<'a>(
        &'a self,
        _peer: std::net::IpAddr,
        head: &'a RequestHead,
        body: Result<Bytes, Refusal>,
    ) -> impl Future<Output = Answer> + Send + 'a {
        let note = NoteDrop(self.dropped.clone());
        let started = self.started.clone();
        async move {
            let body = match body {
                Ok(b) => b,
                Err(e) => {
                    let mut resp = http::Response::new(
                        Full::new(Bytes::from(e.message))
                            .map_err(|never| match never {})
                            .boxed_unsync(),
                    );
                    *resp.status_mut() = e.status;
                    return resp.into();
                }
            };
            if head.path() == "/hang" {
                let _note = note;
                started.raise();
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

/// A flag a test waits on without polling.
#[derive(Default)]
struct Flag {
    set: AtomicBool,
    raised: Notify,
}

impl Flag {
    fn raise(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.raised.notify_one();
    }

    fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }
}

/// Waits (bounded) until `flag` is raised.
async fn until(flag: &Flag, what: &str) {
    let raised = async {
        while !flag.is_set() {
            flag.raised.notified().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), raised)
        .await
        .expect(what);
}

async fn start() -> (String, Arc<Flag>, Arc<Flag>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (started, dropped) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
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

// The clock is paused: the read timeout passes when nothing else can happen (loopback
// sockets in this process), without waiting for it.
#[tokio::test(start_paused = true)]
async fn started_heads_and_stalled_bodies_time_out_idle_connections_do_not() {
    let (addr, _, _) = start().await;
    // Idle past the timeout, then a whole request: answered.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    tokio::time::advance(Duration::from_millis(400)).await;
    idle.write_all(
        b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
    )
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
        .write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhalf")
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
    s.write_all(b"GET /hang HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // The handler is running (and hangs); the client leaves.
    until(&started, "the handler never started").await;
    assert!(!dropped.is_set());
    drop(s);
    until(&dropped, "the handler was never dropped").await;
}

#[tokio::test]
async fn chunked_bodies_over_the_limit_are_413_and_the_answer_is_readable() {
    let (addr, _, _) = start().await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 600, "x".repeat(600));
    s.write_all(
        format!(
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n{chunk}{chunk}{chunk}"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let got = read_all(&mut s).await;
    assert!(got.starts_with("HTTP/1.1 413 "), "{got}");
    assert!(got.contains("connection: close"), "{got}");
}

/// What `parse_request` makes of a whole head: `Ok` with the head's framing, or the status
/// of its refusal.
fn parsed(wire: &str) -> Result<Framing, u16> {
    let mut buf = BytesMut::from(wire.as_bytes());
    match parse_request(&mut buf, &mut Spans::new()) {
        Ok(Some(head)) => Ok(head.framing),
        Ok(None) => panic!("incomplete head: {wire:?}"),
        Err(refusal) => Err(refusal.status.as_u16()),
    }
}

#[test]
fn request_heads_are_refused_where_their_framing_could_be_read_two_ways() {
    use crate::http::framing::Chunk;
    let chunked = Ok(Framing::Chunked(Chunk::Size));
    let cases: &[(&str, Result<Framing, u16>)] = &[
        ("GET / HTTP/1.1\r\nhost: x\r\n\r\n", Ok(Framing::Done)),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n",
            Ok(Framing::Length(5)),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\n",
            Ok(Framing::Length(5)),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5, 5\r\n\r\n",
            Ok(Framing::Length(5)),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: +5\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5 5\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
            chunked,
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding:\tchunked\r\n\r\n",
            chunked,
        ),
        // Several fields are one list: gzip, chunked.
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n",
            Err(501),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntransfer-encoding: gzip\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: xchunked\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, identity\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding : chunked\r\n\r\n",
            Err(400),
        ),
        // obs-fold, bare LF, bare CR, NUL.
        (
            "POST / HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n folded\r\n\r\n",
            Err(400),
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\n transfer-encoding: chunked\r\n\r\n",
            Err(400),
        ),
        ("GET / HTTP/1.1\nhost: x\r\n\r\n", Err(400)),
        ("GET / HTTP/1.1\r\nhost: x\n\n", Err(400)),
        ("GET / HTTP/1.1\r\nhost: x\r\nx-a: 1\r2\r\n\r\n", Err(400)),
        ("GET / HTTP/1.1\r\nhost: x\r\nx-a: 1\x002\r\n\r\n", Err(400)),
        // Host: required on HTTP/1.1, never twice.
        ("GET / HTTP/1.1\r\n\r\n", Err(400)),
        ("GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", Err(400)),
        ("GET / HTTP/1.0\r\n\r\n", Ok(Framing::Done)),
        ("GET / HTTP/1.0\r\nhost: a\r\nhost: a\r\n\r\n", Err(400)),
    ];
    for (wire, want) in cases {
        assert_eq!(&parsed(wire), want, "{wire:?}");
    }
    // A head over the limit is 431 even when it arrived whole.
    let big = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(MAX_HEAD)
    );
    assert_eq!(parsed(&big), Err(431));
}

// The clock is paused: a head trickled in a byte at a time, each byte well within the read
// timeout (200 ms), is still cut off once the whole head took longer than the timeout:
// the 408 comes while bytes are still arriving (a timer per read would never fire then).
#[tokio::test(start_paused = true)]
async fn a_head_trickled_a_byte_at_a_time_is_cut_off_at_the_timeout() {
    let (addr, _, _) = start().await;
    let (mut r, mut w) = TcpStream::connect(&addr).await.unwrap().into_split();
    let head = format!(
        "POST / HTTP/1.1\r\nhost: x\r\nx-slow: {}\r\n\r\n",
        "a".repeat(100)
    );
    let began = tokio::time::Instant::now();
    // 50 ms a byte: the head would take over 6 s to arrive whole.
    let writer = tokio::spawn(async move {
        for b in head.into_bytes() {
            if w.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut got = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), r.read(&mut got))
        .await
        .expect("an answer comes")
        .unwrap();
    let at = began.elapsed();
    assert!(!writer.is_finished(), "the head was sent whole first");
    writer.abort();
    let got = String::from_utf8_lossy(&got[..n]);
    assert!(got.starts_with("HTTP/1.1 408 "), "{got}");
    assert!(
        at >= Duration::from_millis(200) && at < Duration::from_millis(400),
        "answered after {at:?}"
    );
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let (addr, _, _) = start().await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n")
        .await
        .unwrap();
    let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut got = vec![0u8; interim.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
        .await
        .expect("the interim answer comes")
        .unwrap();
    assert_eq!(got, interim);
    s.write_all(b"abc").await.unwrap();
    s.shutdown().await.unwrap();
    let got = read_all(&mut s).await;
    assert!(
        got.starts_with("HTTP/1.1 200 OK") && got.ends_with("3 bytes"),
        "{got}"
    );
}

#[tokio::test]
async fn a_bare_lf_after_the_last_chunk_closes_and_the_next_request_is_not_read() {
    let (addr, _, _) = start().await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\nPOST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nz")
        .await
        .unwrap();
    let got = read_all(&mut s).await;
    assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    assert!(got.contains("bare LF"), "{got}");
    assert_eq!(got.matches("HTTP/1.1").count(), 1, "{got}");
}
