//! The pools at run time: each [`Pool`] with its token source, session rule, routing history
//! and upstream protocol, and how a request finds its pool (by model or LoRA adapter).
//!
//! (This lives with the proxy, not with [`crate::pool`]: the token source reads parsed
//! requests, which are the proxy's.)

use std::{
    collections::HashMap,
    sync::{
        Arc, Weak,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use super::{Proxy, TokenSource, calibration::Calibration, unkeyed::UnkeyedCounts};
use crate::{
    kv_index::{AgentLoad, PeerLoadSink, PlacementSink, RouterKey, SourceId},
    policy::compiled::PoolBase,
    pool::{LOAD_CHANGED, LOAD_REFRESH, Pool, UpstreamProtocol},
    routing::{BlockTiming, SessionSource, replication::Replication},
    telemetry::PoolId,
};

/// One pool at run time: its endpoints and state, token source and session rule.
#[derive(Debug)]
pub struct PoolRuntime {
    pub name: String,
    pub pool: Pool,
    pub tokens: TokenSource,
    pub session: SessionSource,
    pub(super) telemetry_id: PoolId,
    /// Spreads `/tokenize` calls (engine token source) over the endpoints.
    tokenize_cursor: AtomicUsize,
    /// HTTP/1.1 or h2c to the engines.
    pub protocol: UpstreamProtocol,
    /// Requests routed without prefix keys, by reason.
    pub unkeyed: UnkeyedCounts,
    /// Each pod's TTFT model and the pool's prediction errors.
    pub calibration: Arc<Calibration>,
    /// The pool's hot prefixes and their homes.
    pub replication: parking_lot::Mutex<Replication>,
    /// The prefixes each pod keeps for reuse ([`crate::routing::resident`]).
    pub resident: parking_lot::Mutex<crate::routing::resident::Resident>,
    /// Cold requests that yielded at a full pod ([`super::cold_yield`]).
    pub cold_yields: crate::routing::cold_yield::ColdYields,
    /// Cold requests held for this agent's slot in the cluster, while the pool's requests
    /// come in bursts ([`super::forward`]).
    pub staggered: crate::routing::stagger::Holds,
    /// The second admission stage under the pool's own `clusterMaxConcurrent`
    /// ([`super::admission::Admission::for_pool`]); `None`: off.
    pub admission: Option<Arc<super::admission::Admission>>,
}

impl PoolRuntime {
    /// The endpoint asked to tokenize (engine token source): the next one in rotation.
    pub(super) fn tokenize_target(&self) -> Option<String> {
        let endpoints = self.pool.endpoints();
        let routable: Vec<_> = endpoints.iter().filter(|e| e.routable()).collect();
        let n = routable.len();
        let i = self.tokenize_cursor.fetch_add(1, Ordering::Relaxed);
        (n > 0).then(|| routable[i % n].authority.clone())
    }
}

impl Proxy {
    /// Adds a pool (speaking HTTP/1.1 to its engines; see [`PoolRuntime::protocol`]).
    pub fn add_pool(
        &mut self,
        name: &str,
        pool: Pool,
        tokens: TokenSource,
        session: SessionSource,
    ) -> &mut PoolRuntime {
        let telemetry_id = self.telemetry.register_pool(name, &pool.model);
        self.policy.add_pool(PoolBase {
            name: name.to_string(),
            model: pool.model.clone(),
            targets: Default::default(),
            policy: pool.policy,
        });
        self.pools.push(PoolRuntime {
            name: name.to_string(),
            pool,
            tokens,
            session,
            telemetry_id,
            tokenize_cursor: AtomicUsize::new(0),
            protocol: UpstreamProtocol::default(),
            unkeyed: UnkeyedCounts::new(name),
            calibration: Arc::default(),
            replication: Default::default(),
            resident: Default::default(),
            cold_yields: Default::default(),
            staggered: Default::default(),
            admission: None,
        });
        self.pools.last_mut().expect("a pool was just pushed")
    }

    /// Records every peer agent's placement applied to the index (docs/cluster.md) in the
    /// routing history, as this agent's own decisions are: the pull of a prefix's home is
    /// then the same on every agent of a cluster, as one central agent's history would be,
    /// instead of each agent pulling the prefix back to where it alone sent it. Without a
    /// cluster no placement comes.
    pub fn follow_peer_placements(self: &Arc<Self>) {
        // Weak: the index (which the proxy holds) must not keep the proxy alive.
        let proxy = Arc::downgrade(self);
        self.index
            .set_peer_placement_sink(PlacementSink::new(move |source, keys, new_blocks| {
                if let Some(proxy) = proxy.upgrade() {
                    proxy.record_peer_placement(
                        source,
                        keys,
                        new_blocks,
                        std::time::Instant::now(),
                    );
                }
            }));
    }

    /// Shares loads with the cluster's other agents, once a cluster carries them (the index's
    /// load sink is set: docs/cluster.md, "Shared load"): their reports go onto the endpoints
    /// and the pools count peers by them ([`Pool::count_peers_exactly`]), and this proxy's
    /// own load on each pod goes to them on every change, and again every [`LOAD_REFRESH`]
    /// while it is not zero. The task ends once the proxy is dropped.
    pub fn share_loads(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let proxy = Arc::downgrade(self);
        self.index
            .set_peer_load_sink(PeerLoadSink::new(move |source, agent, load| {
                if let Some(proxy) = proxy.upgrade() {
                    proxy.record_peer_load(source, agent, load, Instant::now());
                }
            }));
        tokio::spawn(publish_loads(Arc::downgrade(self)))
    }

    /// A peer agent reported its load on the pod whose index source is `source`.
    fn record_peer_load(&self, source: SourceId, agent: &str, load: AgentLoad, now: Instant) {
        for p in &self.pools {
            if let Some(e) = p.pool.endpoints().iter().find(|e| e.source == Some(source)) {
                e.set_peer_load(agent, load, now);
            }
        }
    }

    /// This proxy's load on each pod with an index source, summed over its pools.
    fn own_loads(&self) -> HashMap<SourceId, AgentLoad> {
        let mut loads: HashMap<SourceId, AgentLoad> = HashMap::new();
        for p in &self.pools {
            for e in p.pool.endpoints().iter() {
                if let Some(source) = e.source {
                    let own = e.own_load();
                    let l = loads.entry(source).or_default();
                    l.in_flight = l.in_flight.saturating_add(own.in_flight);
                    l.queued_prefill_blocks = l
                        .queued_prefill_blocks
                        .saturating_add(own.queued_prefill_blocks);
                }
            }
        }
        loads
    }

    /// A peer routed `keys` to the pod whose index source is `source`.
    fn record_peer_placement(
        &self,
        source: SourceId,
        keys: &[RouterKey],
        new_blocks: usize,
        now: std::time::Instant,
    ) {
        for p in &self.pools {
            let endpoints = p.pool.endpoints();
            if let Some(e) = endpoints.iter().find(|e| e.source == Some(source)) {
                p.pool.history.record(e.history, keys, now);
                // The prefix it reused there is resident (where the pool prices KV).
                if p.pool.policy.kind.prices_kv_room() {
                    let held = keys.len().saturating_sub(new_blocks);
                    p.resident.lock().reused(keys, held, now);
                }
                // Its load until the peer's own report can count it (`pool::provisional`):
                // read only where the peers report their loads.
                if p.pool.counts_peers_exactly() {
                    e.note_cold_placement(new_blocks, keys.len(), now);
                }
                // Its KV too, for as long as this pool's requests are in flight, where this
                // pool prices KV room.
                if !p.pool.policy.kind.prices_kv_room() {
                    continue;
                }
                let output = p.calibration.output_blocks(p.pool.block_size);
                let lifetime = std::time::Duration::try_from_secs_f64(p.calibration.lifetime())
                    .unwrap_or_default();
                e.lease(keys, output, now, now + lifetime);
                // And its prefill: the blocks new to the pod join the work queued there,
                // drained at the pod's calibrated rate (this agent does not see it start);
                // unless the peers report their queued prefill themselves (shared load).
                if p.pool.counts_peers_exactly() {
                    continue;
                }
                let rate = BlockTiming::new(p.calibration.timing(e.serial), p.pool.block_size);
                e.queue_peer_prefill(new_blocks as u64, rate.secs_per_block, now);
            }
        }
    }

    /// The pool serving `model` (its index), and the LoRA adapter when `model` names one.
    pub(super) fn pool_for(&self, model: &str) -> Option<(usize, Option<String>)> {
        if let Some(i) = self.pools.iter().position(|p| p.pool.model == model) {
            return Some((i, None));
        }
        // A pool whose routable endpoints serve the adapter, else (everything draining) any
        // that serves it: its candidates then answer 503, not 404.
        let serves = |routable_only: bool| {
            self.pools.iter().position(|p| {
                p.pool
                    .endpoints()
                    .iter()
                    .any(|e| (!routable_only || e.routable()) && e.serves(model))
            })
        };
        serves(true)
            .or_else(|| serves(false))
            .map(|i| (i, Some(model.to_string())))
    }
}

/// The shortest time between two passes of [`publish_loads`]: a burst of request events
/// is sent as one load per pod.
const LOAD_GAP: Duration = Duration::from_millis(1);

/// The loads to send now, given what was `sent` (updated: pods no longer routed to are
/// forgotten): each pod whose load changed, and each whose load is not zero and was last
/// sent [`LOAD_REFRESH`] ago.
fn due_loads(
    sent: &mut HashMap<SourceId, (AgentLoad, Instant)>,
    loads: &HashMap<SourceId, AgentLoad>,
    now: Instant,
) -> Vec<(SourceId, AgentLoad)> {
    sent.retain(|source, _| loads.contains_key(source));
    let idle = AgentLoad::default();
    let mut due = Vec::new();
    for (&source, &load) in loads {
        let send = match sent.get(&source) {
            Some(&(last, at)) => {
                last != load || (load != idle && now.saturating_duration_since(at) >= LOAD_REFRESH)
            }
            None => load != idle,
        };
        if send {
            sent.insert(source, (load, now));
            due.push((source, load));
        }
    }
    due
}

/// [`Proxy::share_loads`]'s publisher: waits for a request event anywhere (or the refresh
/// period), then sends what [`due_loads`] says, while the index shares loads.
async fn publish_loads(proxy: Weak<Proxy>) {
    let mut sent = HashMap::new();
    // Whether the pools count peers by their reports yet (from the first pass that finds
    // the cluster sharing loads on).
    let mut exact = false;
    loop {
        let changed = LOAD_CHANGED.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        {
            let Some(proxy) = proxy.upgrade() else {
                return;
            };
            if proxy.index.shares_loads() {
                if !exact {
                    crate::pool::share_loads();
                    for p in &proxy.pools {
                        p.pool.count_peers_exactly();
                    }
                    exact = true;
                }
                for (source, load) in due_loads(&mut sent, &proxy.own_loads(), Instant::now()) {
                    proxy.index.report_load(source, load);
                }
            }
        }
        tokio::select! {
            _ = &mut changed => {}
            _ = tokio::time::sleep(LOAD_REFRESH) => {}
        }
        tokio::time::sleep(LOAD_GAP).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_are_sent_on_change_and_refreshed_while_not_zero() {
        let index = KvIndex::new(IndexConfig::default());
        let source = |pod: &str| {
            index.add_source(SourceInfo {
                pod: pod.into(),
                rank: None,
            })
        };
        let (a, b) = (source("a:1"), source("b:1"));
        let load = |in_flight, queued_prefill_blocks| AgentLoad {
            in_flight,
            queued_prefill_blocks,
        };
        let t0 = Instant::now();
        let mut sent = HashMap::new();
        // An idle pod is not sent until it has had a load.
        let now = HashMap::from([(a, load(2, 30)), (b, AgentLoad::default())]);
        assert_eq!(due_loads(&mut sent, &now, t0), vec![(a, load(2, 30))]);
        // Unchanged, before the refresh: nothing.
        let later = t0 + Duration::from_millis(500);
        assert_eq!(due_loads(&mut sent, &now, later), vec![]);
        // a's first byte: sent at once.
        let now = HashMap::from([(a, load(2, 0)), (b, AgentLoad::default())]);
        assert_eq!(due_loads(&mut sent, &now, later), vec![(a, load(2, 0))]);
        // Unchanged for the refresh period: sent again (so peers keep counting it).
        let refresh = later + LOAD_REFRESH;
        assert_eq!(due_loads(&mut sent, &now, refresh), vec![(a, load(2, 0))]);
        // Back to idle: sent once, then never refreshed.
        let idle = HashMap::from([(a, AgentLoad::default()), (b, AgentLoad::default())]);
        assert_eq!(
            due_loads(&mut sent, &idle, refresh),
            vec![(a, AgentLoad::default())]
        );
        assert_eq!(
            due_loads(&mut sent, &idle, refresh + LOAD_REFRESH * 2),
            vec![]
        );
        // A pod no longer routed to is forgotten.
        assert_eq!(due_loads(&mut sent, &HashMap::new(), refresh), vec![]);
        assert!(sent.is_empty());
    }
    use crate::{
        kv_index::{IndexConfig, KvIndex, SourceInfo},
        routing::Policy,
        telemetry::{Telemetry, TelemetryConfig},
    };

    #[test]
    fn a_peers_placement_joins_the_routing_history_and_own_speculation_does_not() {
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let (a, b) = (
            index.add_source(SourceInfo {
                pod: "a:1".into(),
                rank: None,
            }),
            index.add_remote_source(SourceInfo {
                pod: "b:1".into(),
                rank: None,
            }),
        );
        let telemetry = Arc::new(Telemetry::new(&TelemetryConfig::default()).expect("telemetry"));
        let mut proxy = Proxy::new(index, telemetry, Default::default());
        let endpoints = vec![("a:1".to_string(), Some(a)), ("b:1".to_string(), Some(b))];
        let pool = Pool::new("m".into(), 16, Policy::Precise, endpoints);
        proxy.add_pool(
            "p",
            pool,
            TokenSource::Approximate,
            SessionSource::default(),
        );
        let proxy = Arc::new(proxy);
        proxy.follow_peer_placements();
        let history = |keys: &[RouterKey]| {
            let pool = &proxy.pools[0].pool;
            let endpoints = pool.endpoints();
            let found = pool.history.lookup(keys);
            endpoints
                .iter()
                .map(|e| {
                    found
                        .iter()
                        .find(|(s, _)| *s == e.history)
                        .map_or(0, |(_, n)| *n)
                })
                .collect::<Vec<_>>()
        };
        let keys: Vec<RouterKey> = (1..=32).map(RouterKey).collect();
        let now = Instant::now();
        let pod_b = proxy.pools[0].pool.endpoints()[1].clone();
        pod_b.set_kv_capacity(1000);
        // A peer sent the chain to b: b's history holds it, a's does not.
        proxy
            .index
            .speculate_remote(b, &keys, Duration::from_secs(2), now);
        assert_eq!(history(&keys), [0, 32]);
        // And b's KV accounting: the 32 prompt blocks and, before any answer, the prior's
        // 128 output tokens (8 blocks), held for the prior's lifetime (1 s).
        let room = pod_b.kv_room(&keys).expect("sized");
        assert_eq!((room.pinned, room.shared), (40, 32));
        // And b's batch: under the prefix presets the peer's request is one in flight there,
        // as one central agent would count it; least-loaded counts this agent's own only.
        let runtime = &proxy.pools[0];
        let endpoints = runtime.pool.endpoints();
        let ctx = crate::routing::RequestCtx {
            keys: keys.clone(),
            ..Default::default()
        };
        let in_flight = |policy| {
            crate::proxy::candidates::candidates(&proxy.index, runtime, &endpoints, &ctx, policy)
                .iter()
                .map(|c| c.in_flight)
                .collect::<Vec<_>>()
        };
        assert_eq!(in_flight(Policy::Precise), [0, 1]);
        assert_eq!(in_flight(Policy::Approximate), [0, 1]);
        assert_eq!(in_flight(Policy::LeastLoaded), [0, 0]);
        // And its prefill: all 32 keys were new to b, queued there (read as of `now`, before
        // any of it drained).
        assert_eq!(pod_b.peer_prefill_blocks(now), 32);
        assert_eq!(
            proxy.pools[0].pool.endpoints()[0].peer_prefill_blocks(now),
            0
        );
        // The same chain placed again adds nothing: b holds it now.
        proxy
            .index
            .speculate_remote(b, &keys, Duration::from_secs(2), now);
        assert_eq!(pod_b.peer_prefill_blocks(now), 32);
        // This agent's own speculation is recorded by its forwarding step, not here.
        let other: Vec<RouterKey> = (100..=110).map(RouterKey).collect();
        proxy.index.speculate(a, &other, now);
        assert_eq!(history(&other), [0, 0]);
        // The proxy gone, a late placement is dropped (the sink holds no proxy alive).
        let index = proxy.index.clone();
        drop(proxy);
        index.speculate_remote(a, &other, Duration::from_secs(2), now);
    }
}
