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
        _peer: IpAddr,
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
        format!("POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n{chunk}{chunk}{chunk}")
            .as_bytes(),
    )
    .await
    .unwrap();
    let got = read_all(&mut s).await;
    assert!(got.starts_with("HTTP/1.1 413 "), "{got}");
    assert!(got.contains("connection: close"), "{got}");
}
