//! Who may talk to the cluster: the shared key, HMAC-SHA256 on every gossip datagram (a
//! chitchat [`Transport`] over UDP), and the token gRPC streams present (docs/cluster.md,
//! "Security").
//!
//! A datagram is `MAGIC | HMAC-SHA256(key, cluster_id | 0 | payload) | payload`, the payload
//! being chitchat's serialised envelope. A datagram whose tag does not verify is dropped
//! before chitchat parses a byte of it, and counted. The gRPC token is
//! `hex(HMAC-SHA256(key, "warmpath-grpc-v1" | 0 | cluster_id))`, compared in constant time.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use async_trait::async_trait;
use chitchat::{
    ChitchatEnvelope,
    transport::{RecvOutcome, SendOutcome, Socket, Transport},
};
use ring::hmac;
use subtle::ConstantTimeEq;

/// First bytes of every warmpath gossip datagram (format version 1).
pub const MAGIC: &[u8; 4] = b"WPG1";
const TAG: usize = 32;
/// Bytes a datagram carries besides chitchat's payload.
pub const OVERHEAD: usize = MAGIC.len() + TAG;
/// The largest UDP payload over IPv4 (what chitchat sizes its messages to).
pub const MAX_DATAGRAM: usize = 65_507;
/// The shortest key accepted (after a final newline is trimmed).
pub const MIN_KEY_BYTES: usize = 32;

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cluster key file {path}: cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cluster key{where_}: {len} bytes, at least {MIN_KEY_BYTES} needed")]
    TooShort { where_: String, len: usize },
}

/// The cluster's shared secret (from a file or a Kubernetes Secret). Never printed.
pub struct ClusterKey {
    key: hmac::Key,
    cluster_id: String,
    grpc_token: String,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterKey")
            .field("cluster_id", &self.cluster_id)
            .finish_non_exhaustive()
    }
}

// === impl ClusterKey ===

impl ClusterKey {
    /// A key for `cluster_id` from the secret's bytes (a final newline is not part of it).
    pub fn new(secret: &[u8], cluster_id: &str) -> Result<Self, KeyError> {
        Self::with_origin(secret, cluster_id, String::new())
    }

    /// Reads the key from a file.
    pub fn from_file(path: &Path, cluster_id: &str) -> Result<Self, KeyError> {
        let secret = std::fs::read(path).map_err(|source| KeyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::with_origin(&secret, cluster_id, format!(" file {}", path.display()))
    }

    fn with_origin(secret: &[u8], cluster_id: &str, where_: String) -> Result<Self, KeyError> {
        let secret = secret
            .strip_suffix(b"\n")
            .map(|s| s.strip_suffix(b"\r").unwrap_or(s))
            .unwrap_or(secret);
        if secret.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort {
                where_,
                len: secret.len(),
            });
        }
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(b"warmpath-grpc-v1\0");
        ctx.update(cluster_id.as_bytes());
        let grpc_token = hex::encode(ctx.sign().as_ref());
        Ok(Self {
            key,
            cluster_id: cluster_id.to_string(),
            grpc_token,
        })
    }

    fn tag(&self, payload: &[u8]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(self.cluster_id.as_bytes());
        ctx.update(&[0]);
        ctx.update(payload);
        ctx.sign()
    }

    /// Writes the datagram carrying `payload` into `out` (cleared first).
    pub fn seal(&self, payload: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(self.tag(payload).as_ref());
        out.extend_from_slice(payload);
    }

    /// The payload of a datagram sealed with this key and cluster id, or `None`.
    pub fn open<'a>(&self, datagram: &'a [u8]) -> Option<&'a [u8]> {
        let rest = datagram.strip_prefix(MAGIC.as_slice())?;
        if rest.len() < TAG {
            return None;
        }
        let (tag, payload) = rest.split_at(TAG);
        bool::from(self.tag(payload).as_ref().ct_eq(tag)).then_some(payload)
    }

    /// The bearer token this agent presents on IndexSync streams.
    pub fn grpc_token(&self) -> &str {
        &self.grpc_token
    }

    /// Whether a presented token is this cluster's (constant time).
    pub fn check_token(&self, presented: &str) -> bool {
        bool::from(presented.as_bytes().ct_eq(self.grpc_token.as_bytes()))
    }
}

/// What the authenticated transport counted.
#[derive(Debug, Default)]
pub struct AuthCounters {
    /// Datagrams dropped: no header, a tag that does not verify, another cluster's.
    pub rejected_datagrams: AtomicU64,
    /// Datagrams that verified but did not parse as chitchat (a peer's bug, not an attack).
    pub malformed_datagrams: AtomicU64,
    /// Messages too large for one datagram once sealed (not sent).
    pub oversized: AtomicU64,
    /// Gossip streams refused for a bad token (the gRPC server counts here).
    pub rejected_streams: AtomicU64,
}

