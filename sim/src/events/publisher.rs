//! The ZeroMQ side: a PUB socket sending `[topic, seq (u64 BE), payload]` per engine step, and
//! a ROUTER replay endpoint answering `[b"", start_seq]` with the buffered batches.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use tokio::{sync::mpsc, task::JoinHandle};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::{Encoder, should_bind};
use crate::engine::StepEvents;

/// The end-of-replay marker: -1 as a signed 8-byte big-endian integer.
const END_SEQ: [u8; 8] = [0xff; 8];

/// Reply layout of the replay endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplayLayout {
    /// `[b"", seq, payload]`, ending `[b"", END_SEQ, b""]` (vLLM up to v0.25).
    V025,
    /// `[b"", topic, seq, payload]`, ending `[b"", b"", END_SEQ, b""]` (vLLM v0.26+).
    #[default]
    V026,
}

/// Publisher failures at start-up.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    #[error("KV events endpoint {endpoint}: {source}")]
    Socket {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
}

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct Publisher {
    pub endpoint: String,
    /// None: follow vLLM's bind/connect rule for `endpoint`.
    pub bind: Option<bool>,
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub buffer_steps: usize,
    pub replay_layout: ReplayLayout,
    pub encoder: Encoder,
    /// Fault injection: do not send every Nth batch (it still enters the replay buffer).
    pub drop_every: Option<u64>,
    /// Fault injection: send every Nth batch twice.
    pub duplicate_every: Option<u64>,
    /// Fault injection: hold every Nth batch back and send it after the next one.
    pub reorder_every: Option<u64>,
}

/// Whether batch `seq` is an Nth one.
fn every(n: Option<u64>, seq: u64) -> bool {
    n.is_some_and(|n| n > 0 && (seq + 1).is_multiple_of(n))
}

type Buffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

impl Publisher {
    /// Opens the sockets, then publishes every batch received on `rx` until it closes.
    pub async fn start(
        self,
        mut rx: mpsc::Receiver<StepEvents>,
    ) -> Result<Started, PublisherError> {
        let mut publisher = PubSocket::new();
        let bind = self.bind.unwrap_or_else(|| should_bind(&self.endpoint));
        let endpoint = normalise(&self.endpoint);
        let opened = if bind {
            publisher.bind(&endpoint).await.map(|e| e.to_string())
        } else {
            publisher
                .connect(&endpoint)
                .await
                .map(|()| endpoint.clone())
        };
        let events_endpoint = opened.map_err(|source| PublisherError::Socket {
            endpoint: self.endpoint.clone(),
            source,
        })?;
        let buffer: Buffer = Arc::new(Mutex::new(VecDeque::new()));
        let mut replay_endpoint = None;
        let mut replay_task = tokio::spawn(async {});
        if let Some(replay) = &self.replay_endpoint {
            let mut router = RouterSocket::new();
            let bound =
                router
                    .bind(&normalise(replay))
                    .await
                    .map_err(|source| PublisherError::Socket {
                        endpoint: replay.clone(),
                        source,
                    })?;
            replay_endpoint = Some(bound.to_string());
            replay_task = tokio::spawn(serve_replay(
                router,
                buffer.clone(),
                self.topic.clone(),
                self.replay_layout,
            ));
        }
        let task = tokio::spawn(async move {
            let mut seq: u64 = 0;
            // A batch held back by the reorder fault, sent after the next one.
            let mut held: Option<(u64, ZmqMessage)> = None;
            while let Some(step) = rx.recv().await {
                let payload = Bytes::from(self.encoder.batch(step.ts, &step.events));
                {
                    let mut buf = buffer.lock().expect("never poisoned");
                    buf.push_back((seq, payload.clone()));
                    while buf.len() > self.buffer_steps {
                        buf.pop_front();
                    }
                }
                if !every(self.drop_every, seq) {
                    let frames = vec![
                        Bytes::from(self.topic.clone().into_bytes()),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        payload,
                    ];
                    let msg =
                        ZmqMessage::try_from(frames).expect("three frames is a valid message");
                    if every(self.reorder_every, seq) && held.is_none() {
                        held = Some((seq, msg));
                    } else {
                        if every(self.duplicate_every, seq) {
                            publish(&mut publisher, msg.clone(), seq).await;
                        }
                        publish(&mut publisher, msg, seq).await;
                        if let Some((late_seq, late)) = held.take() {
                            publish(&mut publisher, late, late_seq).await;
                        }
                    }
                }
                seq += 1;
            }
        });
        Ok(Started {
            task,
            replay_task,
            events_endpoint,
            replay_endpoint,
        })
    }
}

async fn publish(publisher: &mut PubSocket, msg: ZmqMessage, seq: u64) {
    if let Err(err) = publisher.send(msg).await {
        tracing::warn!(%err, seq, "KV event publish failed");
    }
}

/// A running publisher and the endpoints it actually uses (ports resolved when 0 was asked).
#[derive(Debug)]
pub struct Started {
    pub task: JoinHandle<()>,
    /// The replay endpoint's task (finished at once when there is none).
    pub replay_task: JoinHandle<()>,
    pub events_endpoint: String,
    pub replay_endpoint: Option<String>,
}

/// `tcp://*:P` means every interface to ZeroMQ; the zeromq crate wants an address.
fn normalise(endpoint: &str) -> String {
    endpoint.replace("://*:", "://0.0.0.0:")
}

async fn serve_replay(
    mut router: RouterSocket,
    buffer: Buffer,
    topic: String,
    layout: ReplayLayout,
) {
    loop {
        let request = match router.recv().await {
            Ok(m) => m,
            Err(err) => {
                tracing::warn!(%err, "replay endpoint stopped");
                return;
            }
        };
        let frames = request.into_vec();
        // [identity, b"", start_seq] from a DEALER; tolerate a missing empty delimiter.
        let Some(identity) = frames.first().cloned() else {
            continue;
        };
        let Some(start) = frames
            .last()
            .and_then(|f| <[u8; 8]>::try_from(f.as_ref()).ok())
            .map(u64::from_be_bytes)
        else {
            tracing::warn!(frames = frames.len(), "malformed replay request dropped");
            continue;
        };
        let batches: Vec<(u64, Bytes)> = buffer
            .lock()
            .expect("never poisoned")
            .iter()
            .filter(|(s, _)| *s >= start)
            .cloned()
            .collect();
        let topic = Bytes::from(topic.clone().into_bytes());
        let empty = Bytes::new();
        for (seq, payload) in batches {
            let seq = Bytes::copy_from_slice(&seq.to_be_bytes());
            let frames = match layout {
                ReplayLayout::V025 => vec![identity.clone(), empty.clone(), seq, payload],
                ReplayLayout::V026 => {
                    vec![identity.clone(), empty.clone(), topic.clone(), seq, payload]
                }
            };
            if send(&mut router, frames).await.is_err() {
                break;
            }
        }
        let end = Bytes::from_static(&END_SEQ);
        let frames = match layout {
            ReplayLayout::V025 => vec![identity, empty.clone(), end, empty],
            ReplayLayout::V026 => vec![identity, empty.clone(), empty.clone(), end, empty],
        };
        let _ = send(&mut router, frames).await;
    }
}

async fn send(router: &mut RouterSocket, frames: Vec<Bytes>) -> zeromq::ZmqResult<()> {
    let msg = ZmqMessage::try_from(frames).expect("non-empty frame list");
    router.send(msg).await
}
