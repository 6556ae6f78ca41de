//! A fake Kubernetes API server for the agent's watchers: real list/watch HTTP on
//! `127.0.0.1`, driven by the real `kube` client (there is no kube-apiserver on these
//! machines).
//!
//! What it models:
//! - a store of JSON objects for any registered kind ([`ResourceType`]; by default pods,
//!   services, InferencePools, RoutePolicies, Tenants and Leases), with one global
//!   `resourceVersion` counter (as etcd's revision), `uid`, `creationTimestamp` and
//!   `generation` (bumped when anything but `metadata` and `status` changes, as for CRDs with
//!   a status subresource); a write that changes nothing records no event;
//! - LIST with `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, exists, `!`), `fieldSelector`
//!   (`metadata.name`, `metadata.namespace`, and per kind e.g. `spec.nodeName`), `limit` /
//!   `continue` pagination, `resourceVersion` / `resourceVersionMatch` (refusing the
//!   combinations the real server refuses);
//! - WATCH (`watch=true`) from a resourceVersion: replay from a bounded history, then live
//!   events; selectors applied to each change (an object that stops matching is sent as
//!   DELETED, one that starts as ADDED); `allowWatchBookmarks` (BOOKMARK every
//!   [`Builder::bookmark_interval`]); `timeoutSeconds`; `sendInitialEvents` (streaming lists);
//!   an expired resourceVersion answered as an `ERROR` event with a 410 `Status` or as HTTP
//!   410 ([`Expiry`]);
//! - GET, POST, PUT (409 on a stale `metadata.resourceVersion`), PATCH (merge, JSON patch,
//!   strategic merge and server-side apply) and DELETE of objects and of the `/status`
//!   subresource; every HTTP write is recorded with its field manager and headers
//!   ([`FakeKube::writes`]) before the change can be read back;
//! - discovery (`/api`, `/apis`, `/api/v1`, `/apis/{group}/{version}`) and `/version`;
//! - a bearer token: requests without it get 401;
//! - bounds: the event history ([`Builder::history`]), the objects
//!   ([`Builder::max_objects`]; beyond, 507), request bodies (1 MiB; 413), recorded writes
//!   and connections. Every refusal is a `Status` with its code; no input panics.
//!
//! What it does not: authorization (RBAC), admission, validation against schemas, owner
//! references and garbage collection, finalizers (DELETE removes at once; tests mark pods
//! terminating with [`FakeKube::start_deletion`]), field ownership (server-side apply is a
//! merge patch of the applied object: fields a manager stops applying are not removed),
//! strategic merge keys (a strategic merge patch is a JSON merge patch), consistent list
//! snapshots across pages (a later page reads the current objects; a watch from the first
//! page's resourceVersion replays whatever changed meanwhile, so clients still converge),
//! TLS, protobuf and table output.
//!
//! Test knobs: [`FakeKube::compact`], [`FakeKube::drop_watches`],
//! [`FakeKube::expire_watches`], [`FakeKube::pause_watches`], [`FakeKube::fail_next`];
//! observations: [`FakeKube::counters`], [`FakeKube::wait_for_counters`],
//! [`FakeKube::writes`]. The test drives the cluster with [`FakeKube::apply`] and
//! [`FakeKube::delete`], which bypass HTTP.

mod discovery;
mod reads;
mod resources;
mod selector;
mod server;
mod state;
mod status;
mod store;
mod watch;
mod writes;

use std::{
    net::SocketAddr,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use serde::Serialize;
use serde_json::{Value, json};

pub use resources::{
    DEFAULT_RESOURCES, INFERENCE_POOLS, LEASES, PODS, ROUTE_POLICIES, ResourceType, SERVICES,
    TENANTS,
};
pub use state::{Counters, Expiry, RecordedWrite};
pub use status::ApiError;
pub use store::{EventType, Limits};

use state::Shared;

use store::{Key, Store};

/// Events kept for watch replay: a watch from further back is expired (410).
const DEFAULT_HISTORY: usize = 1_000;
/// Objects kept across all kinds; far above any test's cluster.
const DEFAULT_MAX_OBJECTS: usize = 10_000;
/// Short, so a test sees bookmarks within its deadline; a real server sends one a minute.
const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);
/// The bearer token of every fake's kubeconfig.
const TOKEN: &str = "fake-kube-token";

