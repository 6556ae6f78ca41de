//! Many agents in one process over chitchat's channel transport (on tokio's paused clock;
//! their IndexSync streams are real gRPC on loopback), and a few over sealed UDP.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use chitchat::transport::{ChannelTransport, RecvOutcome, SendOutcome, Socket, Transport};

use super::{
    ClusterNode, LocalPod, NodeSettings,
    auth::{AuthCounters, ClusterKey, SealedUdp},
    membership::MembershipConfig,
    remote::DEFAULT_REMOTE_GRACE,
};
use crate::kv_index::{IndexConfig, KvIndex, SourceId, SourceInfo};

mod dynamic;
mod health;

/// Gossip interval under test (production: 500 ms, `DEFAULT_GOSSIP_INTERVAL`).
const INTERVAL: Duration = Duration::from_millis(50);

fn pod_id(i: usize) -> String {
    format!("127.0.0.1:{}", 20_000 + i)
}

fn gossip_addr(i: usize, base: u16) -> SocketAddr {
    ([127, 0, 0, 1], base + i as u16).into()
}

/// One agent: its index, its own pod and the others' as remote sources.
struct Agent {
    node: ClusterNode,
    index: Arc<KvIndex>,
    remote: Vec<(String, SourceId)>,
}

fn settings(i: usize, incarnation: u64, listen: SocketAddr, seed: SocketAddr) -> NodeSettings {
    NodeSettings {
        membership: MembershipConfig {
            cluster_id: "test".into(),
            node_id: format!("agent-{i}"),
            incarnation,
            listen,
            advertise: listen,
            seeds: vec![seed.to_string()],
            gossip_interval: INTERVAL,
            dead_grace: Duration::from_secs(3_600),
        },
        grpc_listen: ([127, 0, 0, 1], 0).into(),
        grpc_advertise: None,
        proxy: None,
        key: None,
        counters: Arc::default(),
        publish_every: INTERVAL,
        remote_grace: DEFAULT_REMOTE_GRACE,
    }
}

/// Agent `i` of `n` (incarnation `incarnation`), gossiping on `listen`, joining via `seed`.
async fn start_agent(
    (i, n, incarnation): (usize, usize, u64),
    listen: SocketAddr,
    seed: SocketAddr,
    transport: &dyn Transport,
) -> Agent {
    let index = Arc::new(KvIndex::new(IndexConfig::default()));
    let info = |pod: String| SourceInfo { pod, rank: None };
    let local = LocalPod {
        id: pod_id(i),
        model: "m".into(),
        source: index.add_source(info(pod_id(i))),
    };
    let remote: Vec<(String, SourceId)> = (0..n)
        .filter(|&j| j != i)
        .map(|j| (pod_id(j), index.add_remote_source(info(pod_id(j)))))
        .collect();
    let node = ClusterNode::start(
        settings(i, incarnation, listen, seed),
        index.clone(),
        vec![local],
        remote.clone(),
        transport,
    )
    .await
    .expect("starts");
    Agent {
        node,
        index,
        remote,
    }
}

async fn start_cluster(n: usize, transport: &dyn Transport) -> Vec<Option<Agent>> {
    let mut agents = Vec::new();
    for i in 0..n {
        let addr = gossip_addr(i, 10_000);
        agents.push(Some(
            start_agent((i, n, 1), addr, gossip_addr(0, 10_000), transport).await,
        ));
    }
    agents
}

/// Whether every live agent sees every other live agent as the owner of its pod.
fn converged(agents: &[Option<Agent>]) -> bool {
    agents.iter().flatten().all(|a| {
        agents.iter().enumerate().all(|(j, b)| {
            let owner = a.node.owner(&pod_id(j));
            match b {
                Some(b) if b.node.node_id() == a.node.node_id() => true,
                Some(_) => owner.as_deref() == Some(&*format!("agent-{j}")),
                None => true,
            }
        })
    })
}

/// Waits (virtual time under a paused clock) until `cond` holds; the time it took.
async fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = tokio::time::Instant::now();
    tokio::time::timeout(limit, async {
        while !cond() {
            tokio::time::sleep(INTERVAL / 5).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("condition not met within {limit:?}"));
    start.elapsed()
}

fn state_of(agent: &Agent, pod: &str) -> &'static str {
    let source = agent
        .remote
        .iter()
        .find(|(p, _)| p == pod)
        .map(|(_, s)| *s)
        .expect("a remote pod of this agent");
    agent
        .index
        .status()
        .into_iter()
        .find(|(id, _)| *id == source)
        .map_or("absent", |(_, s)| s.state)
}

