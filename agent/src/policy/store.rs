//! Off-cluster policy: reads the `--policy-dir` directory into what serves ([`Accepted`]),
//! keeping the last good version of every object whose update is invalid; [`watch`]
//! reloads it when the directory changes (docs/policy.md, "Reload").
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
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::jiff::Timestamp;

use super::{
    documents,
    resources::{Condition, FieldError, Resource, ResourceStatus},
};

mod dir;
#[cfg(test)]
mod tests;
mod watch;

pub use dir::{MAX_FILES, MAX_OBJECTS};
pub use watch::{DEBOUNCE, Error, MAX_DELAY, ReloadCounts, WatchHandle, watch};

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
    /// The file that defines it.
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

/// [`load`] at a given time (for the conditions' `lastTransitionTime`).
fn load_at(dir: &Path, v: &Validator, previous: Option<&Accepted>, now: SystemTime) -> Accepted {
    let empty = Accepted::default();
    let prev = previous.unwrap_or(&empty);
    let listing = match dir::read(dir) {
        Ok(listing) => listing,
        Err(error) => {
            // The directory is gone or unreadable: everything keeps serving as it was.
            return Accepted {
                files: vec![FileStatus {
                    file: dir.to_path_buf(),
                    error: Some(format!("{error}; the last accepted policies keep serving")),
                }],
                generation: prev.generation.max(u64::from(previous.is_none())),
                ..prev.clone()
            };
        }
    };
    let mut load = Load::new(prev, now);
    let mut files = Vec::new();
    if let Some(error) = &listing.error {
        files.push(FileStatus {
            file: dir.to_path_buf(),
            error: Some(error.clone()),
        });
    }
    let mut failed: HashMap<PathBuf, String> = HashMap::new();
    let mut read = HashSet::new();
    for file in listing.files {
        read.insert(file.path.clone());
        let error = match file.outcome {
            Ok(resources) => {
                for r in resources {
                    load.define(&file.path, r, v);
                }
                None
            }
            Err(error) => {
                failed.insert(file.path.clone(), error.clone());
                Some(error)
            }
        };
        files.push(FileStatus {
            file: file.path,
            error,
        });
    }
    // Objects of files that could not be used, and of files beyond MAX_FILES that exist.
    for (id, k) in &prev.known {
        let error = match failed.get(&k.file) {
            Some(e) => e.clone(),
            None if listing.truncated && !read.contains(&k.file) && k.file.is_file() => {
                format!("not read: more than {MAX_FILES} policy files in the directory")
            }
            None => continue,
        };
        load.keep(id, k, error);
    }
    load.resolve_conflicts(v);
    load.finish(previous.is_none(), files)
}