/// Why [`FakeKube::client`] could not build a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the fake's kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("the kube client: {0}")]
    Client(#[from] kube::Error),
}

/// Settings of a fake before it starts.
#[derive(Debug, Clone)]
pub struct Builder {
    resources: Vec<ResourceType>,
    limits: Limits,
    bookmark_interval: Duration,
    expiry: Expiry,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            resources: DEFAULT_RESOURCES.to_vec(),
            limits: Limits {
                history: DEFAULT_HISTORY,
                objects: DEFAULT_MAX_OBJECTS,
            },
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            expiry: Expiry::ErrorEvent,
        }
    }
}

impl Builder {
    /// Serves `kind` too.
    pub fn resource(mut self, kind: ResourceType) -> Self {
        self.resources
            .retain(|k| k.plural != kind.plural || k.group != kind.group);
        self.resources.push(kind);
        self
    }

    /// Events kept for replay (at least 1).
    pub fn history(mut self, events: usize) -> Self {
        self.limits.history = events.max(1);
        self
    }

    pub fn max_objects(mut self, objects: usize) -> Self {
        self.limits.objects = objects;
        self
    }

    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every.max(Duration::from_millis(1));
        self
    }

    pub fn expiry(mut self, expiry: Expiry) -> Self {
        self.expiry = expiry;
        self
    }

    /// Binds `127.0.0.1:0` and starts serving on the current tokio runtime.
    pub async fn start(self) -> std::io::Result<FakeKube> {
        let store = Store::new(self.resources, self.limits);
        let shared = Arc::new(Shared::new(
            store,
            self.expiry,
            self.bookmark_interval,
            TOKEN,
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(server::serve(listener, shared.clone()));
        Ok(FakeKube {
            shared,
            addr,
            server,
        })
    }
}

/// A running fake; the server and its watch streams stop when it is dropped.
#[derive(Debug)]
pub struct FakeKube {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.shared.control.send_modify(|c| c.shutdown = true);
        self.server.abort();
    }
}

// === impl FakeKube ===

