//! An admitted request's response body: it holds the request's admission slot until it ends
//! or is dropped, and gives up on an engine that sends nothing for the idle timeout while the
//! client waits for more (a stream then ends with vLLM's error event, other bodies are cut
//! short). The clock only runs while the body is waiting on the engine: a client that reads
//! slowly never makes the engine look stalled.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Frame;
use tokio::time::{Instant, Sleep};

use super::{Admission, Permit};
use crate::http::{Body, BoxError, sse};

/// `body` with its slot and the idle timeout. `sse`: the body is an event stream (its end
/// on a stall is an error event).
pub fn hold(body: Body, permit: Option<Permit>, admission: &Arc<Admission>, sse: bool) -> Body {
    Held {
        inner: body,
        _permit: permit,
        admission: admission.clone(),
        sse,
        open_event: false,
        idle: None,
        armed: false,
        done: false,
    }
    .boxed_unsync()
}

struct Held {
    inner: Body,
    _permit: Option<Permit>,
    admission: Arc<Admission>,
    sse: bool,
    /// The last data sent ended inside an SSE event.
    open_event: bool,
    /// Made at the first wait (most bodies never wait long enough to need it).
    idle: Option<Pin<Box<Sleep>>>,
    /// The timer runs from the wait's start.
    armed: bool,
    done: bool,
}

impl Held {
    /// The engine went silent: count it, end the body.
    fn stalled(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        self.done = true;
        // Drop the engine's body now: its connection closes (the engine aborts the request)
        // and its in-flight slot is released, whenever the client reads the end.
        self.inner = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        self.admission.idle_timeouts.fetch_add(1, Ordering::Relaxed);
        let limit = self.admission.limits.upstream_idle_timeout;
        let message = format!(
            "The engine sent nothing for {} ms (upstream idle timeout).",
            limit.as_millis()
        );
        tracing::warn!(?limit, "engine response stalled; giving up");
        if !self.sse {
            return Some(Err(message.into()));
        }
        let body = serde_json::json!({"error": {"message": message, "type": "GatewayTimeoutError",
            "param": null, "code": 504}});
        let lead = if self.open_event { "\n\n" } else { "" };
        Some(Ok(Frame::data(Bytes::from(format!(
            "{lead}data: {body}\n\ndata: [DONE]\n\n"
        )))))
    }
}

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.armed = false;
                if this.sse
                    && let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref))
                    && let Some(data) = data
                    && !data.is_empty()
                {
                    this.open_event = !sse::ends_event(data);
                }
                Poll::Ready(frame)
            }
            Poll::Pending => {
                let limit: Duration = this.admission.limits.upstream_idle_timeout;
                let deadline = Instant::now() + limit;
                let idle = this
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if !this.armed {
                    idle.as_mut().reset(deadline);
                    this.armed = true;
                }
                match idle.as_mut().poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(()) => Poll::Ready(this.stalled()),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
