//! The Gateway API Inference Extension's `InferencePool` (`inference.networking.k8s.io/v1`,
//! namespaced): which pods serve one model, and on which port. A pool configured with
//! `inferencePool: {namespace, name}` follows that one object: its `spec.selector.matchLabels`
//! and `spec.targetPorts[0].number` become the pods watcher's [`Selection`], restarted when
//! they change.
//!
//! Only the fields read here are typed; the rest of the object (status, the endpoint
//! picker's settings) is accepted and ignored, so newer servers' additions do not break
//! the watch.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::config::check_match_labels;

/// The pods a pool's endpoints come from: those of `namespace` carrying every one of
/// `match_labels`, served on `port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub namespace: String,
    pub match_labels: BTreeMap<String, String>,
    pub port: u16,
}

impl Selection {
    /// The label selector as the API server takes it (`app=vllm,tier=gpu`).
    pub fn label_selector(&self) -> String {
        self.match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `InferencePool.spec`, the fields the agent reads (upstream `api/v1/inferencepool_types.go`).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "inference.networking.k8s.io",
    version = "v1",
    kind = "InferencePool",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Pods of the pool's namespace with these labels are its members.
    #[serde(default)]
    pub selector: PoolLabelSelector,
    /// The members' serving port (upstream allows exactly one).
    #[serde(default)]
    pub target_ports: Vec<TargetPort>,
    /// The endpoint picker a Gateway would consult; not used by the agent, which picks
    /// itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker_ref: Option<EndpointPickerRef>,
}

/// Upstream's simplified label selector: `matchLabels` only.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolLabelSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// One `targetPorts` entry.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
pub struct TargetPort {
    pub number: i64,
}

/// `endpointPickerRef`, kept for status and logs only.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerRef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_number: Option<i64>,
}

/// What an `InferencePool` selects, or why it cannot be used (the pool then has no
/// endpoints, and the reason is logged).
pub fn selection_of(pool: &InferencePool) -> Result<Selection, String> {
    let namespace = pool
        .metadata
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or("it has no namespace")?;
    check_match_labels(&pool.spec.selector.match_labels)
        .map_err(|(_, m)| format!("spec.selector.matchLabels: {m}"))?;
    let port = match pool.spec.target_ports.as_slice() {
        [] => return Err("spec.targetPorts is empty".into()),
        [first, ..] => u16::try_from(first.number)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                format!(
                    "spec.targetPorts[0].number: {} is not a port (1 to 65535)",
                    first.number
                )
            })?,
    };
    Ok(Selection {
        namespace,
        match_labels: pool.spec.selector.match_labels.clone(),
        port,
    })
}

/// Keeps what [`selection_of`] reads.
pub fn slim(pool: &mut InferencePool) {
    pool.metadata.managed_fields = None;
    pool.metadata.annotations = None;
    pool.metadata.labels = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(json: serde_json::Value) -> InferencePool {
        serde_json::from_value(json).unwrap()
    }

    fn upstream_example() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "llama", "namespace": "ml", "resourceVersion": "7"},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm-llama"}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": "llama-epp", "portNumber": 9002, "failureMode": "FailClose"}
            },
            "status": {"parents": [{"parentRef": {"name": "gw"}, "conditions": []}]}
        })
    }

    #[test]
    fn an_upstream_object_selects_its_pods() {
        let p = pool(upstream_example());
        assert_eq!(
            selection_of(&p),
            Ok(Selection {
                namespace: "ml".into(),
                match_labels: [("app".to_string(), "vllm-llama".to_string())].into(),
                port: 8000,
            })
        );
        assert_eq!(
            p.spec.endpoint_picker_ref.map(|r| r.name),
            Some("llama-epp".into())
        );
        let two = Selection {
            namespace: "ml".into(),
            match_labels: [("a", "1"), ("b", "2")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            port: 1,
        };
        assert_eq!(two.label_selector(), "a=1,b=2");
    }

    #[test]
    fn unusable_objects_say_why() {
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v = upstream_example();
            f(&mut v);
            selection_of(&pool(v)).unwrap_err()
        };
        for (edit, why) in [
            (
                &(|v: &mut serde_json::Value| v["spec"]["targetPorts"] = serde_json::json!([]))
                    as &dyn Fn(&mut serde_json::Value),
                "spec.targetPorts is empty",
            ),
            (
                &|v: &mut serde_json::Value| {
                    v["spec"]["targetPorts"] = serde_json::json!([{"number": 70000}])
                },
                "70000 is not a port",
            ),
            (
                &|v: &mut serde_json::Value| {
                    v["spec"]["targetPorts"] = serde_json::json!([{"number": 0}])
                },
                "0 is not a port",
            ),
            (
                &|v: &mut serde_json::Value| v["spec"]["selector"] = serde_json::json!({}),
                "empty selector",
            ),
            (
                &|v: &mut serde_json::Value| {
                    v["spec"]["selector"]["matchLabels"] = serde_json::json!({"app": "a b"})
                },
                "value `a b`",
            ),
            (
                &|v: &mut serde_json::Value| v["metadata"]["namespace"] = serde_json::Value::Null,
                "no namespace",
            ),
        ] {
            let e = with(edit);
            assert!(e.contains(why), "want {why}: {e}");
        }
    }
}
