//! HTTP writes: POST (create), PUT (replace), PATCH (merge, JSON patch, strategic merge as
//! merge, server-side apply as a merge of the applied object) and DELETE, of objects and of
//! the `/status` subresource; each one recorded with who sent it.

use std::collections::HashMap;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;

use super::{
    resources::{ResourceType, Target},
    server::{Body, json_response, key_of_target},
    state::{RecordedWrite, Shared},
    status::ApiError,
    store::Store,
};

/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 1 << 20;

/// How a PATCH body changes the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatchKind {
    Merge,
    Json,
    Apply,
}

fn patch_kind(content_type: &str) -> Result<PatchKind, ApiError> {
    match content_type.split(';').next().unwrap_or_default().trim() {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            Ok(PatchKind::Merge)
        }
        "application/json-patch+json" => Ok(PatchKind::Json),
        "application/apply-patch+yaml" => Ok(PatchKind::Apply),
        other => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of a PATCH cannot be {other:?}"),
        )),
    }
}

fn parse_body(bytes: &Bytes, yaml: bool) -> Result<Value, ApiError> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(bytes).or_else(|e| {
        if yaml {
            serde_norway::from_slice(bytes).map_err(|y| {
                ApiError::bad_request(format!("the body is neither JSON ({e}) nor YAML ({y})"))
            })
        } else {
            Err(ApiError::bad_request(format!("the body is not JSON: {e}")))
        }
    })
}

/// Reads the body whole (at most [`MAX_BODY`]) and parses it as JSON (or YAML for an
/// apply); an empty body is `null`.
async fn read_body(body: Incoming, yaml: bool) -> Result<Value, ApiError> {
    let bytes = http_body_util::Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| ApiError::new(413, "RequestEntityTooLarge", format!("request body: {e}")))?;
    parse_body(&bytes, yaml)
}

/// Performs one write on the store.
fn dispatch(
    store: &mut Store,
    method: &Method,
    target: &Target,
    content_type: Option<&str>,
    has_field_manager: bool,
    body: Value,
) -> Result<(StatusCode, Value), ApiError> {
    match (method, target.name.is_some()) {
        (&Method::POST, false) => create(store, target, body),
        (&Method::PUT, true) => replace(store, target, body),
        (&Method::PATCH, true) => {
            let kind = patch_kind(content_type.unwrap_or_default())?;
            if kind == PatchKind::Apply && !has_field_manager {
                return Err(ApiError::bad_request(
                    "fieldManager is required for apply requests",
                ));
            }
            patch(store, target, kind, body)
        }
        (&Method::DELETE, true) => delete(store, target, &body).map(|obj| (StatusCode::OK, obj)),
        _ => Err(ApiError::method_not_allowed(method.as_str(), "this path")),
    }
}

/// Serves a POST, PUT, PATCH or DELETE and records it. The record is made before the
/// written object can be read back, so a test that saw the change finds the write.
pub(crate) async fn handle(
    shared: &Shared,
    target: Target,
    params: HashMap<String, String>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    let text = |h: header::HeaderName| {
        req.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let content_type = text(header::CONTENT_TYPE);
    let user_agent = text(header::USER_AGENT);
    let headers = req
        .headers()
        .iter()
        .filter(|(name, _)| *name != header::AUTHORIZATION)
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_string(), value)
        })
        .collect();
    let field_manager = params.get("fieldManager").cloned();
    let yaml = content_type.as_deref().is_some_and(|c| c.contains("yaml"));
    let body = read_body(req.into_body(), yaml).await;
    let result = shared.write(|store| {
        let result = body.clone().and_then(|b| {
            dispatch(
                store,
                &method,
                &target,
                content_type.as_deref(),
                field_manager.is_some(),
                b,
            )
        });
        let name = target.name.clone().or_else(|| {
            let b = body.as_ref().ok()?;
            b["metadata"]["name"].as_str().map(str::to_string)
        });
        let record = RecordedWrite {
            method: method.to_string(),
            plural: store.kinds[target.kind].plural,
            namespace: target.namespace.clone(),
            name: name.unwrap_or_default(),
            subresource: target.status.then(|| "status".to_string()),
            field_manager,
            user_agent,
            headers,
            content_type,
            body: body.unwrap_or(Value::Null),
            code: result.as_ref().map_or_else(|e| e.code, |(c, _)| c.as_u16()),
        };
        (result, record)
    });
    shared.count(target.kind, |c| c.writes += 1);
    result.map(|(code, obj)| json_response(code, &obj))
}

