//! The pool's and its endpoints' own counters: members, scrape health, in-flight load.

use super::*;

/// A precise pool of one configured pod, `a:1`.
pub(super) fn one_pod() -> Pool {
    Pool::new(
        "m".into(),
        16,
        crate::routing::Policy::Precise,
        vec![("a:1".into(), None)],
    )
}

#[test]
fn configured_metrics_urls_are_kept_and_affinity_follows_the_address() {
    let endpoints = vec![("a:1".to_string(), None), ("b:1".to_string(), None)];
    let pool = Pool::new("m".into(), 16, crate::routing::Policy::Precise, endpoints)
        .with_metrics_urls(vec!["http://a:9/metrics".into(), "http://b:9/m".into()]);
    let urls: Vec<String> = pool
        .endpoints()
        .iter()
        .map(|e| e.metrics_url.clone())
        .collect();
    assert_eq!(urls, ["http://a:9/metrics", "http://b:9/m"]);
    // The same address hashes the same in another pool (another agent), whatever its
    // position.
    let other = Pool::new(
        "m".into(),
        16,
        crate::routing::Policy::Precise,
        vec![("b:1".to_string(), None)],
    );
    assert_eq!(pool.endpoints()[1].affinity, other.endpoints()[0].affinity);
    assert_ne!(pool.endpoints()[0].affinity, pool.endpoints()[1].affinity);
}

#[test]
fn membership_changes_are_announced_and_scrape_health_follows_failures() {
    let pool = one_pod();
    let changes = pool.changes();
    assert!(!changes.has_changed().unwrap());
    let discovered = pool.endpoint(EndpointParts {
        authority: "b:1".into(),
        wanted: true,
        discovered: true,
        ..Default::default()
    });
    pool.set_endpoints(vec![pool.endpoints()[0].clone(), discovered.clone()]);
    assert!(changes.has_changed().unwrap(), "set_endpoints announces");

    // A discovered endpoint is healthy once its metrics answered, and until two scrapes
    // in a row fail.
    assert!(!discovered.scrape_healthy(), "never scraped");
    discovered.set_engine_load(0, 0, 0.0);
    assert!(discovered.scrape_healthy());
    discovered.note_scrape_failure();
    assert!(discovered.scrape_healthy(), "one failure is tolerated");
    discovered.note_scrape_failure();
    assert!(!discovered.scrape_healthy(), "two in a row are not");
    discovered.set_engine_load(0, 0, 0.0);
    assert!(discovered.scrape_healthy(), "an answer resets the count");
    discovered.set_wanted(false);
    assert!(!discovered.scrape_healthy(), "draining");
}

#[test]
fn work_ahead_counts_engine_queues_the_proxy_did_not_fill() {
    let pool = one_pod();
    let e = pool.endpoints()[0].clone();
    for _ in 0..64 {
        pool.note_prefill(10);
    }
    let _guard = e.start(7, &[], 0);
    assert_eq!(
        pool.work_ahead(&e, true, f64::NAN, std::time::Instant::now()),
        7,
        "not scraped yet: own queue only"
    );
    e.set_engine_load(5, 2, 0.5);
    let ahead = pool.work_ahead(&e, true, f64::NAN, std::time::Instant::now());
    assert!(
        (45..=50).contains(&ahead),
        "5 waiting x ~10 blocks, got {ahead}"
    );
    e.set_engine_load(0, 2, 0.5);
    assert_eq!(
        pool.work_ahead(&e, true, f64::NAN, std::time::Instant::now()),
        7
    );
    // Two scrapes failing in a row leave the last report's waiting count out.
    e.set_engine_load(5, 2, 0.5);
    e.note_scrape_failure();
    assert!(
        pool.work_ahead(&e, true, f64::NAN, std::time::Instant::now()) >= 45,
        "one failure is tolerated"
    );
    e.note_scrape_failure();
    assert_eq!(
        pool.work_ahead(&e, true, f64::NAN, std::time::Instant::now()),
        7
    );
}