/// The counters at one instant, as `/status` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CountersSnapshot {
    pub rejected_datagrams: u64,
    pub malformed_datagrams: u64,
    pub oversized_datagrams: u64,
    pub rejected_streams: u64,
}

impl AuthCounters {
    pub fn rejected_datagrams(&self) -> u64 {
        self.rejected_datagrams.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> CountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountersSnapshot {
            rejected_datagrams: get(&self.rejected_datagrams),
            malformed_datagrams: get(&self.malformed_datagrams),
            oversized_datagrams: get(&self.oversized),
            rejected_streams: get(&self.rejected_streams),
        }
    }
}

/// Chitchat's transport over UDP with every datagram sealed with the cluster key.
///
/// chitchat 0.13 keeps its envelope codec to itself, so each socket runs chitchat's own
/// `UdpSocket` on a private loopback port as the codec: an envelope to send goes through it
/// to a relay socket (now as bytes, which are sealed and sent to the peer), and an opened
/// payload goes from the relay into it (and comes out as an envelope). Both hops are one
/// loopback datagram, one at a time (`Socket` takes `&mut self`), each checked to come
/// from the other end.
#[derive(Debug, Clone)]
pub struct SealedUdp {
    key: Arc<ClusterKey>,
    counters: Arc<AuthCounters>,
}

impl SealedUdp {
    pub fn new(key: Arc<ClusterKey>, counters: Arc<AuthCounters>) -> Self {
        Self { key, counters }
    }
}

/// How long one loopback hop through the codec may take before it counts as lost.
const CODEC_HOP: std::time::Duration = std::time::Duration::from_secs(1);

#[async_trait]
impl Transport for SealedUdp {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let public = tokio::net::UdpSocket::bind(listen_addr)
            .await
            .map_err(|e| anyhow::anyhow!("bind gossip socket {listen_addr}/udp: {e}"))?;
        let lo: SocketAddr = (std::net::Ipv4Addr::LOCALHOST, 0).into();
        let codec = chitchat::transport::UdpSocket::open(lo).await?;
        let codec_addr = codec.local_addr()?;
        let relay = tokio::net::UdpSocket::bind(lo).await?;
        let relay_addr = relay.local_addr()?;
        Ok(Box::new(SealedSocket {
            public,
            codec: Box::new(codec),
            codec_addr,
            relay,
            relay_addr,
            key: self.key.clone(),
            counters: self.counters.clone(),
            datagram: Vec::with_capacity(MAX_DATAGRAM),
            buf: vec![0; MAX_DATAGRAM + 1].into_boxed_slice(),
        }))
    }
}

struct SealedSocket {
    /// Where peers send (the gossip address).
    public: tokio::net::UdpSocket,
    /// chitchat's own socket, serialising and parsing envelopes; its only peer is `relay`.
    codec: Box<dyn Socket>,
    codec_addr: SocketAddr,
    relay: tokio::net::UdpSocket,
    relay_addr: SocketAddr,
    key: Arc<ClusterKey>,
    counters: Arc<AuthCounters>,
    datagram: Vec<u8>,
    buf: Box<[u8]>,
}

/// Errors a UDP socket reports for a peer (an ICMP unreachable on Linux), not for itself.
fn peer_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::OutOfMemory
    )
}

impl SealedSocket {
    /// Serialises an envelope through the codec: its bytes, in `self.buf[..n]`.
    async fn encode(&mut self, envelope: ChitchatEnvelope) -> anyhow::Result<usize> {
        self.codec.send(self.relay_addr, envelope).await?;
        loop {
            let (n, from) = tokio::time::timeout(CODEC_HOP, self.relay.recv_from(&mut self.buf))
                .await
                .map_err(|_| anyhow::anyhow!("gossip codec hop timed out"))??;
            if from == self.codec_addr {
                return Ok(n);
            }
        }
    }

