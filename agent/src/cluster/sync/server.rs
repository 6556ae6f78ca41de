//! The owner's side of IndexSync: a tonic service (written out by hand, as tonic's codegen
//! would) whose one streaming method checks the caller's token, reads its subscription and
//! streams each subscribed local pod from the client's watermark; placements the client
//! sends are applied here and relayed to the pod's other subscribers.
//!
//! The pods served change at run time ([`SyncServer::set_pods`]): every producer looks its
//! pods' sources up again on each pass, so a pod no longer local stops streaming at once and
//! one re-added with a new source (a new journal incarnation) is sent as a snapshot.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll},
    time::Duration,
};

use parking_lot::RwLock;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{
    Request, Response, Status, Streaming,
    codegen::{Body, BoxFuture, StdError, http},
};

use super::{
    SNAPSHOT_CHUNK, STREAM_QUEUE, SYNC_PATH, key_tier,
    proto::{
        ClientMsg, Placement, PodDelta, PodLoad, ServerMsg, SnapshotChunk, client_msg, server_msg,
    },
};
use crate::{
    cluster::{
        auth::{AuthCounters, ClusterKey},
        lag::{Lags, Stamp},
    },
    kv_index::{AgentLoad, KvIndex, RouterKey, Since, SourceId, Watermark},
};

/// Placements relayed between one owner's streams.
const RELAY_QUEUE: usize = 4_096;

/// What is passed between one owner's streams, with the stream that sent it (0 for this
/// agent's own).
#[derive(Debug, Clone)]
enum Relayed {
    /// A placement: (pod, keys, ttl ms, when it was made (unix us)).
    Placement((Arc<str>, Arc<[u64]>, u32, u64), u64),
    /// An agent's load on a pod.
    Load(Arc<PodLoad>, u64),
}

impl Relayed {
    fn pod(&self) -> &str {
        match self {
            Relayed::Placement((pod, ..), _) => pod,
            Relayed::Load(l, _) => &l.pod,
        }
    }

    fn from(&self) -> u64 {
        match self {
            Relayed::Placement(_, from) | Relayed::Load(_, from) => *from,
        }
    }
}

/// Pods by id and their sources here.
pub type PodSources = HashMap<String, SourceId>;

/// What the owner serves: its local pods, and every pod it knows (for placements).
#[derive(Debug)]
pub struct SyncServer {
    index: Arc<KvIndex>,
    /// Local pods by id: what may be subscribed to.
    local: RwLock<PodSources>,
    /// Every pod this agent has a source for (placements on any of them apply here).
    known: RwLock<PodSources>,
    key: Option<Arc<ClusterKey>>,
    counters: Arc<AuthCounters>,
    /// Where the lag of subscribers' placements is recorded.
    lags: Arc<Lags>,
    relay: broadcast::Sender<Relayed>,
    next_stream: std::sync::atomic::AtomicU64,
}

