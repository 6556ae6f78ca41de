//! The client leg against scripted engines: every framing, reuse, expiry, stale and bad
//! connections.

use super::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

// The clock is paused: idle ages are measured on tokio's clock under test, advanced here.
#[tokio::test(start_paused = true)]
async fn idle_connections_expire_and_gone_endpoints_lose_theirs() {
    let answer = &b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"[..];
    let (a, _server_a) = server(vec![vec![answer]]).await;
    let (b, _server_b) = server(vec![vec![answer]]).await;
    let client = H1Client::with_idle_timeout(Duration::from_secs(2), Duration::from_millis(100));
    assert_eq!(get(&client, &a).await.unwrap(), (200, b"ok".to_vec()));
    assert_eq!(client.idle(), 1);
    // Time passes.
    tokio::time::advance(Duration::from_millis(150)).await;
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

#[tokio::test]
async fn fields_named_by_connection_stay_on_the_client_leg() {
    let (addr, server) = server(vec![vec![b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"]]).await;
    let head = Bytes::from_static(
        b"Connection: keep-alive, X-Secret\r\nx-secret: 1\r\nx-kept: 2\r\nkeep-alive: timeout=5\r\ncontent-type: text/plain\r\n\r\n",
    );
    let mut spans = crate::http::headers::Spans::new();
    let mut fields = [httparse::EMPTY_HEADER; 8];
    let Ok(httparse::Status::Complete((_, parsed))) = httparse::parse_headers(&head, &mut fields)
    else {
        panic!("the test's head parses");
    };
    crate::http::framing::spans(&head, parsed, &mut spans);
    let headers = Headers::Raw { head, spans };
    let body = Bytes::new();
    let client = H1Client::new(Duration::from_secs(2));
    let resp = client
        .send(
            &addr,
            Outgoing {
                method: &http::Method::GET,
                target: "/x",
                headers: &headers,
                body: &body,
            },
        )
        .await
        .unwrap();
    assert_eq!(resp.status, 200);
    drop(resp);
    let seen = server.await.unwrap();
    let want = format!(
        "GET /x HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nx-kept: 2\r\ncontent-type: text/plain\r\n\r\n"
    );
    assert_eq!(String::from_utf8_lossy(&seen[0]), want);
    let map = forwarded_map(&headers);
    let names: Vec<_> = map.keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["x-kept", "content-type"]);
}

#[test]
fn response_heads_whose_framing_could_be_read_two_ways_are_invalid() {
    let head = |wire: &str| parse_head_for_test(wire.as_bytes());
    assert!(head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_ok());
    assert!(head("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2, 2\r\n\r\n").is_ok());
    for bad in [
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
        "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\n",
        "HTTP/1.1 200 OK\r\nx-a: 1\r\n folded\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding : chunked\r\n\r\n",
        "HTTP/1.1 200 OK\ncontent-length: 2\r\n\r\n",
        "HTTP/1.1 200 OK\r\nx-a: 1\x002\r\n\r\n",
    ] {
        assert!(matches!(head(bad), Err(H1Error::Invalid(_))), "{bad:?}");
    }
    let big = format!(
        "HTTP/1.1 200 OK\r\nx-big: {}\r\n\r\n",
        "a".repeat(crate::http::MAX_HEAD)
    );
    assert!(matches!(head(&big), Err(H1Error::Invalid(_))));
}

/// Parses a whole response head: `Ok(())` when it is read, or the error.
fn parse_head_for_test(wire: &[u8]) -> Result<(), H1Error> {
    let mut buf = BytesMut::from(wire);
    match exchange::parse_head(&mut buf)? {
        Some(_) => Ok(()),
        None => panic!("incomplete head: {wire:?}"),
    }
}
