//! Following one pool's members: its `InferencePool` (when it names one) resolved into a
//! [`Selection`], the pods of that selection watched, and the pool's entry of [`Desired`]
//! published after every batch of changes ([`super::pods`] translates them). The pods
//! watcher restarts when the selection changes; until its first list is complete the
//! previous membership stays published.

use std::{
    collections::HashMap,
    sync::{Arc, atomic::Ordering},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, runtime::watcher};
use tokio::sync::watch;

use super::{
    Shared,
    inference_pool::{self, InferencePool, Selection},
    pods::{self, Problem},
    watch::follow,
};
use crate::{
    config::PoolMembers,
    discovery::{Desired, EndpointSpec},
};

/// Follows pool `name`'s members forever, publishing its entry of `members`.
pub(super) async fn follow_pool(
    shared: Arc<Shared>,
    name: String,
    members: PoolMembers,
    out: watch::Sender<Desired>,
) {
    let mut pool = PoolState {
        name,
        out,
        shared,
        synced: false,
        reported: HashMap::new(),
    };
    match members {
        PoolMembers::Selector {
            namespace,
            match_labels,
            port,
        } => {
            let selection = Selection {
                namespace,
                match_labels,
                port,
            };
            pool.follow_pods(&selection).await;
        }
        PoolMembers::InferencePool { namespace, name } => {
            pool.follow_inference_pool(namespace, name).await;
        }
    }
}

/// What an `InferencePool` resolves to.
#[derive(Debug, Clone, PartialEq)]
enum Resolved {
    /// Not listed yet.
    Unknown,
    /// Absent or unusable (the reason was logged): the pool has no endpoints.
    Nothing,
    Selects(Selection),
}

struct PoolState {
    name: String,
    out: watch::Sender<Desired>,
    shared: Arc<Shared>,
    synced: bool,
    /// The problem last reported per pod uid.
    reported: HashMap<String, String>,
}

impl PoolState {
    async fn follow_inference_pool(&mut self, namespace: String, object: String) {
        let (tx, mut rx) = watch::channel(Resolved::Unknown);
        let shared = self.shared.clone();
        let pool = self.name.clone();
        let what = format!("InferencePool {namespace}/{object} (pool {pool})");
        let api = Api::<InferencePool>::namespaced(shared.client.clone(), &namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={object}"));
        let mut last_reason = None;
        let resolve = follow(
            api,
            config,
            &what,
            &shared.counters.inference_pools,
            inference_pool::slim,
            |objects| {
                let resolved = match objects.first() {
                    None => Err("not found".to_string()),
                    Some(p) => inference_pool::selection_of(p),
                };
                let resolved = match resolved {
                    Ok(s) => {
                        last_reason = None;
                        Resolved::Selects(s)
                    }
                    Err(why) => {
                        if last_reason.as_ref() != Some(&why) {
                            tracing::warn!("kubernetes: {what}: {why}; the pool has no endpoints");
                            last_reason = Some(why);
                        }
                        Resolved::Nothing
                    }
                };
                tx.send_if_modified(|r| {
                    let changed = *r != resolved;
                    *r = resolved;
                    changed
                });
            },
        );
        let members = async {
            loop {
                let current = rx.borrow_and_update().clone();
                match current {
                    Resolved::Unknown => {}
                    Resolved::Nothing => self.publish(Vec::new()),
                    Resolved::Selects(selection) => {
                        tokio::select! {
                            _ = self.follow_pods(&selection) => {}
                            _ = rx.changed() => {
                                self.shared.counters.pods.restarts.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                        }
                    }
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = resolve => {}
            _ = members => {}
        }
    }

    async fn follow_pods(&mut self, selection: &Selection) {
        let labels = selection.label_selector();
        let what = format!("pods {} {labels} (pool {})", selection.namespace, self.name);
        let api = Api::<Pod>::namespaced(self.shared.client.clone(), &selection.namespace);
        let config = watcher::Config::default().labels(&labels);
        let shared = self.shared.clone();
        let node = shared.node.as_deref();
        follow(
            api,
            config,
            &what,
            &shared.counters.pods,
            pods::slim,
            |list| {
                let t = pods::translate(selection.port, list.iter().map(|p| &**p), node);
                self.report(&t.problems);
                self.publish(t.endpoints);
            },
        )
        .await;
    }

    /// Logs and counts each pod's problem once (again when it changes).
    fn report(&mut self, problems: &[Problem]) {
        let mut now = HashMap::with_capacity(problems.len());
        for p in problems {
            if self.reported.get(&p.uid) != Some(&p.message) {
                self.shared
                    .counters
                    .bad_annotations
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "kubernetes: pool {}: pod {}: {}",
                    self.name,
                    p.pod,
                    p.message
                );
            }
            now.insert(p.uid.clone(), p.message.clone());
        }
        self.reported = now;
    }

    fn publish(&mut self, endpoints: Vec<EndpointSpec>) {
        let name = &self.name;
        let changed = self.out.send_if_modified(|d| {
            if d.get(name) == Some(&endpoints) {
                return false;
            }
            d.insert(name.clone(), endpoints);
            true
        });
        if changed {
            self.shared
                .counters
                .members_published
                .fetch_add(1, Ordering::Relaxed);
        }
        if !self.synced {
            self.synced = true;
            self.shared
                .pending
                .send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}
