//! Forwarding to an endpoint: pooled HTTP/1.1 connections per endpoint, responses streamed
//! back frame by frame (never buffered), the request's in-flight accounting tied to the body.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

use super::{Body, BoxError};
use crate::pool::InFlight;

/// Idle upstream connections are kept this long.
const POOL_IDLE: Duration = Duration::from_secs(90);

/// The shared upstream client (connection pools per endpoint).
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE)
        .pool_max_idle_per_host(1024)
        .build(connector)
}

/// An upstream response body that releases the request's prefill accounting at the first
/// data frame and its in-flight slot when dropped (finished, or the client went away — which
/// also drops the upstream connection, so the engine aborts the request).
pub struct Tracked {
    inner: Incoming,
    guard: InFlight,
    seen_data: bool,
}

impl Tracked {
    pub fn boxed(inner: Incoming, guard: InFlight) -> Body {
        Self {
            inner,
            guard,
            seen_data: false,
        }
        .boxed_unsync()
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
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && frame.is_data()
            && !this.seen_data
        {
            this.seen_data = true;
            this.guard.first_byte();
        }
        polled.map_err(|e| Box::new(e) as BoxError)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
