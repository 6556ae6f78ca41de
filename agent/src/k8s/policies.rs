//! `RoutePolicy` (namespaced) and `Tenant` (cluster-scoped) objects from the Kubernetes API
//! into the active policy, the same way the policy directory's are (docs/policy.md,
//! "Kubernetes").
//!
//! One followed list per kind (per watched namespace for `RoutePolicy`: [`super::watch::follow`],
//! kube's watcher and reflector with backoff); a watch that ends or fails resumes from its
//! last resourceVersion, and on `410 Gone` (an `ERROR` event or a refused watch) relists,
//! the listed set replacing the old one whole. Every change wakes
//! one task that, once changes pause for [`store::DEBOUNCE`] (at most [`store::MAX_DELAY`]
//! after the first), settles every object of every store with [`store::accept`] — the
//! directory's path: each object validated, an invalid update keeping its last good
//! version, the set checked — and applies the result ([`ActivePolicy::apply_accepted`])
//! when it changed something. Nothing is applied before every reflector has listed once,
//! so a start never serves a partial set.
//!
//! An object's source (`ObjectStatus::file`) is `kubernetes:<key>`. Only what policy reads
//! of an object is kept for accepting (`metadata.name`, `namespace`, `generation`, `uid`,
//! and the `spec`): a status write or an annotation change settles into the same set and
//! publishes nothing.
//!
//! With `status` settings the same task hands every object's desired status to
//! [`status`](super::status), whose writer (the one holder of the status Lease) writes
//! what differs from the object's status.

use std::{path::PathBuf, sync::Arc};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Api, Client, runtime::watcher};
use opentelemetry::metrics::Meter;
use parking_lot::Mutex;
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};

use super::{
    status::{self, Target},
    watch::{KindCounters, follow},
};
use crate::policy::{
    active::ActivePolicy,
    resources::{Resource, ResourceStatus, RoutePolicy, Tenant},
    store::{self, Accepted, MAX_OBJECTS, ReloadCounts, Reloads, Serving, Validator},
};

/// Prefix of an API object's source in its status (`kubernetes:team-a/chat`).
pub const SOURCE_PREFIX: &str = "kubernetes:";

/// The running watchers; dropping it stops them (what was applied keeps serving).
#[derive(Debug)]
pub struct PoliciesHandle {
    synced: watch::Receiver<bool>,
    rounds: watch::Receiver<u64>,
    reloads: Arc<Reloads>,
    status: Option<status::StatusHandle>,
    tasks: Vec<JoinHandle<()>>,
}

/// The latest complete state of one followed list; `None` until it has listed once.
type Slot<K> = Arc<Mutex<Option<Vec<Arc<K>>>>>;

/// Every followed list.
struct Stores {
    policies: Vec<Slot<RoutePolicy>>,
    tenants: Slot<Tenant>,
}

// === impl Stores ===

impl Stores {
    fn listed(&self) -> bool {
        self.policies.iter().all(|s| s.lock().is_some()) && self.tenants.lock().is_some()
    }

    fn policies(&self) -> Vec<Arc<RoutePolicy>> {
        self.policies
            .iter()
            .flat_map(|s| s.lock().clone().unwrap_or_default())
            .collect()
    }

    fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.tenants.lock().clone().unwrap_or_default()
    }
}