#[test]
fn in_flight_counts_what_the_engine_runs_beyond_own_requests_and_peers_leases() {
    let pool = one_pod();
    let e = pool.endpoints()[0].clone();
    let _a = e.start(0, &[], 0);
    let _b = e.start(0, &[], 0);
    assert_eq!(
        pool.in_flight(&e, true),
        2,
        "not scraped, no peers: own two"
    );
    // Three peers' placements, leased for a minute.
    let now = std::time::Instant::now();
    for _ in 0..3 {
        e.lease(&[], 0, now, now + std::time::Duration::from_secs(60));
    }
    assert_eq!(pool.in_flight(&e, true), 5, "own two and three leases");
    // The engine runs 4 and queues 3: 5 beyond own, more than the leases say.
    e.set_engine_load(3, 4, 0.5);
    assert_eq!(
        pool.in_flight(&e, true),
        7,
        "own two and the engine's other five"
    );
    // The engine reports one beyond own, fewer than the three leases: the leases.
    e.set_engine_load(0, 3, 0.5);
    assert_eq!(pool.in_flight(&e, true), 5);
    // Least-loaded and session pools count their own only.
    e.set_engine_load(3, 4, 0.5);
    assert_eq!(pool.in_flight(&e, false), 2);
    // Scrapes failing: one is tolerated, two in a row leave the stale count out.
    e.note_scrape_failure();
    assert_eq!(pool.in_flight(&e, true), 7);
    e.note_scrape_failure();
    assert_eq!(pool.in_flight(&e, true), 5, "own two and three leases");
}

/// A fresh pool's warm share after `notes` (each request warm at its pick or not).
fn warm_share_after(notes: impl IntoIterator<Item = bool>) -> f64 {
    let pool = one_pod();
    for warm in notes {
        pool.note_warm(warm);
    }
    pool.warm_share()
}

#[test]
fn the_warm_share_is_the_plain_mean_until_its_memory_fills_then_forgets_at_one_in_64() {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
    assert_eq!(warm_share_after([]), 0.0, "nothing seen");
    // Its traffic's share from the first requests: one warm of one, 3 of 4.
    assert_eq!(warm_share_after([true]), 1.0);
    assert!(close(warm_share_after([true, false, true, true]), 0.75));
    // 30 requests, every other one warm (a fleet's agent sees a quarter of 120): 0.5, not
    // the 0.19 an average started at 0 with weight 1/64 would give.
    assert!(close(warm_share_after([true, false].repeat(15)), 0.5));
    // 64 warm fill the memory; each cold request after keeps 63/64 of the share.
    let full = || std::iter::repeat_n(true, 64);
    assert_eq!(warm_share_after(full()), 1.0);
    assert!(close(warm_share_after(full().chain([false])), 63.0 / 64.0));
    assert!(close(
        warm_share_after(full().chain([false, false])),
        (63.0f64 / 64.0).powi(2)
    ));
}

#[test]
fn pools_start_their_rotation_apart() {
    // Pools made together (as agents started together make theirs) do not start their
    // rotation at one pod: of 64, the starts fall on more than one of 4 pods (all on one by
    // chance: 4^-63).
    let starts: std::collections::HashSet<usize> = (0..64)
        .map(|_| {
            let pool = Pool::new(
                "m".into(),
                16,
                crate::routing::Policy::RoundRobin,
                Vec::new(),
            );
            pool.rotation.load(std::sync::atomic::Ordering::Relaxed) % 4
        })
        .collect();
    assert!(starts.len() > 1, "{starts:?}");
}

#[test]
fn idle_time_counts_from_the_last_request_sent_ended_or_placed_by_a_peer_and_is_zero_while_one_runs()
 {
    let pool = one_pod();
    let e = pool.endpoints()[0].clone();
    let later = |s: u64| std::time::Instant::now() + std::time::Duration::from_secs(s);
    // A new endpoint counts from when it was made.
    assert!(e.idle_for(later(5)) >= std::time::Duration::from_secs(5));
    let guard = e.start(3, &[], 0);
    assert_eq!(e.idle_for(later(5)), std::time::Duration::ZERO, "busy");
    drop(guard);
    // Ended: idle again (from the end; made just before it, so this cannot tell the two).
    let idle = e.idle_for(later(2));
    assert!(
        idle >= std::time::Duration::from_secs(2) && idle < std::time::Duration::from_secs(3),
        "{idle:?}"
    );
    // A peer's placement here restarts the clock too (a cluster's pods are busy with the
    // peers' requests this agent does not send): one placed 10 s from now.
    let fresh = one_pod().endpoints()[0].clone();
    assert!(fresh.idle_for(later(11)) >= std::time::Duration::from_secs(11));
    fresh.lease(&[], 0, later(10), later(60));
    let idle = fresh.idle_for(later(11));
    assert!(
        idle >= std::time::Duration::from_millis(900) && idle < std::time::Duration::from_secs(2),
        "{idle:?}"
    );
}