/// One load in progress: every object's candidate versions.
struct Load<'p> {
    prev: &'p Accepted,
    /// Previous serving versions, by id.
    prev_serving: HashMap<ObjectId, (&'p Resource, i64)>,
    /// Previous `Accepted` conditions, by (kind, key, file).
    prev_conditions: HashMap<(&'static str, &'p str, &'p Path), &'p Condition>,
    slots: BTreeMap<ObjectId, Slot>,
    duplicates: Vec<ObjectStatus>,
    now: SystemTime,
}

/// One object: its latest version and what may serve.
struct Slot {
    file: PathBuf,
    latest: Resource,
    generation: i64,
    /// The latest version, when it is valid.
    current: Option<Resource>,
    last_good: Option<(Resource, i64)>,
    /// Which one serves: 2 current, 1 last good, 0 none.
    level: u8,
    /// Why the latest version does not serve: reason and problems.
    rejection: Option<(&'static str, Vec<String>)>,
}

// === impl Load ===

impl<'p> Load<'p> {
    fn new(prev: &'p Accepted, now: SystemTime) -> Self {
        let mut prev_serving = HashMap::new();
        let mut by_id: HashMap<ObjectId, &Resource> = prev
            .resources
            .iter()
            .map(|r| ((r.kind(), r.key()), r))
            .collect();
        for o in &prev.objects {
            let generation = match o.serving {
                Serving::Current => o.observed_generation,
                Serving::LastGood { generation } => generation,
                Serving::None => continue,
            };
            if let Some(r) = by_id.remove(&(o.kind, o.key.clone())) {
                prev_serving.insert((o.kind, o.key.clone()), (r, generation));
            }
        }
        let prev_conditions = prev
            .objects
            .iter()
            .filter_map(|o| Some(((o.kind, o.key.as_str(), o.file.as_path()), o.accepted()?)))
            .collect();
        Self {
            prev,
            prev_serving,
            prev_conditions,
            slots: BTreeMap::new(),
            duplicates: Vec::new(),
            now,
        }
    }

    fn last_good(&self, id: &ObjectId) -> Option<(Resource, i64)> {
        self.prev_serving.get(id).map(|(r, g)| ((*r).clone(), *g))
    }

    /// An object read from `file`.
    fn define(&mut self, file: &Path, r: Resource, v: &Validator) {
        let id = (r.kind(), r.key());
        if let Some(first) = self.slots.get(&id) {
            let message = format!(
                "{} {} is also defined in {}, the definition in use: an object is defined once",
                id.0,
                id.1,
                first.file.display()
            );
            let generation = r.metadata().generation.unwrap_or(0);
            self.duplicates.push(ObjectStatus {
                kind: id.0,
                key: id.1.clone(),
                file: file.to_path_buf(),
                observed_generation: generation,
                serving: Serving::None,
                conditions: vec![self.condition(&id, file, "Conflicted", message, generation)],
            });
            return;
        }
        let generation = generation(&r, self.prev.known.get(&id));
        let errors = (v.object)(&r);
        let (current, rejection) = if errors.is_empty() {
            (Some(r.clone()), None)
        } else {
            (
                None,
                Some(("Invalid", errors.iter().map(|e| e.to_string()).collect())),
            )
        };
        let last_good = self.last_good(&id);
        let level = if current.is_some() {
            2
        } else {
            u8::from(last_good.is_some())
        };
        self.slots.insert(
            id,
            Slot {
                file: file.to_path_buf(),
                latest: r,
                generation,
                current,
                last_good,
                level,
                rejection,
            },
        );
    }

    /// An object of a file that could not be used: as it was.
    fn keep(&mut self, id: &ObjectId, k: &Known, error: String) {
        if self.slots.contains_key(id) {
            // Another file defines it now.
            return;
        }
        let last_good = self.last_good(id);
        let level = u8::from(last_good.is_some());
        self.slots.insert(
            id.clone(),
            Slot {
                file: k.file.clone(),
                latest: k.latest.clone(),
                generation: k.generation,
                current: None,
                last_good,
                level,
                rejection: Some(("FileError", vec![error])),
            },
        );
    }

    fn serving(&self) -> Vec<Resource> {
        self.slots
            .values()
            .filter_map(Slot::serving)
            .cloned()
            .collect()
    }

    /// Validates the serving set until it accepts everything: each object it rejects falls
    /// back one step. Ends: every round lowers at least one level, and levels only fall.
    fn resolve_conflicts(&mut self, v: &Validator) {
        loop {
            let rejected = (v.set)(&self.serving());
            let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (key, e) in rejected {
                by_key.entry(key).or_default().push(e.to_string());
            }
            let mut lowered = false;
            for ((_, key), slot) in &mut self.slots {
                let Some(errors) = by_key.get(key) else {
                    continue;
                };
                if slot.level == 0 {
                    continue;
                }
                lowered = true;
                slot.level = if slot.level == 2 && slot.last_good.is_some() {
                    1
                } else {
                    0
                };
                match &mut slot.rejection {
                    None => slot.rejection = Some(("Conflicted", errors.clone())),
                    Some((_, problems)) => {
                        for e in errors {
                            if !problems.contains(e) {
                                problems.push(e.clone());
                            }
                        }
                    }
                }
            }
            if !lowered {
                return;
            }
        }
    }

    fn finish(self, first: bool, files: Vec<FileStatus>) -> Accepted {
        let mut resources = Vec::new();
        let mut objects = Vec::new();
        let mut known = BTreeMap::new();
        for (id, slot) in &self.slots {
            let serving = match (slot.level, &slot.last_good) {
                (2, _) => Serving::Current,
                (1, Some((_, generation))) => Serving::LastGood {
                    generation: *generation,
                },
                _ => Serving::None,
            };
            let (reason, message) = match &slot.rejection {
                None => ("Accepted", format!("generation {} serves", slot.generation)),
                Some((reason, problems)) => (*reason, problems.join("; ")),
            };
            let condition = self.condition(id, &slot.file, reason, message, slot.generation);
            if let Some(r) = slot.serving() {
                resources.push(r.clone());
            }
            objects.push(ObjectStatus {
                kind: id.0,
                key: id.1.clone(),
                file: slot.file.clone(),
                observed_generation: slot.generation,
                serving,
                conditions: vec![condition],
            });
            known.insert(
                id.clone(),
                Known {
                    file: slot.file.clone(),
                    latest: slot.latest.clone(),
                    generation: slot.generation,
                },
            );
        }
        objects.extend(self.duplicates);
        objects.sort_by(|a, b| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
        let generation = if first {
            1
        } else if resources == self.prev.resources {
            self.prev.generation
        } else {
            self.prev.generation.saturating_add(1)
        };
        Accepted {
            generation,
            resources,
            objects,
            files,
            known,
        }
    }

    /// The `Accepted` condition, keeping the previous transition time when its status is
    /// the same.
    fn condition(
        &self,
        id: &ObjectId,
        file: &Path,
        reason: &str,
        message: String,
        generation: i64,
    ) -> Condition {
        let status = if reason == "Accepted" {
            "True"
        } else {
            "False"
        };
        let since = self
            .prev_conditions
            .get(&(id.0, id.1.as_str(), file))
            .filter(|c| c.status == status)
            .map(|c| c.last_transition_time.clone());
        Condition {
            type_: ACCEPTED.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: Some(generation),
            last_transition_time: since.unwrap_or_else(|| rfc3339(self.now)),
        }
    }
}

// === impl Slot ===

impl Slot {
    fn serving(&self) -> Option<&Resource> {
        match self.level {
            2 => self.current.as_ref(),
            1 => self.last_good.as_ref().map(|(r, _)| r),
            _ => None,
        }
    }
}

/// An object's generation: `metadata.generation` when set, else the previous one, plus one
/// when the spec changed.
fn generation(r: &Resource, prev: Option<&Known>) -> i64 {
    if let Some(g) = r.metadata().generation {
        return g;
    }
    match prev {
        None => 1,
        Some(k) if same_spec(&k.latest, r) => k.generation,
        Some(k) => k.generation.saturating_add(1),
    }
}

fn same_spec(a: &Resource, b: &Resource) -> bool {
    match (a, b) {
        (Resource::RoutePolicy(a), Resource::RoutePolicy(b)) => a.spec == b.spec,
        (Resource::Tenant(a), Resource::Tenant(b)) => a.spec == b.spec,
        _ => false,
    }
}

/// RFC 3339 in UTC, to the second (`2026-12-01T12:25:00Z`), as Kubernetes writes times.
fn rfc3339(t: SystemTime) -> String {
    Timestamp::try_from(t)
        .and_then(|ts| Timestamp::from_second(ts.as_second()))
        .map_or_else(|_| Timestamp::UNIX_EPOCH.to_string(), |ts| ts.to_string())
}
