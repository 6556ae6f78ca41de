//! Declarative policy: `RoutePolicy` and `Tenant` resources (group `warmpath.dev`,
//! `v1alpha1`), from Kubernetes or, off-cluster, from YAML files in `--policy-dir`
//! (docs/policy.md).
//!
//! Data flows one way: documents ([`documents`]) are read into resources
//! ([`resources`]), checked ([`validate`]), compiled with the agent's own configuration
//! into one immutable [`compiled::PolicySet`] and published ([`active::ActivePolicy`]); off
//! cluster the `store` reads and watches the directory and keeps the last good version of
//! each object when an update is invalid. The proxy reads the current set once per request.

pub mod active;
pub mod cli;
pub mod compiled;
pub mod convert;
pub mod crds;
pub mod crds_command;
pub mod documents;
pub mod quota;
pub mod resources;
pub mod salt;
pub mod schema_docs;
pub mod store;
pub mod validate;

use std::{path::Path, sync::Arc};

/// Watches `dir` (off-cluster policy) and applies each accepted set to `active`; the
/// first load has been applied when this returns. Dropping the handle stops watching.
pub fn watch_dir(
    dir: &Path,
    active: Arc<active::ActivePolicy>,
    meter: &opentelemetry::metrics::Meter,
) -> Result<PolicyWatch, store::Error> {
    let (tx, mut rx) = tokio::sync::watch::channel(Arc::new(store::Accepted::default()));
    let handle = store::watch(dir.to_path_buf(), store::Validator::default(), tx)?;
    let first = rx.borrow_and_update().clone();
    active.apply_accepted(first);
    let applier = active.clone();
    let task = tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let accepted = rx.borrow_and_update().clone();
            applier.apply_accepted(accepted);
        }
    });
    handle.observe(meter);
    Ok(PolicyWatch {
        _handle: handle,
        task,
    })
}

/// A watched policy directory; dropping it stops watching (the last set keeps serving).
#[derive(Debug)]
pub struct PolicyWatch {
    _handle: store::WatchHandle,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PolicyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
