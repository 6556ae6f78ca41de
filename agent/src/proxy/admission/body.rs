//! An admitted request's response body: it holds the request's admission slot until it ends
//! or is dropped, so a stream holds its slot for as long as it runs. (The engine's silence is
//! judged where the body records its outcome: [`crate::proxy`]'s `tracked`.)

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Frame;

use super::Permit;
use crate::http::{Body, BoxError};

/// `body` with its slot (none when admission is off: the body as it is).
pub fn hold(body: Body, permit: Option<Permit>) -> Body {
    match permit {
        Some(permit) => Held {
            inner: body,
            _permit: permit,
        }
        .boxed_unsync(),
        None => body,
    }
}

struct Held {
    inner: Body,
    _permit: Permit,
}

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
