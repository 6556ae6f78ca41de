//! The replica's side of IndexSync: one task per owning peer, subscribing to the pods this
//! agent replicates from it, applying snapshots and deltas in order, sending this agent's
//! placements on those pods, and resuming from its watermarks after any break.
//!
//! A delta out of order (not the next sequence of the copy's incarnation) means the copy
//! cannot be trusted: it is dropped, and the stream starts over with a snapshot.
//!
//! The pods replicated from one peer change at run time ([`replicate_changing`]): the
//! stream is then opened again with the new set, the kept copies resuming from their
//! watermarks, new ones from a snapshot, removed ones forgotten. A message is applied only
//! while the index still names this peer as its source's owner, so a source the caller
//! removed (its id reused by another pod) is never written by a stream that outlived it.

use std::{collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, transport::Endpoint};

use super::{
    BACKOFF_MAX, BACKOFF_MIN, STREAM_QUEUE, SYNC_PATH, bearer,
    proto::{
        ClientMsg, Placement, PodLoad, PodWatermark, ServerMsg, Subscribe, client_msg, server_msg,
    },
    server::agent_load,
    tier_of,
};
use crate::{
    cluster::lag::{Lags, Stamp},
    kv_index::{KeyDelta, KvIndex, RouterKey, SourceId, Watermark},
};

/// Pods by id and their sources here, in order.
pub type PodSet = Vec<(String, SourceId)>;

