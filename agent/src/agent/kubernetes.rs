//! The agent's Kubernetes side: the watchers started, client identity and policies from the
//! API, and what `/status` and the metrics say about them (docs/install.md).

use super::{Config, Error};

/// The agent's Kubernetes side: pods, InferencePools and Services watched into pool
/// membership and intercepted VIPs; RoutePolicy and Tenant objects into the active policy,
/// with their status written by the holder of the status Lease.
#[derive(Debug)]
pub struct Kubernetes {
    pub watchers: crate::k8s::Watchers,
    /// The pods that identify clients (Tenant selectors by namespace, service account,
    /// labels).
    _identity: crate::k8s::identity::IdentityHandle,
    /// Taken out at shutdown to hand the status Lease back.
    pub policies: parking_lot::Mutex<Option<crate::k8s::policies::PoliciesHandle>>,
    /// Whether `kubernetes.intercept` names Services (interception follows them).
    pub intercepts: bool,
}

/// How long the agent waits for its first complete lists before serving anyway (watchers
/// keep retrying with backoff; pools stay empty until their pods are listed).
pub const KUBERNETES_SYNC_BOUND: std::time::Duration = std::time::Duration::from_secs(30);

/// Starts the Kubernetes watchers and policies (membership is applied by [`crate::discovery`]
/// once the cluster is joined), and waits (at most [`KUBERNETES_SYNC_BOUND`]) for their first
/// complete lists.
pub(super) async fn start_kubernetes(
    k: &crate::config::KubernetesConfig,
    config: &Config,
    proxy: &std::sync::Arc<crate::proxy::Proxy>,
) -> Result<std::sync::Arc<Kubernetes>, Error> {
    if config.policy_dir.is_some() {
        return Err(Error::Config(
            "policyDir and kubernetes are exclusive: on Kubernetes, RoutePolicy and Tenant objects come from the API".into(),
        ));
    }
    let client = crate::k8s::client::client().await?;
    let watchers = crate::k8s::start(client.clone(), k, &config.pools).await?;
    // Client identity first, so that Tenant selectors match pods from the first policy set.
    let scope = match (k.identity, &k.node_name) {
        (crate::config::IdentityScope::Node, Some(node)) => {
            crate::k8s::identity::Scope::Node(node.clone())
        }
        (crate::config::IdentityScope::Node, None) => {
            tracing::warn!(
                "kubernetes.identity is node but there is no node name (nodeName or $NODE_NAME): identifying clients from every pod of the cluster"
            );
            crate::k8s::identity::Scope::Cluster
        }
        (crate::config::IdentityScope::Cluster, _) => crate::k8s::identity::Scope::Cluster,
    };
    let (workloads, identity) = crate::k8s::identity::spawn(client.clone(), scope);
    // Intercepted clients by their pod's cgroup first (walked on the first lookup only).
    match crate::ebpf::cgroup2_root() {
        Ok(root) => proxy.policy.set_cgroups(std::sync::Arc::new(
            crate::k8s::identity::cgroup::PodCgroups::new(workloads.clone(), root),
        )),
        Err(err) => {
            tracing::info!(%err, "no cgroup v2 mount: clients are identified by address, not by cgroup")
        }
    }
    proxy.policy.set_workloads(workloads);
    let status = match (k.status_writes, &k.node_name) {
        (true, Some(node)) => Some(crate::k8s::status::Settings {
            holder: node.clone(),
            namespace: std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into()),
            timing: Default::default(),
        }),
        (true, None) => {
            tracing::warn!(
                "kubernetes.statusWrites without a node name (nodeName or $NODE_NAME): this agent writes no status"
            );
            None
        }
        (false, _) => None,
    };
    let policies = crate::k8s::policies::spawn(
        client,
        proxy.policy.clone(),
        k.namespaces.clone(),
        status,
        proxy.telemetry.meter(),
    );
    let synced = async {
        watchers.synced().await;
        identity.synced().await;
        policies.synced().await;
    };
    match tokio::time::timeout(KUBERNETES_SYNC_BOUND, synced).await {
        Ok(()) => tracing::info!(node = ?k.node_name, "kubernetes: first lists complete"),
        Err(_) => tracing::warn!(
            pending = watchers.pending(),
            "kubernetes: not every watcher has listed within {KUBERNETES_SYNC_BOUND:?}; serving, they keep retrying"
        ),
    }
    let kubernetes = std::sync::Arc::new(Kubernetes {
        watchers,
        _identity: identity,
        policies: parking_lot::Mutex::new(Some(policies)),
        intercepts: !k.intercept.is_empty(),
    });
    let shown = kubernetes.clone();
    proxy
        .sections
        .set("kubernetes", std::sync::Arc::new(move || shown.status()));
    kubernetes.observe(proxy.telemetry.meter());
    Ok(kubernetes)
}

