//! Kubernetes: the agent finds its pods, pools, Services and policies itself (docs/install.md).
//!
//! Watchers ([`kube::runtime`] reflectors with backoff, relisting on `410 Gone`) turn the
//! cluster's objects into the agent's inputs, data flowing one way:
//!
//! - [`pods`] and [`inference_pool`]: each configured pool's endpoints
//!   ([`crate::discovery::EndpointSpec`]), from the pods its `InferencePool` or selector
//!   picks, with where each publishes KV events and serves metrics (pod annotations);
//!   [`members`] follows each pool, [`watch`] is the one list-and-watch loop they all use;
//! - [`services`]: the Service VIPs the eBPF programs intercept;
//! - [`policies`]: `RoutePolicy` and `Tenant` objects, validated into the active policy, with
//!   [`status`] conditions written by exactly one agent per object;
//! - [`identity`]: client pod IP -> namespace, service account and labels, so `Tenant`
//!   selectors match workloads.
//!
//! [`client`] builds the API client: in-cluster service account, or `KUBECONFIG`.
//! [`start`] starts the pool and Service watchers and returns their outputs as
//! [`tokio::sync::watch`] channels (level-triggered: a receiver that misses a change still
//! sees the latest state).

pub mod client;
pub mod identity;
pub mod inference_pool;
pub mod members;
pub mod pods;
pub mod policies;
pub mod services;
pub mod status;
pub mod watch;

use std::sync::{Arc, atomic::Ordering};

use tokio::{sync::watch as channel, task::JoinSet};

pub use client::{ClientError, client, detect};
pub use services::InterceptedService;
pub use watch::{KindCounters, KindSnapshot};

use crate::{
    config::{KubernetesConfig, PoolConfig},
    discovery::Desired,
};

/// Why the watchers cannot start with this configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes.enabled is false: nothing to watch")]
    Disabled,
    #[error(
        "pool `{pool}`: its pods are in namespace `{namespace}`, which kubernetes.namespaces does not list"
    )]
    NamespaceNotWatched { pool: String, namespace: String },
    #[error(
        "kubernetes.intercept: {namespace}/{name} names pool `{pool}`, which is not configured"
    )]
    UnknownPool {
        namespace: String,
        name: String,
        pool: String,
    },
}

/// What the watchers share: the client, this node, counters, the count of watchers still
/// before their first complete list.
pub(crate) struct Shared {
    pub(crate) client: kube::Client,
    pub(crate) node: Option<String>,
    pub(crate) counters: Counters,
    pub(crate) pending: channel::Sender<usize>,
}

/// Counted since start, per kind.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) pods: KindCounters,
    pub(crate) inference_pools: KindCounters,
    pub(crate) services: KindCounters,
    /// Pod annotation problems reported (once per pod and problem).
    pub(crate) bad_annotations: std::sync::atomic::AtomicU64,
    /// Intercepted Services found without a VIP (headless, not found, no such port),
    /// once per Service and reason.
    pub(crate) services_without_vip: std::sync::atomic::AtomicU64,
    /// Changes of a pool's membership published (one per complete list or batch of
    /// changes that changed it; an identical relist publishes nothing).
    pub(crate) members_published: std::sync::atomic::AtomicU64,
}

/// The watchers' counters at one moment (exported as metrics by the agent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub pods: KindSnapshot,
    pub inference_pools: KindSnapshot,
    pub services: KindSnapshot,
    pub bad_annotations: u64,
    pub services_without_vip: u64,
    pub members_published: u64,
}

