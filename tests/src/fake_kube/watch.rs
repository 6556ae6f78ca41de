//! One watch stream: the replayed events, then live ones, filtered by the request's
//! namespace and selectors, as newline-delimited JSON in a chunked response; BOOKMARKs when
//! asked; ended by `timeoutSeconds`, by the test's knobs (dropped abruptly, or ended with a
//! 410 `ERROR` event), or by a subscription that fell behind (closed, as the real server
//! closes a slow watcher).

use std::{collections::VecDeque, sync::Arc, time::Duration};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::{
    selector::Selectors,
    state::{Control, Shared},
    status::ApiError,
    store::Event,
};

/// Lines buffered towards a slow client before the task waits for it.
const STREAM_BUFFER: usize = 64;

/// Chunks of the response body; an `Err` makes the server abort the connection.
pub(crate) type Chunks = mpsc::Receiver<Result<Bytes, std::io::Error>>;

/// What a watch request asked for.
#[derive(Debug)]
pub(crate) struct WatchRequest {
    pub kind: usize,
    pub namespace: Option<String>,
    pub selectors: Selectors,
    pub from: Option<u64>,
    pub bookmarks: bool,
    pub timeout: Duration,
    /// `sendInitialEvents=true`: synthetic ADDED events, then a BOOKMARK marking their end.
    pub initial_events: bool,
}

/// Opens the stream, or refuses the request when its resourceVersion is expired and the
/// fake answers that with HTTP 410. An expired watch in `ErrorEvent` mode gets a stream
/// holding just the 410 `ERROR` event.
pub(crate) fn open(
    shared: Arc<Shared>,
    req: WatchRequest,
    http_410: bool,
) -> Result<Chunks, ApiError> {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let from = if req.initial_events { None } else { req.from };
    let subscribed = {
        let store = shared.store.lock();
        let kind_name = store.kinds[req.kind].clone();
        store.subscribe(req.kind, from).map(|s| (s, kind_name))
    };
    let (sub, rt) = match subscribed {
        Ok(s) => s,
        Err(e) if e.code == 410 => {
            shared.count(req.kind, |c| c.expired += 1);
            if http_410 {
                return Err(e);
            }
            shared.count(req.kind, |c| c.watches += 1);
            let line = event_line("ERROR", &e.to_status());
            // The fresh channel has room for one line.
            let _ = tx.try_send(Ok(line));
            return Ok(rx);
        }
        Err(e) => return Err(e),
    };
    // The knobs as of now, before the watch is counted: a test that sees it open and then
    // drops or pauses watches reaches this stream, however late its task starts.
    let mut control = shared.control.subscribe();
    let start: Control = *control.borrow_and_update();
    shared.count(req.kind, |c| {
        c.watches += 1;
        c.open_watches += 1;
    });
    let stream = Stream {
        shared,
        tx,
        selectors: req.selectors,
        namespace: req.namespace,
        kind: req.kind,
        bookmark_kind: (rt.kind, rt.api_version()),
        last_rv: from.filter(|rv| *rv > 0).unwrap_or(sub.current),
        pending: sub.replay.into(),
        initial_end: req.initial_events,
    };
    tokio::spawn(stream.run(sub.live, control, start, req.bookmarks, req.timeout));
    Ok(rx)
}

fn event_line(event_type: &str, object: &Value) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// How a stream ended.
enum End {
    /// Final chunk sent: the client re-watches from its last resourceVersion.
    Graceful,
    /// Connection aborted mid-stream.
    Abort,
    /// A 410 `ERROR` event, then the end.
    Expired,
    /// The client went away or the fake stopped: nothing to send.
    Gone,
}

struct Stream {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    selectors: Selectors,
    namespace: Option<String>,
    kind: usize,
    /// (kind, apiVersion) of BOOKMARK objects.
    bookmark_kind: (&'static str, String),
    /// The resourceVersion every event up to which has been sent or filtered out.
    last_rv: u64,
    pending: VecDeque<Arc<Event>>,
    initial_end: bool,
}

impl Stream {
    async fn run(
        mut self,
        mut live: broadcast::Receiver<Arc<Event>>,
        mut control: watch::Receiver<Control>,
        start: Control,
        bookmarks: bool,
        timeout: Duration,
    ) {
        let mut paused = start.paused;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticks = tokio::time::interval(self.shared.bookmark_interval);
        ticks.reset();
        let end = loop {
            if !paused && !self.flush().await {
                break End::Gone;
            }
            tokio::select! {
                () = &mut deadline => break End::Graceful,
                () = self.tx.closed() => break End::Gone,
                event = live.recv(), if !paused => match event {
                    Ok(e) if e.kind == self.kind => self.pending.push_back(e),
                    Ok(e) => self.last_rv = self.last_rv.max(e.rv),
                    Err(broadcast::error::RecvError::Lagged(_)) => break End::Graceful,
                    Err(broadcast::error::RecvError::Closed) => break End::Gone,
                },
                _ = ticks.tick(), if bookmarks && !paused => {
                    if !self.bookmark(false).await {
                        break End::Gone;
                    }
                }
                changed = control.changed() => {
                    let now: Control = *control.borrow_and_update();
                    if changed.is_err() || now.shutdown {
                        break End::Gone;
                    }
                    if now.dropped != start.dropped {
                        break End::Abort;
                    }
                    if now.expired != start.expired {
                        break End::Expired;
                    }
                    paused = now.paused;
                }
            }
        };
        self.finish(end).await;
    }

    async fn finish(&mut self, end: End) {
        match end {
            End::Graceful | End::Gone => {}
            End::Abort => {
                let aborted = std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "watch dropped by the test",
                );
                let _ = self.tx.send(Err(aborted)).await;
            }
            End::Expired => {
                self.shared.count(self.kind, |c| c.expired += 1);
                let status =
                    ApiError::expired("the watch fell behind the compacted history").to_status();
                let _ = self.tx.send(Ok(event_line("ERROR", &status))).await;
            }
        }
        self.shared.count(self.kind, |c| {
            c.open_watches = c.open_watches.saturating_sub(1)
        });
    }

    /// Sends every pending event that passes the filters; false when the client is gone.
    async fn flush(&mut self) -> bool {
        while let Some(event) = self.pending.pop_front() {
            if let Some((event_type, object)) =
                event.filtered(self.namespace.as_deref(), &self.selectors)
                && self
                    .tx
                    .send(Ok(event_line(event_type.as_str(), object)))
                    .await
                    .is_err()
            {
                return false;
            }
            self.last_rv = self.last_rv.max(event.rv);
        }
        if std::mem::take(&mut self.initial_end) {
            return self.bookmark(true).await;
        }
        true
    }

    async fn bookmark(&mut self, initial_end: bool) -> bool {
        let mut metadata = json!({"resourceVersion": self.last_rv.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (kind, api_version) = &self.bookmark_kind;
        let object = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
        self.tx
            .send(Ok(event_line("BOOKMARK", &object)))
            .await
            .is_ok()
    }
}
