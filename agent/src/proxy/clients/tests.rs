use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use super::*;
use crate::telemetry::{Telemetry, TelemetryConfig};

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("test addresses are valid")
}

/// Two pool ids as the proxy gets them (registered with telemetry).
fn pools() -> (PoolId, PoolId) {
    let t = Telemetry::new(&TelemetryConfig::default()).expect("default telemetry starts");
    (t.register_pool("chat", "a"), t.register_pool("code", "b"))
}

const VIP: &str = "10.96.0.10:8000";
const A: &str = "10.1.0.1:8000";
const B: &str = "10.1.0.2:8000";
const C: &str = "10.1.0.3:8000";

/// `pods` of the one entry of `clients`.
fn pods_of(clients: &ClientPods) -> Vec<(SocketAddr, u32)> {
    let all = clients.snapshot(None);
    assert_eq!(all.len(), 1, "one client: {all:?}");
    all[0].pods.clone()
}

fn record_n(clients: &ClientPods, pool: PoolId, pod: &str, n: u32, at: Instant) {
    for _ in 0..n {
        clients.record(7, addr(VIP), pool, addr(pod), at);
    }
}

#[test]
fn pods_are_ordered_by_answered_requests_ties_first_come() {
    let (pool, _) = pools();
    let clients = ClientPods::new(16, 4);
    let now = Instant::now();
    record_n(&clients, pool, A, 1, now);
    record_n(&clients, pool, B, 1, now);
    assert_eq!(pods_of(&clients), vec![(addr(A), 1), (addr(B), 1)]);
    record_n(&clients, pool, B, 2, now);
    record_n(&clients, pool, C, 2, now);
    assert_eq!(
        pods_of(&clients),
        vec![(addr(B), 3), (addr(C), 2), (addr(A), 1)]
    );
    let entry = &clients.snapshot(None)[0];
    assert_eq!(
        (entry.cgroup_id, entry.vip, entry.pool, entry.last),
        (7, addr(VIP), pool, now)
    );
}

#[test]
fn a_new_pod_replaces_the_least_answered_when_full() {
    let (pool, _) = pools();
    let clients = ClientPods::new(16, 2);
    let now = Instant::now();
    record_n(&clients, pool, A, 2, now);
    record_n(&clients, pool, B, 1, now);
    record_n(&clients, pool, C, 1, now);
    assert_eq!(pods_of(&clients), vec![(addr(A), 2), (addr(C), 1)]);
}

#[test]
fn counts_halve_at_the_decay_point_so_a_moved_client_follows() {
    let (pool, _) = pools();
    let clients = ClientPods::new(16, 4);
    let now = Instant::now();
    record_n(&clients, pool, A, DECAY_AT - 1, now);
    record_n(&clients, pool, B, 3, now);
    assert_eq!(pods_of(&clients), vec![(addr(A), 15), (addr(B), 3)]);
    // A reaches 16: every count halves (3 -> 1).
    record_n(&clients, pool, A, 1, now);
    assert_eq!(pods_of(&clients), vec![(addr(A), 8), (addr(B), 1)]);
    // The client moved to B: eight more of its requests put B first.
    record_n(&clients, pool, B, 8, now);
    assert_eq!(pods_of(&clients), vec![(addr(B), 9), (addr(A), 8)]);
    // B at 16 halves both again; a pod at 1 halves to 0 and is dropped.
    record_n(&clients, pool, B, 6, now);
    record_n(&clients, pool, C, 1, now);
    assert_eq!(
        pods_of(&clients),
        vec![(addr(B), 15), (addr(A), 8), (addr(C), 1)]
    );
    record_n(&clients, pool, B, 1, now);
    assert_eq!(pods_of(&clients), vec![(addr(B), 8), (addr(A), 4)]);
}

#[test]
fn another_pool_starts_the_entry_afresh() {
    let (chat, code) = pools();
    let clients = ClientPods::new(16, 4);
    let now = Instant::now();
    record_n(&clients, chat, A, 3, now);
    record_n(&clients, code, B, 1, now);
    let all = clients.snapshot(None);
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].pool, all[0].pods.clone()),
        (code, vec![(addr(B), 1)])
    );
}

