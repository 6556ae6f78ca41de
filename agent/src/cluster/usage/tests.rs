//! The publishing rules on their own, and agents exchanging usage in one process over
//! chitchat's channel transport on tokio's paused clock.

use std::{collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};

use chitchat::transport::ChannelTransport;
use parking_lot::Mutex;

use super::*;
use crate::cluster::{
    NodeSettings, facts::Rate, membership::MembershipConfig, remote::DEFAULT_REMOTE_GRACE,
};

/// Gossip interval under test (production: 1 s).
const INTERVAL: Duration = Duration::from_millis(50);

fn demand(requests: f64, prompt_tokens: f64, output_tokens: f64) -> Demand {
    Demand {
        requests,
        prompt_tokens,
        output_tokens,
    }
}

fn tenant(name: &str, d: Demand) -> (Arc<str>, Demand) {
    (Arc::from(name), d)
}

fn set_tenants(round: &Round) -> Vec<&str> {
    round
        .set
        .iter()
        .map(|f| match f {
            Fact::Usage { tenant, .. } => tenant.as_str(),
            other => panic!("not a usage fact: {other:?}"),
        })
        .collect()
}

#[test]
fn at_most_256_tenants_are_published_the_most_demanding_first() {
    let mut published = Published::default();
    // Tenant i asks for i prompt tokens per second; t000 for nothing.
    let demands: Vec<_> = (0..300)
        .map(|i| tenant(&format!("t{i:03}"), demand(1.0, f64::from(i), 0.0)))
        .collect();
    let round = published.round(demands.clone());
    let mut names = set_tenants(&round);
    names.sort_unstable();
    let expected: Vec<String> = (44..300).map(|i| format!("t{i:03}")).collect();
    assert_eq!(names, expected);
    assert!(round.retract.is_empty());
    // The same demand again: nothing to send.
    assert_eq!(published.round(demands.clone()), Round::default());
    // t043 now outranks t044 (by output tokens): t044's fact is withdrawn at once.
    let mut more = demands;
    more[43] = tenant("t043", demand(1.0, 43.0, 2.0));
    let round = published.round(more);
    assert_eq!(set_tenants(&round), ["t043"]);
    assert_eq!(round.retract, ["usage:t044"]);
}

#[test]
fn a_rate_is_republished_when_it_moves_by_more_than_one_percent() {
    let mut published = Published::default();
    let round = published.round(vec![tenant("a", demand(100.0, 1000.0, 10.0))]);
    assert_eq!(set_tenants(&round), ["a"]);
    // 0.5 % on requests, 0.9 % on prompt tokens: kept as published.
    let round = published.round(vec![tenant("a", demand(100.5, 991.0, 10.0))]);
    assert_eq!(round, Round::default());
    // Output tokens up 2 %.
    let round = published.round(vec![tenant("a", demand(100.5, 991.0, 10.2))]);
    assert_eq!(
        round.set,
        [Fact::Usage {
            tenant: "a".into(),
            usage: UsageFact {
                requests: Rate::from_milli(100_500),
                prompt_tokens: Rate::from_milli(991_000),
                output_tokens: Rate::from_milli(10_200),
            },
        }]
    );
}

#[test]
fn an_idle_tenant_is_published_at_zero_then_retracted() {
    let mut published = Published::default();
    // Zero demand for a tenant never published: nothing.
    assert_eq!(
        published.round(vec![tenant("idle", Demand::default())]),
        Round::default()
    );
    published.round(vec![tenant("a", demand(1.0, 0.0, 0.0))]);
    // The engine no longer reports it: zero, once.
    let round = published.round(Vec::new());
    assert_eq!(
        round.set,
        [Fact::Usage {
            tenant: "a".into(),
            usage: UsageFact::default(),
        }]
    );
    for _ in 1..IDLE_ROUNDS {
        assert_eq!(published.round(Vec::new()), Round::default());
    }
    let round = published.round(Vec::new());
    assert_eq!(round.retract, ["usage:a"]);
    assert!(round.set.is_empty());
    assert_eq!(published.round(Vec::new()), Round::default());
    // Back: published again.
    let round = published.round(vec![tenant("a", demand(0.5, 0.0, 0.0))]);
    assert_eq!(set_tenants(&round), ["a"]);
}

