//! Ingestion I/O: one ZeroMQ SUB per event source, feeding the tracker and the index, with
//! replay over a DEALER when batches go missing.
//!
//! The SUB connects to the engine's PUB, or binds for engines configured to connect (vLLM's
//! bind/connect rule, mirrored). The zeromq crate reconnects and resubscribes by itself; an
//! engine that restarts shows up as sequence numbers starting again from 0.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::StreamExt;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::{
    KvIndex, SourceId,
    tracker::{SeqTracker, Step},
    wire::decode_batch,
};

/// The replay end marker: -1 as a signed 8-byte big-endian integer.
const END_SEQ: [u8; 8] = [0xff; 8];
/// Silence after which the replay endpoint is asked for batches that may have been lost.
pub const IDLE_PROBE: Duration = Duration::from_secs(1);
/// How long a replay may take before the gap is declared unrecoverable.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(3);

/// Where one source publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    pub pod: String,
    /// Data-parallel rank, when the pod runs several.
    pub rank: Option<u32>,
    /// The engine's KV events endpoint (`tcp://host:port`).
    pub endpoint: String,
    /// Bind instead of connecting (the engine connects to us).
    pub bind: bool,
    /// The engine's replay endpoint, if it has one.
    pub replay: Option<String>,
    /// Topic prefix to subscribe to ("" = all).
    pub topic: String,
}

/// Failures opening a subscription.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    #[error("KV events {endpoint}: {source}")]
    Socket {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
}

/// Opens the subscription and spawns the ingestion task for an already registered source.
pub async fn spawn(
    index: Arc<KvIndex>,
    id: SourceId,
    cfg: SourceConfig,
) -> Result<tokio::task::JoinHandle<()>, SubscribeError> {
    let mut options = zeromq::SocketOptions::default();
    // Each connect attempt gives up after this; the task below tries again, so a publisher
    // that appears late is found within about this long.
    options.connect_timeout(CONNECT_ATTEMPT);
    let mut sub = SubSocket::with_options(options);
    let monitor = sub.monitor();
    let err = |source| SubscribeError::Socket {
        endpoint: cfg.endpoint.clone(),
        source,
    };
    // A malformed address fails now, not in a retry loop.
    cfg.endpoint
        .parse::<zeromq::Endpoint>()
        .map_err(|e| err(e.into()))?;
    if cfg.bind {
        sub.bind(&cfg.endpoint).await.map_err(err)?;
        sub.subscribe(&cfg.topic).await.map_err(err)?;
        return Ok(tokio::spawn(ingest(index, id, cfg, sub, monitor)));
    }
    // Connecting waits for the publisher to exist. A pod that is down (or not up yet) must
    // not hold up the agent: connect in the background; until events arrive the pod simply
    // has no trusted prefix information (prefix weight 0, visible in /status).
    Ok(tokio::spawn(async move {
        let mut warned = false;
        loop {
            let attempt = async {
                sub.connect(&cfg.endpoint).await?;
                sub.subscribe(&cfg.topic).await
            };
            match attempt.await {
                Ok(()) => break,
                Err(e) => {
                    if !warned {
                        tracing::warn!(pod = %cfg.pod, endpoint = %cfg.endpoint, error = %e, "KV events publisher not reachable yet; routing this pod without prefix information until it is (retrying)");
                        warned = true;
                    }
                    // Timeouts retry at once; other failures (refused before the timeout
                    // machinery applies, bad address) wait a little.
                    if !matches!(e, zeromq::ZmqError::ConnectTimeout(_)) {
                        tokio::time::sleep(CONNECT_ATTEMPT).await;
                    }
                }
            }
        }
        tracing::info!(pod = %cfg.pod, endpoint = %cfg.endpoint, "subscribed to KV events");
        ingest(index, id, cfg, sub, monitor).await;
    }))
}

/// One connect attempt's limit (a publisher that appears late is found within about this).
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