/// The object a write stores: with the status subresource, a write to `/status` changes
/// only `status`, and a write to the object keeps the stored `status`.
fn with_status_rules(
    rt: &ResourceType,
    target: &Target,
    mut new: Value,
    prev: Option<&Value>,
) -> Value {
    if target.status {
        let mut obj = prev.cloned().unwrap_or(Value::Null);
        match new.get_mut("status").map(Value::take) {
            Some(status) => obj["status"] = status,
            None => {
                if let Some(m) = obj.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        return obj;
    }
    if rt.status_subresource && new.is_object() {
        match prev.and_then(|p| p.get("status")).cloned() {
            Some(status) => new["status"] = status,
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    new
}

/// Checks the written object is the one the path names and stores it.
fn store_write(
    store: &mut Store,
    target: &Target,
    new: Value,
    prev: Option<&Value>,
) -> Result<Value, ApiError> {
    let rt = store.kinds[target.kind].clone();
    let mut obj = with_status_rules(&rt, target, new, prev);
    let key = store.key_of(target.kind, &mut obj, target.namespace.as_deref())?;
    if let Some(name) = &target.name
        && key.2 != *name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            key.2
        )));
    }
    store.commit(key, obj)
}

fn stored_rv(obj: &Value) -> Option<&str> {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
}

fn conflict_check(new: &Value, prev: &Value) -> Result<(), ApiError> {
    match stored_rv(new) {
        Some(rv) if Some(rv) != stored_rv(prev) => Err(ApiError::conflict(format!(
            "Operation cannot be fulfilled on {:?}: the object has been modified; please apply your changes to the latest version and try again",
            prev["metadata"]["name"].as_str().unwrap_or_default()
        ))),
        _ => Ok(()),
    }
}

fn existing(store: &Store, target: &Target) -> Result<Value, ApiError> {
    let name = target.name.as_deref().unwrap_or_default();
    store.get(&key_of_target(target)).cloned().ok_or_else(|| {
        ApiError::not_found(&format!("{} {name:?}", store.kinds[target.kind].plural))
    })
}

fn create(
    store: &mut Store,
    target: &Target,
    body: Value,
) -> Result<(StatusCode, Value), ApiError> {
    let mut probe = body.clone();
    let key = store.key_of(target.kind, &mut probe, target.namespace.as_deref())?;
    if store.get(&key).is_some() {
        return Err(ApiError::new(
            409,
            "AlreadyExists",
            format!(
                "{} {:?} already exists",
                store.kinds[target.kind].plural, key.2
            ),
        ));
    }
    let mut body = body;
    if let Some(m) = body["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    store_write(store, target, body, None).map(|o| (StatusCode::CREATED, o))
}

fn replace(
    store: &mut Store,
    target: &Target,
    body: Value,
) -> Result<(StatusCode, Value), ApiError> {
    let prev = existing(store, target)?;
    conflict_check(&body, &prev)?;
    store_write(store, target, body, Some(&prev)).map(|o| (StatusCode::OK, o))
}

fn patch(
    store: &mut Store,
    target: &Target,
    kind: PatchKind,
    body: Value,
) -> Result<(StatusCode, Value), ApiError> {
    let prev = match existing(store, target) {
        Ok(prev) => prev,
        // Server-side apply creates what does not exist.
        Err(e) if e.code == 404 && kind == PatchKind::Apply && !target.status => {
            return create(
                store,
                &Target {
                    name: None,
                    ..target.clone()
                },
                body,
            )
            .and_then(|(code, obj)| {
                let name = obj["metadata"]["name"].as_str().unwrap_or_default();
                if Some(name) == target.name.as_deref() {
                    Ok((code, obj))
                } else {
                    Err(ApiError::bad_request(
                        "the applied object's name does not match the URL",
                    ))
                }
            });
        }
        Err(e) => return Err(e),
    };
    let mut patched = prev.clone();
    match kind {
        PatchKind::Merge | PatchKind::Apply => {
            if !body.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(&mut patched, &body);
        }
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(body)
                .map_err(|e| ApiError::bad_request(format!("not a JSON patch: {e}")))?;
            json_patch::patch(&mut patched, &ops).map_err(|e| {
                ApiError::new(422, "Invalid", format!("the JSON patch failed: {e}"))
            })?;
        }
    }
    conflict_check(&patched, &prev)?;
    store_write(store, target, patched, Some(&prev)).map(|o| (StatusCode::OK, o))
}

fn delete(store: &mut Store, target: &Target, body: &Value) -> Result<Value, ApiError> {
    if target.status {
        return Err(ApiError::method_not_allowed(
            "DELETE",
            "a status subresource",
        ));
    }
    let prev = existing(store, target)?;
    let pre = &body["preconditions"];
    if let Some(rv) = pre["resourceVersion"].as_str()
        && Some(rv) != stored_rv(&prev)
    {
        return Err(ApiError::conflict(
            "the resourceVersion in the precondition does not match",
        ));
    }
    if let Some(uid) = pre["uid"].as_str()
        && Some(uid) != prev["metadata"]["uid"].as_str()
    {
        return Err(ApiError::conflict(
            "the uid in the precondition does not match",
        ));
    }
    store.remove(&key_of_target(target))
}
