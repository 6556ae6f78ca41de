//! Settling objects into what serves — each object's candidate versions (its latest when
//! valid, its last good one, none), settled against the set check, then the result — for
//! both sources: the policy directory ([`load_at`]) and objects given whole, such as the
//! Kubernetes API's ([`accept_at`]).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    time::SystemTime,
};

use super::{
    ACCEPTED, Accepted, FileStatus, Known, MAX_FILES, ObjectId, ObjectStatus, Serving, Validator,
    dir, rfc3339,
};
use crate::policy::resources::{Condition, Resource};

/// [`super::load`] at a given time (for the conditions' `lastTransitionTime`).
pub(super) fn load_at(
    dir: &Path,
    v: &Validator,
    previous: Option<&Accepted>,
    now: SystemTime,
) -> Accepted {
    let listing = match dir::read(dir) {
        Ok(listing) => listing,
        Err(error) => return unreadable(dir, previous, error),
    };
    let mut files = Vec::new();
    if let Some(error) = &listing.error {
        files.push(FileStatus {
            file: dir.to_path_buf(),
            error: Some(error.clone()),
        });
    }
    let mut failed: HashMap<PathBuf, String> = HashMap::new();
    let mut read = HashSet::new();
    let mut objects = Vec::new();
    for file in listing.files {
        read.insert(file.path.clone());
        let error = match file.outcome {
            Ok(resources) => {
                objects.extend(resources.into_iter().map(|r| (file.path.clone(), r)));
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
    let kept = |k: &Known| match failed.get(&k.file) {
        Some(e) => Some(e.clone()),
        None if listing.truncated && !read.contains(&k.file) && k.file.is_file() => Some(format!(
            "not read: more than {MAX_FILES} policy files in the directory"
        )),
        None => None,
    };
    settle(objects, kept, files, v, previous, now)
}

/// [`super::accept`] at a given time (the conditions' `lastTransitionTime`).
pub fn accept_at(
    objects: Vec<(PathBuf, Resource)>,
    v: &Validator,
    previous: Option<&Accepted>,
    now: SystemTime,
) -> Accepted {
    settle(objects, |_| None, Vec::new(), v, previous, now)
}

/// The one path of both sources: `objects` defined (in order: a second definition of an
/// object is `Conflicted`), the previous objects `kept` names (with why) kept as they were,
/// the set check settled, the result.
fn settle(
    objects: Vec<(PathBuf, Resource)>,
    kept: impl Fn(&Known) -> Option<String>,
    files: Vec<FileStatus>,
    v: &Validator,
    previous: Option<&Accepted>,
    now: SystemTime,
) -> Accepted {
    let empty = Accepted::default();
    let prev = previous.unwrap_or(&empty);
    let mut load = Load::new(prev, now);
    for (source, r) in objects {
        load.define(&source, r, v);
    }
    for (id, k) in &prev.known {
        if let Some(error) = kept(k) {
            load.keep(id, k, error);
        }
    }
    load.resolve_conflicts(v);
    load.finish(previous.is_none(), files)
}

/// The directory is gone or cannot be listed: everything stays as it was.
fn unreadable(dir: &Path, previous: Option<&Accepted>, error: String) -> Accepted {
    let files = vec![FileStatus {
        file: dir.to_path_buf(),
        error: Some(format!("{error}; the last accepted policies keep serving")),
    }];
    match previous {
        Some(prev) => Accepted {
            files,
            ..prev.clone()
        },
        None => Accepted {
            generation: 1,
            files,
            ..Accepted::default()
        },
    }
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