#[test]
fn the_least_recently_recorded_client_is_evicted_at_capacity() {
    let (pool, _) = pools();
    let clients = ClientPods::new(3, 4);
    assert_eq!(clients.capacity(), 3);
    let now = Instant::now();
    for cgroup in [1, 2, 3] {
        clients.record(cgroup, addr(VIP), pool, addr(A), now);
    }
    // 1 is touched again, so 2 is the least recent when 4 comes.
    clients.record(1, addr(VIP), pool, addr(A), now);
    clients.record(4, addr(VIP), pool, addr(B), now);
    let held: Vec<(u64, u32)> = clients
        .snapshot(None)
        .iter()
        .map(|e| (e.cgroup_id, e.pods[0].1))
        .collect();
    assert_eq!(held, vec![(1, 2), (3, 1), (4, 1)]);
    assert_eq!(clients.len(), 3);
}

#[test]
fn the_same_cgroup_dialling_two_vips_is_two_clients() {
    let (pool, _) = pools();
    let clients = ClientPods::new(16, 4);
    let now = Instant::now();
    clients.record(1, addr("10.96.0.10:8000"), pool, addr(A), now);
    clients.record(1, addr("[fd00::10]:8000"), pool, addr(B), now);
    let vips: Vec<SocketAddr> = clients.snapshot(None).iter().map(|e| e.vip).collect();
    assert_eq!(vips, vec![addr("10.96.0.10:8000"), addr("[fd00::10]:8000")]);
}

#[test]
fn capacity_is_split_over_shards_without_exceeding_the_kernel_map() {
    assert_eq!(ClientPods::default().capacity(), 65_536);
    assert_eq!(ClientPods::new(65_536, 4).shards.len(), 16);
    assert_eq!(ClientPods::new(5000, 4).shards.len(), 4);
    assert_eq!(ClientPods::new(5000, 4).capacity(), 5000);
    assert_eq!(ClientPods::new(1500, 4).shards.len(), 1);
    assert_eq!(ClientPods::new(0, 0).capacity(), 1);
}

#[test]
fn many_clients_stay_within_capacity() {
    let (pool, _) = pools();
    let clients = ClientPods::new(2048, 4);
    let now = Instant::now();
    for cgroup in 0..10_000 {
        clients.record(cgroup, addr(VIP), pool, addr(A), now);
    }
    assert_eq!(clients.len(), 2048);
}

#[test]
fn snapshot_since_returns_only_recent_clients() {
    let (pool, _) = pools();
    let clients = ClientPods::new(16, 4);
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_secs(1);
    clients.record(1, addr(VIP), pool, addr(A), t0);
    clients.record(2, addr(VIP), pool, addr(A), t1);
    let recent: Vec<u64> = clients
        .snapshot(Some(t1))
        .iter()
        .map(|e| e.cgroup_id)
        .collect();
    assert_eq!(recent, vec![2]);
    assert_eq!(clients.snapshot(None).len(), 2);
    // A late record with an earlier time does not move `last` back.
    clients.record(2, addr(VIP), pool, addr(A), t0);
    assert_eq!(clients.snapshot(Some(t1))[0].last, t1);
}

#[test]
fn forget_pod_drops_it_everywhere_and_empty_clients_with_it() {
    let (pool, _) = pools();
    let clients = ClientPods::new(16, 4);
    let now = Instant::now();
    clients.record(1, addr(VIP), pool, addr(A), now);
    clients.record(1, addr(VIP), pool, addr(A), now);
    clients.record(1, addr(VIP), pool, addr(B), now);
    clients.record(2, addr(VIP), pool, addr(A), now);
    clients.forget_pod(addr(A));
    let left: Vec<(u64, Vec<(SocketAddr, u32)>)> = clients
        .snapshot(None)
        .into_iter()
        .map(|e| (e.cgroup_id, e.pods))
        .collect();
    assert_eq!(left, vec![(1, vec![(addr(B), 1)])]);
    assert_eq!(clients.len(), 1);
    assert!(!clients.is_empty());
}

#[test]
fn answers_are_learned_from_ip_pods_only() {
    let (pool, _) = pools();
    let clients = std::sync::Arc::new(ClientPods::new(16, 4));
    let learning = Learning::new(&clients, 9, addr(VIP));
    let now = Instant::now();
    learning.answered(pool, "engine.local:8000", now);
    assert!(clients.is_empty(), "a host name is no kernel-table backend");
    learning.answered(pool, "[fd00::1]:8000", now);
    learning.answered(pool, A, now);
    learning.answered(pool, A, now);
    let all = clients.snapshot(None);
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].cgroup_id, all[0].vip, all[0].pods.clone()),
        (
            9,
            addr(VIP),
            vec![(addr(A), 2), (addr("[fd00::1]:8000"), 1)]
        )
    );
}
