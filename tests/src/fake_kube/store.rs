//! The fake's state: every object by (kind, namespace, name), one global resourceVersion
//! counter (as etcd's revision), a bounded history of change events for watches to replay,
//! and the live broadcast of new events.
//!
//! Each change is committed, appended to the history and broadcast under one lock, and a
//! watch replays the history and subscribes under the same lock: a watch sees every event
//! after its resourceVersion exactly once, in order.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::{resources::ResourceType, selector::Selectors, status::ApiError};

/// (kind index, namespace or "" when cluster-scoped, name): objects sort in list order.
pub(crate) type Key = (usize, String, String);

/// Watches open at once, across kinds; no test needs nearly this many.
const MAX_WATCHES: usize = 1_000;
/// Longest name the fake accepts (a DNS subdomain).
const MAX_NAME_LEN: usize = 253;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change. `prev` is the object before it, so a selector-filtered watch can
/// tell an object that stopped matching (sent as DELETED) from one that never matched.
#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub kind: usize,
    pub event_type: EventType,
    pub object: Arc<Value>,
    pub prev: Option<Arc<Value>>,
}

impl Event {
    /// The event a watch with `selectors` on `namespace` sees, if any: ADDED when the object
    /// starts matching, DELETED when it stops, as the real server's filtered watches do.
    pub fn filtered(
        &self,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> Option<(EventType, &Value)> {
        if namespace.is_some_and(|ns| self.object["metadata"]["namespace"].as_str() != Some(ns)) {
            return None;
        }
        let now = selectors.matches(&self.object);
        let before = self.prev.as_deref().is_some_and(|p| selectors.matches(p));
        let event_type = match (self.event_type, before, now) {
            (EventType::Deleted, _, true) => EventType::Deleted,
            (EventType::Deleted, _, false) => return None,
            (_, false, true) => EventType::Added,
            (_, true, true) => EventType::Modified,
            (_, true, false) => EventType::Deleted,
            (_, false, false) => return None,
        };
        Some((event_type, &self.object))
    }
}

/// Bounds and limits of one fake.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Events kept for watches to replay; a watch from an older resourceVersion is expired.
    pub history: usize,
    /// Objects stored across all kinds; a create beyond it is refused.
    pub objects: usize,
}

/// A watch's start: what to replay, then the live events.
#[derive(Debug)]
pub(crate) struct Subscription {
    pub replay: Vec<Arc<Event>>,
    pub live: broadcast::Receiver<Arc<Event>>,
    /// The resourceVersion when it subscribed.
    pub current: u64,
}

/// A page of a list.
#[derive(Debug)]
pub(crate) struct Page {
    pub items: Vec<Value>,
    /// The key of the last item returned when more remain.
    pub next: Option<Key>,
    pub remaining: usize,
}

#[derive(Debug)]
pub(crate) struct Store {
    pub kinds: Vec<ResourceType>,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Event>>,
    limits: Limits,
    rv: u64,
    /// Every event after this resourceVersion is still in the history.
    floor: u64,
    uids: u64,
    live: broadcast::Sender<Arc<Event>>,
}

/// Now, as metadata timestamps are written (RFC 3339, seconds, UTC).
pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The object without metadata and status: what `metadata.generation` counts changes of.
fn desired_state(obj: &Value) -> Map<String, Value> {
    let mut m = obj.as_object().cloned().unwrap_or_default();
    m.remove("metadata");
    m.remove("status");
    m
}

// === impl Store ===