impl FakeKube {
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A fake with the default kinds and settings.
    pub async fn start() -> std::io::Result<Self> {
        Builder::default().start().await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bearer token requests must carry.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// A kubeconfig naming this server (plain HTTP) and its token, namespace `default`.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\n\
             users:\n- name: fake\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  context:\n    \
             cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\n",
            url = self.url(),
            token = self.shared.token,
        )
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path`, for a process under test to read
    /// through `KUBECONFIG`.
    pub fn kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    /// A real kube client configured from this fake's kubeconfig, as `KUBECONFIG` would.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml())?;
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        Ok(kube::Client::try_from(config)?)
    }

    fn kind_index(&self, kind: &ResourceType) -> Result<usize, ApiError> {
        self.shared
            .store
            .lock()
            .kind_of(kind)
            .ok_or_else(|| ApiError::not_found(&format!("resource {}", kind.plural)))
    }

    fn key(kind: usize, rt: &ResourceType, namespace: Option<&str>, name: &str) -> Key {
        let ns = if rt.namespaced {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        (kind, ns.to_string(), name.to_string())
    }

    /// Creates or replaces `obj` (its kind from `apiVersion` and `kind`, namespace
    /// `default` when it names none) exactly as given, `status` included; returns it as
    /// stored, with its new resourceVersion.
    pub fn apply(&self, mut obj: Value) -> Result<Value, ApiError> {
        let mut store = self.shared.store.lock();
        let kind = store.kind_of_object(&obj)?;
        let key = store.key_of(kind, &mut obj, None)?;
        store.commit(key, obj)
    }

    /// [`Self::apply`] of a typed object (a k8s-openapi `Pod`, a warmpath `RoutePolicy`).
    pub fn apply_object<T: Serialize>(&self, obj: &T) -> Result<Value, ApiError> {
        let value = serde_json::to_value(obj)
            .map_err(|e| ApiError::bad_request(format!("the object does not serialize: {e}")))?;
        self.apply(value)
    }

    /// Deletes at once (no finalizers, no grace period); returns the object as the DELETED
    /// event carries it.
    pub fn delete(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let k = self.kind_index(kind)?;
        self.shared
            .store
            .lock()
            .remove(&Self::key(k, kind, namespace, name))
    }

    /// Marks the object terminating, as a graceful delete does before the kubelet finishes:
    /// sets `metadata.deletionTimestamp` and `deletionGracePeriodSeconds` (a MODIFIED event;
    /// none when it is terminating already).
    pub fn start_deletion(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let k = self.kind_index(kind)?;
        let key = Self::key(k, kind, namespace, name);
        let mut store = self.shared.store.lock();
        let mut obj = store
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(name))?;
        if obj["metadata"].get("deletionTimestamp").is_some() {
            return Ok(obj);
        }
        obj["metadata"]["deletionTimestamp"] = json!(store::now_rfc3339());
        obj["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        store.commit(key, obj)
    }

    pub fn get(&self, kind: &ResourceType, namespace: Option<&str>, name: &str) -> Option<Value> {
        let k = self.kind_index(kind).ok()?;
        self.shared
            .store
            .lock()
            .get(&Self::key(k, kind, namespace, name))
            .cloned()
    }

    /// Every stored object of `kind`, in list order.
    pub fn objects(&self, kind: &ResourceType) -> Vec<Value> {
        let Ok(k) = self.kind_index(kind) else {
            return Vec::new();
        };
        let store = self.shared.store.lock();
        store.list(k, None, &Default::default(), None, None).items
    }

    /// The latest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.lock().resource_version()
    }

    // --- knobs ---

    /// Drops the event history and advances the resourceVersion by one: a watch from any
    /// resourceVersion handed out before is expired (410), so a client whose watch ends
    /// (timeout, [`Self::drop_watches`], [`Self::expire_watches`]) must relist, whether or
    /// not it had received the latest events. Open watches keep streaming.
    pub fn compact(&self) {
        self.shared.store.lock().compact();
    }

    /// Closes every open watch stream abruptly (no final chunk), as a dropped connection.
    pub fn drop_watches(&self) {
        self.shared.control.send_modify(|c| c.dropped += 1);
    }

    /// Ends every open watch with a 410 `ERROR` event (as the server does to a watcher that
    /// fell behind compaction); the client must relist.
    pub fn expire_watches(&self) {
        self.shared.control.send_modify(|c| c.expired += 1);
    }

    /// Holds back events and bookmarks on every watch (open and new) until
    /// [`Self::resume_watches`]; a watch held back longer than the history is closed.
    pub fn pause_watches(&self) {
        self.shared.control.send_modify(|c| c.paused = true);
    }

    pub fn resume_watches(&self) {
        self.shared.control.send_modify(|c| c.paused = false);
    }

    pub fn set_expiry(&self, expiry: Expiry) {
        self.shared.knobs.lock().expiry = expiry;
    }

    /// Answers the next `n` API requests (any kind, lists and watches included) with
    /// `code` (e.g. 500, or 429 with `Retry-After: 1`).
    pub fn fail_next(&self, n: usize, code: u16) {
        self.shared.knobs.lock().failures = (n, code);
    }

    // --- observations ---

    pub fn counters(&self, kind: &ResourceType) -> Counters {
        let Ok(k) = self.kind_index(kind) else {
            return Counters::default();
        };
        self.shared.counters(k)
    }

    /// Waits until `kind`'s counters satisfy `pred`; Err with the last counters after
    /// `timeout`.
    pub async fn wait_for_counters(
        &self,
        kind: &ResourceType,
        timeout: Duration,
        mut pred: impl FnMut(&Counters) -> bool,
    ) -> Result<Counters, Counters> {
        let deadline = Instant::now() + timeout;
        let mut changed = self.shared.counters_changed();
        loop {
            let now = self.counters(kind);
            if pred(&now) {
                return Ok(now);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Err(self.counters(kind)),
            }
        }
    }

    /// Every HTTP write recorded, oldest first (at most the latest 10,000).
    pub fn writes(&self) -> Vec<RecordedWrite> {
        self.shared.writes()
    }

    /// The writes to one object's `/status` subresource.
    pub fn status_writes(
        &self,
        kind: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Vec<RecordedWrite> {
        self.writes()
            .into_iter()
            .filter(|w| {
                w.plural == kind.plural
                    && w.name == name
                    && w.namespace.as_deref() == namespace.filter(|_| kind.namespaced)
                    && w.subresource.as_deref() == Some("status")
            })
            .collect()
    }
}
