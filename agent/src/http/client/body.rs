//! A response body read straight off the engine's connection, its framing decoded as it is
//! polled; the connection goes home when the body ends cleanly.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use hyper::body::Frame;

use super::{Conn, H1Error, Shared, exchange::poll_read_more};
use crate::http::framing::{Decoded, Framing};

/// A response body read straight off the engine's connection.
#[derive(Debug)]
pub struct H1Body {
    pub(super) conn: Option<Conn>,
    pub(super) framing: Framing,
    /// Where the connection goes back when the body ended cleanly (absent: not reusable).
    pub(super) home: Option<(Arc<Shared>, Arc<str>)>,
}

// === impl H1Body ===

impl H1Body {
    /// The body ended: the connection goes home if it can be reused.
    pub(super) fn finish(&mut self) {
        self.framing = Framing::Done;
        if let (Some(conn), Some((shared, authority))) = (self.conn.take(), self.home.take())
            // Bytes past the response mean the engine is confused: do not reuse.
            && conn.buf.is_empty()
        {
            shared.checkin(&authority, conn);
        }
    }

    /// The body cannot go on: the connection is closed, the error reported once.
    fn fail(&mut self, err: H1Error) -> H1Error {
        self.conn = None;
        self.home = None;
        self.framing = Framing::Done;
        err
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, H1Error>>> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match self.framing.decode(&mut conn.buf) {
                Ok(Decoded::Data(data)) => {
                    if self.framing.is_done() {
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(data)));
                }
                Ok(Decoded::End) => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => {}
                Err(err) => return Poll::Ready(Some(Err(self.fail(err.into())))),
            }
            match std::task::ready!(poll_read_more(conn, cx)) {
                Ok(0) => match self.framing.at_eof() {
                    Ok(()) => {
                        // Until-close bodies: the connection is spent.
                        self.conn = None;
                        return Poll::Ready(None);
                    }
                    Err(_) => return Poll::Ready(Some(Err(self.fail(H1Error::ClosedInBody)))),
                },
                Ok(_) => {}
                Err(err) => return Poll::Ready(Some(Err(self.fail(err.into())))),
            }
        }
    }
}

impl hyper::body::Body for H1Body {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        self.get_mut()
            .poll_data(cx)
            .map(|d| d.map(|d| d.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.framing.is_done()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.framing.remaining() {
            Some(n) => hyper::body::SizeHint::with_exact(n),
            None => hyper::body::SizeHint::default(),
        }
    }
}
