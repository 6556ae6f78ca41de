//! What serves ([`Accepted`]) from the policy objects of a source, keeping the last good
//! version of every object whose update is invalid: off-cluster the `--policy-dir`
//! directory ([`load`]; [`watch`] reloads it when the directory changes), on Kubernetes the
//! objects of the API ([`accept`], called by `k8s::policies`); docs/policy.md, "Reload".
//! Both take the same path from step 3 on.
//!
//! One [`load`]:
//! 1. List the directory (not recursively): every `*.yaml`, `*.yml` and `*.json` file, by
//!    name, hidden files (`.x`, which covers a ConfigMap mount's `..data`) and editor files
//!    (`x~`) left out, at most [`MAX_FILES`]. Symbolic links are followed.
//! 2. Parse each file ([`documents::parse`]). A file is one change: when it cannot be read
//!    or parsed, every object it held before keeps its previous state and the file's error
//!    is reported.
//! 3. An object defined twice (same kind and key) keeps its first definition in file order;
//!    the others are rejected as `Conflicted`.
//! 4. Validate each object ([`Validator::object`]); an invalid one keeps serving its last
//!    accepted version, if it had one.
//! 5. Validate the set that would serve ([`Validator::set`]); an object it rejects falls
//!    back one step (its new version to its last good one, a last good one to nothing), and
//!    the set is validated again until it accepts everything.
//! 6. Objects no longer in any file are gone (a deletion is always valid).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::jiff::Timestamp;

use super::{
    documents,
    resources::{Condition, FieldError, Resource, ResourceStatus},
};

mod dir;
mod load;
mod reloads;
#[cfg(test)]
mod tests;
mod watch;

pub use dir::{MAX_FILES, MAX_OBJECTS};
pub use load::accept_at;
use load::load_at;
pub use reloads::{ReloadCounts, Reloads};
pub use watch::{DEBOUNCE, Error, MAX_DELAY, WatchHandle, quiet, watch};

/// The checks a load applies: one object at a time, then the set that would serve.
#[derive(Debug, Clone, Copy)]
pub struct Validator {
    /// Every problem of one resource.
    pub object: fn(&Resource) -> Vec<FieldError>,
    /// Conflicts between resources, each with the [`Resource::key`] of the one rejected.
    pub set: fn(&[Resource]) -> Vec<(String, FieldError)>,
}

impl Default for Validator {
    /// The checks of [`super::validate`].
    fn default() -> Self {
        Self {
            object: super::validate::validate,
            set: super::validate::validate_set,
        }
    }
}

/// What serves after a load, and why each object does or does not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Accepted {
    /// Increments on every load that changed what serves (the first load gives 1).
    pub generation: u64,
    /// What serves now, sorted by (kind, key).
    pub resources: Vec<Resource>,
    /// Every object found (and those kept from files that could not be read), sorted by
    /// (kind, key), a duplicate definition after the one used.
    pub objects: Vec<ObjectStatus>,
    /// Every policy file read, in name order; the directory itself when it could not be
    /// listed or held more than [`MAX_FILES`].
    pub files: Vec<FileStatus>,
    /// The latest version read of each object, for the next load's generations.
    known: BTreeMap<ObjectId, Known>,
}

/// The state of one object definition.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectStatus {
    /// `RoutePolicy` or `Tenant`.
    pub kind: &'static str,
    /// [`Resource::key`].
    pub key: String,
    /// Where it is defined: its file, or `kubernetes:<key>` for an object of the API.
    pub file: PathBuf,
    /// The generation of the latest version read: `metadata.generation` when set, else a
    /// counter that increments whenever the spec changes.
    pub observed_generation: i64,
    pub serving: Serving,
    /// `Accepted`: `True` (reason `Accepted`) or `False` (`Invalid`, `Conflicted`,
    /// `FileError`).
    pub conditions: Vec<Condition>,
}

/// Which version of an object serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// Its latest version.
    Current,
    /// An earlier version (its latest is rejected).
    LastGood { generation: i64 },
    /// None: the object has no accepted version.
    None,
}

/// One policy file and why it could not be used, if it could not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStatus {
    pub file: PathBuf,
    pub error: Option<String>,
}

/// (kind, key).
type ObjectId = (&'static str, String);

/// The latest version read of an object, and where.
#[derive(Debug, Clone, PartialEq)]
struct Known {
    file: PathBuf,
    latest: Resource,
    generation: i64,
}

/// Condition type of the one condition a load sets.
pub const ACCEPTED: &str = "Accepted";

// === impl Accepted ===

impl Accepted {
    /// The status of the object `key` of `kind` (its definition in use).
    pub fn object(&self, kind: &str, key: &str) -> Option<&ObjectStatus> {
        self.objects.iter().find(|o| o.kind == kind && o.key == key)
    }

    /// Object definitions not serving their latest version.
    pub fn rejected(&self) -> usize {
        self.objects.iter().filter(|o| o.is_rejected()).count()
    }

    /// Files (or the directory) that could not be used.
    pub fn file_errors(&self) -> impl Iterator<Item = &FileStatus> {
        self.files.iter().filter(|f| f.error.is_some())
    }
}

// === impl ObjectStatus ===

impl ObjectStatus {
    /// The `Accepted` condition.
    pub fn accepted(&self) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == ACCEPTED)
    }

    /// Its latest version does not serve.
    pub fn is_rejected(&self) -> bool {
        self.accepted().is_none_or(|c| c.status != "True")
    }

    /// As a resource's `status` subresource.
    pub fn status(&self) -> ResourceStatus {
        ResourceStatus {
            observed_generation: Some(self.observed_generation),
            conditions: self.conditions.clone(),
        }
    }
}

/// Reads `dir` into what serves; `previous` is the last load's result (its versions keep
/// serving where the new ones are rejected, and its conditions keep their transition
/// times). Never fails: every problem is reported in the result.
pub fn load(dir: &Path, v: &Validator, previous: Option<&Accepted>) -> Accepted {
    load_at(dir, v, previous, SystemTime::now())
}

/// Settles `objects` — every object of a source other than a directory, each with where it
/// comes from (`kubernetes:<key>`) — into what serves, exactly as a [`load`] settles a
/// directory's: each validated, an invalid update keeping its last good version, the set
/// checked, an object absent from `objects` deleted. Never fails.
pub fn accept(
    objects: Vec<(PathBuf, Resource)>,
    v: &Validator,
    previous: Option<&Accepted>,
) -> Accepted {
    accept_at(objects, v, previous, SystemTime::now())
}

/// RFC 3339 in UTC, to the second (`2026-12-01T12:25:00Z`), as Kubernetes writes times.
fn rfc3339(t: SystemTime) -> String {
    Timestamp::try_from(t)
        .and_then(|ts| Timestamp::from_second(ts.as_second()))
        .map_or_else(|_| Timestamp::UNIX_EPOCH.to_string(), |ts| ts.to_string())
}
