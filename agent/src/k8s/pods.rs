//! A pool's pods as endpoints: the pure translation ([`endpoints_of`]) of the pods a
//! selection picks into [`EndpointSpec`]s ([`super::members`] follows them).
//!
//! Per pod (docs/config.md, "Which pods, and how each is reached"):
//! - no pod IP yet, phase `Succeeded` or `Failed`: not an endpoint;
//! - routable: phase `Running`, condition `Ready` `True`, no `deletionTimestamp` (a
//!   terminating pod stays, drained, until it is deleted);
//! - local: `spec.nodeName` is this agent's node;
//! - annotations say where KV events are published and metrics served; a bad value routes
//!   the pod without events and is reported (once per pod and value, counted).

use std::{
    borrow::Borrow,
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use kube::api::ObjectMeta;

use crate::discovery::EndpointSpec;

/// The pod's KV-event publisher: a port, or `tcp://HOST:PORT`.
pub const KV_EVENTS: &str = "warmpath.dev/kv-events";
/// Its replay (ROUTER) socket, the same forms.
pub const KV_REPLAY: &str = "warmpath.dev/kv-replay";
/// Its ZeroMQ topic prefix.
pub const KV_TOPIC: &str = "warmpath.dev/kv-topic";
/// The port of its `/metrics` (default: the serving port).
pub const METRICS_PORT: &str = "warmpath.dev/metrics-port";
/// Its data-parallel ranks, each publishing on the events port + rank.
pub const DP_RANKS: &str = "warmpath.dev/dp-ranks";
/// Most data-parallel ranks one pod may announce (far above a node's GPUs).
pub const MAX_DP_RANKS: u32 = 64;
/// Longest topic accepted.
pub const MAX_TOPIC_LEN: usize = 255;

/// A pod's annotation that could not be used, for the log and the counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `namespace/pod`.
    pub pod: String,
    /// The pod's uid (its `namespace/name` without one): one report per pod and message.
    pub uid: String,
    pub message: String,
}

/// The endpoints of `pods` served on `port`, and what was wrong with their annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Translation {
    /// Ordered by authority and rank; one per (authority, rank), a routable pod preferred
    /// when two claim the same address.
    pub endpoints: Vec<EndpointSpec>,
    pub problems: Vec<Problem>,
}

/// The endpoints of `pods` (see [`translate`]).
pub fn endpoints_of<P: Borrow<Pod>>(
    port: u16,
    pods: impl IntoIterator<Item = P>,
    node: Option<&str>,
) -> Vec<EndpointSpec> {
    translate(port, pods, node).endpoints
}

/// The endpoints of `pods` served on `port`, with `node` this agent's node.
pub fn translate<P: Borrow<Pod>>(
    port: u16,
    pods: impl IntoIterator<Item = P>,
    node: Option<&str>,
) -> Translation {
    let mut by_address: BTreeMap<(String, Option<u32>), EndpointSpec> = BTreeMap::new();
    let mut problems = Vec::new();
    for pod in pods {
        let pod = pod.borrow();
        let (endpoints, problem) = pod_endpoints(port, pod, node);
        if let Some(message) = problem {
            problems.push(Problem {
                pod: origin(&pod.metadata),
                uid: pod
                    .metadata
                    .uid
                    .clone()
                    .unwrap_or_else(|| origin(&pod.metadata)),
                message,
            });
        }
        for e in endpoints {
            let key = (e.authority.clone(), e.dp_rank);
            match by_address.get(&key) {
                Some(old) if old.routable || !e.routable => {}
                _ => {
                    by_address.insert(key, e);
                }
            }
        }
    }
    Translation {
        endpoints: by_address.into_values().collect(),
        problems,
    }
}

/// One pod's endpoints (none, one, or one per DP rank) and its annotations' problem.
fn pod_endpoints(port: u16, pod: &Pod, node: Option<&str>) -> (Vec<EndpointSpec>, Option<String>) {
    let Some(status) = &pod.status else {
        return (Vec::new(), None);
    };
    let phase = status.phase.as_deref().unwrap_or("");
    if matches!(phase, "Succeeded" | "Failed") {
        return (Vec::new(), None);
    }
    let Some(ip) = status.pod_ip.as_deref().filter(|s| !s.is_empty()) else {
        return (Vec::new(), None);
    };
    let Ok(ip) = ip.parse::<IpAddr>() else {
        return (
            Vec::new(),
            Some(format!("status.podIP `{ip}` is not an IP address")),
        );
    };
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let routable = phase == "Running" && ready && pod.metadata.deletion_timestamp.is_none();
    let local = node.is_some_and(|n| {
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|p| p == n)
    });
    let annotation = |k: &str| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
    };
    let mut problems = Vec::new();
    let metrics_port = match annotation(METRICS_PORT).map(parse_port).transpose() {
        Ok(p) => p.unwrap_or(port),
        Err(m) => {
            problems.push(format!("{METRICS_PORT}: {m}; metrics read on port {port}"));
            port
        }
    };
    let events = match events_of(&annotation, ip) {
        Ok(e) => e,
        Err(m) => {
            problems.push(format!("{m}; routed without KV events"));
            None
        }
    };
    let authority = SocketAddr::new(ip, port).to_string();
    let base = EndpointSpec {
        metrics_url: format!("http://{}/metrics", SocketAddr::new(ip, metrics_port)),
        authority,
        kv_events: None,
        kv_replay: None,
        kv_topic: String::new(),
        dp_rank: None,
        local,
        routable,
        origin: origin(&pod.metadata),
    };
    let endpoints = match events {
        None => vec![base],
        Some(ev) => ev
            .ranks
            .iter()
            .map(|&(events, replay, rank)| EndpointSpec {
                kv_events: Some(format!("tcp://{events}")),
                kv_replay: replay.map(|r| format!("tcp://{r}")),
                kv_topic: ev.topic.clone(),
                dp_rank: rank,
                ..base.clone()
            })
            .collect(),
    };
    let problem = (!problems.is_empty()).then(|| problems.join("; "));
    (endpoints, problem)
}

