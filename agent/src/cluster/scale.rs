//! Gossip at many agents in one process, for `warmpath bench cluster` (docs/benchmarks.md,
//! "Cluster"): `agents` cluster nodes with `pods` local pods each over chitchat's channel
//! transport (no sockets for gossip: the bytes counted are chitchat's messages, before the
//! 36-byte seal and the UDP/IP headers), measuring
//!
//! - how long after the last start every agent knows every other agent's pods (agents start
//!   spread over one interval, so their rounds are out of step as on separate machines);
//! - how long one change (a pod turning unsure on agent 0) takes to be known to all others,
//!   from the change until the last agent's view shows it (each agent's live-member watch
//!   is awaited, no polling, so the figure is exact to the instant); `changes` changes,
//!   each at another phase of the round (another pod each), the slowest and the mean;
//! - chitchat's bytes and messages sent per node per second, idle, then busy: every pod's
//!   engine storing a block every `batch_every` (watermarks moving, paced by
//!   `watermarks::WATERMARK_EVERY`) and every pod's load changing (published by the agent's
//!   load publisher, at most once per `loads::LOAD_ROUNDS` rounds), as on a loaded cluster.
//!
//! **Run it on a paused tokio clock** (a current-thread runtime with `start_paused(true)`):
//! time is virtual and advances only when every task waits, so the figures are gossip's own,
//! in rounds of the configured interval, whatever the machine's CPUs are doing. What that
//! leaves out: network latency (none in channels) and CPU time per round.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use chitchat::transport::ChannelTransport;

use super::{
    ClusterNode, DEFAULT_PUBLISH_EVERY, LocalPod, NodeSettings, StartError,
    facts::PodHealth,
    loads::{load_fact, spawn_load_publisher},
    membership::{MembershipConfig, View},
    remote::DEFAULT_REMOTE_GRACE,
};
use crate::kv_index::{
    IndexConfig, KvIndex, SourceId, SourceInfo, Tier,
    wire::{Batch, EngineHash, Event, Stored},
};

