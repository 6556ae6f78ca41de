//! Step 1 of a request: the listener. Connections are accepted on the agent's runtime and
//! handed to a data-path worker ([`super::workers`]), where the first bytes tell HTTP/1.x
//! (warmpath's own server, [`crate::http::server`]) from h2c with prior knowledge (hyper's
//! server). Either way a request ends up in [`super::handle`], with the connection's
//! [`ClientOrigin`]: the client's address and, when the eBPF data path intercepted the
//! connection, the VIP it dialled and the cgroup it came from (docs/ebpf.md).

use std::{convert::Infallible, net::IpAddr, net::SocketAddr, sync::Arc};

pub use crate::ebpf::Intercepted;

use http::StatusCode;
use http_body_util::{BodyExt, Limited};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

use super::{Proxy, ProxyError, Workers, handle::respond};
use crate::http::{
    Body,
    server::{self, Rewind, Sniffed},
};

/// Serves the proxy on `listener` until the task is dropped: each connection accepted is
/// served on one of `workers`.
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>, workers: Arc<Workers>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(err) => {
                tracing::warn!(%err, "accept failed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (intercepted, held) = origin(&stream, peer).unzip();
        let client = ClientOrigin {
            addr: peer.ip(),
            intercepted,
        };
        let proxy = proxy.clone();
        workers.serve(stream, move |stream| async move {
            connection(stream, client, proxy).await;
            // The connection is closed: its origin entry goes (getpeername() read it till now).
            drop(held);
        });
    }
}

/// Who is at the other end of a client connection, for every request on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOrigin {
    /// The client's address (interception keeps it: the connection comes from the pod).
    pub addr: IpAddr,
    /// Where an intercepted connection was headed and which cgroup opened it; `None` when
    /// this agent does not intercept or the connection was made to the agent directly.
    pub intercepted: Option<Intercepted>,
}

impl ClientOrigin {
    /// A client at `addr`, not intercepted.
    pub fn direct(addr: IpAddr) -> Self {
        Self {
            addr,
            intercepted: None,
        }
    }
}

/// Where an intercepted connection was headed and which cgroup opened it (recorded by the
/// kernel, docs/ebpf.md), with the guard that removes the record when the connection is
/// done; `None` at the cost of one atomic load unless this agent intercepts.
fn origin(stream: &TcpStream, peer: SocketAddr) -> Option<(Intercepted, crate::ebpf::Held)> {
    if !crate::ebpf::intercepting() {
        return None;
    }
    let local = stream.local_addr().ok()?;
    let (found, held) = crate::ebpf::intercepted(peer, local)?;
    tracing::debug!(%peer, vip = %found.vip, cgroup_id = found.cgroup_id, "intercepted connection");
    Some((found, held))
}

/// Serves one client connection: HTTP/1.x on warmpath's own server, h2c on hyper's.
async fn connection(mut stream: TcpStream, client: ClientOrigin, proxy: Arc<Proxy>) {
    let mut buf = bytes::BytesMut::with_capacity(8 * 1024);
    match server::sniff(&mut stream, &mut buf).await {
        Ok(Sniffed::Http1) => {
            server::serve(stream, buf, client, proxy.as_ref()).await;
        }
        Ok(Sniffed::H2) => {
            let io = Rewind::new(buf.freeze(), stream);
            let service = service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(h2c(&proxy, client, req).await) }
            });
            let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(io), service)
                .await;
            if let Err(err) = served {
                tracing::debug!(%err, "client connection ended");
            }
        }
        Ok(Sniffed::Closed) => {}
        Err(err) => tracing::debug!(%err, "client connection ended"),
    }
}

/// A request from hyper's server (h2c): its body read (size-limited), then answered.
async fn h2c(
    proxy: &Proxy,
    client: ClientOrigin,
    req: http::Request<Incoming>,
) -> http::Response<Body> {
    let (parts, body) = req.into_parts();
    let body = Limited::new(body, proxy.max_body)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                ProxyError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("Request body exceeds {} bytes.", proxy.max_body),
                )
            } else {
                ProxyError::bad_request(format!("Could not read the request body: {e}"))
            }
        });
    respond(proxy, client, &parts.into(), body)
        .await
        .into_http()
}
