//! What an owner says about its pods reaches the replicas: a stalled event stream (the
//! engine owes events and sends none) is published as `stalled` and untrusted on the owner
//! and on every replica until the next batch; the owner's scraped load reaches the replicas'
//! `/status`. Gossip over chitchat's channel transport on tokio's paused clock, IndexSync
//! over real gRPC on loopback, as in the parent module.

use std::{sync::Arc, time::Duration};

use chitchat::transport::ChannelTransport;

use super::{gossip_addr, settings, wait_for};
use crate::{
    cluster::{
        ClusterNode, LocalPod,
        facts::LoadFact,
        now, spawn_load_publisher,
        sync::tests::{blocks, stored},
    },
    kv_index::{DEFAULT_STALL_AFTER, IndexConfig, KvIndex, SourceInfo},
};

const BASE: u16 = 15_000;
const POD: &str = "10.0.0.9:8000";

#[tokio::test(start_paused = true)]
async fn a_stalled_pod_is_published_and_untrusted_everywhere_until_its_next_batch() {
    let transport = ChannelTransport::with_mtu(65_507);
    let info = || SourceInfo {
        pod: POD.into(),
        rank: None,
    };
    let (ia, ib) = (
        Arc::new(KvIndex::new(IndexConfig::default())),
        Arc::new(KvIndex::new(IndexConfig::default())),
    );
    let (pa, pb) = (ia.add_source(info()), ib.add_remote_source(info()));
    let local = vec![LocalPod {
        id: POD.into(),
        model: "m".into(),
        source: pa,
    }];
    let start = |i, index, local, remote| {
        ClusterNode::start(
            settings(i, 1, gossip_addr(i, BASE), gossip_addr(0, BASE)),
            index,
            local,
            remote,
            &transport,
        )
    };
    let a = start(0, ia.clone(), local, Vec::new()).await.expect("A");
    let b = start(1, ib.clone(), Vec::new(), vec![(POD.to_string(), pb)])
        .await
        .expect("B");
    let limit = Duration::from_secs(30);
    let (batch, keys) = stored(4, 300);
    ia.apply(pa, &batch, 0);
    wait_for(limit, || blocks(&ib, pb, &keys) == 4 && ib.trusted(pb)).await;

    // The owner's load, from its scrapes (a fixed figure here), reaches B's report.
    let load = LoadFact {
        running: 3,
        waiting: 1,
        kv_permille: 410,
    };
    let _loads = spawn_load_publisher(&a, Arc::new(move |_: &str| Some(load)));
    let report = b.report();
    wait_for(limit, || {
        report.status()["remote_pods"][0]["owner_load"]
            == serde_json::json!({"running": 3, "waiting": 1, "kv_cache_usage": 0.41})
    })
    .await;
    assert_eq!(report.status()["remote_pods"][0]["owner"], "agent-0");

    // A request routed to the pod adds blocks it did not hold and the engine answers it:
    // the engine owes their events.
    let (_, owed) = stored(6, 400);
    ia.owe(
        ia.speculate(pa, &owed, now())
            .expect("blocks new to the pod"),
    );
    tokio::time::sleep(DEFAULT_STALL_AFTER).await;
    // The agent's sweep (every 250 ms in `warmpath agent`) finds it stalled.
    ia.sweep(now());
    assert!(!ia.trusted(pa), "the owner stops trusting its own source");
    assert_eq!(a.report().status()["local_pods"][0]["health"], "stalled");
    let took = wait_for(limit, || !ib.trusted(pb)).await;
    eprintln!("a stalled pod: untrusted on the replica {took:?} after the owner's sweep");
    let reason = ib
        .status()
        .into_iter()
        .find(|(id, _)| *id == pb)
        .and_then(|(_, s)| s.reason)
        .unwrap_or_default();
    assert_eq!(reason, "owner agent-0: the pod's KV events are stalled");
    assert_eq!(report.status()["remote_pods"][0]["owner_health"], "stalled");
    // The replica's copy is kept (the stream may only be late), and counts for nothing.
    assert_eq!(blocks(&ib, pb, &keys), 4);

    // The engine's events come: trusted again on both.
    let (late, _) = stored(6, 400);
    ia.apply(pa, &late, 1);
    assert!(ia.trusted(pa));
    wait_for(limit, || ib.trusted(pb) && blocks(&ib, pb, &owed) == 6).await;
    assert_eq!(report.status()["remote_pods"][0]["owner_health"], "healthy");
}
