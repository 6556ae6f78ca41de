//! The admin listener (127.0.0.1 by default): `/status` (JSON), `/metrics` (Prometheus),
//! `/ready`, `/live`.

use std::{convert::Infallible, fmt::Write as _, sync::Arc};

use http::{Method, StatusCode};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use super::Proxy;
use crate::http::{Body, message::full};

/// Serves the admin endpoints until the task is dropped.
pub async fn serve_admin(listener: TcpListener, proxy: Arc<Proxy>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(admin(&proxy, req.method(), req.uri().path())) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn admin(proxy: &Proxy, method: &Method, path: &str) -> http::Response<Body> {
    match (method, path) {
        (&Method::GET, "/live") => full(StatusCode::OK, "text/plain", "live\n"),
        (&Method::GET, "/ready") => full(StatusCode::OK, "text/plain", "ready\n"),
        (&Method::GET, "/status") => full(
            StatusCode::OK,
            "application/json",
            status(proxy).to_string(),
        ),
        (&Method::GET, "/metrics") => {
            full(StatusCode::OK, "text/plain; version=0.0.4", metrics(proxy))
        }
        _ => super::ProxyError::new(StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

/// Pools and their pods (load, index health and size per pod), and the tenants' live figures.
pub fn status(proxy: &Proxy) -> serde_json::Value {
    let sources = proxy.index.status();
    let mut pods = Vec::new();
    let mut pools = Vec::new();
    for p in &proxy.pools {
        for e in &p.pool.endpoints {
            let index = e
                .source
                .and_then(|s| sources.iter().find(|(id, _)| *id == s))
                .map(|(_, st)| st.clone());
            let trusted = e.source.is_some_and(|s| proxy.index.trusted(s));
            pods.push(
                serde_json::json!({"pool": p.name, "load": e.snapshot(), "index": index,
                "lora": e.lora_info(), "prefix_weight": u8::from(trusted)}),
            );
        }
        pools.push(serde_json::json!({"name": p.name, "model": p.pool.model,
            "policy": format!("{:?}", p.pool.policy.kind), "weights": p.pool.policy.weights,
            "block_size": p.pool.block_size, "tokens": p.tokens.name(), "upstream": p.protocol.as_str(),
            "endpoints": p.pool.endpoints.len()}));
    }
    let first = &proxy.pools[0].pool;
    serde_json::json!({"model": first.model, "policy": format!("{:?}", first.policy.kind),
        "block_size": first.block_size, "pools": pools, "index_entries": proxy.index.len(),
        "index_bytes": proxy.index.bytes(), "pods": pods, "tenants": proxy.telemetry.live()})
}

fn metrics(proxy: &Proxy) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# TYPE warmpath_endpoint_requests_total counter");
    for e in proxy.pools.iter().flat_map(|p| &p.pool.endpoints) {
        let s = e.snapshot();
        let _ = writeln!(
            out,
            "warmpath_endpoint_requests_total{{endpoint=\"{}\"}} {}",
            s.endpoint, s.requests
        );
    }
    let _ = writeln!(out, "# TYPE warmpath_endpoint_in_flight gauge");
    for e in proxy.pools.iter().flat_map(|p| &p.pool.endpoints) {
        let _ = writeln!(
            out,
            "warmpath_endpoint_in_flight{{endpoint=\"{}\"}} {}",
            e.authority,
            e.in_flight()
        );
    }
    let _ = writeln!(
        out,
        "# TYPE warmpath_index_entries gauge\nwarmpath_index_entries {}",
        proxy.index.len()
    );
    out.push_str(&proxy.telemetry.prometheus());
    out
}
