//! Pods that come and go (docs/cluster.md): agents started with no pods, their sets changed
//! with `ClusterNode::set_pods` while they run. Gossip over chitchat's channel transport on
//! tokio's paused clock, IndexSync over real gRPC on loopback, as in the parent module.

use std::{future::Future, sync::Arc, time::Duration};

use chitchat::transport::{ChannelTransport, Transport};

use super::{INTERVAL, gossip_addr, settings, wait_for};
use crate::{
    cluster::{
        ClusterNode, LocalPod, Refused, now,
        sync::{
            client::{Upstream, replicate},
            tests::{blocks, stored},
        },
    },
    kv_index::{IndexConfig, KvIndex, RouterKey, SourceId, SourceInfo, Watermark},
};

const BASE: u16 = 14_000;
const POD: &str = "10.0.0.7:8000";

struct Agent {
    node: ClusterNode,
    index: Arc<KvIndex>,
}

async fn start_empty(i: usize, transport: &dyn Transport) -> Agent {
    let index = Arc::new(KvIndex::new(IndexConfig::default()));
    let node = ClusterNode::start(
        settings(i, 1, gossip_addr(i, BASE), gossip_addr(0, BASE)),
        index.clone(),
        Vec::new(),
        Vec::new(),
        transport,
    )
    .await
    .expect("starts");
    Agent { node, index }
}

fn info(pod: &str) -> SourceInfo {
    SourceInfo {
        pod: pod.into(),
        rank: None,
    }
}

fn local(source: SourceId) -> Vec<LocalPod> {
    vec![LocalPod {
        id: POD.into(),
        model: "m".into(),
        source,
    }]
}

fn state(index: &KvIndex, source: SourceId) -> &'static str {
    index
        .status()
        .into_iter()
        .find(|(id, _)| *id == source)
        .map_or("absent", |(_, s)| s.state)
}

/// The router keys a source holds, sorted.
fn held(index: &KvIndex, source: SourceId) -> Vec<RouterKey> {
    let mut keys: Vec<RouterKey> = index
        .source_keys(source)
        .into_iter()
        .map(|(_, k, _)| k)
        .collect();
    keys.sort_unstable();
    keys
}

fn sorted(keys: &[RouterKey]) -> Vec<RouterKey> {
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    keys
}

