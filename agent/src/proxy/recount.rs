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
