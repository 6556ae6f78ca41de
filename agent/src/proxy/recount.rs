//! Each pool's resident prefixes recounted on their pods every [`REFRESH`], off the request
//! path ([`crate::routing::resident`]): the table is held only to copy its prefixes and to
//! install the counts, and the index is read in between, so no request waits on a recount
//! (one index read per tracked prefix: up to 4,096 a pool).

use std::{sync::Arc, time::Instant};

use super::Proxy;
use crate::routing::resident::{REFRESH, tally};

/// Recounts every pool every [`REFRESH`], forever (until the task is aborted).
pub async fn recount_loop(proxy: Arc<Proxy>) {
    let mut tick = tokio::time::interval(REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        recount(&proxy, Instant::now());
    }
}

/// One recount of every pool. A pool whose requests' policies price no KV room tracks no
/// prefix ([`crate::routing::Policy::prices_kv_room`]): its recount is an empty copy.
pub fn recount(proxy: &Proxy, now: Instant) {
    for p in &proxy.pools {
        let prefixes = p.resident.lock().to_count(now);
        let counts = tally(&proxy.index, &prefixes);
        p.resident.lock().set_counts(counts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_index::RouterKey;

    #[test]
    fn a_recount_counts_each_pools_reused_prefixes_on_the_pods_holding_them() {
        let proxy = crate::proxy::candidates::tests::proxy();
        let p = &proxy.pools[0];
        let pods: Vec<_> = p.pool.endpoints().iter().filter_map(|e| e.source).collect();
        let now = Instant::now();
        // A 12-block prefix held by pod b and reused by a request.
        let keys: Vec<RouterKey> = (1..=12).map(RouterKey).collect();
        proxy.index.speculate(pods[1], &keys, now);
        p.resident.lock().reused(&keys, 12, now);
        let blocks = || {
            let r = p.resident.lock();
            pods.iter().map(|&s| r.blocks(s)).collect::<Vec<_>>()
        };
        // Nothing counted until a recount; then the 12 on b.
        assert_eq!(blocks(), [0, 0]);
        recount(&proxy, now);
        assert_eq!(blocks(), [0, 12]);
    }
}
