//! An engine's response body on its way to the client: it releases the request's prefill
//! accounting at the first data frame and its in-flight slot when dropped, passes every
//! frame through the response's tap ([`super::tap`]), and, when it ends or is dropped, writes
//! the request's one telemetry record ([`super::record`]).

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;

use super::{
    record::{Attempt, Ending},
    tap::Tap,
    upstream::UpstreamBody,
};
use crate::{
    http::{Body, BoxError},
    pool::InFlight,
    telemetry::{Outcome, Telemetry},
};

/// What the response body reports to telemetry when it ends (or is dropped).
#[derive(Debug)]
pub struct Observer {
    pub telemetry: Arc<Telemetry>,
    /// The request's bookkeeping, as it stood when the engine answered.
    pub attempt: Attempt,
    pub pod: (u16, Arc<str>),
    pub status: http::StatusCode,
    pub tap: Tap,
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
                                this.ttft = Some(
                                    now.saturating_duration_since(this.observer.attempt.start),
                                );
                                this.ended = last.then_some(now);
                                this.guard.first_byte();
                            }
                            let out = this.observer.tap.frame(data, last);
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
                    if let Some(end) = this.observer.tap.fail(|| {
                        format!(
                            "The engine at {} failed mid-stream: {err}",
                            this.observer.pod.1
                        )
                    }) {
                        this.done = true;
                        return Poll::Ready(Some(Ok(Frame::data(end))));
                    }
                    return Poll::Ready(Some(Err(err)));
                }
                None => {
                    this.done = true;
                    let rest = this.observer.tap.finish();
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
        match self.observer.tap.rewrites() {
            true => hyper::body::SizeHint::default(),
            false => self.inner.size_hint(),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let o = &self.observer;
        let (usage, error_event, streamed) = o.tap.readings();
        let outcome = if self.failed || error_event {
            Outcome::UpstreamError
        } else if !self.done && !hyper::body::Body::is_end_stream(&self.inner) {
            // (A body that ended without being read — HEAD, 204 — finished all the same.)
            Outcome::Cancelled
        } else {
            Outcome::of_status(o.status)
        };
        o.attempt.record(
            &o.telemetry,
            Ending {
                pod: Some((o.pod.0, &o.pod.1)),
                outcome,
                usage,
                ttft: self.ttft,
                at: self.ended.unwrap_or_else(Instant::now),
                streamed,
            },
        );
    }
}
