//! The HTTP side: accepting connections, the bearer token, injected failures, discovery,
//! and the dispatch to reads (`reads.rs`), writes (`writes.rs`) and discovery.

use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;

use super::{
    discovery,
    reads::{get, list, watch},
    resources::{PathKind, Target, parse_path},
    state::Shared,
    status::ApiError,
    writes,
};

pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// Connections served at once; more are closed on accept (no test opens this many).
const MAX_CONNECTIONS: usize = 1_024;

/// Accepts until the task is aborted; connections live in a `JoinSet` owned by this task,
/// so aborting it closes them all.
pub(crate) async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors or a reset before accept: try again shortly.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        if connections.len() >= MAX_CONNECTIONS {
            continue;
        }
        let shared = shared.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move {
                    Ok::<_, Infallible>(handle(&shared, req).await.unwrap_or_else(error_response))
                }
            });
            // A connection error is the client's business (it hung up); nothing to report.
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(
        Full::new(Bytes::from(bytes))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn error_response(e: ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json_response(code, &e.to_status());
    if code == StatusCode::TOO_MANY_REQUESTS {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    resp
}

/// Query parameters, decoded (`+` is a space, as form encoding writes it).
pub(crate) fn query_params(query: Option<&str>) -> HashMap<String, String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

async fn handle(shared: &Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let expected = format!("Bearer {}", shared.token);
    if req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(expected.as_str())
    {
        return Err(ApiError::new(401, "Unauthorized", "no valid bearer token"));
    }
    let path = req.uri().path().to_string();
    if path == "/version" {
        return Ok(json_response(StatusCode::OK, &discovery::version()));
    }
    let parsed = parse_path(&path).ok_or_else(|| ApiError::not_found(&format!("path {path}")))?;
    let target = match parsed {
        PathKind::Discovery { group, version } => {
            inject_failure(shared, None)?;
            let body = discovery::discovery(&shared.store.lock().kinds, group, version)?;
            return Ok(json_response(StatusCode::OK, &body));
        }
        PathKind::Resource {
            group,
            version,
            namespace,
            plural,
            name,
            subresource,
        } => resolve(shared, group, version, namespace, plural, name, subresource)?,
    };
    inject_failure(shared, Some(target.kind))?;
    let params = query_params(req.uri().query());
    match (req.method().clone(), target.name.is_some()) {
        (Method::GET, false)
            if matches!(params.get("watch").map(String::as_str), Some("true" | "1")) =>
        {
            watch(shared, &target, &params)
        }
        (Method::GET, false) => list(shared, &target, &params),
        (Method::GET, true) => get(shared, &target),
        (Method::POST | Method::PUT | Method::PATCH | Method::DELETE, _) => {
            writes::handle(shared, target, params, req).await
        }
        (method, _) => Err(ApiError::method_not_allowed(method.as_str(), &path)),
    }
}

/// Answers the request with the failure the test asked for, if any remain.
fn inject_failure(shared: &Shared, kind: Option<usize>) -> Result<(), ApiError> {
    let code = {
        let mut knobs = shared.knobs.lock();
        let (left, code) = &mut knobs.failures;
        if *left == 0 {
            return Ok(());
        }
        *left -= 1;
        *code
    };
    if let Some(kind) = kind {
        shared.count(kind, |c| c.injected_failures += 1);
    }
    let reason = if code == 429 {
        "TooManyRequests"
    } else {
        "InternalError"
    };
    Err(ApiError::new(code, reason, "failure injected by the test"))
}

#[allow(clippy::too_many_arguments)]
fn resolve(
    shared: &Shared,
    group: &str,
    version: &str,
    namespace: Option<&str>,
    plural: &str,
    name: Option<&str>,
    subresource: Option<&str>,
) -> Result<Target, ApiError> {
    let store = shared.store.lock();
    let kind = store.kind_by_path(group, version, plural).ok_or_else(|| {
        ApiError::not_found(&format!(
            "the server could not find the requested resource {group}/{version}/{plural}"
        ))
    })?;
    let rt = &store.kinds[kind];
    if namespace.is_some() && !rt.namespaced {
        return Err(ApiError::not_found(&format!(
            "{plural} is cluster-scoped; namespaced path"
        )));
    }
    if name.is_some() && rt.namespaced && namespace.is_none() {
        return Err(ApiError::not_found(&format!(
            "{plural} is namespaced; path without a namespace"
        )));
    }
    let status = match subresource {
        None => false,
        Some("status") if rt.status_subresource => true,
        Some(other) => {
            return Err(ApiError::not_found(&format!(
                "subresource {other} of {plural}"
            )));
        }
    };
    Ok(Target {
        kind,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        status,
    })
}

pub(crate) fn key_of_target(target: &Target) -> (usize, String, String) {
    (
        target.kind,
        target.namespace.clone().unwrap_or_default(),
        target.name.clone().unwrap_or_default(),
    )
}