/// One peer to replicate from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub peer: String,
    pub grpc: SocketAddr,
    /// The pods it owns that this agent replicates, and their sources here.
    pub pods: PodSet,
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamEnd {
    #[error("connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("{0}")]
    Status(#[from] tonic::Status),
    #[error("the owner ended the stream")]
    Closed,
    #[error("the pods replicated from this peer changed")]
    Resubscribe,
    #[error("pod {pod}: delta {got:?} does not follow {have:?}; starting over from a snapshot")]
    OutOfOrder {
        pod: String,
        got: Watermark,
        have: Watermark,
    },
}

/// This agent's copy of one replicated pod.
#[derive(Debug)]
pub(crate) struct Copy {
    source: SourceId,
    at: Watermark,
    /// Snapshot chunks received so far (applied whole on the last).
    pending: Vec<(RouterKey, u8)>,
}

impl Copy {
    /// A copy with nothing yet: the owner starts it with a snapshot.
    pub(crate) fn new(source: SourceId) -> Self {
        Self {
            source,
            at: Watermark::default(),
            pending: Vec::new(),
        }
    }

    /// How far it has come: the last snapshot or delta applied.
    pub(crate) fn at(&self) -> Watermark {
        self.at
    }
}

/// Replicates `upstream`'s pods into `index` until aborted. `placements` carries this
/// agent's placements on those pods. (No lag is recorded.)
pub async fn replicate(
    upstream: Upstream,
    index: Arc<KvIndex>,
    token: Option<String>,
    placements: mpsc::Receiver<Placement>,
) {
    // The sender lives as long as the stream: the set never changes.
    let (_fixed, pods) = watch::channel(upstream.pods.clone());
    let lags = Arc::new(Lags::default());
    // No loads to send (the sender dropped: the branch is off).
    let (_, loads) = mpsc::channel(1);
    replicate_changing(upstream, pods, index, token, (placements, loads), lags).await;
}

/// [`replicate`], with the pods to replicate from `pods` (`upstream.pods` is ignored): each
/// change opens the stream again with the new set. Each applied delta's and placement's lag
/// is recorded in `lags`. The second receiver carries this agent's loads on those pods.
pub async fn replicate_changing(
    mut upstream: Upstream,
    mut pods: watch::Receiver<PodSet>,
    index: Arc<KvIndex>,
    token: Option<String>,
    (mut placements, mut loads): (mpsc::Receiver<Placement>, mpsc::Receiver<PodLoad>),
    lags: Arc<Lags>,
) {
    let mut copies: HashMap<String, Copy> = HashMap::new();
    let mut backoff = BACKOFF_MIN;
    loop {
        upstream.pods = pods.borrow_and_update().clone();
        keep_copies(&mut copies, &upstream.pods);
        let end = stream_once(
            &upstream,
            &index,
            token.as_deref(),
            &mut copies,
            (&mut placements, &mut loads, &mut pods),
            &lags,
        )
        .await;
        if matches!(end, StreamEnd::Resubscribe) {
            backoff = BACKOFF_MIN;
            continue;
        }
        match &end {
            StreamEnd::OutOfOrder { pod, .. } => {
                start_over(&index, &mut copies, pod);
                tracing::warn!(peer = %upstream.peer, error = %end, "IndexSync stream restarted");
            }
            _ => {
                tracing::debug!(peer = %upstream.peer, error = %end, "IndexSync stream ended; resuming")
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
        if matches!(end, StreamEnd::Closed) {
            backoff = BACKOFF_MIN;
        }
    }
}

/// Makes `copies` the copies of `pods`: kept ones keep their watermarks, a pod whose source
/// changed starts over, removed ones are forgotten.
fn keep_copies(copies: &mut HashMap<String, Copy>, pods: &[(String, SourceId)]) {
    copies.retain(|pod, c| pods.iter().any(|(p, s)| p == pod && *s == c.source));
    for (pod, source) in pods {
        copies
            .entry(pod.clone())
            .or_insert_with(|| Copy::new(*source));
    }
}

/// Whether the index still names `peer` as the owner of the source a message is for.
fn owned_by(
    index: &KvIndex,
    copies: &HashMap<String, Copy>,
    peer: &str,
    m: &server_msg::Msg,
) -> bool {
    let pod = match m {
        server_msg::Msg::Delta(d) => &d.pod,
        server_msg::Msg::Snapshot(s) => &s.pod,
        server_msg::Msg::Placement(p) => &p.pod,
        server_msg::Msg::Load(l) => &l.pod,
    };
    copies
        .get(pod)
        .is_some_and(|c| index.owner(c.source).as_deref() == Some(peer))
}

/// The stamps of a message, to record once it is applied.
fn stamp(m: &server_msg::Msg) -> Stamp {
    match m {
        server_msg::Msg::Delta(d) => Stamp::Delta {
            applied_us: d.applied_unix_us,
            event_us: d.event_unix_us,
        },
        server_msg::Msg::Placement(p) => Stamp::Placement {
            placed_us: p.placed_unix_us,
            relayed: p.relayed,
        },
        server_msg::Msg::Snapshot(_) | server_msg::Msg::Load(_) => Stamp::None,
    }
}

async fn stream_once(
    upstream: &Upstream,
    index: &KvIndex,
    token: Option<&str>,
    copies: &mut HashMap<String, Copy>,
    (placements, loads, pods): (
        &mut mpsc::Receiver<Placement>,
        &mut mpsc::Receiver<PodLoad>,
        &mut watch::Receiver<PodSet>,
    ),
    lags: &Lags,
) -> StreamEnd {
    let channel = match Endpoint::from_shared(format!("http://{}", upstream.grpc)) {
        Ok(e) => e.connect_timeout(Duration::from_secs(2)),
        Err(e) => return StreamEnd::Connect(e),
    };
    let channel = match channel.connect().await {
        Ok(c) => c,
        Err(e) => return StreamEnd::Connect(e),
    };
    let (out, out_rx) = mpsc::channel(STREAM_QUEUE);
    let subscribe = Subscribe {
        pods: copies
            .iter()
            .map(|(pod, c)| PodWatermark {
                pod: pod.clone(),
                incarnation: c.at.incarnation,
                sequence: c.at.sequence,
            })
            .collect(),
    };
    let msg = |m| ClientMsg { msg: Some(m) };
    // Cannot fail: the queue is empty and its receiver is here.
    let _ = out.try_send(msg(client_msg::Msg::Subscribe(subscribe)));
    let mut request = Request::new(ReceiverStream::new(out_rx));
    if let Some(token) = token
        && let Ok(v) = bearer(token).parse()
    {
        request.metadata_mut().insert("authorization", v);
    }
    let mut grpc = tonic::client::Grpc::new(channel);
    if let Err(e) = grpc.ready().await {
        return StreamEnd::Connect(e);
    }
    let path = http::uri::PathAndQuery::from_static(SYNC_PATH);
    let response = grpc
        .streaming(
            request,
            path,
            tonic_prost::ProstCodec::<ClientMsg, ServerMsg>::default(),
        )
        .await;
    let mut inbound = match response {
        Ok(r) => r.into_inner(),
        Err(status) => return StreamEnd::Status(status),
    };
    loop {
        tokio::select! {
            got = inbound.message() => match got {
                Ok(Some(ServerMsg { msg: Some(m) })) => {
                    if !owned_by(index, copies, &upstream.peer, &m) {
                        continue;
                    }
                    let stamp = stamp(&m);
                    if let Err(end) = apply(index, copies, m) {
                        return end;
                    }
                    lags.record(stamp);
                }
                Ok(Some(ServerMsg { msg: None })) => {}
                Ok(None) => return StreamEnd::Closed,
                Err(status) => return StreamEnd::Status(status),
            },
            Some(p) = placements.recv() => {
                // A full queue drops the placement: it is a hint, and the engine's events follow.
                let _ = out.try_send(msg(client_msg::Msg::Placement(p)));
            }
            Some(l) = loads.recv() => {
                // A full queue drops it: the next change or refresh sends the load again.
                let _ = out.try_send(msg(client_msg::Msg::Load(l)));
            }
            // A closed sender (the stream's owner going away) disables the branch.
            Ok(()) = pods.changed() => return StreamEnd::Resubscribe,
        }
    }
}

/// Drops the copy of `pod` after a delta out of order: no entries, waiting for a snapshot.
pub(crate) fn start_over(index: &KvIndex, copies: &mut HashMap<String, Copy>, pod: &str) {
    if let Some(c) = copies.get_mut(pod) {
        index.resync_remote(c.source);
        c.at = Watermark::default();
        c.pending.clear();
    }
}

/// Applies one message of the owner's stream to the copies it names (others are ignored);
/// `Err` for a delta that is not the next of its copy's incarnation.
pub(crate) fn apply(
    index: &KvIndex,
    copies: &mut HashMap<String, Copy>,
    m: server_msg::Msg,
) -> Result<(), StreamEnd> {
    match m {
        server_msg::Msg::Delta(d) => {
            let Some(c) = copies.get_mut(&d.pod) else {
                return Ok(());
            };
            let got = Watermark {
                incarnation: d.incarnation,
                sequence: d.sequence,
            };
            // A copy at sequence u64::MAX has no next delta (only a snapshot moves it on).
            if got.incarnation != c.at.incarnation
                || c.at.sequence.checked_add(1) != Some(got.sequence)
            {
                return Err(StreamEnd::OutOfOrder {
                    pod: d.pod,
                    got,
                    have: c.at,
                });
            }
            let delta = KeyDelta {
                applied_unix_us: d.applied_unix_us,
                event_unix_us: d.event_unix_us,
                cleared: d.cleared,
                stored: d
                    .stored
                    .iter()
                    .map(|t| (RouterKey(t.key), tier_of(t)))
                    .collect(),
                removed: d
                    .removed
                    .iter()
                    .map(|t| (RouterKey(t.key), tier_of(t)))
                    .collect(),
            };
            index.apply_remote(c.source, &delta);
            c.at = got;
        }
        server_msg::Msg::Snapshot(s) => {
            let Some(c) = copies.get_mut(&s.pod) else {
                return Ok(());
            };
            if s.chunk == 0 {
                c.pending.clear();
            }
            // Bounded like the index itself: a snapshot larger than it could hold is cut.
            let room = index.config().max_entries.saturating_sub(c.pending.len());
            c.pending.extend(
                s.held
                    .iter()
                    .take(room)
                    .map(|t| (RouterKey(t.key), u8::try_from(t.tier).unwrap_or(0))),
            );
            if s.last {
                index.load_snapshot(c.source, &c.pending);
                c.pending = Vec::new();
                c.at = Watermark {
                    incarnation: s.incarnation,
                    sequence: s.sequence,
                };
            }
        }
        server_msg::Msg::Placement(p) => {
            if let Some(c) = copies.get(&p.pod) {
                let keys: Vec<RouterKey> = p.keys.iter().map(|&k| RouterKey(k)).collect();
                index.speculate_remote(
                    c.source,
                    &keys,
                    Duration::from_millis(u64::from(p.ttl_ms)),
                    tokio::time::Instant::now().into_std(),
                );
            }
        }
        server_msg::Msg::Load(l) => {
            if let Some(c) = copies.get(&l.pod) {
                index.peer_load(c.source, &l.agent, agent_load(&l));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cluster::sync::proto::{KeyTier, PodDelta, SnapshotChunk},
        kv_index::{IndexConfig, SourceInfo},
    };

    fn delta(incarnation: u64, sequence: u64) -> server_msg::Msg {
        server_msg::Msg::Delta(PodDelta {
            pod: "a".into(),
            incarnation,
            sequence,
            cleared: false,
            stored: vec![KeyTier { key: 7, tier: 0 }],
            removed: Vec::new(),
            ..Default::default()
        })
    }

    /// The fuzzing finding (cluster_sync): a copy at sequence u64::MAX overflowed computing
    /// its next sequence (a panic with debug assertions, and a wrapped "next" of 0 without).
    #[test]
    fn a_copy_at_the_last_sequence_refuses_every_delta() {
        let index = KvIndex::new(IndexConfig::default());
        let source = index.add_remote_source(SourceInfo {
            pod: "a".into(),
            rank: None,
        });
        let mut copies = HashMap::from([("a".to_string(), Copy::new(source))]);
        let snapshot = server_msg::Msg::Snapshot(SnapshotChunk {
            pod: "a".into(),
            incarnation: 1,
            sequence: u64::MAX,
            chunk: 0,
            last: true,
            held: Vec::new(),
        });
        apply(&index, &mut copies, snapshot).expect("a snapshot is always taken");
        assert_eq!(
            copies["a"].at(),
            Watermark {
                incarnation: 1,
                sequence: u64::MAX
            }
        );
        for sequence in [0, 1, u64::MAX] {
            let end = apply(&index, &mut copies, delta(1, sequence));
            assert!(matches!(end, Err(StreamEnd::OutOfOrder { .. })), "{end:?}");
        }
        assert!(index.source_keys(source).is_empty());
    }

    #[test]
    fn the_next_delta_is_applied_and_a_repeat_refused() {
        let index = KvIndex::new(IndexConfig::default());
        let source = index.add_remote_source(SourceInfo {
            pod: "a".into(),
            rank: None,
        });
        let mut copies = HashMap::from([("a".to_string(), Copy::new(source))]);
        apply(&index, &mut copies, delta(0, 1)).expect("the first delta of a fresh copy");
        assert_eq!(index.source_keys(source).len(), 1);
        let end = apply(&index, &mut copies, delta(0, 1));
        assert!(matches!(end, Err(StreamEnd::OutOfOrder { .. })), "{end:?}");
        start_over(&index, &mut copies, "a");
        assert_eq!(copies["a"].at(), Watermark::default());
        assert!(index.source_keys(source).is_empty());
        assert!(!index.trusted(source));
    }
}