/// Waits (virtual time) until the async `cond` holds.
async fn eventually<F: Future<Output = bool>>(limit: Duration, mut cond: impl FnMut() -> F) {
    tokio::time::timeout(limit, async {
        while !cond().await {
            tokio::time::sleep(INTERVAL / 5).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("condition not met within {limit:?}"));
}

/// Whether `agent` sees `owner` publishing [`POD`] (or not).
async fn sees_claim(agent: &Agent, owner: &str) -> bool {
    agent
        .node
        .view()
        .await
        .peers
        .get(owner)
        .is_some_and(|p| p.pods.contains_key(POD))
}

#[tokio::test(start_paused = true)]
async fn a_pod_added_at_run_time_replicates_leaves_and_comes_back() {
    let transport = ChannelTransport::with_mtu(65_507);
    let a = start_empty(0, &transport).await;
    let b = start_empty(1, &transport).await;
    let c = start_empty(2, &transport).await;
    let limit = Duration::from_secs(30);

    // Agent A gets the pod (its node's), agent B replicates it.
    let pa = a.index.add_source(info(POD));
    let changed = a.node.set_pods(local(pa), Vec::new());
    assert_eq!((changed.local_added, changed.local_removed), (1, 0));
    let pb = b.index.add_remote_source(info(POD));
    let changed = b.node.set_pods(Vec::new(), vec![(POD.into(), pb)]);
    assert_eq!((changed.remote_added, changed.remote_removed), (1, 0));
    let (batch, keys) = stored(8, 100);
    a.index.apply(pa, &batch, 0);
    let took = wait_for(limit, || {
        blocks(&b.index, pb, &keys) == 8 && b.index.trusted(pb)
    })
    .await;
    eprintln!("a pod added at run time: replicated to B {took:?} after the sets were given");
    assert_eq!(b.node.owner(POD).as_deref(), Some("agent-0"));
    assert_eq!(
        held(&b.index, pb),
        sorted(&keys),
        "B holds what A's engine stored"
    );
    let first = a.index.watermark(pa).expect("journaled");
    assert_eq!(
        first.incarnation,
        1 << 16,
        "the first journal of incarnation 1"
    );

    // Agent C names the pod after A publishes it, and replicates it too.
    eventually(limit, || sees_claim(&c, "agent-0")).await;
    let pc = c.index.add_remote_source(info(POD));
    c.node.set_pods(Vec::new(), vec![(POD.into(), pc)]);
    wait_for(limit, || blocks(&c.index, pc, &keys) == 8).await;
    assert_eq!(c.node.owner(POD).as_deref(), Some("agent-0"));

    // C's placement on the pod reaches its owner and B.
    let cold: Vec<RouterKey> = (1..=6).map(|k| RouterKey(0xC01D_0000 + k)).collect();
    c.index.speculate(pc, &cold, now());
    wait_for(limit, || {
        blocks(&a.index, pa, &cold) == 6 && blocks(&b.index, pb, &cold) == 6
    })
    .await;

    // A's pod leaves A's set: retracted; B and C empty their copies and forget the owner.
    let changed = a.node.set_pods(Vec::new(), Vec::new());
    assert_eq!((changed.local_added, changed.local_removed), (0, 1));
    let took = wait_for(limit, || {
        [(&b, pb), (&c, pc)].iter().all(|(x, s)| {
            x.node.owner(POD).is_none()
                && blocks(&x.index, *s, &keys) == 0
                && state(&x.index, *s) == "waiting"
        })
    })
    .await;
    eprintln!("a pod removed from its owner: B's and C's copies emptied {took:?} later");
    // Bound: the owner publishes at once, then chitchat spreads the retraction.
    assert!(took <= INTERVAL * 6, "{took:?}");
    // A's engine goes on storing while the pod is out of A's set.
    let (later, later_keys) = stored(2, 300);
    a.index.apply(pa, &later, 1);

    // Back in A's set: a new journal incarnation, and both copies converge on everything A
    // holds (the first chain, the placement that A's engine did not confirm aside, and the
    // one stored while it was out).
    a.node.set_pods(local(pa), Vec::new());
    let again = a.index.watermark(pa).expect("journaled");
    assert_eq!(
        again.incarnation,
        2 << 16,
        "the second journal of incarnation 1"
    );
    let took = wait_for(limit, || {
        [&b, &c]
            .iter()
            .all(|x| x.node.owner(POD).as_deref() == Some("agent-0"))
    })
    .await;
    eprintln!("re-added: B and C know its owner again {took:?} later (gossip)");
    let took = wait_for(limit, || {
        [(&b, pb), (&c, pc)].iter().all(|(x, s)| {
            blocks(&x.index, *s, &keys) == 8
                && blocks(&x.index, *s, &later_keys) == 2
                && x.index.trusted(*s)
        })
    })
    .await;
    eprintln!("re-added: then B and C took the snapshot {took:?} later");
    let mut all = keys.clone();
    all.extend(&later_keys);
    assert_eq!(held(&b.index, pb), sorted(&all));

    // B drops the pod from its remote set: nothing of it kept, its stream stops; C goes on.
    let changed = b.node.set_pods(Vec::new(), Vec::new());
    assert_eq!((changed.remote_added, changed.remote_removed), (0, 1));
    assert_eq!(b.node.pods(), (Vec::new(), Vec::new()));
    assert_eq!(b.node.owner(POD), None);
    assert!(held(&b.index, pb).is_empty(), "the copy is emptied at once");
    let (last, last_keys) = stored(3, 600);
    a.index.apply(pa, &last, 2);
    wait_for(limit, || blocks(&c.index, pc, &last_keys) == 3).await;
    assert_eq!(blocks(&b.index, pb, &last_keys), 0);
    assert!(held(&b.index, pb).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_remote_pod_named_before_its_owner_publishes_it_converges_once_it_does() {
    let transport = ChannelTransport::with_mtu(65_507);
    let a = start_empty(0, &transport).await;
    let b = start_empty(1, &transport).await;
    let limit = Duration::from_secs(30);
    let pb = b.index.add_remote_source(info(POD));
    b.node.set_pods(Vec::new(), vec![(POD.into(), pb)]);
    // B knows A, and A claims nothing: the pod waits for an owner.
    eventually(limit, || async {
        b.node.view().await.peers.contains_key("agent-0")
    })
    .await;
    assert_eq!(b.node.owner(POD), None);
    assert_eq!(state(&b.index, pb), "waiting");

    // A's engine stored blocks before A took the pod: the snapshot carries them.
    let pa = a.index.add_source(info(POD));
    let (batch, keys) = stored(5, 700);
    a.index.apply(pa, &batch, 0);
    a.node.set_pods(local(pa), Vec::new());
    let took = wait_for(limit, || b.node.owner(POD).as_deref() == Some("agent-0")).await;
    eprintln!("owner took the pod: B knows it {took:?} later (gossip)");
    let took = wait_for(limit, || {
        blocks(&b.index, pb, &keys) == 5 && b.index.trusted(pb)
    })
    .await;
    eprintln!("then B replicated it {took:?} later");
    assert_eq!(b.node.owner(POD).as_deref(), Some("agent-0"));
    assert_eq!(held(&b.index, pb), sorted(&keys));
    assert_eq!(
        a.index.watermark(pa),
        Some(Watermark {
            incarnation: 1 << 16,
            sequence: 0
        }),
        "events before the journal are in no delta: only the snapshot has them"
    );
}

/// The owner's side alone: a stream that still asks for a pod after the owner dropped it
/// (a replica that has not heard yet) gets nothing more of it, and gets a snapshot when the
/// pod comes back (a new journal incarnation).
#[tokio::test(start_paused = true)]
async fn a_pod_no_longer_local_is_no_longer_served_and_a_returning_one_is_sent_whole() {
    let transport = ChannelTransport::with_mtu(65_507);
    let a = start_empty(0, &transport).await;
    let limit = Duration::from_secs(30);
    let other = "10.0.0.8:8000";
    let pa = a.index.add_source(info(POD));
    let qa = a.index.add_source(info(other));
    let both = |p: SourceId| {
        let mut pods = local(p);
        pods.push(LocalPod {
            id: other.into(),
            model: "m".into(),
            source: qa,
        });
        pods
    };
    a.node.set_pods(both(pa), Vec::new());
    // A replica that keeps asking for both pods: its index names agent-0 their owner.
    let replica = Arc::new(KvIndex::new(IndexConfig::default()));
    let (pr, qr) = (
        replica.add_remote_source(info(POD)),
        replica.add_remote_source(info(other)),
    );
    replica.set_owner(pr, Some("agent-0"));
    replica.set_owner(qr, Some("agent-0"));
    let (_placements, rx) = tokio::sync::mpsc::channel(1);
    let stream = tokio::spawn(replicate(
        Upstream {
            peer: "agent-0".into(),
            grpc: a.node.grpc_addr(),
            pods: vec![(POD.into(), pr), (other.into(), qr)],
        },
        replica.clone(),
        None,
        rx,
    ));
    let (p1, p1_keys) = stored(4, 100);
    let (q1, q1_keys) = stored(4, 200);
    a.index.apply(pa, &p1, 0);
    a.index.apply(qa, &q1, 0);
    wait_for(limit, || {
        blocks(&replica, pr, &p1_keys) == 4 && blocks(&replica, qr, &q1_keys) == 4
    })
    .await;

    // POD leaves A's set; A's engine stores on both pods.
    a.node.set_pods(both(pa).split_off(1), Vec::new());
    let (p2, p2_keys) = stored(3, 300);
    let (q2, q2_keys) = stored(3, 400);
    a.index.apply(pa, &p2, 1);
    a.index.apply(qa, &q2, 1);
    wait_for(limit, || blocks(&replica, qr, &q2_keys) == 3).await;
    // One more pass of the producer after the one that carried q2: anything it would have
    // sent of POD in that pass is on the stream before q3.
    let (q3, q3_keys) = stored(2, 500);
    a.index.apply(qa, &q3, 2);
    wait_for(limit, || blocks(&replica, qr, &q3_keys) == 2).await;
    assert_eq!(blocks(&replica, pr, &p2_keys), 0, "no longer served");
    assert_eq!(
        blocks(&replica, pr, &p1_keys),
        4,
        "the replica's copy is its own business"
    );

    // Back: a new incarnation, so the stream sends POD whole.
    a.node.set_pods(both(pa), Vec::new());
    wait_for(limit, || {
        blocks(&replica, pr, &p2_keys) == 3 && blocks(&replica, pr, &p1_keys) == 4
    })
    .await;
    let mut all = p1_keys.clone();
    all.extend(&p2_keys);
    assert_eq!(held(&replica, pr), sorted(&all));
    stream.abort();
}

#[tokio::test(start_paused = true)]
async fn local_pods_unfit_for_facts_or_listed_twice_are_left_out() {
    let transport = ChannelTransport::with_mtu(65_507);
    let a = start_empty(0, &transport).await;
    let s1 = a.index.add_source(info(POD));
    let s2 = a.index.add_source(info(POD));
    let s3 = a.index.add_source(info("bad pod"));
    let pods = vec![
        LocalPod {
            id: POD.into(),
            model: "m".into(),
            source: s1,
        },
        LocalPod {
            id: POD.into(),
            model: "m".into(),
            source: s2,
        },
        LocalPod {
            id: "bad pod".into(),
            model: "m".into(),
            source: s3,
        },
    ];
    let changed = a.node.set_pods(pods, vec![(POD.into(), s2)]);
    assert_eq!(changed.local_added, 1);
    assert_eq!(
        changed.remote_added, 0,
        "a pod owned here is not replicated"
    );
    assert_eq!(changed.refused.len(), 2);
    assert_eq!(
        changed.refused[0],
        Refused::Duplicate { pod: POD.into() },
        "the second entry"
    );
    assert!(
        changed.refused[1]
            .to_string()
            .contains("holds whitespace, a control character or '='"),
        "{}",
        changed.refused[1]
    );
    let (kept, remote) = a.node.pods();
    assert_eq!(
        kept.iter()
            .map(|p| (p.id.as_str(), p.source))
            .collect::<Vec<_>>(),
        vec![(POD, s1)]
    );
    assert!(remote.is_empty());
    assert!(a.index.watermark(s1).is_some());
    assert_eq!(a.index.watermark(s2), None);
    assert_eq!(a.index.watermark(s3), None);
}
