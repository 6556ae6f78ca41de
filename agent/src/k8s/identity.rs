//! Client identity from pods: the pod at a request's source address, with its namespace,
//! service account and labels, so `Tenant` workload selectors match workloads rather than
//! headers (docs/policy.md, "Client identity on Kubernetes").
//!
//! A [`PodDirectory`] follows pods ([`super::watch::follow`]: kube's watcher with backoff,
//! resumed watches, relists on `410 Gone`): with [`Scope::Node`] only the pods of this node (`fieldSelector
//! spec.nodeName=NODE`: intercepted clients run on the agent's node), with
//! [`Scope::Cluster`] every pod (clients reaching the agent from other nodes). Of each pod
//! it keeps only what identity needs — its addresses (`status.podIPs`, IPv4 and IPv6),
//! namespace, name, service account, labels and UID — never the whole object. Pods on the
//! host network are left out (their address is the node's, shared by every such pod), and
//! so are pods that have finished (`Succeeded`, `Failed`: their address may already be
//! another pod's).
//!
//! Every batch of watch events (the whole list after it), and every new set of selectors
//! from the policy
//! ([`Workloads::select`]), recomputes one map of address -> tenant, swapped whole
//! (arc-swap): a request costs one hash lookup, and a recomputation is linear in the pods
//! kept. Two pods with one address (a pod replaced while the old one is still listed): a
//! running one wins, else the first by namespace/name.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::Arc,
};

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use kube::{Api, Client, runtime::watcher};
use parking_lot::Mutex;
use tokio::{sync::watch, task::JoinHandle};

use super::watch::{KindCounters, follow};
use crate::tenant::{Workload, WorkloadDirectory, WorkloadSelectors, Workloads};

/// Most pods kept: above the 150,000 pods Kubernetes supports in one cluster. Pods beyond
/// are left out (their clients fall back to CIDRs and headers) with a warning.
pub const MAX_PODS: usize = 200_000;

/// Which pods are followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The pods of this node (by `spec.nodeName`).
    Node(String),
    /// Every pod of the cluster.
    Cluster,
}

/// One pod, as identity keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    uid: Option<String>,
    ips: Vec<IpAddr>,
    running: bool,
    workload: Arc<Workload>,
}

#[derive(Debug, Default)]
struct State {
    /// By `namespace/name`.
    pods: BTreeMap<String, Entry>,
    selectors: Arc<WorkloadSelectors>,
    /// A warning about [`MAX_PODS`] was logged.
    warned: bool,
}

/// What requests read: recomputed after every change.
#[derive(Debug, Default)]
struct View {
    tenants: HashMap<IpAddr, Arc<str>>,
    workloads: HashMap<IpAddr, Arc<Workload>>,
    by_uid: HashMap<String, Arc<Workload>>,
    /// Pod UID -> tenant (what a client cgroup resolves to, [`cgroup::PodCgroups`]).
    tenants_by_uid: HashMap<String, Arc<str>>,
}

/// Client pods by address; a [`Workloads`] directory for the policy (see the module docs).
#[derive(Debug)]
pub struct PodDirectory {
    state: Mutex<State>,
    view: ArcSwap<View>,
    /// Counts recomputations, for whoever awaits a change.
    version: watch::Sender<u64>,
}

impl Default for PodDirectory {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            view: ArcSwap::default(),
            version: watch::Sender::new(0),
        }
    }
}