    /// Parses an opened payload through the codec.
    async fn decode(&mut self, payload: std::ops::Range<usize>) -> Option<ChitchatEnvelope> {
        self.relay
            .send_to(&self.buf[payload], self.codec_addr)
            .await
            .ok()?;
        loop {
            let got = tokio::time::timeout(CODEC_HOP, self.codec.recv()).await;
            match got {
                Ok(Ok(out)) if out.from_addr == self.relay_addr => return Some(out.envelope),
                // Not from our relay: something else on this host wrote to the codec's port.
                Ok(Ok(_)) => continue,
                // chitchat drops a payload it cannot parse and waits for the next one.
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }
}

#[async_trait]
impl Socket for SealedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.public.local_addr()?)
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let n = self.encode(envelope).await?;
        self.key.seal(&self.buf[..n], &mut self.datagram);
        if self.datagram.len() > MAX_DATAGRAM {
            self.counters.oversized.fetch_add(1, Ordering::Relaxed);
            anyhow::bail!(
                "gossip message of {} bytes does not fit one datagram once sealed",
                self.datagram.len()
            );
        }
        match self.public.send_to(&self.datagram, to).await {
            Ok(num_bytes_sent) => Ok(SendOutcome { num_bytes_sent }),
            Err(e) if peer_error(&e) => Ok(SendOutcome { num_bytes_sent: 0 }),
            Err(e) => Err(e.into()),
        }
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let (n, from_addr) = match self.public.recv_from(&mut self.buf).await {
                Ok(r) => r,
                Err(e) if peer_error(&e) => continue,
                Err(e) => return Err(e.into()),
            };
            let Some(payload) = self.key.open(&self.buf[..n]).map(<[u8]>::len) else {
                let total = self
                    .counters
                    .rejected_datagrams
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                // Counted always; logged for the first and then every 1,000th.
                if total == 1 || total.is_multiple_of(1_000) {
                    tracing::warn!(from = %from_addr, bytes = n, rejected = total, "gossip datagram rejected: not sealed with this cluster's key");
                }
                continue;
            };
            match self.decode(n - payload..n).await {
                Some(envelope) => {
                    return Ok(RecvOutcome {
                        from_addr,
                        envelope,
                        num_bytes_received: n,
                    });
                }
                None => {
                    self.counters
                        .malformed_datagrams
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(from = %from_addr, "sealed gossip datagram did not parse");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef\n";

    #[test]
    fn a_sealed_datagram_opens_only_with_the_same_key_and_cluster() {
        let key = ClusterKey::new(SECRET, "prod").expect("long enough");
        let mut d = Vec::new();
        key.seal(b"hello", &mut d);
        assert_eq!(d.len(), OVERHEAD + 5);
        assert_eq!(key.open(&d), Some(&b"hello"[..]));
        let other_key = ClusterKey::new(b"0123456789abcdef0123456789abcdeX", "prod").expect("ok");
        assert_eq!(other_key.open(&d), None);
        let other_cluster = ClusterKey::new(SECRET, "staging").expect("ok");
        assert_eq!(other_cluster.open(&d), None);
        // A flipped payload bit, a truncated tag, no header at all.
        let mut flipped = d.clone();
        *flipped.last_mut().expect("non-empty") ^= 1;
        assert_eq!(key.open(&flipped), None);
        assert_eq!(key.open(&d[..MAGIC.len() + 10]), None);
        assert_eq!(key.open(b"hello"), None);
    }

    #[test]
    fn short_keys_are_refused_and_the_key_never_prints() {
        let err = ClusterKey::new(b"short\n", "c").expect_err("5 bytes");
        assert_eq!(err.to_string(), "cluster key: 5 bytes, at least 32 needed");
        let key = ClusterKey::new(SECRET, "c").expect("ok");
        let debug = format!("{key:?}");
        assert!(!debug.contains("0123456789"), "{debug}");
        // The token is derived, not the secret, and checked in constant time.
        assert!(!key.grpc_token().contains("0123456789abcdef0123"));
        assert!(key.check_token(key.grpc_token()));
        assert!(!key.check_token("0000"));
    }

    #[tokio::test]
    async fn datagrams_with_another_key_are_dropped_and_counted() {
        use chitchat::{ChitchatMessage, ProtocolVersion};
        let good = Arc::new(ClusterKey::new(SECRET, "c").expect("ok"));
        let bad = Arc::new(ClusterKey::new(b"ffffffffffffffffffffffffffffffff", "c").expect("ok"));
        let counters = Arc::new(AuthCounters::default());
        let lo: SocketAddr = ([127, 0, 0, 1], 0).into();
        let mut receiver = SealedUdp::new(good.clone(), counters.clone())
            .open(lo)
            .await
            .expect("bind");
        let to = receiver.local_addr().expect("bound");
        let mut intruder = SealedUdp::new(bad, Arc::new(AuthCounters::default()))
            .open(lo)
            .await
            .expect("bind");
        let mut member = SealedUdp::new(good, Arc::new(AuthCounters::default()))
            .open(lo)
            .await
            .expect("bind");
        let envelope = || ChitchatEnvelope {
            version: ProtocolVersion::V0,
            message: ChitchatMessage::BadCluster,
        };
        intruder.send(to, envelope()).await.expect("sent");
        let raw = tokio::net::UdpSocket::bind(lo).await.expect("bind");
        raw.send_to(b"not even sealed", to).await.expect("sent");
        member.send(to, envelope()).await.expect("sent");
        // Loopback keeps order: the member's datagram comes after the two rejected ones.
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), receiver.recv())
            .await
            .expect("the member's datagram arrives")
            .expect("socket fine");
        assert_eq!(got.envelope, envelope());
        assert_eq!(got.from_addr, member.local_addr().expect("bound"));
        assert_eq!(counters.rejected_datagrams(), 2);
    }
}