impl SyncServer {
    pub fn new(
        index: Arc<KvIndex>,
        local: PodSources,
        known: PodSources,
        key: Option<Arc<ClusterKey>>,
        counters: Arc<AuthCounters>,
        lags: Arc<Lags>,
    ) -> Self {
        Self {
            index,
            local: RwLock::new(local),
            known: RwLock::new(known),
            key,
            counters,
            lags,
            relay: broadcast::channel(RELAY_QUEUE).0,
            next_stream: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// Replaces the pods served (`local`) and those placements apply to (`known`), and wakes
    /// every producer to look its pods up again.
    pub fn set_pods(&self, local: PodSources, known: PodSources) {
        *self.local.write() = local;
        *self.known.write() = known;
        self.index.changes().notify_waiters();
    }

    /// How many subscribers' streams are being served now (each producer holds one relay
    /// receiver until its stream ends).
    #[cfg(test)]
    pub(crate) fn streams(&self) -> usize {
        self.relay.receiver_count()
    }

    /// The source a local pod is served from now.
    fn local_source(&self, pod: &str) -> Option<SourceId> {
        self.local.read().get(pod).copied()
    }

    /// The owner's own router placed `keys` on its local pod at `placed_us` (unix
    /// microseconds): tell its subscribers.
    pub fn placed_locally(&self, pod: &str, keys: &[RouterKey], ttl: Duration, placed_us: u64) {
        let keys: Arc<[u64]> = keys.iter().map(|k| k.0).collect();
        let ttl = u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX);
        // No subscriber is not an error.
        let _ = self.relay.send(Relayed::Placement(
            (Arc::from(pod), keys, ttl, placed_us),
            0,
        ));
    }

    /// The owner's own router's load on its local pod changed: tell its subscribers.
    pub fn loaded_locally(&self, load: PodLoad) {
        // No subscriber is not an error.
        let _ = self.relay.send(Relayed::Load(Arc::new(load), 0));
    }

    /// Applies a subscriber's load (on a pod this agent knows) and relays it to the pod's
    /// other subscribers when the pod is local.
    fn apply_load(&self, load: PodLoad, from: u64) {
        let Some(source) = self.known.read().get(&load.pod).copied() else {
            return;
        };
        self.index.peer_load(source, &load.agent, agent_load(&load));
        if self.local.read().contains_key(&load.pod) {
            let _ = self.relay.send(Relayed::Load(Arc::new(load), from));
        }
    }

    fn authorized<T>(&self, request: &Request<T>) -> bool {
        let Some(key) = &self.key else {
            return true;
        };
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        presented.is_some_and(|t| key.check_token(t))
    }

    /// Applies a subscriber's placement (on a pod this agent knows) and relays it.
    fn apply_placement(&self, p: &Placement, from: u64) {
        let Some(source) = self.known.read().get(&p.pod).copied() else {
            return;
        };
        let keys: Vec<RouterKey> = p.keys.iter().map(|&k| RouterKey(k)).collect();
        let ttl = Duration::from_millis(u64::from(p.ttl_ms));
        self.index
            .speculate_remote(source, &keys, ttl, tokio::time::Instant::now().into_std());
        self.lags.record(Stamp::Placement {
            placed_us: p.placed_unix_us,
            relayed: p.relayed,
        });
        if self.local.read().contains_key(&p.pod) {
            let _ = self.relay.send(Relayed::Placement(
                (
                    Arc::from(p.pod.as_str()),
                    p.keys.clone().into(),
                    p.ttl_ms,
                    p.placed_unix_us,
                ),
                from,
            ));
        }
    }
}

/// The load a [`PodLoad`] reports.
pub(super) fn agent_load(l: &PodLoad) -> AgentLoad {
    AgentLoad {
        in_flight: l.in_flight,
        queued_prefill_blocks: l.queued_prefill_blocks,
    }
}

/// Streams the subscribed pods to `tx` from their watermarks until the client goes away.
async fn produce(
    server: Arc<SyncServer>,
    mut pods: Vec<(String, SourceId, Watermark)>,
    stream: u64,
    tx: mpsc::Sender<Result<ServerMsg, Status>>,
) {
    let mut relay = server.relay.subscribe();
    loop {
        let changed = server.index.changes().notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        for (pod, source, at) in &mut pods {
            // No longer local: not served (the replica learns it from gossip).
            let Some(now) = server.local_source(pod) else {
                continue;
            };
            // Re-added with another source: its journal is another incarnation, so `since`
            // answers with a snapshot.
            *source = now;
            let Some(since) = server.index.since(*source, *at) else {
                continue;
            };
            if send_since(pod, since, at, &tx).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = &mut changed => {}
            _ = tx.closed() => return,
            relayed = relay.recv() => match relayed {
                Ok(relayed) => {
                    let from = relayed.from();
                    if from != stream && pods.iter().any(|(p, _, _)| *p == relayed.pod()) {
                        let msg = match relayed {
                            Relayed::Placement((pod, keys, ttl_ms, placed_unix_us), _) => {
                                server_msg::Msg::Placement(Placement {
                                    pod: pod.to_string(),
                                    keys: keys.to_vec(),
                                    ttl_ms,
                                    placed_unix_us,
                                    // Another subscriber's: this owner is its second hop.
                                    relayed: from != 0,
                                })
                            }
                            Relayed::Load(load, _) => server_msg::Msg::Load((*load).clone()),
                        };
                        if tx.send(Ok(ServerMsg { msg: Some(msg) })).await.is_err() {
                            return;
                        }
                    }
                }
                // Placements are hints: a slow stream skips the ones it missed.
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

/// Sends what a replica at `at` needs, advancing `at`.
async fn send_since(
    pod: &str,
    since: Since,
    at: &mut Watermark,
    tx: &mpsc::Sender<Result<ServerMsg, Status>>,
) -> Result<(), ()> {
    let send = |msg| tx.send(Ok(ServerMsg { msg: Some(msg) }));
    match since {
        Since::Deltas(deltas) => {
            for (sequence, d) in deltas {
                let msg = server_msg::Msg::Delta(PodDelta {
                    pod: pod.to_string(),
                    incarnation: at.incarnation,
                    sequence,
                    cleared: d.cleared,
                    stored: d
                        .stored
                        .iter()
                        .map(|&(k, t)| key_tier(k, t as u8))
                        .collect(),
                    removed: d
                        .removed
                        .iter()
                        .map(|&(k, t)| key_tier(k, t as u8))
                        .collect(),
                    applied_unix_us: d.applied_unix_us,
                    event_unix_us: d.event_unix_us,
                });
                send(msg).await.map_err(|_| ())?;
                at.sequence = sequence;
            }
        }
        Since::Snapshot { at: now, held } => {
            let chunks = held.len().div_ceil(SNAPSHOT_CHUNK).max(1);
            for (i, chunk) in (0..chunks).map(|i| {
                (
                    i,
                    &held[i * SNAPSHOT_CHUNK..((i + 1) * SNAPSHOT_CHUNK).min(held.len())],
                )
            }) {
                let msg = server_msg::Msg::Snapshot(SnapshotChunk {
                    pod: pod.to_string(),
                    incarnation: now.incarnation,
                    sequence: now.sequence,
                    chunk: i as u32,
                    last: i + 1 == chunks,
                    held: chunk.iter().map(|&(k, bits)| key_tier(k, bits)).collect(),
                });
                send(msg).await.map_err(|_| ())?;
            }
            *at = now;
        }
    }
    Ok(())
}

/// The method: authenticate, read the subscription, start the producer.
#[derive(Debug)]
struct SyncMethod(Arc<SyncServer>);

type ServerStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<ServerMsg, Status>> + Send>>;

impl tonic::server::StreamingService<ClientMsg> for SyncMethod {
    type Response = ServerMsg;
    type ResponseStream = ServerStream;
    type Future = BoxFuture<Response<ServerStream>, Status>;

    fn call(&mut self, request: Request<Streaming<ClientMsg>>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move {
            if !server.authorized(&request) {
                let n = server
                    .counters
                    .rejected_streams
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                tracing::warn!(rejected = n, remote = ?request.remote_addr(), "IndexSync stream refused: bad or missing cluster token");
                return Err(Status::unauthenticated("not a member of this cluster"));
            }
            let mut inbound = request.into_inner();
            let first = inbound.message().await?;
            let Some(ClientMsg {
                msg: Some(client_msg::Msg::Subscribe(sub)),
            }) = first
            else {
                return Err(Status::invalid_argument(
                    "the first message must be a Subscribe",
                ));
            };
            let pods: Vec<_> = sub
                .pods
                .iter()
                .filter_map(|w| {
                    let source = server.local_source(&w.pod)?;
                    let at = Watermark {
                        incarnation: w.incarnation,
                        sequence: w.sequence,
                    };
                    Some((w.pod.clone(), source, at))
                })
                .collect();
            let stream = server.next_stream.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = mpsc::channel(STREAM_QUEUE);
            let producer = tokio::spawn(produce(server.clone(), pods, stream, tx));
            tokio::spawn(async move {
                // Placements until the client closes its side; then the producer stops too.
                while let Ok(Some(msg)) = inbound.message().await {
                    match msg.msg {
                        Some(client_msg::Msg::Placement(p)) => server.apply_placement(&p, stream),
                        Some(client_msg::Msg::Load(l)) => server.apply_load(l, stream),
                        _ => {}
                    }
                }
                producer.abort();
            });
            let out: ServerStream = Box::pin(ReceiverStream::new(rx));
            Ok(Response::new(out))
        })
    }
}

/// The tower service tonic's router serves.
#[derive(Debug, Clone)]
pub struct IndexSyncService(pub Arc<SyncServer>);

impl tonic::server::NamedService for IndexSyncService {
    const NAME: &'static str = "warmpath.cluster.v1.IndexSync";
}

impl<B> tonic::codegen::Service<http::Request<B>> for IndexSyncService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move {
            if req.uri().path() != SYNC_PATH {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.streaming(SyncMethod(server), req).await)
        })
    }
}

/// Serves IndexSync on `listener` until the task is aborted. Accepted connections send
/// without Nagle's delay: a delta or a relayed placement is one small frame, and held back
/// behind an unacknowledged one it would wait for the peer's delayed ACK (up to 40 ms on
/// Linux).
pub async fn serve(server: Arc<SyncServer>, listener: tokio::net::TcpListener) {
    use tokio_stream::StreamExt as _;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
        if let Ok(tcp) = &accepted
            && let Err(err) = tcp.set_nodelay(true)
        {
            tracing::debug!(%err, "IndexSync TCP_NODELAY");
        }
        accepted
    });
    if let Err(e) = tonic::transport::Server::builder()
        .add_service(IndexSyncService(server))
        .serve_with_incoming(incoming)
        .await
    {
        tracing::warn!(error = %e, "IndexSync server stopped");
    }
}
