//! Forwarding to an endpoint: HTTP/1.1 on warmpath's own connection pools ([`super::h1`]) or
//! h2c multiplexed by hyper, responses streamed back frame by frame (never buffered), the
//! request's in-flight accounting tied to the body.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

use super::{
    Body, BoxError,
    h1::{H1Body, H1Client, Outgoing},
};
use crate::{
    headers::Headers,
    pool::InFlight,
    telemetry::{
        Outcome, PoolId, RequestRecord, Telemetry, Tenant,
        usage::{JsonTap, SseTap},
    },
};

/// Idle upstream connections are kept this long.
const POOL_IDLE: Duration = Duration::from_secs(90);
/// HTTP/2 pings on idle upstream connections, so a dead engine is noticed before a request
/// is multiplexed onto its connection.
const H2_KEEPALIVE: Duration = Duration::from_secs(20);

/// An upstream client: a connection pool per endpoint.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// How a pool talks to its engines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with keep-alive: one request per connection at a time (vLLM's default
    /// server, uvicorn, speaks only this).
    #[default]
    Http1,
    /// HTTP/2 over cleartext with prior knowledge (h2c): every request to an endpoint
    /// multiplexed over one connection (for engines behind an h2c-capable server).
    H2,
}

impl UpstreamProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http1 => "http1",
            Self::H2 => "h2",
        }
    }
}

/// Longest wait for a TCP connection to an engine.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The upstream clients, one per protocol; pools pick theirs.
#[derive(Debug, Clone)]
pub struct Upstreams {
    /// Proxied requests over HTTP/1.1.
    h1: H1Client,
    /// Side requests (scrapes, `/tokenize`) over HTTP/1.1: off the data path, where a
    /// generic client's convenience is worth more than its cost.
    http1: UpstreamClient,
    h2: UpstreamClient,
}

/// An engine's response, whichever protocol carried it.
#[derive(Debug)]
pub struct UpstreamResponse {
    pub status: http::StatusCode,
    pub headers: Headers,
    pub body: UpstreamBody,
}

/// A response body from an engine, whichever protocol carried it (`Left`: HTTP/1.1).
pub type UpstreamBody = http_body_util::Either<H1Body, Incoming>;

impl Default for Upstreams {
    fn default() -> Self {
        Self::new()
    }
}

impl Upstreams {
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(1024)
            .build(connector.clone());
        let h2 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .http2_only(true)
            .http2_keep_alive_interval(H2_KEEPALIVE)
            .http2_keep_alive_while_idle(true)
            .http2_adaptive_window(true)
            .timer(hyper_util::rt::TokioTimer::new())
            .build(connector);
        Self {
            h1: H1Client::new(CONNECT_TIMEOUT),
            http1,
            h2,
        }
    }

    /// The client for side requests (scrapes, `/tokenize`) in `protocol`.
    pub fn client(&self, protocol: UpstreamProtocol) -> &UpstreamClient {
        match protocol {
            UpstreamProtocol::Http1 => &self.http1,
            UpstreamProtocol::H2 => &self.h2,
        }
    }

    /// Sends a proxied request to the engine at `authority`; the response body streams.
    pub async fn send(
        &self,
        protocol: UpstreamProtocol,
        authority: &Arc<str>,
        req: Outgoing<'_>,
    ) -> Result<UpstreamResponse, BoxError> {
        match protocol {
            UpstreamProtocol::Http1 => {
                let r = self.h1.send(authority, req).await?;
                Ok(UpstreamResponse {
                    status: r.status,
                    headers: r.headers,
                    body: UpstreamBody::Left(r.body),
                })
            }
            UpstreamProtocol::H2 => {
                let mut up = http::Request::new(Full::new(req.body.clone()));
                *up.method_mut() = req.method.clone();
                *up.uri_mut() = format!("http://{authority}{}", req.target).parse()?;
                *up.headers_mut() = req
                    .headers
                    .to_map(|n| super::h1::client::forwarded(n.as_str().as_bytes()));
                let (parts, body) = self.h2.request(up).await?.into_parts();
                Ok(UpstreamResponse {
                    status: parts.status,
                    headers: Headers::Map(parts.headers),
                    body: UpstreamBody::Right(body),
                })
            }
        }
    }
}