#[test]
fn a_tenant_name_unfit_for_a_key_is_skipped() {
    let mut published = Published::default();
    let round = published.round(vec![
        tenant("has space", demand(1.0, 1.0, 1.0)),
        tenant("", demand(1.0, 1.0, 1.0)),
        tenant("ok", demand(1.0, 1.0, 1.0)),
    ]);
    assert_eq!(set_tenants(&round), ["ok"]);
}

/// A quota engine with a fixed local demand that keeps what it was told.
#[derive(Debug, Default)]
struct Fake {
    local: Mutex<Vec<(Arc<str>, Demand)>>,
    remote: Mutex<HashMap<Arc<str>, Vec<Demand>>>,
}

impl UsageExchange for Fake {
    fn local_demand(&self) -> Vec<(Arc<str>, Demand)> {
        self.local.lock().clone()
    }

    fn set_remote_demand(&self, remote: HashMap<Arc<str>, Vec<Demand>>) {
        *self.remote.lock() = remote;
    }
}

struct Agent {
    node: ClusterNode,
    usage: Arc<Fake>,
    task: JoinHandle<()>,
}

fn gossip_addr(i: usize) -> SocketAddr {
    ([127, 0, 0, 1], 12_000 + i as u16).into()
}

fn settings(i: usize) -> NodeSettings {
    NodeSettings {
        membership: MembershipConfig {
            cluster_id: "usage".into(),
            node_id: format!("agent-{i:02}"),
            incarnation: 1,
            listen: gossip_addr(i),
            advertise: gossip_addr(i),
            seeds: vec![gossip_addr(0).to_string()],
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

/// Agent `i`'s demand: a tenant all share and one of its own (halves and quarters, so the
/// values read back exactly).
fn local_of(i: usize) -> Vec<(Arc<str>, Demand)> {
    let k = (i + 1) as f64;
    vec![
        tenant("shared", demand(1.5 * k, 100.25 * k, 10.0 * k)),
        tenant(&format!("only-{i}"), demand(0.5, k, 0.0)),
    ]
}

async fn start(n: usize, transport: &ChannelTransport) -> Vec<Option<Agent>> {
    let mut agents = Vec::new();
    for i in 0..n {
        let index = Arc::new(crate::kv_index::KvIndex::new(Default::default()));
        let node = ClusterNode::start(settings(i), index, Vec::new(), Vec::new(), transport)
            .await
            .expect("starts");
        let usage = Arc::new(Fake::default());
        *usage.local.lock() = local_of(i);
        let task = spawn_usage_exchange(&node, usage.clone(), node.gossip_interval());
        agents.push(Some(Agent { node, usage, task }));
    }
    agents
}

/// What agent `i` must be told when the agents in `alive` run with [`local_of`]'s demand:
/// per tenant, one demand per other agent, in node id order.
fn expected(i: usize, alive: &[usize]) -> HashMap<Arc<str>, Vec<Demand>> {
    let mut want: HashMap<Arc<str>, Vec<Demand>> = HashMap::new();
    for &j in alive.iter().filter(|&&j| j != i) {
        for (t, d) in local_of(j) {
            want.entry(t).or_default().push(d);
        }
    }
    want
}

/// Waits (virtual time) until `cond` holds; the time it took.
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

fn everyone_told(agents: &[Option<Agent>]) -> bool {
    let alive: Vec<usize> = (0..agents.len()).filter(|&j| agents[j].is_some()).collect();
    alive.iter().all(|&i| {
        let a = agents[i].as_ref().expect("alive");
        *a.usage.remote.lock() == expected(i, &alive)
    })
}

#[tokio::test(start_paused = true)]
async fn four_agents_see_each_others_demand_and_a_dead_ones_drops_out() {
    let transport = ChannelTransport::with_mtu(65_507);
    let mut agents = start(4, &transport).await;
    let took = wait_for(Duration::from_secs(30), || everyone_told(&agents)).await;
    eprintln!("4 agents told each other's demand {took:?} after start (gossip every {INTERVAL:?})");
    // Spelled out once for agent 0: agents 1-3's demand, in node id order.
    let told = agents[0]
        .as_ref()
        .expect("alive")
        .usage
        .remote
        .lock()
        .clone();
    assert_eq!(
        told["shared"],
        [
            demand(3.0, 200.5, 20.0),
            demand(4.5, 300.75, 30.0),
            demand(6.0, 401.0, 40.0)
        ]
    );
    assert_eq!(told["only-2"], [demand(0.5, 3.0, 0.0)]);
    assert_eq!(told.len(), 4, "{told:?}");

    // Agent 3 stops: its demand drops out everywhere within the failure-detection window.
    let dead = agents[3].take().expect("running");
    dead.node.shutdown();
    let took = wait_for(Duration::from_secs(30), || everyone_told(&agents)).await;
    eprintln!("agent 3's demand gone from the 3 others {took:?} after it stopped");
    // The cluster tests see a stopped agent declared dead in 12-15 rounds at this interval.
    assert!(took < INTERVAL * 40, "{took:?}");
    tokio::time::timeout(INTERVAL * 4, dead.task)
        .await
        .expect("the exchange ends with its node")
        .expect("ends without panicking");

    // Agent 0's own tenant goes idle: the others see zero, then no fact at all.
    agents[0]
        .as_ref()
        .expect("alive")
        .usage
        .local
        .lock()
        .truncate(1);
    let zero = |agents: &[Option<Agent>]| {
        agents[1..3].iter().flatten().all(|a| {
            a.usage.remote.lock().get("only-0").map(Vec::as_slice) == Some(&[Demand::default()][..])
        })
    };
    wait_for(INTERVAL * 20, || zero(&agents)).await;
    let took = wait_for(INTERVAL * (IDLE_ROUNDS + 20), || {
        agents[1..3]
            .iter()
            .flatten()
            .all(|a| !a.usage.remote.lock().contains_key("only-0"))
    })
    .await;
    eprintln!("agent 0's idle tenant retracted everywhere {took:?} after the others saw zero");
    // Held at zero for IDLE_ROUNDS rounds first (give or take the spread of two gossip waves).
    assert!(took >= INTERVAL * (IDLE_ROUNDS / 2), "{took:?}");
    for a in agents.iter().flatten() {
        a.task.abort();
    }
}

/// Time from a change of agent 0's demand to every other agent being told it, for a few
/// changes at different phases of the gossip round.
async fn staleness(n: usize) -> Vec<Duration> {
    let transport = ChannelTransport::with_mtu(65_507);
    let agents = start(n, &transport).await;
    wait_for(Duration::from_secs(60), || everyone_told(&agents)).await;
    let mut took = Vec::new();
    for step in 1..=5u32 {
        // Shift the change's phase within the round.
        tokio::time::sleep(INTERVAL * 3 + INTERVAL * step / 5).await;
        let requests = 100.0 * f64::from(step);
        let a0 = agents[0].as_ref().expect("alive");
        a0.usage.local.lock()[0] = tenant("shared", demand(requests, 1.0, 1.0));
        let want = demand(requests, 1.0, 1.0);
        took.push(
            wait_for(Duration::from_secs(30), || {
                agents[1..].iter().flatten().all(|a| {
                    a.usage
                        .remote
                        .lock()
                        .get("shared")
                        .is_some_and(|v| v.contains(&want))
                })
            })
            .await,
        );
    }
    for a in agents.iter().flatten() {
        a.task.abort();
    }
    took
}

#[tokio::test(start_paused = true)]
async fn a_demand_change_reaches_every_agent_within_a_few_rounds() {
    for n in [4, 16] {
        let took = staleness(n).await;
        let rounds: Vec<f64> = took
            .iter()
            .map(|t| t.as_secs_f64() / INTERVAL.as_secs_f64())
            .collect();
        eprintln!(
            "{n} agents: a change at agent 0 known to all others after {took:?} ({rounds:.1?} rounds)"
        );
        // One round to publish, then about log3(n) rounds of gossip.
        let max = took.iter().max().expect("five changes");
        assert!(*max <= INTERVAL * 10, "{n} agents: {took:?}");
    }
}