/// Watches `RoutePolicy` objects in `namespaces` (empty: every namespace) and every
/// `Tenant`, and applies them to `active`; with `status`, writes their status conditions
/// while this agent holds the status Lease. Registers `warmpath.policy.reloads{result}` and
/// `warmpath.policy.rejected` on `meter`. Must be called within a Tokio runtime.
pub fn spawn(
    client: Client,
    active: Arc<ActivePolicy>,
    namespaces: Vec<String>,
    status: Option<status::Settings>,
    meter: &Meter,
) -> PoliciesHandle {
    let wake = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    let apis: Vec<(Api<RoutePolicy>, String)> = if namespaces.is_empty() {
        vec![(Api::all(client.clone()), "routepolicies".into())]
    } else {
        namespaces
            .iter()
            .map(|ns| {
                (
                    Api::namespaced(client.clone(), ns),
                    format!("routepolicies {ns}"),
                )
            })
            .collect()
    };
    let policies = apis
        .into_iter()
        .map(|(api, what)| reflect(api, what, &wake, &mut tasks))
        .collect();
    let tenants = reflect(
        Api::<Tenant>::all(client.clone()),
        "tenants".into(),
        &wake,
        &mut tasks,
    );
    let stores = Stores { policies, tenants };
    let reloads = Arc::new(Reloads::default());
    reloads.observe(meter);
    let (synced_tx, synced) = watch::channel(false);
    let (rounds_tx, rounds) = watch::channel(0);
    let (targets_tx, targets_rx) = watch::channel(Arc::new(Vec::new()));
    let status = status.map(|s| status::spawn(client, s, targets_rx));
    tasks.push(tokio::spawn(run(Run {
        stores,
        active,
        wake,
        reloads: reloads.clone(),
        synced: synced_tx,
        rounds: rounds_tx,
        targets: targets_tx,
    })));
    PoliciesHandle {
        synced,
        rounds,
        reloads,
        status,
        tasks,
    }
}

/// Follows `api` into a slot, waking `wake` after every batch; its task is pushed to
/// `tasks`.
fn reflect<K>(
    api: Api<K>,
    what: String,
    wake: &Arc<Notify>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Slot<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let slot: Slot<K> = Arc::default();
    let (into, wake) = (slot.clone(), wake.clone());
    tasks.push(tokio::spawn(async move {
        let counters = KindCounters::default();
        let on_state = |state: &[Arc<K>]| {
            *into.lock() = Some(state.to_vec());
            wake.notify_one();
        };
        follow(
            api,
            watcher::Config::default(),
            &what,
            &counters,
            slim::<K>,
            on_state,
        )
        .await;
    }));
    slot
}

/// What settling and status writing never read.
fn slim<K: kube::Resource>(o: &mut K) {
    let meta = o.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
}

// === impl PoliciesHandle ===