#[tokio::test(start_paused = true)]
async fn sixteen_agents_converge_and_a_killed_agents_pods_turn_unsure_everywhere() {
    let transport = ChannelTransport::with_mtu(65_507);
    let mut agents = start_cluster(16, &transport).await;
    let took = wait_for(Duration::from_secs(30), || converged(&agents)).await;
    eprintln!("16 agents converged in {took:?} of virtual time (gossip every {INTERVAL:?})");

    // Every replica takes its owner's snapshot over IndexSync and trusts it.
    let all_healthy = |agents: &[Option<Agent>]| {
        agents
            .iter()
            .flatten()
            .all(|a| a.remote.iter().all(|(p, _)| state_of(a, p) == "healthy"))
    };
    wait_for(Duration::from_secs(30), || all_healthy(&agents)).await;
    let killed = 5;
    agents[killed].take().expect("running").node.shutdown();
    let pod = pod_id(killed);
    let took = wait_for(Duration::from_secs(30), || {
        agents
            .iter()
            .flatten()
            .all(|a| state_of(a, &pod) == "unsure")
    })
    .await;
    eprintln!("agent-{killed}'s pod unsure on all 15 others {took:?} after it stopped");
    // chitchat's phi-accrual detector: well under a second at a 50 ms interval (8-10 s
    // at the production 1 s).
    assert!(took < INTERVAL * 40, "{took:?}");
    // Nobody else's pods were touched.
    for a in agents.iter().flatten() {
        for (p, _) in &a.remote {
            if *p != pod {
                assert_eq!(state_of(a, p), "healthy", "{p} on {}", a.node.node_id());
            }
        }
    }
    // It comes back (a new incarnation): every agent follows it and resyncs its pod.
    let addr = gossip_addr(killed, 10_000);
    let back = start_agent((killed, 16, 2), addr, gossip_addr(0, 10_000), &transport).await;
    agents[killed] = Some(back);
    wait_for(Duration::from_secs(30), || {
        converged(&agents) && all_healthy(&agents)
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn dropped_and_delayed_messages_still_converge() {
    let lossy = Lossy {
        inner: ChannelTransport::with_mtu(65_507),
        drop_per_mille: 200,
        delay_per_mille: 300,
        max_delay: INTERVAL * 4,
        dropped: Arc::new(AtomicU64::new(0)),
        delayed: Arc::new(AtomicU64::new(0)),
    };
    let agents = start_cluster(16, &lossy).await;
    let took = wait_for(Duration::from_secs(60), || converged(&agents)).await;
    let (dropped, delayed) = (
        lossy.dropped.load(Ordering::Relaxed),
        lossy.delayed.load(Ordering::Relaxed),
    );
    eprintln!("converged in {took:?} with {dropped} messages dropped, {delayed} delayed");
    assert!(dropped > 0 && delayed > 0, "the faults happened");
}

#[tokio::test]
async fn over_sealed_udp_members_meet_and_an_intruder_is_rejected_and_counted() {
    let secret = b"a-test-key-of-at-least-32-bytes!";
    let counters: Vec<Arc<AuthCounters>> = (0..3).map(|_| Arc::default()).collect();
    let key = |s: &[u8]| Arc::new(ClusterKey::new(s, "test").expect("long enough"));
    let lo: SocketAddr = ([127, 0, 0, 1], 0).into();
    // Real sockets on free ports: bind to learn them, then hand them to gossip.
    let mut addrs = Vec::new();
    for _ in 0..3 {
        let s = std::net::UdpSocket::bind(lo).expect("bind");
        addrs.push(s.local_addr().expect("bound"));
    }
    let mut agents = Vec::new();
    for i in 0..3 {
        // Agent 2 has the wrong key.
        let k = if i == 2 {
            key(b"another-key-of-at-least-32-bytes")
        } else {
            key(secret)
        };
        let t = SealedUdp::new(k, counters[i].clone());
        agents.push(start_agent((i, 3, 1), addrs[i], addrs[0], &t).await);
    }
    // Real time here: bounded waits on conditions.
    let limit = Duration::from_secs(20);
    tokio::time::timeout(limit, async {
        while agents[0].node.owner(&pod_id(1)).as_deref() != Some("agent-1")
            || agents[1].node.owner(&pod_id(0)).as_deref() != Some("agent-0")
            || counters[0].rejected_datagrams() == 0
        {
            tokio::time::sleep(INTERVAL).await;
        }
    })
    .await
    .expect("the two members meet and the intruder's datagrams are counted");
    // The intruder is nobody's member, and knows nobody.
    assert_eq!(agents[0].node.owner(&pod_id(2)), None);
    assert_eq!(agents[1].node.owner(&pod_id(2)), None);
    assert!(
        agents[0]
            .node
            .view()
            .await
            .peers
            .keys()
            .all(|p| p != "agent-2")
    );
    // The members never learn its address, so it hears nothing back.
    assert!(agents[2].node.view().await.peers.is_empty());
}

/// A channel transport that drops and delays received messages, decided by a seeded
/// generator per socket (deterministic for a given order of arrival).
struct Lossy {
    inner: ChannelTransport,
    drop_per_mille: u64,
    delay_per_mille: u64,
    max_delay: Duration,
    dropped: Arc<AtomicU64>,
    delayed: Arc<AtomicU64>,
}

#[async_trait]
impl Transport for Lossy {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let inner = self.inner.open(listen_addr).await?;
        Ok(Box::new(LossySocket {
            seed: 0x9E37_79B9_7F4A_7C15 ^ u64::from(listen_addr.port()),
            inner,
            held: Vec::new(),
            drop_per_mille: self.drop_per_mille,
            delay_per_mille: self.delay_per_mille,
            max_delay: self.max_delay,
            dropped: self.dropped.clone(),
            delayed: self.delayed.clone(),
        }))
    }
}

struct LossySocket {
    inner: Box<dyn Socket>,
    seed: u64,
    held: Vec<(tokio::time::Instant, RecvOutcome)>,
    drop_per_mille: u64,
    delay_per_mille: u64,
    max_delay: Duration,
    dropped: Arc<AtomicU64>,
    delayed: Arc<AtomicU64>,
}

impl LossySocket {
    /// splitmix64.
    fn next(&mut self) -> u64 {
        self.seed = self.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[async_trait]
impl Socket for LossySocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.inner.local_addr()
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: chitchat::ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        self.inner.send(to, envelope).await
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let now = tokio::time::Instant::now();
            if let Some(i) = self.held.iter().position(|(at, _)| *at <= now) {
                return Ok(self.held.swap_remove(i).1);
            }
            let next_due = self.held.iter().map(|(at, _)| *at).min();
            let got = tokio::select! {
                got = self.inner.recv() => got?,
                _ = tokio::time::sleep_until(next_due.unwrap_or(now + Duration::from_secs(3_600))), if next_due.is_some() => continue,
            };
            let roll = self.next() % 1_000;
            if roll < self.drop_per_mille {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if roll < self.drop_per_mille + self.delay_per_mille && self.held.len() < 1_000 {
                let nanos = self.next() % self.max_delay.as_nanos() as u64;
                self.delayed.fetch_add(1, Ordering::Relaxed);
                self.held.push((now + Duration::from_nanos(nanos), got));
                continue;
            }
            return Ok(got);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_partition_makes_each_side_unsure_of_the_other_and_heals() {
    let transport = ChannelTransport::with_mtu(65_507);
    let mut agents = start_cluster(4, &transport).await;
    let all_healthy = |agents: &[Option<Agent>]| {
        agents
            .iter()
            .flatten()
            .all(|a| a.remote.iter().all(|(p, _)| state_of(a, p) == "healthy"))
    };
    wait_for(Duration::from_secs(30), || all_healthy(&agents)).await;
    // {0, 1} | {2, 3}: gossip between the sides is cut both ways.
    let side = |i: usize| i / 2;
    for i in 0..4 {
        for j in 0..4 {
            if side(i) != side(j) {
                transport
                    .remove_link(gossip_addr(i, 10_000), gossip_addr(j, 10_000))
                    .await;
            }
        }
    }
    let split = |agents: &[Option<Agent>], want_across: &str| {
        agents.iter().flatten().enumerate().all(|(i, a)| {
            (0..4).filter(|&j| j != i).all(|j| {
                let want = if side(i) == side(j) {
                    "healthy"
                } else {
                    want_across
                };
                state_of(a, &pod_id(j)) == want
            })
        })
    };
    let took = wait_for(Duration::from_secs(30), || split(&agents, "unsure")).await;
    eprintln!("partition: each side unsure of the other's pods {took:?} after the cut");
    for i in 0..4 {
        for j in 0..4 {
            transport
                .add_link(gossip_addr(i, 10_000), gossip_addr(j, 10_000))
                .await;
        }
    }
    let took = wait_for(Duration::from_secs(60), || all_healthy(&agents)).await;
    eprintln!("healed: every replica resynced {took:?} after the links came back");
    assert!(converged(&agents));
    agents.clear();
}
