//! The table rule on exact inputs: slot apportionment, the shed hysteresis, affinity and
//! backend sets, deadlines, pods that left, and the diff.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    time::{Duration, Instant},
};

use super::*;

fn pod(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 231, 0, n], 8000))
}

const VIP: &str = "10.96.0.10:8000";

fn vip() -> SocketAddr {
    VIP.parse().unwrap()
}

fn member(n: u8, ready: bool, load: u32) -> Member {
    Member {
        addr: pod(n),
        ready,
        load,
    }
}

fn set(pods: &[u8]) -> Vec<SocketAddr> {
    pods.iter().map(|&n| pod(n)).collect()
}

#[test]
fn slots_repeat_pods_in_proportion_within_four() {
    assert_eq!(slots(&[(pod(1), 10), (pod(2), 5)]), set(&[1, 1, 2]));
    assert_eq!(slots(&[(pod(1), 4), (pod(2), 0)]), set(&[1]));
    assert_eq!(slots(&[(pod(1), 3), (pod(2), 3)]), set(&[1, 2]));
    // 7:3 over 4 slots: 2.8 and 1.2, the remaining slot to the larger remainder.
    assert_eq!(slots(&[(pod(1), 7), (pod(2), 3)]), set(&[1, 1, 1, 2]));
    // 9:1: 3.6 and 0.4; the last slot goes to the first pod, the second gets none.
    assert_eq!(slots(&[(pod(1), 9), (pod(2), 1)]), set(&[1, 1, 1, 1]));
    // Five equal pods: the first four, once each.
    let five: Vec<_> = (1..=5).map(|n| (pod(n), 1)).collect();
    assert_eq!(slots(&five), set(&[1, 2, 3, 4]));
    assert_eq!(slots(&[]), Vec::<SocketAddr>::new());
    assert_eq!(slots(&[(pod(1), 0)]), Vec::<SocketAddr>::new());
}

#[test]
fn a_much_busier_pod_is_shed_and_comes_back_only_well_below() {
    let none = BTreeSet::new();
    // Others' mean 2: shed at >= 2 * 2 + 4 = 8.
    let pools = vec![vec![member(1, true, 7), member(2, true, 2)]];
    assert_eq!(shed(&pools, &none), BTreeSet::new());
    let pools = vec![vec![member(1, true, 8), member(2, true, 2)]];
    let once = shed(&pools, &none);
    assert_eq!(once, BTreeSet::from([pod(1)]));
    // Back only at <= 1.5 * 2 + 2 = 5: at 6 it stays shed, at 5 it is usable.
    let pools = vec![vec![member(1, true, 6), member(2, true, 2)]];
    assert_eq!(shed(&pools, &once), BTreeSet::from([pod(1)]));
    let pools = vec![vec![member(1, true, 5), member(2, true, 2)]];
    assert_eq!(shed(&pools, &once), BTreeSet::new());
    // A lone ready pod is never shed, nor are unready ones counted as others.
    let pools = vec![vec![member(1, true, 50), member(2, false, 0)]];
    assert_eq!(shed(&pools, &none), BTreeSet::new());
}

#[test]
fn affinity_keeps_usable_learned_pods_of_fresh_clients() {
    let t0 = Instant::now();
    let v6: SocketAddr = "[fd00:96::10]:8000".parse().unwrap();
    let clients = vec![
        // Served by 2 (6 times) and 1 (twice); 3 is not ready.
        Client {
            cgroup_id: 1,
            vip: vip(),
            pods: vec![(pod(2), 6), (pod(1), 2), (pod(3), 1)],
            last: t0 + Duration::from_secs(60),
        },
        // Only an unready pod: no entry (the backend set takes it).
        Client {
            cgroup_id: 2,
            vip: vip(),
            pods: vec![(pod(3), 5)],
            last: t0 + Duration::from_secs(60),
        },
        // Not seen for longer than the deadline.
        Client {
            cgroup_id: 3,
            vip: vip(),
            pods: vec![(pod(1), 5)],
            last: t0,
        },
        // An IPv6 VIP: IPv4 pods cannot serve it.
        Client {
            cgroup_id: 4,
            vip: v6,
            pods: vec![(pod(1), 5)],
            last: t0 + Duration::from_secs(60),
        },
        // Listed twice (adopted, then learned later): the later one wins.
        Client {
            cgroup_id: 5,
            vip: vip(),
            pods: vec![(pod(1), 1)],
            last: t0 + Duration::from_secs(50),
        },
        Client {
            cgroup_id: 5,
            vip: vip(),
            pods: vec![(pod(2), 1)],
            last: t0 + Duration::from_secs(55),
        },
    ];
    let pools = vec![vec![
        member(1, true, 0),
        member(2, true, 0),
        member(3, false, 0),
    ]];
    let inputs = Inputs {
        now: t0 + Duration::from_secs(10 * 60 + 30),
        ttl: Duration::from_secs(10 * 60),
        clients: &clients,
        vips: &[(vip(), 0)],
        pools: &pools,
    };
    let table = desired(&inputs, &BTreeSet::new());
    assert_eq!(
        table.affinity,
        BTreeMap::from([((1, vip()), set(&[2, 2, 2, 1])), ((5, vip()), set(&[2])),])
    );
    assert_eq!(table.backends, BTreeMap::from([(vip(), set(&[1, 2]))]));

    // Pod 2 sheds: client 1 keeps only pod 1, client 5's entry is gone, the set is pod 1.
    let table = desired(&inputs, &BTreeSet::from([pod(2)]));
    assert_eq!(table.affinity, BTreeMap::from([((1, vip()), set(&[1]))]));
    assert_eq!(table.backends, BTreeMap::from([(vip(), set(&[1]))]));
}