async fn ingest(
    index: Arc<KvIndex>,
    id: SourceId,
    cfg: SourceConfig,
    mut sub: SubSocket,
    mut monitor: futures::channel::mpsc::Receiver<SocketEvent>,
) {
    let mut tracker = SeqTracker::default();
    let replay = cfg.replay.clone().map(ZmqReplay);
    let mut lost_peer = false;
    loop {
        let idle = if replay.is_some() {
            IDLE_PROBE
        } else {
            Duration::MAX
        };
        tokio::select! {
            // Connection events first: a batch from a new publisher must not be taken for
            // the old one's.
            biased;
            event = monitor.next() => match event {
                Some(SocketEvent::Disconnected(_)) => lost_peer = true,
                Some(SocketEvent::Connected(..) | SocketEvent::Accepted(..)) if lost_peer => {
                    // The publisher came back. It may be a new process whose sequence
                    // numbers happen to continue past ours: never assume it is the same one.
                    lost_peer = false;
                    tracker = SeqTracker::default();
                    index.reconnected(id);
                    // The zeromq crate resubscribes on reconnect, but not always before the
                    // new publisher starts sending; subscribing again is harmless.
                    if let Err(err) = sub.subscribe(&cfg.topic).await {
                        tracing::warn!(pod = %cfg.pod, %err, "resubscribe after reconnect failed");
                    }
                }
                Some(_) => {}
                // Monitor gone: keep ingesting without it.
                None => monitor = futures::channel::mpsc::channel(1).1,
            },
            received = tokio::time::timeout(idle, sub.recv()) => match received {
                // Quiet: a lost LAST batch would otherwise go unnoticed until the next one.
                Err(_) => catch_up(&index, id, &mut tracker, replay.as_ref()).await,
                Ok(Err(err)) => {
                    tracing::warn!(pod = %cfg.pod, %err, "KV event subscription ended");
                    return;
                }
                Ok(Ok(msg)) => {
                    let frames = msg.into_vec();
                    match split_frames(&frames) {
                        Some((seq, payload)) => on_batch(&index, id, &mut tracker, seq, payload, replay.as_ref()).await,
                        None => index.note_malformed(id),
                    }
                }
            },
        }
    }
}

/// After a quiet period, asks the replay endpoint for anything newer than what was applied
/// (everything, for a fresh subscriber): a lost last batch is found, and a live stream that
/// stays silent is bridged by the replay buffer.
async fn catch_up<R: Replay>(
    index: &KvIndex,
    id: SourceId,
    tracker: &mut SeqTracker,
    replay: Option<&R>,
) {
    let Some(replay) = replay else { return };
    let next = tracker.next().unwrap_or(0);
    let Ok(batches) = replay.fetch(next, u64::MAX).await else {
        return;
    };
    if !batches.is_empty() {
        index.note_gap(id, batches.len() as u64);
    }
    for (seq, payload) in batches {
        on_batch(index, id, tracker, seq, &payload, Some(replay)).await;
    }
}

/// Where lost batches can be fetched from.
pub trait Replay {
    /// Every buffered batch with `from <= seq < until`, in order.
    fn fetch(
        &self,
        from: u64,
        until: u64,
    ) -> impl std::future::Future<Output = Result<Vec<(u64, Bytes)>, String>> + Send;
}

/// A vLLM replay endpoint (ROUTER) reached over a DEALER.
#[derive(Debug, Clone)]
pub struct ZmqReplay(pub String);

impl Replay for ZmqReplay {
    async fn fetch(&self, from: u64, until: u64) -> Result<Vec<(u64, Bytes)>, String> {
        fetch_replay(&self.0, from, until).await
    }
}

/// Handles one arriving batch of a source: order, gaps (replay or unsure), restarts,
/// duplicates, then applies it.
pub async fn on_batch<R: Replay>(
    index: &KvIndex,
    id: SourceId,
    tracker: &mut SeqTracker,
    seq: u64,
    payload: &[u8],
    replay: Option<&R>,
) {
    match tracker.observe(seq) {
        Step::Apply => {}
        Step::Restart { missed } => {
            index.restarted(id);
            if missed > 0 {
                recover(index, id, replay, 0, seq).await;
            }
        }
        Step::JoinedLate { missed } => {
            // Without history the index is a subset of the engine's cache: sound, just
            // blind to older blocks. Replay makes it complete when the buffer reaches 0.
            if let Some(replay) = replay
                && let Ok(batches) = replay.fetch(0, seq).await
                && covers(&batches, 0, seq)
            {
                apply_all(index, id, &batches);
                index.note_gap(id, missed);
            }
        }
        Step::Gap { from } => recover(index, id, replay, from, seq).await,
    }
    apply_payload(index, id, seq, payload);
}

/// Fills `from..until` by replay, or marks the source unsure.
async fn recover<R: Replay>(
    index: &KvIndex,
    id: SourceId,
    replay: Option<&R>,
    from: u64,
    until: u64,
) {
    let lost = until - from;
    let Some(replay) = replay else {
        index.note_gap(id, 0);
        index.mark_unsure(
            id,
            format!("lost batches {from}..{until} and no replay endpoint is configured"),
            Instant::now(),
        );
        return;
    };
    match replay.fetch(from, until).await {
        Ok(batches) if covers(&batches, from, until) => {
            apply_all(index, id, &batches);
            index.note_gap(id, lost);
        }
        Ok(batches) => {
            index.note_gap(id, 0);
            let got = batches
                .first()
                .map_or("nothing".into(), |(s, _)| format!("from {s}"));
            index.mark_unsure(
                id,
                format!("lost batches {from}..{until}; replay buffer returned {got}"),
                Instant::now(),
            );
        }
        Err(e) => {
            index.note_gap(id, 0);
            index.mark_unsure(
                id,
                format!("lost batches {from}..{until}; replay failed: {e}"),
                Instant::now(),
            );
        }
    }
}

