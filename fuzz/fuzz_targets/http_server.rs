//! HTTP/1.1 requests (heads, bodies, pipelines) as warmpath's server reads them from a client
//! connection (`http::server::serve`, over loopback TCP: the server reads real streams).
//!
//! Properties:
//! - the server finishes once the client has sent the input and closed (no hang);
//! - what comes back is a sequence of well-formed responses, one per request the handler saw
//!   (in order, with the status the handler gave), plus at most one refusal of the server's
//!   own (4xx, or 501 for a coding it does not implement), after which nothing follows;
//! - a request with `content-length` got exactly that many body bytes, found in the input as
//!   they are; no body exceeds the handler's limit; bodies never add up to more than the input;
//! - a request with `transfer-encoding` reached the handler only as chunked;
//! - every request the handler saw round-trips: written again canonically (its head fields
//!   as seen, the body with `content-length`), it is read back the same.

#![no_main]

use std::{net::IpAddr, sync::Mutex};

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use libfuzzer_sys::fuzz_target;
use tokio::io::AsyncWriteExt as _;
use warmpath_agent::http::{
    Answer, Refusal, RequestHead,
    message::full,
    server::{Handler, serve},
};
use warmpath_fuzz::net;

/// The handler's body limit: small, so 413 is reached by small inputs.
const MAX_BODY: usize = 2048;

/// What the handler saw of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    method: http::Method,
    target: String,
    version: http::Version,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// The body, or the status of the refusal the server handed over instead.
    body: Result<Bytes, StatusCode>,
}

impl Seen {
    fn status(&self) -> StatusCode {
        match &self.body {
            Ok(_) => StatusCode::OK,
            Err(status) => *status,
        }
    }

    fn field(&self, name: &str) -> impl Iterator<Item = &[u8]> {
        self.fields
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v.as_slice())
    }
}

#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<Seen>>,
}

impl Handler for Recorder {
    type Peer = IpAddr;

    fn max_body(&self) -> usize {
        MAX_BODY
    }

    async fn call<'a>(
        &'a self,
        _peer: IpAddr,
        head: &'a RequestHead,
        body: Result<Bytes, Refusal>,
    ) -> Answer {
        let seen = Seen {
            method: head.method.clone(),
            target: head.target().to_string(),
            version: head.version,
            fields: head
                .headers
                .iter()
                .map(|(n, v)| (n.to_vec(), v.to_vec()))
                .collect(),
            body: body.map_err(|r| r.status),
        };
        let status = seen.status();
        self.seen.lock().expect("not poisoned").push(seen);
        full(status, "text/plain", "ok").into()
    }

    fn refusal_body(&self, _refusal: &Refusal) -> Bytes {
        Bytes::from_static(b"{}")
    }
}

/// Sends `input` on a fresh connection and closes; returns what the handler saw, the bytes
/// that came back, and whether the connection was reset under the client.
fn exchange(input: &[u8]) -> (Vec<Seen>, Vec<u8>, bool) {
    let handler = Recorder::default();
    let (back, reset) = net::run(|listener| async {
        let (server, peer, mut client) = net::pair(listener).await;
        let served = serve(server, BytesMut::new(), peer.ip(), &handler);
        let talk = async {
            let (mut r, mut w) = client.split();
            let write = async {
                // The server may close before reading everything (it answered and closed).
                let _ = w.write_all(input).await;
                let _ = w.shutdown().await;
            };
            let ((), got) = tokio::join!(write, net::read_all(&mut r));
            got
        };
        let ((), got) = tokio::join!(served, talk);
        got
    });
    let seen = handler.seen.into_inner().expect("not poisoned");
    (seen, back, reset)
}

/// One response read back: its status (interim responses are skipped).
fn responses(mut wire: &[u8], seen: &[Seen]) -> (Vec<StatusCode>, bool) {
    let mut out = Vec::new();
    loop {
        if wire.is_empty() {
            return (out, true);
        }
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut fields);
        let len = match resp.parse(wire) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return (out, false),
            Err(e) => panic!("the server wrote a malformed response head ({e}): {wire:?}"),
        };
        let status = StatusCode::from_u16(resp.code.expect("complete heads have a code"))
            .expect("the server writes valid status codes");
        let length = resp
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .map(|h| {
                std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.parse::<usize>().ok())
                    .expect("the server writes decimal lengths")
            });
        wire = &wire[len..];
        if status.is_informational() {
            assert_eq!(status, StatusCode::CONTINUE, "the only interim response");
            continue;
        }
        let head_request = seen
            .get(out.len())
            .is_some_and(|s| s.method == http::Method::HEAD);
        let body = if head_request {
            0
        } else {
            length.expect("every answer here has a length")
        };
        if wire.len() < body {
            return (out, false);
        }
        wire = &wire[body..];
        out.push(status);
    }
}