impl Store {
    pub fn new(kinds: Vec<ResourceType>, limits: Limits) -> Self {
        let (live, _) = broadcast::channel(limits.history.max(16));
        Self {
            kinds,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            limits,
            rv: 0,
            floor: 0,
            uids: 0,
            live,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn kind_by_path(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.kinds
            .iter()
            .position(|k| k.group == group && k.version == version && k.plural == plural)
    }

    pub fn kind_of(&self, kind: &ResourceType) -> Option<usize> {
        self.kind_by_path(kind.group, kind.version, kind.plural)
    }

    /// The kind an object names by `apiVersion` and `kind`.
    pub fn kind_of_object(&self, obj: &Value) -> Result<usize, ApiError> {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        self.kinds
            .iter()
            .position(|k| k.api_version() == api_version && k.kind == kind)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "no resource registered for apiVersion {api_version:?} kind {kind:?}"
                ))
            })
    }

    /// The key of `obj` as `kind`, checking its name and namespace (defaulting the
    /// namespace to `namespace`, the request path's).
    pub fn key_of(
        &self,
        kind: usize,
        obj: &mut Value,
        namespace: Option<&str>,
    ) -> Result<Key, ApiError> {
        let rt = &self.kinds[kind];
        if !obj.is_object() {
            return Err(ApiError::bad_request("the object is not a JSON object"));
        }
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !valid_name(&name) {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!("metadata.name {name:?} is not a valid DNS subdomain"),
            ));
        }
        let ns = if rt.namespaced {
            let own = obj["metadata"]["namespace"].as_str().map(str::to_string);
            let ns = match (own, namespace) {
                (Some(o), Some(p)) if o != p => {
                    return Err(ApiError::bad_request(format!(
                        "the namespace of the object ({o}) does not match the namespace on the request ({p})"
                    )));
                }
                (Some(o), _) => o,
                (None, Some(p)) => p.to_string(),
                (None, None) => "default".to_string(),
            };
            if !valid_name(&ns) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    format!("metadata.namespace {ns:?} is not valid"),
                ));
            }
            obj["metadata"]["namespace"] = json!(ns);
            ns
        } else {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("namespace");
            }
            String::new()
        };
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        Ok((kind, ns, name))
    }

    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of `kind` (in `namespace` when given) matching `selectors`, from after
    /// `after`, at most `limit` of them.
    pub fn list(
        &self,
        kind: usize,
        namespace: Option<&str>,
        selectors: &Selectors,
        limit: Option<usize>,
        after: Option<Key>,
    ) -> Page {
        use std::ops::Bound;
        let start = match after {
            Some(k) => Bound::Excluded(k),
            None => Bound::Included((
                kind,
                namespace.unwrap_or_default().to_string(),
                String::new(),
            )),
        };
        let mut matching = self
            .objects
            .range((start, Bound::Unbounded))
            .take_while(|((k, ns, _), _)| *k == kind && namespace.is_none_or(|want| want == ns))
            .filter(|(_, v)| selectors.matches(v));
        let limit = limit.unwrap_or(usize::MAX);
        let items: Vec<(&Key, &Value)> = matching.by_ref().take(limit).collect();
        let remaining = matching.count();
        Page {
            next: (remaining > 0)
                .then(|| items.last().map(|(k, _)| (*k).clone()))
                .flatten(),
            items: items.into_iter().map(|(_, v)| v.clone()).collect(),
            remaining,
        }
    }

    /// Stores `obj` under `key` (created or replaced): sets resourceVersion, uid,
    /// creationTimestamp and generation, and records the event. A write that changes
    /// nothing returns the stored object and records no event, as the real server does.
    pub fn commit(&mut self, key: Key, mut obj: Value) -> Result<Value, ApiError> {
        let prev = self.objects.get(&key);
        if prev.is_none() && self.objects.len() >= self.limits.objects {
            return Err(ApiError::new(
                507,
                "InsufficientStorage",
                format!(
                    "the fake API server holds at most {} objects",
                    self.limits.objects
                ),
            ));
        }
        let meta = &mut obj["metadata"];
        match prev {
            Some(p) => {
                let pm = &p["metadata"];
                meta["uid"] = pm["uid"].clone();
                meta["creationTimestamp"] = pm["creationTimestamp"].clone();
                meta["resourceVersion"] = pm["resourceVersion"].clone();
                let generation = pm["generation"].as_u64().unwrap_or(1);
                meta["generation"] = json!(generation);
                if obj == *p {
                    return Ok(obj);
                }
                let changed = desired_state(&obj) != desired_state(p);
                obj["metadata"]["generation"] = json!(generation + u64::from(changed));
            }
            None => {
                self.uids += 1;
                meta["uid"] = json!(format!("00000000-0000-4000-8000-{:012x}", self.uids));
                meta["creationTimestamp"] = json!(now_rfc3339());
                meta["generation"] = json!(1);
            }
        }
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let prev = self.objects.insert(key.clone(), obj.clone());
        let event_type = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(key.0, event_type, obj.clone(), prev);
        Ok(obj)
    }

    /// Removes the object under `key`; the DELETED event carries it at a new
    /// resourceVersion.
    pub fn remove(&mut self, key: &Key) -> Result<Value, ApiError> {
        let mut obj = self.objects.remove(key).ok_or_else(|| {
            ApiError::not_found(&format!("{} {:?}", self.kinds[key.0].plural, key.2))
        })?;
        let prev = obj.clone();
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(key.0, EventType::Deleted, obj.clone(), Some(prev));
        Ok(obj)
    }

    fn record(&mut self, kind: usize, event_type: EventType, object: Value, prev: Option<Value>) {
        let event = Arc::new(Event {
            rv: self.rv,
            kind,
            event_type,
            object: Arc::new(object),
            prev: prev.map(Arc::new),
        });
        self.history.push_back(event.clone());
        while self.history.len() > self.limits.history {
            if let Some(old) = self.history.pop_front() {
                self.floor = old.rv;
            }
        }
        // No receiver is no error: nobody watches.
        let _ = self.live.send(event);
    }

    /// Whether events after `rv` are gone from the history.
    pub fn is_expired(&self, rv: u64) -> bool {
        rv < self.floor
    }

    /// Drops the whole history and moves the resourceVersion on by one (a revision no
    /// object has, as etcd's revisions skip): every resourceVersion handed out before is
    /// expired, while a list made after answers one a watch can start from.
    pub fn compact(&mut self) {
        self.history.clear();
        self.rv += 1;
        self.floor = self.rv;
    }

    /// The events of `kind` a watch from `from` must replay, and the subscription to those
    /// after: synthetic ADDED events for every object when `from` is None or 0 (as the
    /// server's "start at most recent"), else the history after `from`.
    pub fn subscribe(&self, kind: usize, from: Option<u64>) -> Result<Subscription, ApiError> {
        if self.live.receiver_count() >= MAX_WATCHES {
            return Err(ApiError::new(
                429,
                "TooManyRequests",
                format!("the fake API server serves at most {MAX_WATCHES} watches at once"),
            ));
        }
        let replay = match from {
            None | Some(0) => self
                .objects
                .range((kind, String::new(), String::new())..)
                .take_while(|((k, _, _), _)| *k == kind)
                .map(|(_, v)| {
                    Arc::new(Event {
                        rv: self.rv,
                        kind,
                        event_type: EventType::Added,
                        object: Arc::new(v.clone()),
                        prev: None,
                    })
                })
                .collect(),
            Some(rv) if rv > self.rv => {
                return Err(ApiError::new(
                    504,
                    "Timeout",
                    format!("Too large resource version: {rv}, current: {}", self.rv),
                ));
            }
            Some(rv) if rv < self.floor => {
                return Err(ApiError::expired(format!(
                    "too old resource version: {rv} ({})",
                    self.floor + 1
                )));
            }
            Some(rv) => self
                .history
                .iter()
                .filter(|e| e.kind == kind && e.rv > rv)
                .cloned()
                .collect(),
        };
        Ok(Subscription {
            replay,
            live: self.live.subscribe(),
            current: self.rv,
        })
    }
}
