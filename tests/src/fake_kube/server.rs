//! The HTTP side: accepting connections, the bearer token, injected failures, discovery,
//! GET (object, list, watch) and the dispatch of writes to `writes.rs`.

use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};

use super::{
    Shared,
    resources::{PathKind, ResourceType, Target, parse_path},
    selector::{FieldSelector, LabelSelector, Selectors},
    status::ApiError,
    watch::{self, WatchRequest},
    writes,
};

pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// The server's default watch length when a request names none (kube always does).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// Longest watch a request may ask for.
const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(3600);

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
        while connections.try_join_next().is_some() {}
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
        return Ok(json_response(StatusCode::OK, &version()));
    }
    let parsed = parse_path(&path).ok_or_else(|| ApiError::not_found(&format!("path {path}")))?;
    let target = match parsed {
        PathKind::Discovery { group, version } => {
            inject_failure(shared, None)?;
            return discovery(shared, group, version).map(|v| json_response(StatusCode::OK, &v));
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

fn get(shared: &Shared, target: &Target) -> Result<Response<Body>, ApiError> {
    shared.count(target.kind, |c| c.gets += 1);
    let store = shared.store.lock();
    let name = target.name.as_deref().unwrap_or_default();
    let obj = store.get(&key_of_target(target)).ok_or_else(|| {
        ApiError::not_found(&format!("{} {name:?}", store.kinds[target.kind].plural))
    })?;
    Ok(json_response(StatusCode::OK, obj))
}

fn selectors(rt: &ResourceType, params: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    Ok(Selectors {
        labels: LabelSelector::parse(params.get("labelSelector").map_or("", String::as_str))?,
        fields: FieldSelector::parse(params.get("fieldSelector").map_or("", String::as_str), rt)?,
    })
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version {s:?}")))
}

/// `continue` tokens: `{resourceVersion of the first page}/{namespace}/{name}` of the last
/// item returned (names and namespaces hold no `/`).
fn parse_continue(token: &str, kind: usize) -> Result<(u64, (usize, String, String)), ApiError> {
    let bad = || ApiError::bad_request(format!("invalid continue token {token:?}"));
    let mut parts = token.splitn(3, '/');
    let (Some(rv), Some(ns), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let rv = rv.parse().map_err(|_| bad())?;
    Ok((rv, (kind, ns.to_string(), name.to_string())))
}

fn list(
    shared: &Shared,
    target: &Target,
    params: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let rt = shared.store.lock().kinds[target.kind].clone();
    let sel = selectors(&rt, params)?;
    let limit = match params.get("limit").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        ),
    };
    let rv = params.get("resourceVersion").filter(|s| !s.is_empty());
    let rv_match = params.get("resourceVersionMatch").filter(|s| !s.is_empty());
    let token = params.get("continue").filter(|s| !s.is_empty());
    if token.is_some() && rv.is_some() {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    if rv_match.is_some() && rv.is_none() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    let store = shared.store.lock();
    let current = store.resource_version();
    let wanted = rv.map(|s| parse_rv(s)).transpose()?;
    match (rv_match.map(String::as_str), wanted) {
        (Some("Exact"), Some(w)) if w < current => {
            return Err(ApiError::expired(format!(
                "too old resource version: {w} ({current})"
            )));
        }
        (Some("Exact" | "NotOlderThan") | None, Some(w)) if w > current => {
            return Err(ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {w}, current: {current}"),
            ));
        }
        (Some("Exact" | "NotOlderThan") | None, _) => {}
        (Some(other), _) => {
            return Err(ApiError::bad_request(format!(
                "unsupported resourceVersionMatch {other:?}"
            )));
        }
    }
    let (page_rv, after) = match token {
        Some(t) => {
            let (rv, after) = parse_continue(t, target.kind)?;
            if store.is_expired(rv) {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, Some(after))
        }
        None => (current, None),
    };
    let page = store.list(target.kind, target.namespace.as_deref(), &sel, limit, after);
    drop(store);
    shared.count(target.kind, |c| c.lists += 1);
    let mut metadata = json!({"resourceVersion": page_rv.to_string()});
    if let Some((_, ns, name)) = &page.next {
        metadata["continue"] = json!(format!("{page_rv}/{ns}/{name}"));
        metadata["remainingItemCount"] = json!(page.remaining);
    }
    let body = json!({
        "kind": format!("{}List", rt.kind),
        "apiVersion": rt.api_version(),
        "metadata": metadata,
        "items": page.items,
    });
    Ok(json_response(StatusCode::OK, &body))
}

fn watch(
    shared: &Arc<Shared>,
    target: &Target,
    params: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let rt = shared.store.lock().kinds[target.kind].clone();
    let flag = |k: &str| matches!(params.get(k).map(String::as_str), Some("true" | "1"));
    let initial_events = flag("sendInitialEvents");
    if initial_events
        && params.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan")
    {
        return Err(ApiError::bad_request(
            "sendInitialEvents requires resourceVersionMatch=NotOlderThan",
        ));
    }
    let timeout = match params.get("timeoutSeconds") {
        None => DEFAULT_WATCH_TIMEOUT,
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        ),
    };
    let req = WatchRequest {
        kind: target.kind,
        namespace: target.namespace.clone(),
        selectors: selectors(&rt, params)?,
        from: params
            .get("resourceVersion")
            .filter(|s| !s.is_empty())
            .map(|s| parse_rv(s))
            .transpose()?,
        bookmarks: flag("allowWatchBookmarks"),
        timeout: timeout.min(MAX_WATCH_TIMEOUT),
        initial_events,
    };
    let http_410 = shared.knobs.lock().expiry == super::Expiry::Http410;
    let chunks = watch::open(shared.clone(), req, http_410)?;
    let body = StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(chunks).map(|r| r.map(Frame::data)),
    );
    let mut resp = Response::new(BodyExt::boxed(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-warmpath-fake",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn discovery(
    shared: &Shared,
    group: Option<&str>,
    version: Option<&str>,
) -> Result<Value, ApiError> {
    let store = shared.store.lock();
    let kinds = &store.kinds;
    let group_of = |g: &str| -> Value {
        let versions: Vec<Value> = kinds
            .iter()
            .filter(|k| k.group == g)
            .map(|k| k.version)
            .fold(Vec::new(), |mut v, x| {
                if !v.contains(&x) {
                    v.push(x);
                }
                v
            })
            .into_iter()
            .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
            .collect();
        json!({"name": g, "versions": versions, "preferredVersion": versions.first()})
    };
    match (group, version) {
        (Some(""), None) => Ok(json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})),
        (None, _) => {
            let mut names: Vec<&str> = kinds
                .iter()
                .map(|k| k.group)
                .filter(|g| !g.is_empty())
                .collect();
            names.dedup();
            names.sort_unstable();
            names.dedup();
            let groups: Vec<Value> = names.into_iter().map(group_of).collect();
            Ok(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
        }
        (Some(g), None) if kinds.iter().any(|k| k.group == g) => {
            let mut v = group_of(g);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            Ok(v)
        }
        (Some(g), Some(ver)) if kinds.iter().any(|k| k.group == g && k.version == ver) => {
            let resources: Vec<Value> = kinds
                .iter()
                .filter(|k| k.group == g && k.version == ver)
                .flat_map(|k| {
                    let main = json!({"name": k.plural, "singularName": k.kind.to_lowercase(),
                        "namespaced": k.namespaced, "kind": k.kind,
                        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]});
                    let status = k.status_subresource.then(|| {
                        json!({"name": format!("{}/status", k.plural),
                        "singularName": "", "namespaced": k.namespaced, "kind": k.kind,
                        "verbs": ["get", "patch", "update"]})
                    });
                    std::iter::once(main).chain(status)
                })
                .collect();
            let group_version = if g.is_empty() {
                ver.to_string()
            } else {
                format!("{g}/{ver}")
            };
            Ok(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": group_version, "resources": resources}))
        }
        (Some(g), v) => Err(ApiError::not_found(&format!(
            "API group {g:?} version {v:?}"
        ))),
    }
}