/// The running watchers. Dropping it stops them.
#[derive(Debug)]
pub struct Watchers {
    /// Every pool with `inferencePool` or `selector` members: its endpoints (a pool appears
    /// once its first list is complete).
    pub members: channel::Receiver<Desired>,
    /// The intercepted Services, each once its first list is complete.
    pub services: channel::Receiver<Vec<InterceptedService>>,
    pending: channel::Receiver<usize>,
    shared: Arc<Shared>,
    _tasks: JoinSet<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("node", &self.node)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// Starts a watcher for every pool of `pools` with `inferencePool` or `selector` members
/// and for every intercepted Service of `settings`, on the current tokio runtime.
pub async fn start(
    client: kube::Client,
    settings: &KubernetesConfig,
    pools: &[PoolConfig],
) -> Result<Watchers, Error> {
    if !settings.enabled {
        return Err(Error::Disabled);
    }
    let followed: Vec<_> = pools
        .iter()
        .filter_map(|p| p.members.clone().map(|m| (p.name.clone(), m)))
        .collect();
    for (pool, m) in &followed {
        if !settings.watches(m.namespace()) {
            return Err(Error::NamespaceNotWatched {
                pool: pool.clone(),
                namespace: m.namespace().into(),
            });
        }
    }
    for s in &settings.intercept {
        if !pools.iter().any(|p| p.name == s.pool) {
            return Err(Error::UnknownPool {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                pool: s.pool.clone(),
            });
        }
    }
    let (pending_tx, pending) = channel::channel(followed.len() + settings.intercept.len());
    let shared = Arc::new(Shared {
        client,
        node: settings.node_name.clone(),
        counters: Counters::default(),
        pending: pending_tx,
    });
    let (members_tx, members) = channel::channel(Desired::new());
    let (services_tx, services) = channel::channel(Vec::new());
    let mut tasks = JoinSet::new();
    for (pool, m) in followed {
        tasks.spawn(members::follow_pool(
            shared.clone(),
            pool,
            m,
            members_tx.clone(),
        ));
    }
    for entry in settings.intercept.clone() {
        tasks.spawn(services::follow_service(
            shared.clone(),
            entry,
            services_tx.clone(),
        ));
    }
    Ok(Watchers {
        members,
        services,
        pending,
        shared,
        _tasks: tasks,
    })
}

impl Watchers {
    /// Resolves once every watcher has completed its first list (each pool and Service
    /// published once). The agent waits for it with a bound before serving.
    pub async fn synced(&self) {
        let mut pending = self.pending.clone();
        // The sender lives in `shared`, which `self` holds: it cannot close first.
        let _ = pending.wait_for(|n| *n == 0).await;
    }

    /// Watchers still before their first complete list.
    pub fn pending(&self) -> usize {
        *self.pending.borrow()
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        let c = &self.shared.counters;
        Snapshot {
            pods: c.pods.snapshot(),
            inference_pools: c.inference_pools.snapshot(),
            services: c.services.snapshot(),
            bad_annotations: c.bad_annotations.load(Ordering::Relaxed),
            services_without_vip: c.services_without_vip.load(Ordering::Relaxed),
            members_published: c.members_published.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Environment, parse_in};

    fn config(pools: &str) -> Config {
        let none = |_: &str| None;
        let no_file = |_: &str| false;
        let text = format!(
            "version: 1\npools:\n{pools}kubernetes: {{enabled: true, intercept: [{{namespace: ml, name: s, port: 80, pool: p}}]}}\n"
        );
        let env = Environment {
            var: &none,
            file_exists: &no_file,
        };
        parse_in(&text, "t.yaml", &env).unwrap()
    }

    /// A client that is never asked anything (nothing listens on port 1).
    fn client() -> kube::Client {
        let url = "http://127.0.0.1:1".parse().unwrap();
        client::from_config(kube::Config::new(url)).unwrap()
    }

    const SELECTOR: &str =
        "- name: p\n  model: m\n  selector: {namespace: ml, matchLabels: {app: a}, port: 80}\n";

    #[tokio::test]
    async fn start_refuses_what_it_cannot_follow() {
        let c = config(SELECTOR);
        let mut k = c.kubernetes.clone().unwrap();
        k.enabled = false;
        let e = start(client(), &k, &c.pools).await.unwrap_err();
        assert!(matches!(e, Error::Disabled), "{e}");
        let mut k = c.kubernetes.clone().unwrap();
        k.namespaces = vec!["serving".into()];
        let e = start(client(), &k, &c.pools).await.unwrap_err().to_string();
        assert_eq!(
            e,
            "pool `p`: its pods are in namespace `ml`, which kubernetes.namespaces does not list"
        );
        let mut k = c.kubernetes.clone().unwrap();
        k.intercept[0].pool = "q".into();
        let e = start(client(), &k, &c.pools).await.unwrap_err().to_string();
        assert_eq!(
            e,
            "kubernetes.intercept: ml/s names pool `q`, which is not configured"
        );
    }

    #[tokio::test]
    async fn nothing_to_follow_is_synced_at_once() {
        let c = config("- name: p\n  model: m\n  endpoints: [{url: http://127.0.0.1:9}]\n");
        let mut k = c.kubernetes.clone().unwrap();
        k.intercept.clear();
        let w = start(client(), &k, &c.pools).await.unwrap();
        assert_eq!(w.pending(), 0);
        w.synced().await;
        assert!(w.members.borrow().is_empty() && w.services.borrow().is_empty());
        // With one pool and one Service to follow, two watchers are pending (the server
        // never answers).
        let c = config(SELECTOR);
        let w = start(client(), c.kubernetes.as_ref().unwrap(), &c.pools)
            .await
            .unwrap();
        assert_eq!(w.pending(), 2);
    }
}