impl PoliciesHandle {
    /// Resolves once every reflector has listed and the first set is applied.
    pub async fn synced(&self) {
        let mut rx = self.synced.clone();
        // The sender lives as long as the task; a task gone is as synced as it will be.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// How many times the objects have been settled (after each batch of changes), to
    /// await one.
    pub fn rounds(&self) -> watch::Receiver<u64> {
        self.rounds.clone()
    }

    /// Reloads so far (each that changed what serves or a status).
    pub fn counts(&self) -> ReloadCounts {
        self.reloads.counts()
    }

    /// Stops writing statuses and hands the status Lease back when this agent holds it
    /// ([`status::StatusHandle::release`]); for a graceful shutdown. The watchers go on.
    pub async fn release_status(&mut self) {
        if let Some(s) = self.status.take() {
            s.release().await;
        }
    }

    /// The status writer, when status writes are on.
    pub fn status(&self) -> Option<&status::StatusHandle> {
        self.status.as_ref()
    }
}

impl Drop for PoliciesHandle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What the applying task owns.
struct Run {
    stores: Stores,
    active: Arc<ActivePolicy>,
    wake: Arc<Notify>,
    reloads: Arc<Reloads>,
    synced: watch::Sender<bool>,
    rounds: watch::Sender<u64>,
    targets: watch::Sender<Arc<Vec<Target>>>,
}

async fn run(r: Run) {
    while !r.stores.listed() {
        r.wake.notified().await;
    }
    let mut published = r.active.subscribe();
    let mut prev: Option<Arc<Accepted>> = None;
    loop {
        let next = Arc::new(store::accept(
            objects(&r.stores),
            &Validator::default(),
            prev.as_deref(),
        ));
        let changed = prev
            .as_ref()
            .is_none_or(|p| p.generation != next.generation || p.objects != next.objects);
        if changed {
            r.reloads.report("kubernetes", prev.as_deref(), &next);
            r.active.apply_accepted(next.clone());
        }
        prev = Some(next.clone());
        r.synced.send_replace(true);
        published.mark_unchanged();
        r.targets
            .send_replace(Arc::new(targets(&r.stores, &next, &r.active)));
        r.rounds.send_modify(|n| *n += 1);
        tokio::select! {
            () = r.wake.notified() => store::quiet(&r.wake).await,
            // A pool added or retargeted changes what references resolve to.
            changed = published.changed() => if changed.is_err() { return },
        }
    }
}

/// Every object of the stores, sorted by source, as policy reads it; at most
/// [`MAX_OBJECTS`] (the others are left out with a warning).
fn objects(stores: &Stores) -> Vec<(PathBuf, Resource)> {
    let mut out: Vec<(PathBuf, Resource)> = Vec::new();
    out.extend(stores.policies().iter().map(|p| {
        let r = Resource::RoutePolicy(RoutePolicy {
            metadata: kept_meta(&p.metadata),
            spec: p.spec.clone(),
            status: None,
        });
        (source(&r), r)
    }));
    out.extend(stores.tenants().iter().map(|t| {
        let r = Resource::Tenant(Tenant {
            metadata: kept_meta(&t.metadata),
            spec: t.spec.clone(),
            status: None,
        });
        (source(&r), r)
    }));
    out.sort_by(|a, b| (a.1.kind(), &a.0).cmp(&(b.1.kind(), &b.0)));
    if out.len() > MAX_OBJECTS {
        tracing::warn!(
            objects = out.len(),
            "more than {MAX_OBJECTS} RoutePolicy and Tenant objects: only the first {MAX_OBJECTS} by kind and key apply"
        );
        out.truncate(MAX_OBJECTS);
    }
    out
}

/// `kubernetes:<key>`.
pub fn source(r: &Resource) -> PathBuf {
    PathBuf::from(format!("{SOURCE_PREFIX}{}", r.key()))
}

fn kept_meta(m: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        generation: m.generation,
        uid: m.uid.clone(),
        ..ObjectMeta::default()
    }
}

/// Each object's status as it is and as this agent would have it: `Accepted` from the
/// settled set, `ResolvedRefs` from compiling the version that serves.
fn targets(stores: &Stores, accepted: &Accepted, active: &ActivePolicy) -> Vec<Target> {
    let set = active.current();
    let desired = |kind: &'static str, key: &str| -> Option<ResourceStatus> {
        let o = accepted.object(kind, key)?;
        let mut s = o.status();
        if o.serving != Serving::None
            && let Some((_, _, c)) = set
                .resolved
                .iter()
                .find(|(k, name, _)| *k == kind && name == key)
        {
            s.conditions.push(c.clone());
        }
        Some(s)
    };
    let mut out = Vec::new();
    for p in stores.policies() {
        let key = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or("default"),
            p.metadata.name.as_deref().unwrap_or("")
        );
        let Some(want) = desired("RoutePolicy", &key) else {
            continue;
        };
        out.push(Target {
            kind: status::Kind::RoutePolicy,
            namespace: p.metadata.namespace.clone(),
            name: p.metadata.name.clone().unwrap_or_default(),
            resource_version: p.metadata.resource_version.clone(),
            current: p.status.clone(),
            desired: want,
        });
    }
    for t in stores.tenants() {
        let name = t.metadata.name.clone().unwrap_or_default();
        let Some(want) = desired("Tenant", &name) else {
            continue;
        };
        out.push(Target {
            kind: status::Kind::Tenant,
            namespace: None,
            name,
            resource_version: t.metadata.resource_version.clone(),
            current: t.status.clone(),
            desired: want,
        });
    }
    out
}