/// What the response body reports to telemetry when it ends (or is dropped).
#[derive(Debug)]
pub struct Observer {
    pub telemetry: Arc<Telemetry>,
    pub tenant: Arc<Tenant>,
    pub pool: PoolId,
    pub pod: (u16, Arc<str>),
    /// When the request arrived.
    pub start: Instant,
    pub queue: Option<Duration>,
    pub retries: u32,
    pub status: http::StatusCode,
    pub tap: Tap,
}

/// How the body is read for usage.
#[derive(Debug)]
pub enum Tap {
    Sse(SseTap),
    Json(JsonTap),
    None,
}

/// An upstream response body that releases the request's prefill accounting at the first
/// data frame and its in-flight slot when dropped (finished, or the client went away — which
/// also drops the upstream connection, so the engine aborts the request), reads usage as it
/// passes, and records the request's telemetry when it ends.
pub struct Tracked {
    inner: UpstreamBody,
    guard: InFlight,
    observer: Observer,
    ttft: Option<Duration>,
    /// When the engine's last byte was read (a body in one frame: when its first was).
    ended: Option<Instant>,
    done: bool,
    failed: bool,
}

impl Tracked {
    pub fn boxed(inner: UpstreamBody, guard: InFlight, observer: Observer) -> Body {
        Self {
            inner,
            guard,
            observer,
            ttft: None,
            ended: None,
            done: false,
            failed: false,
        }
        .boxed_unsync()
    }

    /// Passes a data frame through the tap; may hold bytes back (an incomplete SSE event).
    fn tap(&mut self, data: Bytes, last: bool) -> Bytes {
        match &mut self.observer.tap {
            Tap::Sse(sse) => {
                let out = sse.frame(data);
                if last {
                    let rest = sse.finish();
                    if !rest.is_empty() {
                        return [out, rest].concat().into();
                    }
                }
                out
            }
            Tap::Json(json) => {
                json.observe(&data);
                data
            }
            Tap::None => data,
        }
    }
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let frame = match frame.into_data() {
                        Ok(data) => {
                            let last = this.inner.is_end_stream();
                            if this.ttft.is_none() {
                                let now = Instant::now();
                                this.ttft =
                                    Some(now.saturating_duration_since(this.observer.start));
                                this.ended = last.then_some(now);
                                this.guard.first_byte();
                            }
                            let out = this.tap(data, last);
                            this.done = last;
                            if out.is_empty() && !last {
                                continue;
                            }
                            Frame::data(out)
                        }
                        Err(frame) => frame,
                    };
                    return Poll::Ready(Some(Ok(frame)));
                }
                Some(Err(err)) => {
                    this.failed = true;
                    tracing::warn!(pod = %this.observer.pod.1, %err, "upstream failed mid-response");
                    // A stream ends the way vLLM ends a failed stream; other bodies can only
                    // be cut short.
                    if let Tap::Sse(sse) = &mut this.observer.tap {
                        this.done = true;
                        let end = sse.fail(&format!(
                            "The engine at {} failed mid-stream: {err}",
                            this.observer.pod.1
                        ));
                        return Poll::Ready(Some(Ok(Frame::data(end))));
                    }
                    return Poll::Ready(Some(Err(err)));
                }
                None => {
                    this.done = true;
                    let rest = match &mut this.observer.tap {
                        Tap::Sse(sse) => sse.finish(),
                        _ => Bytes::new(),
                    };
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.observer.tap {
            // Rewritten streams change length.
            Tap::Sse(_) => hyper::body::SizeHint::default(),
            _ => self.inner.size_hint(),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let o = &self.observer;
        let (usage, error_event, streamed) = match &o.tap {
            Tap::Sse(sse) => (sse.usage, sse.error_event, true),
            Tap::Json(json) => (json.usage(), false, false),
            Tap::None => (None, false, false),
        };
        let outcome = if self.failed || error_event {
            Outcome::UpstreamError
        } else if !self.done && !hyper::body::Body::is_end_stream(&self.inner) {
            // (A body that ended without being read — HEAD, 204 — finished all the same.)
            Outcome::Cancelled
        } else {
            Outcome::of_status(o.status)
        };
        let now = self.ended.unwrap_or_else(Instant::now);
        o.telemetry.record(
            &o.tenant,
            &RequestRecord {
                pool: o.pool,
                pod: Some((o.pod.0, &o.pod.1)),
                outcome,
                usage,
                retries: o.retries,
                queue: o.queue,
                ttft: self.ttft,
                duration: now.saturating_duration_since(o.start),
                at: now,
                streamed,
            },
        );
    }
}
