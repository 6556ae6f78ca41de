//! An engine's response body on its way to the client: it releases the request's prefill
//! accounting at the first data frame and its in-flight slot when dropped, passes every
//! frame through the response's tap ([`super::tap`]), gives up on an engine that sends
//! nothing for the upstream idle timeout while the client waits for more, and, when it ends
//! or is dropped, writes the request's one telemetry record ([`super::record`]).
//!
//! The idle clock only runs while the body waits on the engine (it is polled only when the
//! client's connection takes more), so a client that reads slowly never makes the engine
//! look stalled. A stall ends a stream with an error event (code 504) and `[DONE]`, cuts
//! another body short, drops the engine's connection at once (the engine aborts the
//! request) and records the request as `upstream_error`.

use std::{
    future::Future as _,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;

use super::{
    admission::Admission,
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
    /// The idle timeout's counter.
    pub admission: Arc<Admission>,
    /// An engine silent this long while the client waits is given up (the request's policy,
    /// else the agent's limit).
    pub idle_timeout: Duration,
}

/// An upstream response body that releases the request's prefill accounting at the first
/// data frame and its in-flight slot when dropped (finished, or the client went away — which
/// also drops the upstream connection, so the engine aborts the request), reads usage as it
/// passes, gives up on a silent engine, and records the request's telemetry when it ends.
pub struct Tracked {
    /// The engine's body and in-flight slot; dropped at once when the engine stalls.
    engine: Option<(UpstreamBody, InFlight)>,
    observer: Observer,
    silence: Silence,
    ttft: Option<Duration>,
    /// When the engine's last byte was read (a body in one frame: when its first was).
    ended: Option<Instant>,
    done: bool,
    failed: bool,
}

impl Tracked {
    pub fn boxed(inner: UpstreamBody, guard: InFlight, observer: Observer) -> Body {
        Self {
            engine: Some((inner, guard)),
            observer,
            silence: Silence::default(),
            ttft: None,
            ended: None,
            done: false,
            failed: false,
        }
        .boxed_unsync()
    }

    /// The engine's next frame, or its silence past the idle timeout (`Err`).
    fn poll_engine(&mut self, cx: &mut Context<'_>) -> Poll<Result<Polled, Stalled>> {
        let Some((inner, _)) = self.engine.as_mut() else {
            return Poll::Ready(Ok(None));
        };
        match hyper::body::Body::poll_frame(Pin::new(inner), cx) {
            Poll::Ready(frame) => {
                self.silence.heard();
                Poll::Ready(Ok(frame))
            }
            Poll::Pending => {
                let limit = self.observer.idle_timeout;
                match self.silence.poll(limit, cx) {
                    Poll::Ready(()) => Poll::Ready(Err(Stalled)),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    /// The engine went silent: drop it, count it, and end the body (a stream with an error
    /// event).
    fn stalled(&mut self) -> Polled {
        self.done = true;
        self.failed = true;
        // Its connection closes (the engine aborts the request) and its in-flight slot is
        // released, whenever the client reads the end.
        self.engine = None;
        self.observer.admission.note_idle_timeout();
        let limit = self.observer.idle_timeout;
        tracing::warn!(pod = %self.observer.pod.1, ?limit, "engine response stalled; giving up");
        let message = || {
            format!(
                "The engine at {} sent nothing for {} ms (upstream idle timeout).",
                self.observer.pod.1,
                limit.as_millis()
            )
        };
        match self
            .observer
            .tap
            .fail(http::StatusCode::GATEWAY_TIMEOUT, message)
        {
            Some(end) => Some(Ok(Frame::data(end))),
            None => Some(Err(message().into())),
        }
    }

    fn engine_ended(&self) -> bool {
        self.engine
            .as_ref()
            .is_none_or(|(inner, _)| hyper::body::Body::is_end_stream(inner))
    }
}

/// The engine sent nothing for the idle timeout.
struct Stalled;

/// What one poll of a body gives.
type Polled = Option<Result<Frame<Bytes>, BoxError>>;

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Polled> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let polled = match this.poll_engine(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(Stalled)) => return Poll::Ready(this.stalled()),
                Poll::Ready(Ok(polled)) => polled,
            };
            match polled {
                Some(Ok(frame)) => {
                    let frame = match frame.into_data() {
                        Ok(data) => {
                            let last = this.engine_ended();
                            if this.ttft.is_none() {
                                let now = Instant::now();
                                this.ttft = Some(
                                    now.saturating_duration_since(this.observer.attempt.start),
                                );
                                this.ended = last.then_some(now);
                                if let Some((_, guard)) = this.engine.as_mut() {
                                    guard.first_byte();
                                }
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
                    if let Some(end) = this.observer.tap.fail(http::StatusCode::BAD_GATEWAY, || {
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
        match (self.observer.tap.rewrites(), &self.engine) {
            (false, Some((inner, _))) => inner.size_hint(),
            _ => hyper::body::SizeHint::default(),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let o = &self.observer;
        let (usage, error_event, streamed) = o.tap.readings();
        let outcome = if self.failed || error_event {
            Outcome::UpstreamError
        } else if !self.done && !self.engine_ended() {
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

/// The idle clock: started when a wait on the engine begins, stopped by each frame. The
/// timer is made at the first wait (most bodies never wait long enough to need one) and
/// reused after.
#[derive(Default)]
struct Silence {
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The timer runs from the current wait's start.
    armed: bool,
}

impl Silence {
    /// The engine sent something: the next wait starts the clock again.
    fn heard(&mut self) {
        self.armed = false;
    }

    /// Waiting on the engine: ready once `limit` has passed since the wait began.
    fn poll(&mut self, limit: Duration, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = tokio::time::Instant::now() + limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            timer.as_mut().reset(deadline);
            self.armed = true;
        }
        timer.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests;
