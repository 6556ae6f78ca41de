use std::time::Duration;

use super::*;

fn name(c: Class) -> Arc<str> {
    Arc::from(format!("t{}", c.tenant))
}

fn limits(max_concurrent: usize, max_queued: usize, queue_ms: u64) -> Limits {
    Limits {
        max_concurrent,
        max_queued,
        queue_timeout: Duration::from_millis(queue_ms),
        ..Limits::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_agent_queues_then_refuses_with_a_retry_hint() {
    let a = Admission::new(limits(2, 1, 1500));
    let p1 = a.admit().await.unwrap().expect("counted");
    let _p2 = a.admit().await.unwrap().expect("counted");
    assert_eq!(a.active(), 2);
    // The third waits; a fourth finds the queue full and is refused at once.
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.admit().await }
    });
    tokio::task::yield_now().await;
    assert_eq!(a.waiting.load(Ordering::Relaxed), 1);
    let full = a.admit().await.unwrap_err();
    assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(full.retry_after, Some(2), "1.5 s rounded up");
    assert_eq!(a.refused(Refused::QueueFull), 1);
    // A released slot goes to the waiter.
    drop(p1);
    let p3 = waiter.await.unwrap().unwrap();
    assert!(p3.is_some());
    assert_eq!(a.active(), 2);
    assert_eq!(a.waiting.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gives_up_at_the_queue_timeout_not_before() {
    let a = Admission::new(limits(1, 4, 300));
    let _held = a.admit().await.unwrap();
    let start = tokio::time::Instant::now();
    let err = a.admit().await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(err.message.contains("300 ms"), "{}", err.message);
    assert_eq!(a.refused(Refused::QueueTimeout), 1);
    assert_eq!(a.waiting.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order_and_none_is_lost() {
    let a = Admission::new(limits(1, 8, 10_000));
    let first = a.admit().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..5 {
        let (a, tx) = (a.clone(), tx.clone());
        tokio::spawn(async move {
            let p = a.admit().await.unwrap();
            tx.send(i).unwrap();
            // Hold the slot a moment, then pass it on.
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(p);
        });
        tokio::task::yield_now().await;
    }
    drop(first);
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(rx.recv().await.unwrap());
    }
    assert_eq!(order, [0, 1, 2, 3, 4]);
    assert_eq!(a.refused(Refused::QueueTimeout), 0);
}

#[tokio::test]
async fn no_limit_counts_nothing() {
    let a = Admission::new(limits(0, 0, 0));
    for _ in 0..100 {
        assert!(a.admit().await.unwrap().is_none());
    }
    assert_eq!(a.active(), 0);
}

#[tokio::test]
async fn a_held_body_keeps_its_slot_until_dropped() {
    let a = Admission::new(limits(1, 0, 1));
    let permit = a.admit().await.unwrap().unwrap();
    let body = hold(
        crate::http::message::full(StatusCode::OK, "text/plain", "x").into_body(),
        Some(permit),
    );
    assert_eq!(a.admit().await.unwrap_err().status, 429);
    drop(body);
    assert!(a.admit().await.unwrap().is_some());
}

#[test]
fn retry_after_rounds_up_to_whole_seconds() {
    assert_eq!(retry_after(Duration::ZERO), 1);
    assert_eq!(retry_after(Duration::from_millis(1)), 1);
    assert_eq!(retry_after(Duration::from_millis(2000)), 2);
    assert_eq!(retry_after(Duration::from_millis(2001)), 3);
}

fn class(tenant: u32, priority: i32, weight: u32) -> Class {
    Class {
        tenant,
        priority,
        weight,
    }
}

/// Queues one waiter per class (in order, each in the queue before the next arrives); each
/// reports its tenant when granted and releases its slot at once.
async fn queue_all(
    a: &Arc<Admission>,
    classes: &[Class],
) -> tokio::sync::mpsc::UnboundedReceiver<u32> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let before = a.waiting();
    for &c in classes {
        let (a, tx) = (a.clone(), tx.clone());
        tokio::spawn(async move {
            let p = a.admit_as(c, &name(c)).await.unwrap();
            tx.send(c.tenant).unwrap();
            drop(p);
        });
        tokio::task::yield_now().await;
    }
    assert_eq!(a.waiting(), before + classes.len());
    rx
}

#[tokio::test(start_paused = true)]
async fn backlogged_tenants_get_slots_in_proportion_to_their_weights() {
    let a = Admission::new(limits(1, 100, 60_000));
    let held = a.admit().await.unwrap();
    let classes: Vec<Class> = (0..20)
        .flat_map(|_| [class(1, 0, 3), class(2, 0, 1)])
        .collect();
    let mut rx = queue_all(&a, &classes).await;
    drop(held);
    let mut order = Vec::new();
    for _ in 0..40 {
        order.push(rx.recv().await.unwrap());
    }
    // While both are backlogged (tenant 1's 20 last 26 grants), every 4 grants: 3 and 1.
    for window in order[..24].chunks(4) {
        assert_eq!(window.iter().filter(|&&t| t == 1).count(), 3, "{order:?}");
    }
    assert_eq!(order.iter().filter(|&&t| t == 1).count(), 20);
    assert_eq!((a.active(), a.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_higher_priority_waiter_overtakes_earlier_ones() {
    let a = Admission::new(limits(1, 100, 60_000));
    let held = a.admit().await.unwrap();
    let classes = [
        class(1, 0, 1),
        class(2, 0, 1),
        class(3, 0, 1000),
        class(9, 1, 1),
    ];
    let mut rx = queue_all(&a, &classes).await;
    drop(held);
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(rx.recv().await.unwrap());
    }
    assert_eq!(order, [9, 1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn a_classed_waiter_still_times_out_with_a_429_and_leaves_nothing_behind() {
    let a = Admission::new(limits(1, 4, 250));
    let held = a.admit().await.unwrap();
    let err = a
        .admit_as(class(5, 3, 7), &name(class(5, 3, 7)))
        .await
        .unwrap_err();
    assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(err.retry_after, Some(1));
    assert_eq!(a.refused(Refused::QueueTimeout), 1);
    assert!(a.queue.lock().order.is_empty());
    drop(held);
    assert_eq!((a.active(), a.waiting()), (0, 0));
    assert!(a.admit().await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_slot_handed_over_at_the_deadline_admits_the_waiter() {
    let a = Admission::new(limits(1, 4, 1000));
    let held = a.admit().await.unwrap();
    let waiter_tenant = name(class(1, 0, 1));
    let mut waiter = Box::pin(a.admit_as(class(1, 0, 1), &waiter_tenant));
    assert!(futures::poll!(waiter.as_mut()).is_pending());
    // The deadline passes and the slot is released before the waiter runs again.
    tokio::time::advance(Duration::from_millis(1000)).await;
    drop(held);
    let p = waiter.await.unwrap();
    assert!(p.is_some());
    assert_eq!((a.active(), a.waiting()), (1, 0));
    assert_eq!(a.refused(Refused::QueueTimeout), 0);
    drop(p);
    assert_eq!(a.active(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_passes_a_slot_it_was_handed_to_the_next() {
    let a = Admission::new(limits(1, 4, 10_000));
    let held = a.admit().await.unwrap();
    let first_tenant = name(class(1, 0, 1));
    let mut first = Box::pin(a.admit_as(class(1, 0, 1), &first_tenant));
    assert!(futures::poll!(first.as_mut()).is_pending());
    let mut rx = queue_all(&a, &[class(2, 0, 1)]).await;
    // Released to `first`, which is dropped (its client went away) before it runs.
    drop(held);
    drop(first);
    assert_eq!(rx.recv().await, Some(2));
    assert_eq!((a.active(), a.waiting()), (0, 0));
    // Cancelled while still queued: it just leaves.
    let held = a.admit().await.unwrap();
    let gone_tenant = name(class(3, 0, 1));
    let mut gone = Box::pin(a.admit_as(class(3, 0, 1), &gone_tenant));
    assert!(futures::poll!(gone.as_mut()).is_pending());
    drop(gone);
    assert!(a.queue.lock().order.is_empty());
    assert_eq!(a.waiting(), 0);
    drop(held);
    assert_eq!(a.active(), 0);
}

/// Releases, arrivals and timeouts racing on four threads: every request is admitted or
/// refused, and no slot or place is left over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_releases_and_timeouts_lose_no_slot() {
    let a = Admission::new(limits(3, 32, 2));
    let mut tasks = Vec::new();
    for i in 0..600u32 {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let c = class(i % 5, (i % 3) as i32, 1 + i % 4);
            match a.admit_as(c, &name(c)).await {
                Ok(p) => {
                    for _ in 0..(i % 4) {
                        tokio::task::yield_now().await;
                    }
                    drop(p);
                    true
                }
                Err(e) => {
                    assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
                    false
                }
            }
        }));
    }
    let outcomes = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(tasks))
        .await
        .expect("600 short requests finish within a minute");
    let admitted = outcomes.iter().filter(|o| *o.as_ref().unwrap()).count() as u64;
    let refused = a.refused(Refused::QueueFull) + a.refused(Refused::QueueTimeout);
    assert_eq!(admitted + refused, 600);
    assert_eq!((a.active(), a.waiting()), (0, 0));
    assert!(a.queue.lock().order.is_empty());
    // Every slot came back: the whole capacity can be taken again, and no more.
    let all: Vec<_> = (0..3).map(|_| a.try_take()).collect();
    assert_eq!(all, [true, true, true]);
    assert!(!a.try_take());
}

fn gated(max_concurrent: usize, cluster: usize) -> Limits {
    Limits {
        cluster_max_concurrent: cluster,
        ..limits(max_concurrent, 64, 60_000)
    }
}

fn contention(priority: i32, weight: u32, demand: u32) -> Contention {
    Contention {
        priority,
        weight,
        demand,
    }
}

#[tokio::test]
async fn the_cluster_gate_holds_a_tenant_to_its_share_and_hands_slots_on_by_it() {
    // Cluster-wide 4 slots; a peer's tenant of priority 5 has 3 of them in demand. Here,
    // `low` (priority 0) may hold 4 - 3 = 1 once the gate knows; `high` (priority 5, here
    // too) may hold its part.
    let a = Admission::new(gated(100, 4));
    let low = class(1, 0, 1);
    // Alone: no cap; three of `low` start.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(a.admit_as(low, &name(low)).await.unwrap().expect("counted"));
    }
    assert_eq!(a.cluster_cap("t1"), None);
    // A round: `low` published with 3, the peer's `high` with 3: `low`'s share is 1.
    assert_eq!(a.take_round(), vec![(name(low), contention(0, 1, 3))]);
    let remote = HashMap::from([(Arc::from("t2"), vec![contention(5, 1, 3)])]);
    a.set_remote_contention(remote, Duration::from_secs(60));
    assert_eq!(a.cluster_cap("t1"), Some(1));
    // Three held, cap 1: a fourth waits though 97 agent slots are free.
    let fourth_tenant = name(low);
    let mut fourth = Box::pin(a.admit_as(low, &fourth_tenant));
    assert!(futures::poll!(&mut fourth).is_pending());
    assert_eq!(a.waiting(), 1);
    // Releases down to the cap keep it waiting; the one below lets it start.
    held.pop();
    held.pop();
    assert!(futures::poll!(&mut fourth).is_pending());
    held.pop();
    let p = fourth.await.unwrap().expect("counted");
    assert_eq!(a.active(), 1);
    drop(p);
    // A stale view (fresh for 0) turns the gate off.
    a.set_remote_contention(
        HashMap::from([(Arc::from("t2"), vec![contention(5, 1, 3)])]),
        Duration::ZERO,
    );
    assert_eq!(a.cluster_cap("t1"), None);
}

/// Cluster-wide 4 slots; `low` (tenant 1) holds one while a peer's priority-5 tenant has 10
/// in demand: `low` is held to the floor of 1.
async fn held_to_the_floor() -> (Arc<Admission>, Option<Permit>) {
    let a = Admission::new(gated(100, 4));
    let low = class(1, 0, 1);
    let held = a.admit_as(low, &name(low)).await.unwrap();
    a.take_round();
    let busy = HashMap::from([(Arc::from("t2"), vec![contention(5, 1, 10)])]);
    a.set_remote_contention(busy, Duration::from_secs(60));
    assert_eq!(a.cluster_cap("t1"), Some(1), "shut out: the floor of 1");
    (a, held)
}

#[tokio::test]
async fn caps_that_rise_let_waiters_start() {
    let (a, _held) = held_to_the_floor().await;
    let low = class(1, 0, 1);
    let second_tenant = name(low);
    let mut second = Box::pin(a.admit_as(low, &second_tenant));
    assert!(futures::poll!(&mut second).is_pending());
    // The peer's demand goes: the next round's caps let the waiter through.
    a.take_round();
    let idle = HashMap::from([(Arc::from("t2"), vec![contention(5, 1, 1)])]);
    a.set_remote_contention(idle, Duration::from_secs(60));
    let _second = second.await.unwrap().expect("counted");
    assert_eq!(a.active(), 2);
}

#[test]
fn the_peers_contention_is_cut_by_demand_whatever_its_order() {
    // 4,100 tenants with demands 1..=4,100 (one agent each), and one tenant reported by
    // 1,025 agents (demand 1 each, but one with 0; 1,024 in all): of the 4,101 tenants the
    // 5 least demanding go (t1-t5; 4,096 kept), and `wide` keeps its 1,024 agents with
    // demand 1.
    let mut remote: HashMap<Arc<str>, Vec<Contention>> = (1..=4_100u32)
        .map(|d| (Arc::from(format!("t{d}")), vec![contention(0, 1, d)]))
        .collect();
    let mut wide = vec![contention(0, 1, 0)];
    wide.extend(std::iter::repeat_n(contention(0, 1, 1), 1_024));
    remote.insert(Arc::from("wide"), wide);
    let kept = bound_remote(remote);
    assert_eq!(kept.len(), 4_096);
    for gone in ["t1", "t2", "t3", "t4", "t5"] {
        assert!(!kept.contains_key(gone), "{gone}");
    }
    assert!(kept.contains_key("t6"));
    let wide = &kept["wide"];
    assert_eq!(wide.len(), 1_024);
    assert!(wide.iter().all(|c| c.demand == 1));
}

#[tokio::test]
async fn a_view_gone_stale_lets_capped_waiters_start() {
    let (a, _held) = held_to_the_floor().await;
    let low = class(1, 0, 1);
    let second_tenant = name(low);
    let mut second = Box::pin(a.admit_as(low, &second_tenant));
    assert!(futures::poll!(&mut second).is_pending());
    // The exchange ends: it says so with an empty view fresh for 0, and the waiter starts
    // without waiting for a release.
    a.set_remote_contention(HashMap::new(), Duration::ZERO);
    let _second = second.await.unwrap().expect("counted");
    assert_eq!(a.active(), 2);
}

#[tokio::test]
async fn a_pools_stage_holds_a_tenant_at_its_cap_and_counts_refusals_in_the_agents() {
    // The agent: 100 slots, nobody may queue. Pool `p`: 2 cluster-wide; alone (a fresh view
    // without peers) `t1` with 2 in demand may hold 2 there, and a third is refused at
    // once (no queue), counted in the agent's refusals with the pool named.
    let agent = Admission::new(limits(100, 0, 1_000));
    let stage = Admission::for_pool(&agent, "p", 2, 1);
    let c = class(1, 0, 1);
    let held = [
        stage.admit_as(c, &name(c)).await.unwrap(),
        stage.admit_as(c, &name(c)).await.unwrap(),
    ];
    stage.take_round();
    stage.set_remote_contention(HashMap::new(), Duration::from_secs(60));
    assert_eq!(stage.cluster_cap("t1"), Some(2));
    let err = stage.admit_as(c, &name(c)).await.unwrap_err();
    assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(err.message.contains("pool `p`"), "{}", err.message);
    assert_eq!(agent.refused(Refused::QueueFull), 1);
    // The agent's own slots are not the stage's: none taken.
    assert_eq!(agent.active(), 0);
    drop(held);
    let _again = stage.admit_as(c, &name(c)).await.unwrap();
}

#[tokio::test]
async fn a_pools_stage_queues_at_most_its_share_of_the_agents_slots() {
    // The agent: 4 slots, 1,000 may queue. One pool of the agent has a stage (cluster-wide 1):
    // its queue holds at most 4 / (1 + 1) = 2, since each of its waiters holds an agent slot;
    // the other 2 agent slots stay for the other pools.
    let agent = Admission::new(limits(4, 1_000, 60_000));
    let stage = Admission::for_pool(&agent, "p", 1, 1);
    let c = class(1, 0, 1);
    let held = stage.admit_as(c, &name(c)).await.unwrap();
    stage.take_round();
    stage.set_remote_contention(HashMap::new(), Duration::from_secs(60));
    assert_eq!(stage.cluster_cap("t1"), Some(1));
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let stage = stage.clone();
            tokio::spawn(async move { stage.admit_as(c, &name(c)).await.map(|p| p.is_some()) })
        })
        .collect();
    for _ in 0..1_000 {
        if stage.waiting() == 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(stage.waiting(), 2, "both wait at the tenant's cap");
    let err = stage.admit_as(c, &name(c)).await.unwrap_err();
    assert_eq!(
        err.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a third may not queue"
    );
    assert_eq!(agent.refused(Refused::QueueFull), 1);
    drop(held);
    let mut started = 0;
    for w in waiters {
        // Each waiter starts once the one before it is done (its permit dropped at once).
        if w.await.unwrap().unwrap() {
            started += 1;
        }
    }
    assert_eq!(started, 2);
}