fn covers(batches: &[(u64, Bytes)], from: u64, until: u64) -> bool {
    batches.len() as u64 == until - from
        && batches
            .iter()
            .enumerate()
            .all(|(i, (s, _))| *s == from + i as u64)
}

fn apply_all(index: &KvIndex, id: SourceId, batches: &[(u64, Bytes)]) {
    for (seq, payload) in batches {
        apply_payload(index, id, *seq, payload);
    }
}

fn apply_payload(index: &KvIndex, id: SourceId, seq: u64, payload: &[u8]) {
    match decode_batch(payload) {
        Ok(batch) => index.apply(id, &batch, seq),
        Err(err) => {
            // Its events are lost: the view may now be wrong in either direction.
            index.note_malformed(id);
            index.mark_unsure(
                id,
                format!("undecodable batch {seq}: {err}"),
                Instant::now(),
            );
        }
    }
}

/// `[topic, seq (8 bytes BE), payload]` -> (seq, payload).
pub(crate) fn split_frames(frames: &[Bytes]) -> Option<(u64, &[u8])> {
    let [_topic, seq, payload] = frames else {
        return None;
    };
    let seq: [u8; 8] = seq.as_ref().try_into().ok()?;
    Some((u64::from_be_bytes(seq), payload.as_ref()))
}

/// Asks a replay endpoint for every buffered batch `>= from`; keeps those `< until`.
/// Understands both reply layouts (v0.25 `[b"", seq, payload]`, v0.26 `[b"", topic, seq,
/// payload]`).
pub async fn fetch_replay(
    endpoint: &str,
    from: u64,
    until: u64,
) -> Result<Vec<(u64, Bytes)>, String> {
    let work = async {
        let mut dealer = DealerSocket::new();
        dealer.connect(endpoint).await.map_err(|e| e.to_string())?;
        let request = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&from.to_be_bytes()),
        ])
        .map_err(|e| e.to_string())?;
        dealer.send(request).await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        loop {
            let frames = dealer.recv().await.map_err(|e| e.to_string())?.into_vec();
            let Some((seq, payload)) = replay_entry(&frames)? else {
                return Ok(out);
            };
            if (from..until).contains(&seq) {
                out.push((seq, payload.clone()));
            }
        }
    };
    tokio::time::timeout(REPLAY_TIMEOUT, work)
        .await
        .map_err(|_| format!("no END after {REPLAY_TIMEOUT:?}"))?
}

/// One replay reply message -> (seq, payload), or `None` for the END marker. Both layouts:
/// `[b"", seq, payload]` (v0.25) and `[b"", topic, seq, payload]` (v0.26), the empty
/// delimiter frame optional.
pub(crate) fn replay_entry(frames: &[Bytes]) -> Result<Option<(u64, &Bytes)>, String> {
    let body = match frames.split_first() {
        Some((first, rest)) if first.is_empty() => rest,
        _ => frames,
    };
    let (seq, payload) = match body {
        [seq, payload] => (seq, payload),
        [_topic, seq, payload] => (seq, payload),
        _ => {
            return Err(format!(
                "unexpected replay reply of {} frames",
                frames.len()
            ));
        }
    };
    let seq: [u8; 8] = seq
        .as_ref()
        .try_into()
        .map_err(|_| "replay seq is not 8 bytes".to_string())?;
    if seq == END_SEQ {
        return Ok(None);
    }
    Ok(Some((u64::from_be_bytes(seq), payload)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_must_be_topic_seq_payload() {
        let ok = [
            Bytes::new(),
            Bytes::copy_from_slice(&5u64.to_be_bytes()),
            Bytes::from_static(b"x"),
        ];
        assert_eq!(split_frames(&ok), Some((5, &b"x"[..])));
        assert_eq!(split_frames(&ok[..2]), None);
        let short_seq = [Bytes::new(), Bytes::from_static(b"123"), Bytes::new()];
        assert_eq!(split_frames(&short_seq), None);
    }

    #[test]
    fn coverage_needs_every_seq() {
        let b = |s: u64| (s, Bytes::new());
        assert!(covers(&[b(3), b(4)], 3, 5));
        assert!(!covers(&[b(4)], 3, 5));
        assert!(!covers(&[b(3), b(5)], 3, 5));
    }
}
