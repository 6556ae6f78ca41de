//! IndexSync between agents in one process: gossip over chitchat's channel transport, the
//! streams over real gRPC on loopback (so real time, with bounded waits on conditions).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use chitchat::transport::ChannelTransport;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;

use crate::{
    cluster::{
        ClusterNode, LocalPod, NodeSettings,
        auth::{AuthCounters, ClusterKey},
        membership::MembershipConfig,
        remote::DEFAULT_REMOTE_GRACE,
        sync::client::{Upstream, replicate},
    },
    kv_index::{
        AgentLoad, IndexConfig, KvIndex, Match, PeerLoadSink, RouterKey, SourceId, SourceInfo,
        Tier,
        keys::block_key,
        wire::{Batch, EngineHash, Event, Removed, Stored},
    },
    telemetry::prometheus::SdkReader,
};

const SECRET: &[u8] = b"sync-test-key-of-at-least-32-bytes";
const LIMIT: Duration = Duration::from_secs(20);

fn pod(i: usize) -> String {
    format!("127.0.0.1:{}", 21_000 + i)
}

struct Agent {
    node: ClusterNode,
    index: Arc<KvIndex>,
    local: SourceId,
    /// Sources by pod index (the local one included).
    sources: Vec<SourceId>,
    counters: Arc<AuthCounters>,
}

async fn start(i: usize, n: usize, transport: &ChannelTransport, port_base: u16) -> Agent {
    let index = Arc::new(KvIndex::new(IndexConfig::default()));
    let sources: Vec<SourceId> = (0..n)
        .map(|j| {
            let info = SourceInfo {
                pod: pod(j),
                rank: None,
            };
            if j == i {
                index.add_source(info)
            } else {
                index.add_remote_source(info)
            }
        })
        .collect();
    let listen = ([127, 0, 0, 1], port_base + i as u16).into();
    let counters = Arc::new(AuthCounters::default());
    let settings = NodeSettings {
        membership: MembershipConfig {
            cluster_id: "sync".into(),
            node_id: format!("agent-{i}"),
            incarnation: 1,
            listen,
            advertise: listen,
            seeds: vec![format!("127.0.0.1:{port_base}")],
            gossip_interval: Duration::from_millis(50),
            dead_grace: Duration::from_secs(3_600),
        },
        grpc_listen: ([127, 0, 0, 1], 0).into(),
        grpc_advertise: None,
        proxy: None,
        key: Some(Arc::new(
            ClusterKey::new(SECRET, "sync").expect("long enough"),
        )),
        counters: counters.clone(),
        publish_every: Duration::from_millis(50),
        remote_grace: DEFAULT_REMOTE_GRACE,
    };
    let local = LocalPod {
        id: pod(i),
        model: "m".into(),
        source: sources[i],
    };
    let remote = (0..n)
        .filter(|&j| j != i)
        .map(|j| (pod(j), sources[j]))
        .collect();
    let node = ClusterNode::start(settings, index.clone(), vec![local], remote, transport)
        .await
        .expect("starts");
    Agent {
        node,
        index,
        local: sources[i],
        sources,
        counters,
    }
}

/// A chain of `n` blocks stored by an engine (hashes from `base`), and its router keys.
pub(crate) fn stored(n: usize, base: u64) -> (Batch, Vec<RouterKey>) {
    let tokens: Vec<u32> = (0..n as u32 * 16).map(|t| t + base as u32 * 7).collect();
    let mut keys = Vec::new();
    let mut parent = None;
    for block in tokens.chunks_exact(16) {
        let k = block_key(parent, block, std::iter::empty());
        keys.push(k);
        parent = Some(k);
    }
    let event = Event::Stored(Stored {
        hashes: (0..n as u64).map(|h| EngineHash(base + h)).collect(),
        parent: None,
        token_ids: tokens,
        block_size: 16,
        lora_name: None,
        tier: Tier::Gpu,
        extra_keys: Vec::new(),
        reusable: true,
    });
    (
        Batch {
            ts: 0.0,
            events: vec![event],
            dp_rank: None,
        },
        keys,
    )
}

pub(crate) fn blocks(index: &KvIndex, source: SourceId, keys: &[RouterKey]) -> usize {
    let mut out: Vec<Match> = Vec::new();
    index.lookup(keys, &mut out);
    out.iter()
        .find(|m| m.source == source.0)
        .map_or(0, |m| m.blocks)
}

/// An SDK reader's metrics in the Prometheus text format.
fn metrics(reader: &SdkReader) -> String {
    let mut out = String::new();
    reader.render(&mut out);
    out
}

