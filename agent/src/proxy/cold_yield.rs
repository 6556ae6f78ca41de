//! Step 4b of a request: a cold request yields to warm ones while its pick has no KV room
//! ([`crate::routing::cold_yield`] says when). It is ranked again each time room may have
//! freed in the pool (a request ended there, a peer reported one ended, a scrape came in)
//! until its pick has room, it turns warm (its prefix reached a pod meanwhile), or the
//! policy's bound passes; then it goes to the pick of that last ranking. Dropping the
//! future (the client left) ends the wait. Missing a wake-up costs at most the bound: the
//! pool's scrapes wake it every 200 ms.
//!
//! Counted per pool ([`crate::routing::cold_yield::ColdYields`]): requests that yielded,
//! those that went at the bound, and the time yielded in all, on `/status` and `/metrics`.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::{
    candidates::{Candidates, candidates},
    pools::PoolRuntime,
};
use crate::{
    kv_index::KvIndex,
    pool::Endpoint,
    routing::{Decision, RequestCtx, RoutePolicy, cold_yield::yields, rank},
};

/// The request ranked `first` yields (the caller checked [`yields`]): it waits until room
/// may have freed, is ranked again on the pool as it is then, and so on while it still
/// yields, for at most `policy.cold_yield`. Returns the last decision (`None`: no pod is
/// left to rank) and how long it yielded; `endpoints` and `ranked` are replaced by the pool
/// as that decision saw it.
pub async fn hold(
    index: &KvIndex,
    runtime: &PoolRuntime,
    policy: RoutePolicy,
    ctx: &RequestCtx,
    endpoints: &mut Arc<Vec<Arc<Endpoint>>>,
    ranked: &mut Candidates,
) -> (Option<Decision>, Duration) {
    let pool = &runtime.pool;
    let start = Instant::now();
    let deadline = start + policy.cold_yield;
    // Counted while it yields, so that the pool's events wake it (and only then pay for it).
    let _yielding = pool.yielding();
    loop {
        // A timeout, not a sleep: the wake-up is the signal, the bound only ends the wait.
        let _ = tokio::time::timeout_at(deadline, pool.room_freed()).await;
        *endpoints = pool.endpoints();
        *ranked = candidates(index, runtime, endpoints, ctx, policy.kind);
        let decision = rank(policy, ctx, ranked, &pool.rotation);
        let still = decision
            .as_ref()
            .is_some_and(|d| yields(d, ranked, ctx.keys.len(), pool.warm_share()));
        let now = Instant::now();
        if !still || now >= deadline {
            let waited = now.saturating_duration_since(start);
            runtime.cold_yields.note(waited, still);
            return (decision, waited);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        kv_index::{IndexConfig, RouterKey},
        pool::Pool,
        proxy::{Proxy, TokenSource},
        routing::{
            Policy, SessionSource,
            cold_yield::{ColdYieldStatus, DEFAULT_COLD_YIELD},
        },
        telemetry::{Telemetry, TelemetryConfig},
    };

    /// A precise pool of one pod with a KV cache of 100 blocks, 90 of them pinned by a
    /// request in flight (its guard returned); half its recent requests were warm.
    fn full_pod() -> (Proxy, crate::pool::InFlight) {
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let telemetry = Arc::new(Telemetry::new(&TelemetryConfig::default()).expect("telemetry"));
        let mut proxy = Proxy::new(index, telemetry, Default::default());
        let pool = Pool::new("m".into(), 16, Policy::Precise, vec![("a:1".into(), None)]);
        proxy.add_pool(
            "p",
            pool,
            TokenSource::Approximate,
            SessionSource::default(),
        );
        let pod = proxy.pools[0].pool.endpoints()[0].clone();
        pod.set_kv_capacity(100);
        let running: Vec<RouterKey> = (1000..1090).map(RouterKey).collect();
        let guard = pod.start(0, &running, 0);
        for warm in [true, false].repeat(64) {
            proxy.pools[0].pool.note_warm(warm);
        }
        (proxy, guard)
    }

    /// A cold request of 32 blocks, ranked once as `forward` ranks it.
    fn ranked(proxy: &Proxy) -> (RequestCtx, Arc<Vec<Arc<Endpoint>>>, Candidates) {
        let ctx = RequestCtx {
            keys: (1..=32).map(RouterKey).collect(),
            ..RequestCtx::default()
        };
        let runtime = &proxy.pools[0];
        let endpoints = runtime.pool.endpoints();
        let c = candidates(&proxy.index, runtime, &endpoints, &ctx, Policy::Precise);
        let d = rank(Policy::Precise, &ctx, &c, &runtime.pool.rotation).expect("a pod");
        assert!(
            yields(&d, &c, 32, runtime.pool.warm_share()),
            "cold, the pod is full and the pool's requests reuse its cache: {:?} {}",
            c[0].kv,
            runtime.pool.warm_share()
        );
        (ctx, endpoints, c)
    }

    #[tokio::test(start_paused = true)]
    async fn a_cold_request_goes_when_a_request_ends_and_frees_room() {
        let (proxy, guard) = full_pod();
        let (ctx, mut endpoints, mut c) = ranked(&proxy);
        let runtime = &proxy.pools[0];
        let policy = RoutePolicy::from(Policy::Precise);
        let start = Instant::now();
        let (decision, waited) = {
            let held = hold(&proxy.index, runtime, policy, &ctx, &mut endpoints, &mut c);
            tokio::pin!(held);
            // Nothing frees for 120 ms: it still waits.
            tokio::select! {
                _ = &mut held => panic!("went without room"),
                () = tokio::time::sleep(Duration::from_millis(120)) => {}
            }
            drop(guard);
            held.await
        };
        assert_eq!(decision.expect("a pod").ranked[0].0, 0);
        assert_eq!(waited, Duration::from_millis(120));
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(120),
            "woken, not timed out"
        );
        assert_eq!(
            c[0].kv.map(|k| k.pinned),
            Some(0),
            "ranked on the freed pod"
        );
        assert_eq!(
            runtime.cold_yields.status(),
            ColdYieldStatus {
                requests: 1,
                at_bound: 0,
                seconds: 0.12
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cold_request_goes_at_the_bound_when_no_room_frees() {
        let (proxy, _guard) = full_pod();
        let (ctx, mut endpoints, mut c) = ranked(&proxy);
        let runtime = &proxy.pools[0];
        let policy = RoutePolicy::from(Policy::Precise);
        // A scrape wakes it on the way: the pod is still full, so it waits on.
        let pod = endpoints[0].clone();
        let scrape = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            pod.set_engine_load(1, 1, 0.9);
        };
        let ((decision, waited), ()) = tokio::join!(
            hold(&proxy.index, runtime, policy, &ctx, &mut endpoints, &mut c),
            scrape
        );
        assert_eq!(decision.expect("a pod").ranked[0].0, 0);
        assert_eq!(waited, DEFAULT_COLD_YIELD);
        let status = runtime.cold_yields.status();
        assert_eq!((status.requests, status.at_bound), (1, 1));
    }
}
