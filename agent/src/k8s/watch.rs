//! One followed list of objects: a [`kube::runtime::watcher`] with the default backoff,
//! its objects slimmed as they arrive and kept in a [`reflector`] store, and a callback with
//! the whole store after each batch of changes.
//!
//! The watcher lists, then watches from the list's `resourceVersion`, re-watching when a
//! watch ends (the server's timeout) and relisting when the server answers a watch with an
//! `ERROR` event of code 410 (`Expired`: the version is older than the server keeps). A
//! watch *request* refused with HTTP 410 is not relisted by the watcher itself (it retries
//! the same version, kube-rs issue #1042); [`follow`] restarts the watcher then, which
//! relists. During a relist the store keeps the previous state until the list is complete.
//!
//! Batches: the callback runs once per complete list (not once per object) and, after
//! that, once per run of changes that arrived together.

use std::{
    convert::Infallible,
    fmt::Debug,
    hash::Hash,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, StreamExt};
use kube::{
    Api, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher::{self, Event},
    },
};
use serde::de::DeserializeOwned;

/// What one kind's watchers did, counted since start.
#[derive(Debug, Default)]
pub struct KindCounters {
    /// Complete lists (the first, and every relist).
    pub lists: AtomicU64,
    /// Watchers started again by the agent: a changed selector, a watch refused with 410.
    pub restarts: AtomicU64,
    /// Errors from the API server or the connection (each retried after a backoff).
    pub errors: AtomicU64,
}

/// [`KindCounters`] read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindSnapshot {
    pub lists: u64,
    pub restarts: u64,
    pub errors: u64,
}

impl KindCounters {
    pub fn snapshot(&self) -> KindSnapshot {
        KindSnapshot {
            lists: self.lists.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// Follows `api` filtered by `config` forever, calling `on_state` with every object after
/// each batch (first: when the first list is complete). `what` names the list in logs
/// (`pods ml app=vllm`); `slim` drops what the callback does not read, bounding memory.
pub async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &str,
    counters: &KindCounters,
    slim: fn(&mut K),
    mut on_state: impl FnMut(&[Arc<K>]),
) -> Infallible
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let mut restart_delay = MIN_RESTART_DELAY;
    loop {
        let (store, writer): (Store<K>, _) = reflector::store();
        let stream = watcher::watcher(api.clone(), config.clone())
            .modify(slim)
            .default_backoff()
            .reflect(writer);
        let mut stream = pin!(stream);
        let mut listed = false;
        'watch: while let Some(first) = stream.next().await {
            let mut changed = false;
            let mut next = Some(first);
            while let Some(item) = next.take() {
                match item {
                    Ok(Event::InitDone) => {
                        counters.lists.fetch_add(1, Ordering::Relaxed);
                        listed = true;
                        changed = true;
                    }
                    Ok(Event::Apply(_) | Event::Delete(_)) => {
                        changed |= listed;
                        restart_delay = MIN_RESTART_DELAY;
                    }
                    Ok(Event::Init | Event::InitApply(_)) => {}
                    Err(e) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("kubernetes: {what}: {e}{}", hint(&e));
                        if refused_gone(&e) {
                            counters.restarts.fetch_add(1, Ordering::Relaxed);
                            tracing::info!("kubernetes: {what}: relisting");
                            break 'watch;
                        }
                    }
                }
                next = stream.next().now_or_never().flatten();
            }
            if changed {
                on_state(&store.state());
            }
        }
        // A server that refuses every watch of a fresh list would otherwise be listed in a
        // loop: wait longer each time until a watch delivers a change.
        tokio::time::sleep(restart_delay).await;
        restart_delay = (restart_delay * 2).min(MAX_RESTART_DELAY);
    }
}

/// The wait before the first restart in a row, doubled on each up to [`MAX_RESTART_DELAY`].
const MIN_RESTART_DELAY: Duration = Duration::from_millis(100);
/// As kube's default watcher backoff at its longest.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);

/// A watch request the server refused because its version is gone (HTTP 410).
fn refused_gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 410)
}

/// What an error usually means, for the log line.
fn hint(e: &watcher::Error) -> &'static str {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => 0,
    };
    match status {
        401 => " (the credentials were refused: the service account token or KUBECONFIG user)",
        403 => " (RBAC: the agent's service account needs list and watch on this kind)",
        404 => {
            " (the API server does not serve this kind: is its CustomResourceDefinition installed?)"
        }
        410 => " (the watched version expired: relisting)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            ..Status::failure("x", "y")
        }))
    }

    #[test]
    fn only_a_refused_watch_start_with_410_restarts() {
        assert!(refused_gone(&watcher::Error::WatchStartFailed(api_error(
            410
        ))));
        assert!(!refused_gone(&watcher::Error::WatchStartFailed(api_error(
            500
        ))));
        // The watcher relists on these itself.
        assert!(!refused_gone(&watcher::Error::WatchError(Box::new(
            Status {
                code: 410,
                ..Status::failure("x", "Expired")
            }
        ))));
        assert!(!refused_gone(&watcher::Error::InitialListFailed(
            api_error(410)
        )));
    }

    #[test]
    fn hints_say_what_to_check() {
        let list = |c| hint(&watcher::Error::InitialListFailed(api_error(c)));
        assert!(list(404).contains("CustomResourceDefinition"));
        assert!(list(403).contains("RBAC"));
        assert!(list(401).contains("credentials"));
        assert_eq!(list(500), "");
        assert_eq!(hint(&watcher::Error::NoResourceVersion), "");
    }
}
