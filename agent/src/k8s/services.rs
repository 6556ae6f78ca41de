//! The Services the eBPF programs intercept (`kubernetes.intercept`): each one's ClusterIPs
//! (IPv4 and IPv6, `spec.clusterIPs`) on the configured port, followed as the Service is
//! created, changed and deleted, published as one list.
//!
//! A Service without a VIP (headless, `clusterIP: None`; `ExternalName`; not found; no such
//! port) stays in the list with no `vips` and a `note` saying why, so status can show it; it
//! is logged once per reason.

use std::{
    net::{IpAddr, SocketAddr},
    sync::{Arc, atomic::Ordering},
};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::{Api, api::ObjectMeta, runtime::watcher};
use tokio::sync::watch;

use super::{Shared, watch::follow};
use crate::config::InterceptConfig;

/// One intercepted Service port, resolved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct InterceptedService {
    pub namespace: String,
    pub name: String,
    pub port: u16,
    /// The pool its requests go to.
    pub pool: String,
    /// `ClusterIP:port` for each of its cluster IPs; empty: nothing to intercept (`note`).
    pub vips: Vec<SocketAddr>,
    /// Why there is no VIP, or what was skipped.
    pub note: Option<String>,
}

/// What `service` (`None`: not found) offers for `entry`.
pub fn intercepted(entry: &InterceptConfig, service: Option<&Service>) -> InterceptedService {
    let (vips, note) = match service {
        None => (Vec::new(), Some("not found".to_string())),
        Some(s) => vips_of(entry.port, s.spec.as_ref()),
    };
    InterceptedService {
        namespace: entry.namespace.clone(),
        name: entry.name.clone(),
        port: entry.port,
        pool: entry.pool.clone(),
        vips,
        note,
    }
}

fn vips_of(port: u16, spec: Option<&ServiceSpec>) -> (Vec<SocketAddr>, Option<String>) {
    let Some(spec) = spec else {
        return (Vec::new(), Some("it has no spec".into()));
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return (
            Vec::new(),
            Some("an ExternalName Service has no cluster IP".into()),
        );
    }
    let ports = spec.ports.as_deref().unwrap_or_default();
    if !ports.iter().any(|p| p.port == i32::from(port)) {
        let listed: Vec<String> = ports.iter().map(|p| p.port.to_string()).collect();
        return (
            Vec::new(),
            Some(format!(
                "it has no port {port} (ports: {})",
                if listed.is_empty() {
                    "none".into()
                } else {
                    listed.join(", ")
                }
            )),
        );
    }
    // `clusterIPs` (dual stack) supersedes `clusterIP`, whose value it repeats first.
    let ips: Vec<&str> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.as_deref().into_iter().collect(),
    };
    if ips.contains(&"None") {
        return (
            Vec::new(),
            Some(
                "headless (clusterIP: None): clients connect to pod IPs, nothing to intercept"
                    .into(),
            ),
        );
    }
    let mut vips = Vec::new();
    let mut bad = Vec::new();
    for ip in ips.iter().filter(|ip| !ip.is_empty()) {
        match ip.parse::<IpAddr>() {
            Ok(a) => vips.push(SocketAddr::new(a, port)),
            Err(_) => bad.push(format!("`{ip}`")),
        }
    }
    vips.sort();
    vips.dedup();
    let note = if !bad.is_empty() {
        Some(format!(
            "cluster IPs that are not addresses skipped: {}",
            bad.join(", ")
        ))
    } else if vips.is_empty() {
        Some("no cluster IP assigned yet".into())
    } else {
        None
    };
    (vips, note)
}

/// Keeps what [`intercepted`] reads.
pub fn slim(service: &mut Service) {
    let m = &mut service.metadata;
    service.metadata = ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        uid: m.uid.take(),
        resource_version: m.resource_version.take(),
        ..ObjectMeta::default()
    };
    service.spec = service.spec.take().map(|s| ServiceSpec {
        type_: s.type_,
        cluster_ip: s.cluster_ip,
        cluster_ips: s.cluster_ips,
        ports: s.ports.map(|p| {
            p.into_iter()
                .map(|p| ServicePort {
                    port: p.port,
                    ..ServicePort::default()
                })
                .collect()
        }),
        ..ServiceSpec::default()
    });
    service.status = None;
}

