//! Reload counts and logs, the same for every source of policy objects (the directory
//! watcher, the Kubernetes watchers): `warmpath.policy.reloads{result}` and
//! `warmpath.policy.rejected`, one info line per reload and a warning per rejection when it
//! first appears or changes.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU64, Ordering},
};

use opentelemetry::{KeyValue, metrics::Meter};

use super::{Accepted, Serving};

/// Reloads so far, by result, and objects rejected by the latest one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReloadCounts {
    /// What serves changed, and nothing was rejected.
    pub applied: u64,
    /// Nothing changed, and nothing was rejected.
    pub unchanged: u64,
    /// At least one object or file could not be used (it keeps its previous state).
    pub rejected: u64,
    /// Objects not serving their latest version after the latest reload.
    pub rejected_objects: u64,
}

/// The counters behind [`ReloadCounts`], shared with the metric callbacks.
#[derive(Debug, Default)]
pub struct Reloads {
    applied: AtomicU64,
    unchanged: AtomicU64,
    rejected: AtomicU64,
    rejected_objects: AtomicU64,
}

// === impl Reloads ===

impl Reloads {
    /// Reloads so far.
    pub fn counts(&self) -> ReloadCounts {
        ReloadCounts {
            applied: self.applied.load(Ordering::Relaxed),
            unchanged: self.unchanged.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            rejected_objects: self.rejected_objects.load(Ordering::Relaxed),
        }
    }

    /// Registers `warmpath.policy.reloads{result}` and `warmpath.policy.rejected` on
    /// `meter`; the callbacks live as long as the provider.
    pub fn observe(self: &std::sync::Arc<Self>, meter: &Meter) {
        let c = self.clone();
        meter
            .u64_observable_counter("warmpath.policy.reloads")
            .with_unit("{reload}")
            .with_description(
                "Policy reloads (directory or Kubernetes API) by result: applied, unchanged, \
                 rejected (at least one object or file kept its previous state)",
            )
            .with_callback(move |o| {
                for (result, n) in [
                    ("applied", &c.applied),
                    ("unchanged", &c.unchanged),
                    ("rejected", &c.rejected),
                ] {
                    o.observe(
                        n.load(Ordering::Relaxed),
                        &[KeyValue::new("result", result)],
                    );
                }
            })
            .build();
        let c = self.clone();
        meter
            .u64_observable_gauge("warmpath.policy.rejected")
            .with_unit("{object}")
            .with_description("Policy objects not serving their latest version")
            .with_callback(move |o| o.observe(c.rejected_objects.load(Ordering::Relaxed), &[]))
            .build();
    }

    /// Counts a reload and logs it (`source`: the directory or `kubernetes`): at info
    /// always, each rejection at warn when it is new.
    pub fn report(&self, source: &str, prev: Option<&Accepted>, next: &Accepted) {
        let rejected = next.rejected();
        let file_errors = next.file_errors().count();
        let result = if rejected + file_errors > 0 {
            &self.rejected
        } else if prev.is_none_or(|p| p.generation != next.generation) {
            &self.applied
        } else {
            &self.unchanged
        };
        result.fetch_add(1, Ordering::Relaxed);
        self.rejected_objects
            .store(rejected as u64, Ordering::Relaxed);
        tracing::info!(
            source,
            generation = next.generation,
            serving = next.resources.len(),
            rejected,
            file_errors,
            "policy loaded"
        );
        for f in next.file_errors() {
            let seen = prev.is_some_and(|p| p.files.contains(f));
            if !seen {
                tracing::warn!(file = %f.file.display(), "policy file rejected: {}", f.error.as_deref().unwrap_or(""));
            }
        }
        let before: HashMap<_, _> = prev
            .map(|p| &p.objects[..])
            .unwrap_or_default()
            .iter()
            .filter(|o| o.is_rejected())
            .map(|o| ((o.kind, o.key.as_str(), o.file.as_path()), o))
            .collect();
        for o in next.objects.iter().filter(|o| o.is_rejected()) {
            let Some(c) = o.accepted() else { continue };
            let seen = before
                .get(&(o.kind, o.key.as_str(), o.file.as_path()))
                .and_then(|p| p.accepted())
                .is_some_and(|p| {
                    p.reason == c.reason
                        && p.message == c.message
                        && p.observed_generation == c.observed_generation
                });
            if seen {
                continue;
            }
            let serving = match o.serving {
                Serving::Current => "its latest version".to_string(),
                Serving::LastGood { generation } => {
                    format!("generation {generation} keeps serving")
                }
                Serving::None => "not serving".to_string(),
            };
            tracing::warn!(kind = o.kind, key = %o.key, file = %o.file.display(), generation = o.observed_generation, reason = %c.reason, "policy object rejected ({serving}): {}", c.message);
        }
    }
}
