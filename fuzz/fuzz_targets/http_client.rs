//! HTTP/1.1 responses as warmpath's engine-side client reads them (`http::H1Client`): a fake
//! engine on loopback reads the request, answers with the input and closes.
//!
//! Properties: the client finishes (no hang); interim 1xx heads are skipped (the status is
//! that of the first final head in the input, as httparse reads the input itself); a body
//! framed by `content-length` is exactly the bytes after the head; a body read until close is
//! everything after the head; a chunked body is shorter than what follows the head; a HEAD
//! request gets no body; body bytes never exceed the input.

#![no_main]

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use warmpath_agent::http::{H1Client, Headers, Outgoing};
use warmpath_fuzz::net;

/// A response head as httparse alone reads it: status, where the head ends, and its
/// `content-length` and `transfer-encoding` values.
type RefHead = (u16, usize, Option<Vec<u8>>, Option<Vec<u8>>);

/// The first final (non-1xx) response head in `wire`.
fn reference(wire: &[u8]) -> Option<RefHead> {
    let mut at = 0;
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 100];
        let mut resp = httparse::Response::new(&mut fields);
        let len = match resp.parse(&wire[at..]) {
            Ok(httparse::Status::Complete(len)) => len,
            _ => return None,
        };
        let code = resp.code?;
        let field = |name: &str| {
            resp.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value.to_vec())
        };
        let (cl, te) = (field("content-length"), field("transfer-encoding"));
        at += len;
        if !(100..200).contains(&code) {
            return Some((code, at, cl, te));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, wire)) = data.split_first() else {
        return;
    };
    let method = if flags & 1 == 1 {
        http::Method::HEAD
    } else {
        http::Method::GET
    };
    let outcome = net::run(|listener| async {
        let authority: Arc<str> = listener.local_addr().expect("bound").to_string().into();
        let engine = async {
            let (mut conn, _) = listener.accept().await.expect("loopback accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while memchr::memmem::find(&request, b"\r\n\r\n").is_none() {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = conn.write_all(wire).await;
            let _ = conn.shutdown().await;
        };
        let client = async {
            let client = H1Client::new(Duration::from_secs(5));
            let headers = Headers::default();
            let body = Bytes::new();
            let req = Outgoing {
                method: &method,
                target: "/v1/completions",
                headers: &headers,
                body: &body,
            };
            let resp = client.send(&authority, req).await?;
            let status = resp.status;
            let mut body = resp.body;
            let mut got = Vec::new();
            let mut failed = false;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(frame) => {
                        if let Ok(d) = frame.into_data() {
                            got.extend_from_slice(&d);
                        }
                    }
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            Ok::<_, warmpath_agent::http::client::H1Error>((status, got, failed))
        };
        let ((), outcome) = tokio::join!(engine, client);
        outcome
    });
    let reference = reference(wire);
    let Ok((status, body, failed)) = outcome else {
        return;
    };
    let (code, head_end, cl, te) =
        reference.expect("the client took a head httparse does not find");
    assert_eq!(status.as_u16(), code, "the final head's status");
    assert!(
        body.len() <= wire.len() - head_end,
        "body bytes beyond the input"
    );
    if method == http::Method::HEAD || code == 204 || code == 304 {
        assert!(body.is_empty(), "a body where none can be");
        return;
    }
    let after = &wire[head_end..];
    let chunked = te.as_deref().is_some_and(|v| {
        v.rsplit(|&b| b == b',')
            .next()
            .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
    });
    if chunked {
        if !failed {
            assert!(
                body.len() < after.len(),
                "a chunked body is shorter than its framing"
            );
        }
    } else if let Some(cl) = cl {
        let n: usize = std::str::from_utf8(&cl)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .expect("an accepted content-length is a decimal");
        if failed {
            assert!(
                after.len() < n,
                "a content-length body failed with all its bytes there"
            );
        } else {
            assert_eq!(&body[..], &after[..n], "content-length {n}");
        }
    } else {
        assert!(!failed, "a body read until close cannot fail");
        assert_eq!(body, after, "a body read until close");
    }
});