/// A request as canonical bytes: its head fields as the handler saw them but the framing
/// ones, then the body with `content-length`.
fn canonical(s: &Seen, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(s.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(s.target.as_bytes());
    out.extend_from_slice(match s.version {
        http::Version::HTTP_10 => b" HTTP/1.0\r\n",
        _ => b" HTTP/1.1\r\n",
    });
    for (n, v) in framing_free(&s.fields) {
        out.extend_from_slice(n);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body);
    out
}

fn framing_free(fields: &[(Vec<u8>, Vec<u8>)]) -> impl Iterator<Item = (&[u8], &[u8])> {
    fields
        .iter()
        .filter(|(n, _)| {
            !(n.eq_ignore_ascii_case(b"content-length")
                || n.eq_ignore_ascii_case(b"transfer-encoding")
                || n.eq_ignore_ascii_case(b"expect"))
        })
        .map(|(n, v)| (n.as_slice(), v.as_slice()))
}

fuzz_target!(|input: &[u8]| {
    let (seen, back, reset) = exchange(input);
    let (statuses, whole) = responses(&back, &seen);
    if !reset {
        assert!(whole, "the last response was cut short: {back:?}");
        assert!(
            statuses.len() == seen.len() || statuses.len() == seen.len() + 1,
            "{} responses for {} requests handled",
            statuses.len(),
            seen.len()
        );
    }
    for (s, status) in seen.iter().zip(&statuses) {
        assert_eq!(*status, s.status(), "responses come in request order");
    }
    if statuses.len() > seen.len() {
        let refusal = statuses[seen.len()];
        assert!(
            refusal.is_client_error() || refusal == StatusCode::NOT_IMPLEMENTED,
            "the server's own refusal: {refusal}"
        );
    }
    if let Some(at) = seen.iter().position(|s| s.body.is_err()) {
        assert_eq!(at + 1, seen.len(), "nothing is read after a refused body");
        assert!(
            statuses.len() <= seen.len(),
            "no second refusal after a refused body"
        );
    }
    let mut total = 0;
    for s in &seen {
        let Ok(body) = &s.body else { continue };
        assert!(
            body.len() <= MAX_BODY,
            "a body over the limit was handed over"
        );
        total += body.len();
        let te: Vec<&[u8]> = s.field("transfer-encoding").collect();
        if let Some(last) = te.last() {
            let last_coding = last.rsplit(|&b| b == b',').next().unwrap_or_default();
            assert!(
                last_coding.trim_ascii().eq_ignore_ascii_case(b"chunked"),
                "transfer-encoding {te:?} handled as a body"
            );
        } else if let Some(cl) = s.field("content-length").next() {
            let n: usize = std::str::from_utf8(cl)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .expect("an accepted content-length is a decimal");
            assert_eq!(body.len(), n, "content-length {n}");
            assert!(
                memchr::memmem::find(input, body).is_some(),
                "a content-length body is a slice of the input"
            );
        } else {
            assert!(body.is_empty(), "a body without framing fields");
        }
    }
    assert!(total <= input.len(), "bodies add up to more than the input");
    for s in &seen {
        let Ok(body) = &s.body else { continue };
        let wire = canonical(s, body);
        let (again, _, _) = exchange(&wire);
        let [again] = &again[..] else {
            panic!("{wire:?} was read as {} requests: {again:?}", again.len());
        };
        let expect_fields: Vec<(Vec<u8>, Vec<u8>)> = framing_free(&s.fields)
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .chain([(
                b"content-length".to_vec(),
                body.len().to_string().into_bytes(),
            )])
            .collect();
        assert_eq!(
            (
                &again.method,
                &again.target,
                again.version,
                &again.fields,
                &again.body
            ),
            (&s.method, &s.target, s.version, &expect_fields, &s.body),
            "round trip of {wire:?}"
        );
    }
});