/// What to run.
#[derive(Debug, Clone)]
pub struct GossipSettings {
    pub agents: usize,
    /// Local pods per agent.
    pub pods: usize,
    pub gossip_interval: Duration,
    /// How long each of the idle and busy phases is measured.
    pub phase: Duration,
    /// How often each pod's engine stores a block in the busy phase.
    pub batch_every: Duration,
    /// Changes measured (one pod each, at phases spread over a round; at most `pods`).
    pub changes: usize,
    /// The longest any wait for convergence may take (virtual time).
    pub limit: Duration,
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GossipFigures {
    pub agents: usize,
    pub pods: usize,
    pub gossip_interval_ms: u64,
    /// From the last agent's start until every agent knows every other agent's pods.
    pub converged_s: f64,
    /// From one pod's health change on agent 0 until every other agent knows it: the
    /// slowest of the changes measured.
    pub change_known_s: f64,
    /// The same in gossip rounds.
    pub change_known_rounds: f64,
    /// The mean and the fastest over the changes.
    pub change_known_mean_s: f64,
    pub change_known_min_s: f64,
    pub changes: usize,
    /// chitchat bytes sent per node per second, idle.
    pub idle_bytes_per_node_s: f64,
    pub idle_messages_per_node_s: f64,
    /// The same with every pod's engine storing a block every `batch_every`.
    pub busy_bytes_per_node_s: f64,
    pub busy_messages_per_node_s: f64,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    #[error("agent {agent}: {source}")]
    Start {
        agent: usize,
        #[source]
        source: StartError,
    },
    #[error("{what}: not within {limit:?} of virtual time")]
    Timeout { what: &'static str, limit: Duration },
}

struct Agent {
    node: ClusterNode,
    index: Arc<KvIndex>,
    pods: Vec<SourceId>,
}

fn pod_id(agent: usize, pod: usize) -> String {
    format!("10.{}.{}.{pod}:8000", agent / 256, agent % 256)
}

fn node_id(agent: usize) -> String {
    format!("node-{agent:04}")
}

async fn start(s: &GossipSettings, transport: &ChannelTransport) -> Result<Vec<Agent>, ScaleError> {
    let mut agents = Vec::with_capacity(s.agents);
    let stagger = s.gossip_interval / s.agents.max(1) as u32;
    for i in 0..s.agents {
        if i > 0 {
            tokio::time::sleep(stagger).await;
        }
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let pods: Vec<SourceId> = (0..s.pods)
            .map(|p| {
                index.add_source(SourceInfo {
                    pod: pod_id(i, p),
                    rank: None,
                })
            })
            .collect();
        let local = pods
            .iter()
            .enumerate()
            .map(|(p, source)| LocalPod {
                id: pod_id(i, p),
                model: "meta-llama/Llama-3.1-8B-Instruct".into(),
                source: *source,
            })
            .collect();
        // Channel addresses only: nothing binds them.
        let listen = ([127, 0, 0, 1], 30_000 + i as u16).into();
        let settings = NodeSettings {
            membership: MembershipConfig {
                cluster_id: "scale".into(),
                node_id: node_id(i),
                incarnation: 1_764_000_000_000,
                listen,
                advertise: listen,
                seeds: vec!["127.0.0.1:30000".into()],
                gossip_interval: s.gossip_interval,
                dead_grace: Duration::from_secs(3_600),
            },
            grpc_listen: ([127, 0, 0, 1], 0).into(),
            grpc_advertise: None,
            proxy: None,
            key: None,
            counters: Arc::default(),
            publish_every: DEFAULT_PUBLISH_EVERY,
            remote_grace: DEFAULT_REMOTE_GRACE,
        };
        let node = ClusterNode::start(settings, index.clone(), local, Vec::new(), transport)
            .await
            .map_err(|source| ScaleError::Start { agent: i, source })?;
        agents.push(Agent { node, index, pods });
    }
    Ok(agents)
}

/// Waits until `done` holds for every agent's view (each awaited on its own live-member
/// watch); the time from the call until the last one held.
async fn until(
    agents: &[&Agent],
    done: impl Fn(&View) -> bool + Clone + Send + 'static,
    limit: Duration,
    what: &'static str,
) -> Result<Duration, ScaleError> {
    let start = tokio::time::Instant::now();
    let mut waits = tokio::task::JoinSet::new();
    for a in agents {
        let mut live = a.node.membership.watch().await;
        let me = a.node.node_id().to_string();
        let done = done.clone();
        waits.spawn(async move {
            loop {
                let view = View::from_live(&live.borrow_and_update(), &me);
                if done(&view) {
                    return true;
                }
                if live.changed().await.is_err() {
                    return false;
                }
            }
        });
    }
    let all = async {
        while let Some(held) = waits.join_next().await {
            if !matches!(held, Ok(true)) {
                return false;
            }
        }
        true
    };
    match tokio::time::timeout(limit, all).await {
        Ok(true) => Ok(start.elapsed()),
        _ => Err(ScaleError::Timeout { what, limit }),
    }
}

/// One stored block on every pod of every agent (each pod's watermark moves by one).
fn churn(agents: &[Agent], round: u64) {
    for a in agents {
        for s in &a.pods {
            let batch = Batch {
                ts: 0.0,
                events: vec![Event::Stored(Stored {
                    hashes: vec![EngineHash(round)],
                    parent: None,
                    token_ids: (0..16).map(|t| t + round as u32).collect(),
                    block_size: 16,
                    lora_name: None,
                    tier: Tier::Gpu,
                    extra_keys: Vec::new(),
                    reusable: true,
                })],
                dp_rank: None,
            };
            a.index.apply(*s, &batch, round);
        }
    }
}

/// (bytes, messages) per node per second sent while `during` runs for `phase`.
async fn rate(
    transport: &ChannelTransport,
    agents: usize,
    phase: Duration,
    during: impl std::future::Future<Output = ()>,
) -> (f64, f64) {
    let before = transport.statistics();
    let started = tokio::time::Instant::now();
    during.await;
    let elapsed = started.elapsed().max(phase).as_secs_f64();
    let after = transport.statistics();
    let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / (agents as f64 * elapsed);
    (
        per(after.num_bytes_total, before.num_bytes_total),
        per(after.num_messages_total, before.num_messages_total),
    )
}

/// Runs the measurement (on a paused clock: see the module docs).
pub async fn measure(s: &GossipSettings) -> Result<GossipFigures, ScaleError> {
    let transport = ChannelTransport::with_mtu(65_507);
    let agents = start(s, &transport).await?;
    let started = tokio::time::Instant::now();
    let all: Vec<&Agent> = agents.iter().collect();
    let (peers, pods) = (s.agents - 1, s.pods);
    until(
        &all,
        move |v| v.peers.len() == peers && v.peers.values().all(|p| p.pods.len() == pods),
        s.limit,
        "every agent knowing every pod",
    )
    .await?;
    let converged = started.elapsed();

    let idle = rate(&transport, s.agents, s.phase, tokio::time::sleep(s.phase)).await;

    // Changes: agent 0's pods turn unsure one by one, each at another phase of the round.
    let changes = s.changes.clamp(1, s.pods);
    let mut took = Vec::with_capacity(changes);
    for k in 0..changes {
        tokio::time::sleep(s.gossip_interval + s.gossip_interval * k as u32 / changes as u32).await;
        agents[0].index.mark_unsure(
            agents[0].pods[k],
            "scale measurement".into(),
            tokio::time::Instant::now().into_std(),
        );
        let (owner, pod) = (node_id(0), pod_id(0, k));
        let t = until(
            &all[1..],
            move |v| {
                v.peers
                    .get(&owner)
                    .and_then(|p| p.pods.get(&pod))
                    .is_some_and(|p| p.fact.health == PodHealth::Unsure)
            },
            s.limit,
            "one pod's health change known to all",
        )
        .await?;
        took.push(t.as_secs_f64());
    }
    let slowest = took.iter().copied().fold(0.0, f64::max);
    let fastest = took.iter().copied().fold(f64::INFINITY, f64::min);
    let mean = took.iter().sum::<f64>() / took.len() as f64;

    let rounds = (s.phase.as_nanos() / s.batch_every.as_nanos().max(1)) as u64;
    // Every pod's load moves with every batch (a new value each time it is read).
    let moved = Arc::new(AtomicU32::new(0));
    let loads: Vec<_> = agents
        .iter()
        .map(|a| {
            let moved = moved.clone();
            spawn_load_publisher(
                &a.node,
                Arc::new(move |_pod: &str| {
                    let m = moved.load(Ordering::Relaxed);
                    Some(load_fact(m % 16, m % 5, f64::from(m % 1_000) / 1_000.0))
                }),
            )
        })
        .collect();
    let busy = rate(&transport, s.agents, s.phase, async {
        for r in 0..rounds {
            churn(&agents, 1_000 + r);
            moved.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(s.batch_every).await;
        }
    })
    .await;
    for l in loads {
        l.abort();
    }
    Ok(GossipFigures {
        agents: s.agents,
        pods: s.pods,
        gossip_interval_ms: s.gossip_interval.as_millis() as u64,
        converged_s: converged.as_secs_f64(),
        change_known_s: slowest,
        change_known_rounds: slowest / s.gossip_interval.as_secs_f64(),
        change_known_mean_s: mean,
        change_known_min_s: fastest,
        changes,
        idle_bytes_per_node_s: idle.0,
        idle_messages_per_node_s: idle.1,
        busy_bytes_per_node_s: busy.0,
        busy_messages_per_node_s: busy.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight agents at 100 ms rounds (a quick check of the machinery; the bench runs the
    /// sizes of docs/benchmarks.md): everyone converges, the change spreads within a few
    /// rounds, and gossip is never silent.
    #[tokio::test(start_paused = true)]
    async fn eight_agents_converge_and_spread_a_change() {
        let s = GossipSettings {
            agents: 8,
            pods: 2,
            gossip_interval: Duration::from_millis(100),
            phase: Duration::from_secs(3),
            batch_every: Duration::from_millis(100),
            changes: 2,
            limit: Duration::from_secs(30),
        };
        let f = measure(&s).await.expect("measured");
        assert_eq!((f.agents, f.pods, f.gossip_interval_ms), (8, 2, 100));
        // chitchat gossips with 3 peers a round: 8 agents know a change in a few rounds,
        // plus up to one publishing period (100 ms: one round here).
        assert!(
            f.change_known_rounds > 0.0 && f.change_known_rounds <= 6.0,
            "{f:?}"
        );
        assert!(f.converged_s > 0.0 && f.converged_s < 5.0, "{f:?}");
        assert_eq!(f.changes, 2);
        assert!(f.change_known_min_s <= f.change_known_mean_s, "{f:?}");
        assert!(f.change_known_mean_s <= f.change_known_s, "{f:?}");
        // Every node sends a SYN to up to 3 peers each round and answers theirs.
        assert!(f.idle_messages_per_node_s >= 10.0, "{f:?}");
        assert!(f.busy_bytes_per_node_s > f.idle_bytes_per_node_s, "{f:?}");
    }
}
