//! The admin listener (127.0.0.1 by default): `/status` (JSON), `/metrics` (Prometheus),
//! `/ready`, `/live`.

use std::{convert::Infallible, fmt::Write as _, sync::Arc};

use http::{Method, StatusCode};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use super::{Body, Proxy, full};

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

/// Pods, their load, and the index's health and size per pod.
pub fn status(proxy: &Proxy) -> serde_json::Value {
    let sources = proxy.index.status();
    let pods: Vec<_> = proxy
        .pool
        .endpoints
        .iter()
        .map(|e| {
            let index = e.source.and_then(|s| sources.iter().find(|(id, _)| *id == s)).map(|(_, st)| st.clone());
            serde_json::json!({"load": e.snapshot(), "index": index, "lora": e.lora_info(),
                "prefix_weight": if e.source.is_some_and(|s| proxy.index.trusted(s)) { 1 } else { 0 }})
        })
        .collect();
    serde_json::json!({"model": proxy.pool.model, "policy": format!("{:?}", proxy.pool.policy.kind), "weights": proxy.pool.policy.weights,
        "block_size": proxy.pool.block_size, "index_entries": proxy.index.len(),
        "index_bytes": proxy.index.bytes(), "pods": pods, "tenants": proxy.telemetry.live()})
}

fn metrics(proxy: &Proxy) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# TYPE warmpath_endpoint_requests_total counter");
    for e in &proxy.pool.endpoints {
        let s = e.snapshot();
        let _ = writeln!(
            out,
            "warmpath_endpoint_requests_total{{endpoint=\"{}\"}} {}",
            s.endpoint, s.requests
        );
    }
    let _ = writeln!(out, "# TYPE warmpath_endpoint_in_flight gauge");
    for e in &proxy.pool.endpoints {
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
