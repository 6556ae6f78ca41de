//! Status conditions on `RoutePolicy` and `Tenant` objects, written by exactly one agent:
//! the holder of the Lease [`LEASE_NAME`] in the agent's namespace ([`lease`]).
//!
//! Every agent computes each object's desired status (`Accepted` from validation,
//! `ResolvedRefs` from compiling the version that serves; `k8s::policies`). The holder
//! compares it with the status the object carries ([`next_status`]): when they differ it
//! writes the whole status with a merge patch of the `status` subresource (field manager
//! [`FIELD_MANAGER`]); when they agree it writes nothing, so a reconnect or relist, which
//! shows the statuses already written, writes nothing either, and a write (which comes back
//! as a watch event with the status written) settles instead of looping. A follower writes
//! nothing; a holder that loses the Lease stops before its next write.
//!
//! Conditions of other types on an object (written by someone else) are kept. A
//! condition's `lastTransitionTime` is the one the object carries while its `status` stays
//! the same, and the time of the write when it changes.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::SystemTime,
};

use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
    time::Instant,
};

use crate::policy::resources::{Condition, ResourceStatus, RoutePolicy, Tenant};

pub mod lease;
#[cfg(test)]
mod tests;

pub use lease::{Elector, KubeLease, LeaseApi, LeaseError, LeaseRecord, LeaseTiming};

/// The Lease whose holder writes statuses.
pub const LEASE_NAME: &str = "warmpath-status";
/// Field manager of status writes.
pub const FIELD_MANAGER: &str = "warmpath";
/// The condition types this agent owns on an object.
pub const MANAGED: [&str; 2] = ["Accepted", "ResolvedRefs"];

/// Where and as whom this agent takes part in the status election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The Lease holder identity: the node name (one agent per node).
    pub holder: String,
    /// The agent's namespace (the Lease's).
    pub namespace: String,
    pub timing: LeaseTiming,
}

/// The kind of an object whose status is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    RoutePolicy,
    Tenant,
}

/// One object: its status as it is, and as this agent would have it.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub kind: Kind,
    /// `None` for a Tenant (cluster-scoped).
    pub namespace: Option<String>,
    pub name: String,
    /// The resourceVersion the `current` status was read at.
    pub resource_version: Option<String>,
    pub current: Option<ResourceStatus>,
    /// Conditions with any `lastTransitionTime` ([`next_status`] sets it).
    pub desired: ResourceStatus,
}

