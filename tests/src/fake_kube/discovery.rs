//! Discovery documents (`/api`, `/apis`, `/apis/{group}`, `/api/v1`,
//! `/apis/{group}/{version}`) and `/version`, from the registered kinds.

use serde_json::{Value, json};

use super::{resources::ResourceType, status::ApiError};

/// `/version`: a 1.33 server.
pub(crate) fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-warmpath-fake",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// An `APIGroup` body (without kind): the group's versions, the first preferred.
fn group(kinds: &[ResourceType], g: &str) -> Value {
    let mut versions: Vec<&str> = Vec::new();
    for k in kinds.iter().filter(|k| k.group == g) {
        if !versions.contains(&k.version) {
            versions.push(k.version);
        }
    }
    let versions: Vec<Value> = versions
        .into_iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({"name": g, "versions": versions, "preferredVersion": versions.first()})
}

/// The `APIResourceList` of one group version: each kind and its status subresource.
fn resource_list(kinds: &[ResourceType], g: &str, version: &str) -> Value {
    let resources: Vec<Value> = kinds
        .iter()
        .filter(|k| k.group == g && k.version == version)
        .flat_map(|k| {
            let main = json!({
                "name": k.plural, "singularName": k.kind.to_lowercase(),
                "namespaced": k.namespaced, "kind": k.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            });
            let status = k.status_subresource.then(|| {
                json!({
                    "name": format!("{}/status", k.plural), "singularName": "",
                    "namespaced": k.namespaced, "kind": k.kind,
                    "verbs": ["get", "patch", "update"],
                })
            });
            std::iter::once(main).chain(status)
        })
        .collect();
    let group_version = if g.is_empty() {
        version.to_string()
    } else {
        format!("{g}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": group_version, "resources": resources})
}

/// The discovery document of a path: `group` None is `/apis`, `Some("")` the core group.
pub(crate) fn discovery(
    kinds: &[ResourceType],
    group_name: Option<&str>,
    version: Option<&str>,
) -> Result<Value, ApiError> {
    match (group_name, version) {
        (Some(""), None) => Ok(json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})),
        (None, _) => {
            let mut names: Vec<&str> = kinds
                .iter()
                .map(|k| k.group)
                .filter(|g| !g.is_empty())
                .collect();
            names.sort_unstable();
            names.dedup();
            let groups: Vec<Value> = names.into_iter().map(|g| group(kinds, g)).collect();
            Ok(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
        }
        (Some(g), None) if !g.is_empty() && kinds.iter().any(|k| k.group == g) => {
            let mut v = group(kinds, g);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            Ok(v)
        }
        (Some(g), Some(ver)) if kinds.iter().any(|k| k.group == g && k.version == ver) => {
            Ok(resource_list(kinds, g, ver))
        }
        (Some(g), v) => Err(ApiError::not_found(&format!(
            "API group {g:?} version {v:?}"
        ))),
    }
}