impl Kubernetes {
    /// Registers the watchers' counters on `meter`: `warmpath.kubernetes.lists`,
    /// `.watch_restarts` and `.watch_errors` by `kind`, `.bad_annotations`, and
    /// `warmpath.kubernetes.status_leader` (1 while this agent writes statuses).
    pub fn observe(self: &std::sync::Arc<Self>, meter: &opentelemetry::metrics::Meter) {
        use opentelemetry::KeyValue;
        type Pick = fn(&crate::k8s::KindSnapshot) -> u64;
        let per_kind: [(&'static str, &'static str, Pick); 3] = [
            (
                "warmpath.kubernetes.lists",
                "Complete lists (the first, and each relist)",
                |k| k.lists,
            ),
            (
                "warmpath.kubernetes.watch_restarts",
                "Watches restarted (dropped, expired)",
                |k| k.restarts,
            ),
            (
                "warmpath.kubernetes.watch_errors",
                "Watch and list errors (retried with backoff)",
                |k| k.errors,
            ),
        ];
        for (name, description, pick) in per_kind {
            let k = self.clone();
            meter
                .u64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| {
                    let w = k.watchers.snapshot();
                    for (kind, snap) in [
                        ("Pod", w.pods),
                        ("InferencePool", w.inference_pools),
                        ("Service", w.services),
                    ] {
                        o.observe(pick(&snap), &[KeyValue::new("kind", kind)]);
                    }
                })
                .build();
        }
        let k = self.clone();
        meter
            .u64_observable_counter("warmpath.kubernetes.bad_annotations")
            .with_description(
                "Pod annotations that could not be used (the pod is routed without them)",
            )
            .with_callback(move |o| o.observe(k.watchers.snapshot().bad_annotations, &[]))
            .build();
        let k = self.clone();
        meter
            .u64_observable_gauge("warmpath.kubernetes.status_leader")
            .with_description("1 while this agent holds the status Lease and writes RoutePolicy and Tenant statuses")
            .with_callback(move |o| {
                let leads = k
                    .policies
                    .lock()
                    .as_ref()
                    .and_then(|p| p.status().map(|s| s.is_leader()))
                    .unwrap_or(false);
                o.observe(u64::from(leads), &[]);
            })
            .build();
    }

    /// The `kubernetes` section of `/status`: the watchers' counters, the policy reloads,
    /// and whether this agent writes statuses.
    pub fn status(&self) -> serde_json::Value {
        let w = self.watchers.snapshot();
        let kind = |k: crate::k8s::KindSnapshot| serde_json::json!({"lists": k.lists, "restarts": k.restarts, "errors": k.errors});
        let policies = self.policies.lock();
        let r = policies.as_ref().map(|p| p.counts()).unwrap_or_default();
        let status = policies
            .as_ref()
            .and_then(|p| p.status())
            .map(|s| serde_json::json!({"leader": s.is_leader(), "writes": s.writes()}));
        drop(policies);
        serde_json::json!({
            "pending": self.watchers.pending(),
            "pods": kind(w.pods), "inference_pools": kind(w.inference_pools),
            "services": kind(w.services), "bad_annotations": w.bad_annotations,
            "services_without_vip": w.services_without_vip,
            "services_intercepted": self.watchers.services.borrow().iter().map(|s| serde_json::json!({
                "service": format!("{}/{}", s.namespace, s.name), "port": s.port, "pool": s.pool,
                "vips": s.vips.iter().map(|v| v.to_string()).collect::<Vec<_>>(), "note": s.note,
            })).collect::<Vec<_>>(),
            "policy_reloads": {"applied": r.applied, "unchanged": r.unchanged, "rejected": r.rejected,
                "rejected_objects": r.rejected_objects},
            "status_writer": status,
        })
    }
}
