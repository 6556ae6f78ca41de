//! The upstream clients: HTTP/1.1 on warmpath's own connection pools ([`crate::http::client`])
//! or h2c multiplexed by hyper, one exchange per attempt, the response body streamed back
//! (never buffered). Side requests (scrapes, `/tokenize`) take hyper's HTTP/1.1 client.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

use crate::{
    http::{BoxError, H1Body, H1Client, Headers, Outgoing, client::forwarded_map},
    pool::UpstreamProtocol,
};

/// Idle upstream connections are kept this long.
const POOL_IDLE: Duration = Duration::from_secs(90);
/// HTTP/2 pings on idle upstream connections, so a dead engine is noticed before a request
/// is multiplexed onto its connection.
const H2_KEEPALIVE: Duration = Duration::from_secs(20);

/// An upstream client: a connection pool per endpoint.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

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
                *up.headers_mut() = forwarded_map(req.headers);
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
