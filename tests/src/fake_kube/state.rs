//! What the handle, the server and the watch tasks share: the store, the test's knobs,
//! the watch control signal, request counters and the recorded writes.

use std::{
    collections::{BTreeMap, VecDeque},
    time::Duration,
};

use parking_lot::Mutex;
use serde_json::Value;

use super::store::Store;

/// HTTP writes recorded; older ones are dropped first.
const MAX_RECORDED_WRITES: usize = 10_000;
/// Bodies recorded whole up to this size; a larger one is recorded as a note of its size.
const MAX_RECORDED_BODY: usize = 64 << 10;

/// How a watch from a resourceVersion older than the history learns it is too old.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// HTTP 200, then one `ERROR` event whose object is a 410 `Expired` `Status` (what
    /// kube-apiserver's watch cache sends).
    ErrorEvent,
    /// HTTP 410 with the `Status` as the response body.
    Http410,
}

/// Requests served per kind, for asserting relists and re-watches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub lists: u64,
    /// Watch requests answered 200.
    pub watches: u64,
    pub open_watches: u64,
    pub gets: u64,
    pub writes: u64,
    /// Watches refused or ended as expired (410, either form).
    pub expired: u64,
    /// Requests answered by [`FakeKube::fail_next`](super::FakeKube::fail_next).
    pub injected_failures: u64,
}

/// One HTTP write as the client sent it.
#[derive(Debug, Clone)]
pub struct RecordedWrite {
    pub method: String,
    /// The kind's plural (`routepolicies`).
    pub plural: &'static str,
    pub namespace: Option<String>,
    pub name: String,
    /// `Some("status")` for the status subresource.
    pub subresource: Option<String>,
    /// The `fieldManager` query parameter.
    pub field_manager: Option<String>,
    pub user_agent: Option<String>,
    /// Every request header but `authorization`, names lowercase.
    pub headers: Vec<(String, String)>,
    pub content_type: Option<String>,
    pub body: Value,
    /// The HTTP status it was answered with.
    pub code: u16,
}

/// Test knobs the server consults on every request.
#[derive(Debug)]
pub struct Knobs {
    pub expiry: Expiry,
    /// (remaining, code) of injected failures.
    pub failures: (usize, u16),
}

/// What open watch streams follow: a change of `dropped` closes them abruptly, of
/// `expired` ends them with a 410 `ERROR` event; `paused` holds their events back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Control {
    pub dropped: u64,
    pub expired: u64,
    pub paused: bool,
    pub shutdown: bool,
}

/// State shared by the handle, the server and every watch task.
#[derive(Debug)]
pub struct Shared {
    pub store: Mutex<Store>,
    pub knobs: Mutex<Knobs>,
    pub control: tokio::sync::watch::Sender<Control>,
    counters: Mutex<BTreeMap<usize, Counters>>,
    counters_changed: tokio::sync::watch::Sender<u64>,
    writes: Mutex<VecDeque<RecordedWrite>>,
    pub bookmark_interval: Duration,
    pub token: String,
}

impl Shared {
    pub fn new(store: Store, expiry: Expiry, bookmark_interval: Duration, token: &str) -> Self {
        Self {
            store: Mutex::new(store),
            knobs: Mutex::new(Knobs {
                expiry,
                failures: (0, 500),
            }),
            control: tokio::sync::watch::Sender::new(Control::default()),
            counters: Mutex::new(BTreeMap::new()),
            counters_changed: tokio::sync::watch::Sender::new(0),
            writes: Mutex::new(VecDeque::new()),
            bookmark_interval,
            token: token.to_string(),
        }
    }

    pub fn count(&self, kind: usize, f: impl FnOnce(&mut Counters)) {
        f(self.counters.lock().entry(kind).or_default());
        self.counters_changed.send_modify(|n| *n += 1);
    }

    pub fn counters(&self, kind: usize) -> Counters {
        self.counters.lock().get(&kind).copied().unwrap_or_default()
    }

    pub fn counters_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.counters_changed.subscribe()
    }

    pub fn writes(&self) -> Vec<RecordedWrite> {
        self.writes.lock().iter().cloned().collect()
    }

    /// Runs a write on the store and records it, both under the writes lock: a reader of
    /// [`Self::writes`] waits for the record of a change it may have seen.
    pub fn write<T>(&self, f: impl FnOnce(&mut Store) -> (T, RecordedWrite)) -> T {
        let mut writes = self.writes.lock();
        let (out, mut write) = f(&mut self.store.lock());
        let size = serde_json::to_vec(&write.body).map_or(0, |b| b.len());
        if size > MAX_RECORDED_BODY {
            write.body = Value::String(format!("(a body of {size} bytes, not kept)"));
        }
        if writes.len() >= MAX_RECORDED_WRITES {
            writes.pop_front();
        }
        writes.push_back(write);
        out
    }
}