/// A pod's event sockets: per rank, its publisher, replay and rank (`None` without DP).
struct Events {
    ranks: Vec<(SocketAddr, Option<SocketAddr>, Option<u32>)>,
    topic: String,
}

/// The pod's event annotations; `None` when it announces no publisher.
fn events_of<'a>(
    annotation: &dyn Fn(&str) -> Option<&'a str>,
    ip: IpAddr,
) -> Result<Option<Events>, String> {
    let socket = |k: &str| {
        annotation(k)
            .map(|v| socket_of(v, ip).map_err(|m| format!("{k}: `{v}`: {m}")))
            .transpose()
    };
    let events = socket(KV_EVENTS)?;
    let replay = socket(KV_REPLAY)?;
    let topic = annotation(KV_TOPIC).unwrap_or("");
    if topic.len() > MAX_TOPIC_LEN {
        return Err(format!(
            "{KV_TOPIC}: {} bytes, at most {MAX_TOPIC_LEN}",
            topic.len()
        ));
    }
    let ranks = annotation(DP_RANKS)
        .map(|v| {
            v.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_DP_RANKS).contains(n))
                .ok_or_else(|| format!("{DP_RANKS}: `{v}`: expected 1 to {MAX_DP_RANKS}"))
        })
        .transpose()?;
    let Some(events) = events else {
        if replay.is_some() {
            return Err(format!("{KV_REPLAY} needs {KV_EVENTS}"));
        }
        if ranks.is_some() {
            return Err(format!("{DP_RANKS} needs {KV_EVENTS}"));
        }
        return Ok(None);
    };
    let ranks = match ranks {
        None | Some(1) => vec![(events, replay, None)],
        Some(n) => (0..n)
            .map(|r| {
                let shift = |a: SocketAddr| {
                    u16::try_from(r)
                        .ok()
                        .and_then(|r| a.port().checked_add(r))
                        .map(|p| SocketAddr::new(a.ip(), p))
                        .ok_or_else(|| {
                            format!("{DP_RANKS}: rank {r} would publish beyond port 65535")
                        })
                };
                Ok((shift(events)?, replay.map(shift).transpose()?, Some(r)))
            })
            .collect::<Result<_, String>>()?,
    };
    Ok(Some(Events {
        ranks,
        topic: topic.to_string(),
    }))
}

/// `PORT` or `tcp://HOST:PORT`; `HOST` `*`, `0.0.0.0` or `::` is the pod's IP, and an IP
/// literal must be the pod's own.
fn socket_of(v: &str, pod_ip: IpAddr) -> Result<SocketAddr, String> {
    let v = v.trim();
    if let Ok(port) = parse_port(v) {
        return Ok(SocketAddr::new(pod_ip, port));
    }
    if v.starts_with("ipc://") || v.starts_with("inproc://") {
        return Err("an ipc:// or inproc:// socket is inside the pod; publish on tcp".into());
    }
    let rest = v
        .strip_prefix("tcp://")
        .ok_or("expected a port or tcp://HOST:PORT")?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or("expected tcp://HOST:PORT (no port)")?;
    let port = parse_port(port)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = match host {
        "*" | "0.0.0.0" | "::" => pod_ip,
        h => h
            .parse::<IpAddr>()
            .map_err(|_| format!("`{h}` is not an IP address (or `*` for the pod's)"))?,
    };
    if ip.is_loopback() {
        return Err(format!(
            "{ip} is the agent's own loopback, not the pod's; use `*` or the port"
        ));
    }
    // Only the pod's own address: whoever may label a pod into a pool must not point the
    // agent at another pod's publisher (its events would be credited to this pod).
    if ip != pod_ip {
        return Err(format!(
            "{ip} is not this pod's address ({pod_ip}); use `*` or the port"
        ));
    }
    Ok(SocketAddr::new(ip, port))
}

/// A TCP port, 1 to 65535.
fn parse_port(v: &str) -> Result<u16, String> {
    v.trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("`{v}` is not a port (1 to 65535)"))
}

/// `namespace/name`.
fn origin(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// Keeps what [`translate`] reads: a listed pod is held in memory for as long as it exists,
/// and a full pod object (containers, env, managed fields, other annotations) is many times
/// larger.
pub fn slim(pod: &mut Pod) {
    let m = &mut pod.metadata;
    let annotations = m.annotations.take().map(|a| {
        a.into_iter()
            .filter(|(k, _)| k.starts_with("warmpath.dev/"))
            .collect()
    });
    pod.metadata = ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        uid: m.uid.take(),
        resource_version: m.resource_version.take(),
        deletion_timestamp: m.deletion_timestamp.take(),
        annotations,
        ..ObjectMeta::default()
    };
    pod.spec = pod.spec.take().map(|s| PodSpec {
        node_name: s.node_name,
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        pod_ip: s.pod_ip,
        conditions: s.conditions.map(|c| {
            c.into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| PodCondition {
                    type_: c.type_,
                    status: c.status,
                    ..PodCondition::default()
                })
                .collect()
        }),
        ..PodStatus::default()
    });
}

#[cfg(test)]
mod tests;