#[test]
fn backend_sets_favour_the_least_loaded_and_follow_membership() {
    let t0 = Instant::now();
    let clients = vec![Client {
        cgroup_id: 1,
        vip: vip(),
        pods: vec![(pod(2), 4)],
        last: t0,
    }];
    let busy = vec![vec![
        member(1, true, 0),
        member(2, true, 5),
        member(4, true, 1),
    ]];
    let inputs = Inputs {
        now: t0,
        ttl: AFFINITY_TTL,
        clients: &clients,
        vips: &[(vip(), 0), ("10.96.0.11:8000".parse().unwrap(), 7)],
        pools: &busy,
    };
    // Least loaded first: 1 (load 0) and 4 (load 1) within the band weigh 2, pod 2 weighs
    // 1: 2:2:1 over four slots gives 2:1:1.
    let table = desired(&inputs, &BTreeSet::new());
    assert_eq!(
        table.backends,
        BTreeMap::from([(vip(), set(&[1, 1, 4, 2]))])
    );
    assert_eq!(table.affinity, BTreeMap::from([((1, vip()), set(&[2]))]));

    // Pod 2 left the pool: out of every entry at once; the emptied entry is deleted.
    let left = vec![vec![member(1, true, 0), member(4, true, 1)]];
    let after = desired(
        &Inputs {
            pools: &left,
            ..inputs
        },
        &BTreeSet::new(),
    );
    assert_eq!(after.backends, BTreeMap::from([(vip(), set(&[1, 4]))]));
    assert!(after.affinity.is_empty());
    assert_eq!(
        diff(&table, &after),
        Diff {
            set_affinity: vec![],
            remove_affinity: vec![(1, vip())],
            set_backends: vec![(vip(), set(&[1, 4]))],
            remove_backends: vec![],
        }
    );

    // Nothing ready: no backend set, and the written one is removed.
    let down = vec![vec![member(1, false, 0)]];
    let none = desired(
        &Inputs {
            pools: &down,
            ..inputs
        },
        &BTreeSet::new(),
    );
    assert_eq!(none, Table::default());
    assert_eq!(
        diff(&after, &none),
        Diff {
            remove_backends: vec![vip()],
            ..Diff::default()
        }
    );
    assert_eq!(diff(&none, &none), Diff::default());
}

#[test]
fn adopted_slots_count_back_to_weights() {
    assert_eq!(counted(&set(&[2, 2, 1, 2])), vec![(pod(2), 3), (pod(1), 1)]);
}

#[test]
fn policy_steers_every_vip_of_its_pools_but_not_the_flags() {
    let a: SocketAddr = "10.96.0.10:8000".parse().unwrap();
    let b: SocketAddr = "10.96.0.11:8000".parse().unwrap();
    let c: SocketAddr = "[fd00:96::10]:8000".parse().unwrap();
    let flagged: SocketAddr = "10.96.0.12:8000".parse().unwrap();
    // a and c serve pool 0, b pool 1, the flagged VIP pool 0.
    let vips = [(a, 0), (b, 1), (c, 0), (flagged, 0)];
    let fixed: BTreeSet<SocketAddr> = [flagged].into();
    assert_eq!(
        policy_steered(&vips, &fixed, |pool| pool == 0),
        BTreeSet::from([a, c])
    );
    assert_eq!(
        policy_steered(&vips, &fixed, |pool| pool == 1),
        BTreeSet::from([b])
    );
    assert!(policy_steered(&vips, &fixed, |_| false).is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_writer_wakes_at_once_on_a_pool_change_or_a_policy_and_else_on_its_tick() {
    use tokio::{sync::watch, time::Instant};

    let mut tick = tokio::time::interval(TABLE_INTERVAL);
    tick.tick().await; // an interval's first tick is immediate
    let (policy_tx, mut policies) = watch::channel(0u8);
    let (a_tx, a_rx) = watch::channel(0u64);
    let (b_tx, b_rx) = watch::channel(0u64);
    let mut pools = vec![a_rx, b_rx];
    let start = Instant::now();

    b_tx.send_modify(|n| *n += 1);
    assert_eq!(
        next_round(&mut tick, &mut policies, &mut pools).await,
        Wake::Members
    );
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "woken before any time passed"
    );

    // Nothing changed since: the tick, one interval after the start.
    assert_eq!(
        next_round(&mut tick, &mut policies, &mut pools).await,
        Wake::Tick
    );
    assert_eq!(start.elapsed(), Duration::from_millis(500));

    // A pool whose sender is gone is dropped from the wait, not a busy loop of wakes.
    drop(a_tx);
    assert_eq!(
        next_round(&mut tick, &mut policies, &mut pools).await,
        Wake::Tick
    );
    assert_eq!(start.elapsed(), Duration::from_millis(1000));
    assert_eq!(pools.len(), 1);

    policy_tx.send(1).unwrap();
    assert_eq!(
        next_round(&mut tick, &mut policies, &mut pools).await,
        Wake::Policy
    );
    assert_eq!(start.elapsed(), Duration::from_millis(1000));

    drop(policy_tx);
    assert_eq!(
        next_round(&mut tick, &mut policies, &mut pools).await,
        Wake::Exit
    );
}