/// The running pod watcher; dropping it stops watching (the directory keeps its pods).
#[derive(Debug)]
pub struct IdentityHandle {
    synced: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

/// Follows the pods of `scope` into a new directory; give it to the policy with
/// `ActivePolicy::set_workloads`. Must be called within a Tokio runtime.
pub fn spawn(client: Client, scope: Scope) -> (Arc<PodDirectory>, IdentityHandle) {
    let directory = Arc::new(PodDirectory::default());
    let config = match &scope {
        Scope::Node(node) => watcher::Config::default().fields(&format!("spec.nodeName={node}")),
        Scope::Cluster => watcher::Config::default(),
    };
    let api: Api<Pod> = Api::all(client);
    let (tx, synced) = watch::channel(false);
    let dir = directory.clone();
    let what = match &scope {
        Scope::Node(node) => format!("pods on {node} (identity)"),
        Scope::Cluster => "pods (identity)".to_string(),
    };
    let task = tokio::spawn(async move {
        let counters = KindCounters::default();
        let on_state = |pods: &[Arc<Pod>]| {
            dir.replace_pods(pods.iter().map(|p| &**p));
            tx.send_replace(true);
        };
        follow(api, config, &what, &counters, slim, on_state).await;
    });
    (directory, IdentityHandle { synced, task })
}

// === impl IdentityHandle ===

impl IdentityHandle {
    /// Resolves once the pods have been listed.
    pub async fn synced(&self) {
        let mut rx = self.synced.clone();
        // The sender lives as long as the task.
        let _ = rx.wait_for(|s| *s).await;
    }
}

impl Drop for IdentityHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// === impl PodDirectory ===

impl PodDirectory {
    /// The pod at `addr`.
    pub fn workload_of(&self, addr: IpAddr) -> Option<Arc<Workload>> {
        self.view.load().workloads.get(&addr).cloned()
    }

    /// The pod with this UID (what a cgroup path names).
    pub fn workload_by_uid(&self, uid: &str) -> Option<Arc<Workload>> {
        self.view.load().by_uid.get(uid).cloned()
    }

    /// The pod whose cgroup has this id (the eBPF path's client cgroup), through `cgroups`.
    pub fn workload_of_cgroup(
        &self,
        cgroups: &cgroup::CgroupIndex,
        cgroup_id: u64,
    ) -> Option<Arc<Workload>> {
        self.workload_by_uid(cgroups.pod_uid(cgroup_id)?)
    }

    /// The tenant the selectors in effect give the pod whose cgroup has this id.
    pub fn tenant_of_cgroup(
        &self,
        cgroups: &cgroup::CgroupIndex,
        cgroup_id: u64,
    ) -> Option<Arc<str>> {
        self.tenant_of_uid(cgroups.pod_uid(cgroup_id)?)
    }

    /// The tenant the selectors in effect give the pod with this UID: one lookup in the
    /// view (no lock; requests of intercepted clients ask it).
    pub fn tenant_of_uid(&self, uid: &str) -> Option<Arc<str>> {
        self.view.load().tenants_by_uid.get(uid).cloned()
    }

    /// Changes after every recomputation of the address map (its value counts them).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Pods kept.
    pub fn len(&self) -> usize {
        self.state.lock().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces every pod with `pods` (the whole list, after every batch of changes).
    pub fn replace_pods<'p>(&self, pods: impl IntoIterator<Item = &'p Pod>) {
        let mut state = self.state.lock();
        state.pods.clear();
        for p in pods {
            state.upsert(p);
        }
        self.recompute(&state);
    }

    /// A pod added or changed.
    pub fn apply_pod(&self, pod: &Pod) {
        let mut state = self.state.lock();
        state.upsert(pod);
        self.recompute(&state);
    }

    /// A pod deleted.
    pub fn delete_pod(&self, pod: &Pod) {
        let mut state = self.state.lock();
        if let Some(key) = key(pod) {
            state.pods.remove(&key);
        }
        self.recompute(&state);
    }