/// The value of the sample line starting with `series` (name and labels), if any.
fn count_f(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

fn count(text: &str, series: &str) -> Option<u64> {
    count_f(text, series).map(|v| v as u64)
}

/// Waits until `cond` holds (real time, bounded); how long it took.
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    tokio::time::timeout(LIMIT, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not within {LIMIT:?}"));
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_follow_the_owner_and_placements_reach_every_agent() {
    let transport = ChannelTransport::with_mtu(65_507);
    let mut agents = Vec::new();
    for i in 0..3 {
        agents.push(start(i, 3, &transport, 11_000).await);
    }
    let owner = &agents[0];
    // Each agent's lag histograms on a meter of its own.
    // (Each provider lives as long as the test: a dropped one records nothing.)
    let (readers, _providers): (Vec<SdkReader>, Vec<SdkMeterProvider>) = agents
        .iter()
        .map(|a| {
            let reader = SdkReader::new();
            let provider = SdkMeterProvider::builder()
                .with_reader(reader.reader())
                .build();
            a.node.lags().observe(&provider.meter("test"));
            (reader, provider)
        })
        .unzip();
    // Before anything is stored the replicas take their (empty) snapshots and trust them.
    wait_for("replicas trusted", || {
        agents[1..].iter().all(|a| a.index.trusted(a.sources[0]))
    })
    .await;

    let (batch, keys) = stored(8, 100);
    owner.index.apply(owner.local, &batch, 0);
    let took = wait_for("stored blocks replicated", || {
        agents[1..]
            .iter()
            .all(|a| blocks(&a.index, a.sources[0], &keys) == 8)
    })
    .await;
    eprintln!("event applied on the owner -> visible in both replicas: {took:?}");

    let removal = Batch {
        ts: 0.0,
        events: vec![Event::Removed(Removed {
            hashes: (104..108).map(EngineHash).collect(),
            tier: Tier::Gpu,
            reusable: true,
        })],
        dp_rank: None,
    };
    owner.index.apply(owner.local, &removal, 1);
    wait_for("removal replicated", || {
        agents[1..]
            .iter()
            .all(|a| blocks(&a.index, a.sources[0], &keys) == 4)
    })
    .await;

    // Agent 1 routes a cold prefix to agent 0's pod: the owner and agent 2 hold it too.
    let cold: Vec<RouterKey> = (1..=6).map(|k| RouterKey(0xC01D_0000 + k)).collect();
    agents[1]
        .index
        .speculate(agents[1].sources[0], &cold, Instant::now());
    let took = wait_for("placement relayed", || {
        blocks(&agents[0].index, agents[0].sources[0], &cold) == 6
            && blocks(&agents[2].index, agents[2].sources[0], &cold) == 6
    })
    .await;
    eprintln!("placement by agent-1 -> held on the owner and on agent-2: {took:?}");
    // Each replica recorded the two deltas' lag (the owner's apply -> its own, under the
    // time the test waited for them; this test's batches carry no engine time); the owner
    // the placement straight from agent 1, agent 2 the one the owner relayed.
    for (i, reader) in readers.iter().enumerate() {
        let text = metrics(reader);
        let deltas = if i == 0 { None } else { Some(2) };
        assert_eq!(
            count(&text, "warmpath_cluster_delta_lag_seconds_count"),
            deltas,
            "{text}"
        );
        assert_eq!(
            count(&text, "warmpath_cluster_event_lag_seconds_count"),
            None
        );
        let placements = [None, None, Some(1)];
        assert_eq!(
            count(
                &text,
                "warmpath_cluster_placement_lag_seconds_count{hops=\"2\"}"
            ),
            placements[i],
            "{text}"
        );
        let direct = if i == 0 { Some(1) } else { None };
        assert_eq!(
            count(
                &text,
                "warmpath_cluster_placement_lag_seconds_count{hops=\"1\"}"
            ),
            direct,
            "{text}"
        );
    }
    let owner_text = metrics(&readers[0]);
    let lag = count_f(
        &owner_text,
        "warmpath_cluster_placement_lag_seconds_sum{hops=\"1\"}",
    )
    .expect("the owner's placement lag");
    assert!(
        lag < took.as_secs_f64() + 0.001,
        "{lag} s; the test saw it within {took:?}"
    );
    assert!(
        agents[2]
            .index
            .holders(cold[0])
            .iter()
            .all(|&(_, _, speculative)| speculative),
        "a placement is speculative until the engine's events confirm it"
    );

    // The owner restarts its pod's events (a new incarnation): replicas resync.
    owner.index.restarted(owner.local);
    let (batch, keys2) = stored(3, 500);
    owner.index.apply(owner.local, &batch, 0);
    wait_for("resynced after the owner's restart", || {
        agents[1..].iter().all(|a| {
            blocks(&a.index, a.sources[0], &keys) == 0
                && blocks(&a.index, a.sources[0], &keys2) == 3
        })
    })
    .await;
    assert!(agents.iter().all(|a| {
        a.counters
            .rejected_streams
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
    }));
    drop(agents);
}

/// What one agent's proxy was told of its peers' loads: (pod's source, agent, load).
type Heard = Arc<parking_lot::Mutex<Vec<(SourceId, String, AgentLoad)>>>;

fn listen_for_loads(index: &KvIndex) -> Heard {
    let heard = Heard::default();
    let h = heard.clone();
    assert!(
        index.set_peer_load_sink(PeerLoadSink::new(move |source, agent, load| {
            h.lock().push((source, agent.to_string(), load));
        }))
    );
    heard
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_reach_every_other_agent_routing_to_the_pod_and_not_their_sender() {
    let transport = ChannelTransport::with_mtu(65_507);
    let mut agents = Vec::new();
    for i in 0..3 {
        agents.push(start(i, 3, &transport, 11_200).await);
    }
    let heard: Vec<Heard> = agents.iter().map(|a| listen_for_loads(&a.index)).collect();
    wait_for("replicas trusted", || {
        (0..3).all(|owner| {
            agents
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != owner)
                .all(|(_, a)| a.index.trusted(a.sources[owner]))
        })
    })
    .await;
    let load = |in_flight, queued_prefill_blocks| AgentLoad {
        in_flight,
        queued_prefill_blocks,
    };
    // Agent 1 on agent 0's pod: to the owner, and relayed by it to agent 2.
    agents[1]
        .index
        .report_load(agents[1].sources[0], load(2, 50));
    // Agent 0 on its own pod: to its subscribers.
    agents[0].index.report_load(agents[0].local, load(1, 0));
    // Agent 2 on agent 1's pod: to agent 1, relayed to agent 0.
    agents[2]
        .index
        .report_load(agents[2].sources[1], load(4, 7));
    let has = |i: usize, pod: usize, agent: &str, l: AgentLoad| {
        heard[i]
            .lock()
            .contains(&(agents[i].sources[pod], agent.to_string(), l))
    };
    wait_for("every load at every other agent", || {
        has(0, 0, "agent-1", load(2, 50))
            && has(2, 0, "agent-1", load(2, 50))
            && has(1, 0, "agent-0", load(1, 0))
            && has(2, 0, "agent-0", load(1, 0))
            && has(1, 1, "agent-2", load(4, 7))
            && has(0, 1, "agent-2", load(4, 7))
    })
    .await;
    // No agent heard its own load back, nor any load twice.
    for (i, h) in heard.iter().enumerate() {
        let own = format!("agent-{i}");
        let h = h.lock();
        assert!(h.iter().all(|(_, agent, _)| *agent != own), "{i}: {h:?}");
        assert_eq!(
            h.len(),
            2,
            "{i}: each agent hears the two others once: {h:?}"
        );
    }
    drop(agents);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_the_wrong_token_is_refused_and_counted() {
    let transport = ChannelTransport::with_mtu(65_507);
    let owner = start(0, 2, &transport, 12_000).await;
    let (batch, keys) = stored(4, 900);
    owner.index.apply(owner.local, &batch, 0);

    let intruder = Arc::new(KvIndex::new(IndexConfig::default()));
    let copy = intruder.add_remote_source(SourceInfo {
        pod: pod(0),
        rank: None,
    });
    let wrong = ClusterKey::new(b"not-the-cluster-key-but-long-enough", "sync").expect("ok");
    let (_placements, rx) = tokio::sync::mpsc::channel(1);
    let task = tokio::spawn(replicate(
        Upstream {
            peer: "agent-0".into(),
            grpc: owner.node.grpc_addr(),
            pods: vec![(pod(0), copy)],
        },
        intruder.clone(),
        Some(wrong.grpc_token().to_string()),
        rx,
    ));
    wait_for("refusal counted", || {
        owner
            .counters
            .rejected_streams
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    })
    .await;
    task.abort();
    assert_eq!(blocks(&intruder, copy, &keys), 0);
    assert!(!intruder.trusted(copy));
}