/// Follows `entry`'s Service forever, keeping its element of `out` current.
pub(super) async fn follow_service(
    shared: Arc<Shared>,
    entry: InterceptConfig,
    out: watch::Sender<Vec<InterceptedService>>,
) {
    let what = format!(
        "Service {}/{} port {} (pool {})",
        entry.namespace, entry.name, entry.port, entry.pool
    );
    let api = Api::<Service>::namespaced(shared.client.clone(), &entry.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", entry.name));
    let mut synced = false;
    let mut last_note = None;
    follow(
        api,
        config,
        &what,
        &shared.counters.services,
        slim,
        |services| {
            let found = services
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(entry.name.as_str()));
            let now = intercepted(&entry, found.map(|s| &**s));
            if now.note != last_note {
                if let Some(note) = &now.note {
                    if now.vips.is_empty() {
                        shared
                            .counters
                            .services_without_vip
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::warn!("kubernetes: {what}: {note}");
                }
                last_note.clone_from(&now.note);
            }
            out.send_if_modified(|list| {
                let key = |s: &InterceptedService| (s.namespace.clone(), s.name.clone(), s.port);
                match list.iter_mut().find(|s| key(s) == key(&now)) {
                    Some(old) if *old == now => false,
                    Some(old) => {
                        *old = now;
                        true
                    }
                    None => {
                        list.push(now);
                        list.sort();
                        true
                    }
                }
            });
            if !synced {
                synced = true;
                shared.pending.send_modify(|n| *n = n.saturating_sub(1));
            }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> InterceptConfig {
        InterceptConfig {
            namespace: "ml".into(),
            name: "llama".into(),
            port: 8000,
            pool: "llama".into(),
        }
    }

    fn service(spec: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "llama", "namespace": "ml", "resourceVersion": "3"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn resolve(spec: serde_json::Value) -> (Vec<String>, Option<String>) {
        let s = intercepted(&entry(), Some(&service(spec)));
        assert_eq!((s.pool.as_str(), s.port), ("llama", 8000));
        (s.vips.iter().map(|v| v.to_string()).collect(), s.note)
    }

    #[test]
    fn cluster_ips_become_vips() {
        let ports = serde_json::json!([{"port": 8000, "targetPort": 8000}, {"port": 9000}]);
        assert_eq!(
            resolve(serde_json::json!({"clusterIP": "10.96.0.10", "ports": ports})),
            (vec!["10.96.0.10:8000".to_string()], None)
        );
        // Dual stack: both families, IPv6 bracketed.
        assert_eq!(
            resolve(serde_json::json!({
                "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
                "ports": ports,
            })),
            (
                vec![
                    "10.96.0.10:8000".to_string(),
                    "[fd00:96::10]:8000".to_string()
                ],
                None
            )
        );
    }

    #[test]
    fn services_without_a_vip_say_why() {
        let ports = serde_json::json!([{"port": 8000}]);
        for (spec, why) in [
            (
                serde_json::json!({"clusterIP": "None", "clusterIPs": ["None"], "ports": ports}),
                "headless",
            ),
            (
                serde_json::json!({"type": "ExternalName", "externalName": "x.example.com", "ports": ports}),
                "ExternalName",
            ),
            (
                serde_json::json!({"clusterIP": "10.96.0.10", "ports": [{"port": 80}, {"port": 443}]}),
                "no port 8000 (ports: 80, 443)",
            ),
            (
                serde_json::json!({"clusterIP": "10.96.0.10"}),
                "no port 8000 (ports: none)",
            ),
            (
                serde_json::json!({"ports": ports}),
                "no cluster IP assigned yet",
            ),
        ] {
            let (vips, note) = resolve(spec);
            assert!(vips.is_empty(), "{vips:?}");
            let note = note.unwrap();
            assert!(note.contains(why), "want {why}: {note}");
        }
        let missing = intercepted(&entry(), None);
        assert_eq!(
            (missing.vips.len(), missing.note.as_deref()),
            (0, Some("not found"))
        );
        let (vips, note) = resolve(serde_json::json!({
            "clusterIPs": ["10.96.0.10", "10.96.0.x"], "ports": ports,
        }));
        assert_eq!(vips, vec!["10.96.0.10:8000".to_string()]);
        assert!(note.unwrap().contains("`10.96.0.x`"));
    }

    #[test]
    fn slimming_keeps_what_the_translation_reads() {
        let mut s = service(serde_json::json!({
            "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "ports": [{"port": 8000, "name": "http", "targetPort": 8000}],
            "selector": {"app": "vllm"}, "sessionAffinity": "None",
        }));
        let before = intercepted(&entry(), Some(&s));
        slim(&mut s);
        assert_eq!(intercepted(&entry(), Some(&s)), before);
        assert_eq!(s.spec.as_ref().unwrap().selector, None);
    }
}