    fn recompute(&self, state: &State) {
        let mut view = View::default();
        let mut running: HashMap<IpAddr, bool> = HashMap::new();
        for e in state.pods.values() {
            for ip in &e.ips {
                // Sorted by key: the first keeps an address unless a running pod claims it.
                let taken = running.get(ip).copied();
                if taken.is_some_and(|r| r || !e.running) {
                    continue;
                }
                running.insert(*ip, e.running);
                view.workloads.insert(*ip, e.workload.clone());
                match state.selectors.tenant_of(&e.workload) {
                    Some((tenant, _)) => view.tenants.insert(*ip, tenant),
                    None => view.tenants.remove(ip),
                };
            }
            if let Some(uid) = &e.uid {
                view.by_uid.insert(uid.clone(), e.workload.clone());
                if let Some((tenant, _)) = state.selectors.tenant_of(&e.workload) {
                    view.tenants_by_uid.insert(uid.clone(), tenant);
                }
            }
        }
        self.view.store(Arc::new(view));
        self.version.send_modify(|n| *n += 1);
    }
}

impl WorkloadDirectory for PodDirectory {
    fn tenant_of(&self, addr: IpAddr) -> Option<Arc<str>> {
        self.view.load().tenants.get(&addr).cloned()
    }
}

impl Workloads for PodDirectory {
    fn select(&self, selectors: Arc<WorkloadSelectors>) {
        let mut state = self.state.lock();
        if *state.selectors == *selectors {
            return;
        }
        state.selectors = selectors;
        self.recompute(&state);
    }
}

// === impl State ===

impl State {
    /// Keeps `p` (replacing its previous version), or forgets it when it identifies no
    /// client any more.
    fn upsert(&mut self, p: &Pod) {
        let Some(key) = key(p) else { return };
        match entry(p) {
            Some(e) if self.pods.len() < MAX_PODS || self.pods.contains_key(&key) => {
                self.pods.insert(key, e);
            }
            Some(_) => self.warn_full(),
            None => {
                self.pods.remove(&key);
            }
        }
    }

    fn warn_full(&mut self) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                "more than {MAX_PODS} pods: the others are not identified (their clients fall back to CIDRs and headers)"
            );
        }
    }
}

/// Drops what identity never reads (containers, volumes, conditions, ...), bounding the
/// memory of the followed list.
fn slim(p: &mut Pod) {
    let meta = &mut p.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.owner_references = None;
    if let Some(spec) = &mut p.spec {
        *spec = PodSpec {
            host_network: spec.host_network,
            node_name: spec.node_name.take(),
            service_account_name: spec.service_account_name.take(),
            ..PodSpec::default()
        };
    }
    if let Some(status) = &mut p.status {
        *status = PodStatus {
            phase: status.phase.take(),
            pod_ip: status.pod_ip.take(),
            pod_ips: status.pod_ips.take(),
            ..PodStatus::default()
        };
    }
}

fn key(p: &Pod) -> Option<String> {
    let name = p.metadata.name.as_deref()?;
    let ns = p.metadata.namespace.as_deref().unwrap_or("default");
    Some(format!("{ns}/{name}"))
}

/// What identity keeps of a pod; `None` for a pod that identifies no client.
fn entry(p: &Pod) -> Option<Entry> {
    let spec = p.spec.as_ref();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        return None;
    }
    let status = p.status.as_ref()?;
    let phase = status.phase.as_deref().unwrap_or("");
    if matches!(phase, "Succeeded" | "Failed") {
        return None;
    }
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .chain(status.pod_ip.as_deref().and_then(|ip| ip.parse().ok()))
        .map(canonical)
        .collect();
    ips.sort();
    ips.dedup();
    if ips.is_empty() {
        return None;
    }
    let service_account = spec
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    Some(Entry {
        uid: p.metadata.uid.clone(),
        ips,
        running: phase == "Running",
        workload: Arc::new(Workload {
            namespace: p
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: p.metadata.name.clone().unwrap_or_default(),
            service_account,
            labels: p.metadata.labels.clone().unwrap_or_default(),
        }),
    })
}

/// IPv4-mapped IPv6 as IPv4 (how tenant resolution looks addresses up).
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

pub mod cgroup;
#[cfg(test)]
mod tests;