/// Writes one object's status.
pub trait StatusApi: Send + Sync + 'static {
    fn write(
        &self,
        target: &Target,
        status: &ResourceStatus,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// The status to write over `current` to say `desired`, or `None` when `current` says it
/// already. The managed conditions ([`MANAGED`]) become `desired`'s — each keeping
/// `current`'s `lastTransitionTime` when its `status` is unchanged, `now` otherwise — and
/// those absent from `desired` are removed; other conditions stay as they are, after them.
/// Conditions are compared by type, in any order.
pub fn next_status(
    current: Option<&ResourceStatus>,
    desired: &ResourceStatus,
    now: &str,
) -> Option<ResourceStatus> {
    let empty = ResourceStatus::default();
    let current = current.unwrap_or(&empty);
    let find = |type_: &str| current.conditions.iter().find(|c| c.type_ == type_);
    let mut conditions: Vec<Condition> = desired
        .conditions
        .iter()
        .map(|c| {
            let since = find(&c.type_)
                .filter(|was| was.status == c.status)
                .map_or_else(|| now.to_string(), |was| was.last_transition_time.clone());
            Condition {
                last_transition_time: since,
                ..c.clone()
            }
        })
        .collect();
    conditions.extend(
        current
            .conditions
            .iter()
            .filter(|c| !MANAGED.contains(&c.type_.as_str()))
            .cloned(),
    );
    let next = ResourceStatus {
        observed_generation: desired.observed_generation,
        conditions,
    };
    let same = next.observed_generation == current.observed_generation
        && by_type(&next) == by_type(current);
    (!same).then_some(next)
}

fn by_type(s: &ResourceStatus) -> Vec<&Condition> {
    let mut c: Vec<&Condition> = s.conditions.iter().collect();
    c.sort_by(|a, b| a.type_.cmp(&b.type_));
    c
}

/// The election and the writer; dropping it stops both (the Lease then expires).
#[derive(Debug)]
pub struct StatusHandle {
    leading: watch::Receiver<Option<Instant>>,
    writes: Arc<AtomicU64>,
    rounds: watch::Receiver<u64>,
    release: Option<oneshot::Sender<()>>,
    /// The election, then the writer.
    tasks: Vec<JoinHandle<()>>,
}

// === impl StatusHandle ===

impl StatusHandle {
    /// This agent holds the Lease (and writes statuses).
    pub fn is_leader(&self) -> bool {
        leads(&self.leading)
    }

    /// Status writes made so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Stops writing and, when this agent holds the Lease, hands it back (holder cleared),
    /// so that another agent takes over at its next read (within 5 s) instead of after the
    /// Lease expires. For a graceful shutdown; dropping the handle stops without it.
    pub async fn release(mut self) {
        if let Some(writer) = self.tasks.get(1) {
            writer.abort();
        }
        if let Some(tx) = self.release.take() {
            let _ = tx.send(());
        }
        if !self.tasks.is_empty() {
            let election = self.tasks.remove(0);
            // The election task bounds its own call; an error here is a cancelled task.
            let _ = election.await;
        }
    }

    /// How many times the writer has gone over the objects (after each change of the
    /// desired statuses or of the election), to await one.
    pub fn rounds(&self) -> watch::Receiver<u64> {
        self.rounds.clone()
    }
}

impl Drop for StatusHandle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn leads(leading: &watch::Receiver<Option<Instant>>) -> bool {
    leading.borrow().is_some_and(|until| Instant::now() < until)
}

/// Takes part in the election over the API and, while holding the Lease, writes the
/// statuses `targets` differ in.
pub fn spawn(
    client: Client,
    settings: Settings,
    targets: watch::Receiver<Arc<Vec<Target>>>,
) -> StatusHandle {
    let lease = KubeLease {
        api: Api::namespaced(client.clone(), &settings.namespace),
        name: LEASE_NAME.to_string(),
    };
    spawn_with(lease, KubeStatus { client }, settings, targets)
}

/// [`spawn`] over any Lease and status API.
pub fn spawn_with<L: LeaseApi, S: StatusApi>(
    lease: L,
    status: S,
    settings: Settings,
    targets: watch::Receiver<Arc<Vec<Target>>>,
) -> StatusHandle {
    let (tx, leading) = watch::channel(None);
    let (rounds_tx, rounds) = watch::channel(0);
    let writes = Arc::new(AtomicU64::new(0));
    let elector = Elector::new(lease, settings.holder, settings.timing);
    let writer = Writer {
        api: status,
        targets,
        leading: leading.clone(),
        writes: writes.clone(),
        rounds: rounds_tx,
    };
    let (release, released) = oneshot::channel();
    let tasks = vec![
        tokio::spawn(elect(elector, settings.timing, tx, released)),
        tokio::spawn(write(writer)),
    ];
    StatusHandle {
        leading,
        writes,
        rounds,
        release: Some(release),
        tasks,
    }
}

async fn elect<L: LeaseApi>(
    mut e: Elector<L>,
    timing: LeaseTiming,
    tx: watch::Sender<Option<Instant>>,
    mut release: oneshot::Receiver<()>,
) {
    loop {
        let round = async {
            // A call that hangs counts as a failure: leading ends at its deadline anyway.
            if let Ok(until) = tokio::time::timeout(timing.retry, e.tick()).await {
                tx.send_replace(until);
            }
            tokio::time::sleep(timing.retry).await;
        };
        tokio::select! {
            biased;
            r = &mut release => {
                if r.is_ok() {
                    tx.send_replace(None);
                    let _ = tokio::time::timeout(timing.retry, e.release()).await;
                }
                return;
            }
            () = round => {}
        }
    }
}

/// Identity of an object across its versions.
type ObjectKey = (Kind, Option<String>, String);

/// What the writing task owns.
struct Writer<S> {
    api: S,
    targets: watch::Receiver<Arc<Vec<Target>>>,
    leading: watch::Receiver<Option<Instant>>,
    writes: Arc<AtomicU64>,
    rounds: watch::Sender<u64>,
}

async fn write<S: StatusApi>(w: Writer<S>) {
    let Writer {
        api,
        mut targets,
        mut leading,
        writes,
        rounds,
    } = w;
    // What was written, per object: the resourceVersion it was written over and the status
    // desired then; until the object comes back changed, the same wish is not written again.
    let mut written: HashMap<ObjectKey, (Option<String>, ResourceStatus)> = HashMap::new();
    loop {
        let ts = targets.borrow_and_update().clone();
        leading.mark_unchanged();
        written.retain(|k, _| {
            ts.iter()
                .any(|t| (t.kind, t.namespace.clone(), t.name.clone()) == *k)
        });
        for t in ts.iter() {
            if !leads(&leading) {
                break;
            }
            let key = (t.kind, t.namespace.clone(), t.name.clone());
            let now = rfc3339_now();
            let Some(next) = next_status(t.current.as_ref(), &t.desired, &now) else {
                written.remove(&key);
                continue;
            };
            let wish = (t.resource_version.clone(), t.desired.clone());
            if written.get(&key) == Some(&wish) {
                continue;
            }
            match api.write(t, &next).await {
                Ok(()) => {
                    writes.fetch_add(1, Ordering::Relaxed);
                    written.insert(key, wish);
                }
                Err(e) => {
                    tracing::warn!(kind = ?t.kind, namespace = ?t.namespace, name = %t.name, error = %e, "status write failed; retried at the next Lease renewal");
                }
            }
        }
        rounds.send_modify(|n| *n += 1);
        tokio::select! {
            r = targets.changed() => if r.is_err() { return },
            r = leading.changed() => if r.is_err() { return },
        }
    }
}

/// Now, RFC 3339 in UTC to the second, as Kubernetes writes condition times.
fn rfc3339_now() -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(now).unwrap_or(0))
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

/// Status writes over the API: a merge patch of the `status` subresource.
#[derive(Clone)]
struct KubeStatus {
    client: Client,
}

impl StatusApi for KubeStatus {
    async fn write(&self, t: &Target, status: &ResourceStatus) -> Result<(), String> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        let patch = Patch::Merge(serde_json::json!({ "status": status }));
        let result = match t.kind {
            Kind::RoutePolicy => {
                let ns = t.namespace.as_deref().unwrap_or("default");
                Api::<RoutePolicy>::namespaced(self.client.clone(), ns)
                    .patch_status(&t.name, &params, &patch)
                    .await
                    .map(drop)
            }
            Kind::Tenant => Api::<Tenant>::all(self.client.clone())
                .patch_status(&t.name, &params, &patch)
                .await
                .map(drop),
        };
        result.map_err(|e| e.to_string())
    }
}
