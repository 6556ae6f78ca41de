//! Reads: GET of one object, LIST (selectors, pages, resourceVersion rules) and the start
//! of a WATCH.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::StreamExt;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::json;

use super::{
    resources::{ResourceType, Target},
    selector::{FieldSelector, LabelSelector, Selectors},
    server::{Body, json_response, key_of_target},
    state::{Expiry, Shared},
    status::ApiError,
    watch::{self, WatchRequest},
};

/// The server's default watch length when a request names none (kube always does).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// Longest watch a request may ask for.
const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(3600);

pub(crate) fn get(shared: &Shared, target: &Target) -> Result<Response<Body>, ApiError> {
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

/// What the real server refuses of a list's `resourceVersion` and `resourceVersionMatch`:
/// an exact version it no longer has (410), one it does not have yet (504).
fn check_list_version(
    rv_match: Option<&str>,
    wanted: Option<u64>,
    current: u64,
) -> Result<(), ApiError> {
    match (rv_match, wanted) {
        (Some("Exact"), Some(w)) if w < current => Err(ApiError::expired(format!(
            "too old resource version: {w} ({current})"
        ))),
        (Some("Exact" | "NotOlderThan") | None, Some(w)) if w > current => Err(ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {w}, current: {current}"),
        )),
        (Some("Exact" | "NotOlderThan") | None, _) => Ok(()),
        (Some(other), _) => Err(ApiError::bad_request(format!(
            "unsupported resourceVersionMatch {other:?}"
        ))),
    }
}

pub(crate) fn list(
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
    check_list_version(
        rv_match.map(String::as_str),
        rv.map(|s| parse_rv(s)).transpose()?,
        current,
    )?;
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

pub(crate) fn watch(
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
    let http_410 = shared.knobs.lock().expiry == Expiry::Http410;
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
