//! Telling HTTP/1.x from h2c (prior knowledge) by a connection's first bytes, and giving
//! those bytes back to whichever server reads the connection.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf},
    net::TcpStream,
};

use super::READ_CHUNK;

/// The client connection preface of HTTP/2 (h2c with prior knowledge).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a new connection speaks, from its first bytes.
#[derive(Debug)]
pub enum Sniffed {
    Http1,
    H2,
    /// Closed before saying anything.
    Closed,
}

/// Reads until the first bytes tell HTTP/1.x from the HTTP/2 preface; they stay in `buf`.
pub async fn sniff(stream: &mut TcpStream, buf: &mut BytesMut) -> io::Result<Sniffed> {
    loop {
        let n = buf.len().min(H2_PREFACE.len());
        if buf[..n] != H2_PREFACE[..n] {
            return Ok(Sniffed::Http1);
        }
        if n == H2_PREFACE.len() {
            return Ok(Sniffed::H2);
        }
        buf.reserve(READ_CHUNK);
        if stream.read_buf(buf).await? == 0 {
            return Ok(if buf.is_empty() {
                Sniffed::Closed
            } else {
                Sniffed::Http1
            });
        }
    }
}

/// A connection whose first bytes were read already (to tell the protocol): they are read
/// again first.
#[derive(Debug)]
pub struct Rewind {
    pre: Bytes,
    io: TcpStream,
}

impl Rewind {
    pub fn new(pre: Bytes, io: TcpStream) -> Self {
        Self { pre, io }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.pre.is_empty() {
            let n = this.pre.len().min(out.remaining());
            out.put_slice(&this.pre.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, out)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, b)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
