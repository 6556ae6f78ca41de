//! The attempts' stall debt: an attempt that fails before an answer leaves the pod owing
//! nothing, and the speculative entries it added are withdrawn. A cold request held for the
//! agent's slot in its cluster is ranked again with what its peers placed meanwhile, counted,
//! and explained.

use std::{
    io::{Read, Write},
    sync::Arc,
    time::Instant,
};

use super::*;
use crate::{
    http::Headers,
    kv_index::{
        AgentLoad, DEFAULT_STALL_AFTER, IndexConfig, KvIndex, RouterKey, SourceInfo, wire::Batch,
    },
    pool::Pool,
    proxy::TokenSource,
    routing::{SessionSource, stagger::HoldStatus},
    telemetry::{Telemetry, TelemetryConfig},
};

/// A request's attempt record as the handler starts it, for tenant `t`.
fn attempt(proxy: &Proxy, runtime: &PoolRuntime) -> Attempt {
    Attempt {
        start: Instant::now(),
        pool: runtime.telemetry_id,
        tenant: proxy.telemetry.tenant(&Arc::from("t")),
        queue: None,
        retries: 0,
        receipt: None,
        prediction: None,
        quota: None,
        client: None,
    }
}

#[tokio::test]
async fn a_refused_attempt_leaves_no_stall_debt_and_withdraws_its_entries() {
    // A loopback port nothing listens on (bound, then released): every connect is refused.
    let authority = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        l.local_addr().expect("bound").to_string()
    };
    let index = Arc::new(KvIndex::new(IndexConfig::default()));
    let source = index.add_source(SourceInfo {
        pod: authority.clone(),
        rank: None,
    });
    // A stream that has spoken once: healthy, and so able to stall.
    let empty = Batch {
        ts: 0.0,
        events: Vec::new(),
        dp_rank: None,
    };
    index.apply(source, &empty, 0);
    let telemetry = Arc::new(Telemetry::new(&TelemetryConfig::default()).expect("telemetry"));
    let mut proxy = Proxy::new(index.clone(), telemetry, Default::default());
    let pool = Pool::new(
        "m".into(),
        16,
        Policy::Precise,
        vec![(authority, Some(source))],
    );
    proxy.add_pool(
        "p",
        pool,
        TokenSource::Approximate,
        SessionSource::default(),
    );
    let runtime = &proxy.pools[0];
    let ctx = RequestCtx {
        keys: (1..=4).map(RouterKey).collect(),
        ..RequestCtx::default()
    };
    let parts = RequestHead::new(
        http::Method::POST,
        Bytes::from_static(b"/v1/completions"),
        http::Version::HTTP_11,
        Headers::default(),
    )
    .expect("an origin-form target");
    let mut attempt = attempt(&proxy, runtime);
    let picked = Instant::now();
    let err = forward(
        &proxy,
        runtime,
        &Action::base("p"),
        &ctx,
        &parts,
        Bytes::from_static(b"{}"),
        &mut attempt,
        false,
    )
    .await
    .expect_err("nothing listens there");
    assert_eq!(err.status, StatusCode::BAD_GATEWAY, "{}", err.message);
    // The pick's entries are gone, and the quiet pod owes nothing long after.
    assert!(index.holders(RouterKey(1)).is_empty());
    index.sweep(picked + DEFAULT_STALL_AFTER * 2);
    assert!(index.trusted(source), "{:?}", index.status());
}

/// A precise pool over `authorities` whose agent shares loads with peers (so it staggers),
/// in slot `slot` of its cluster's order.
fn clustered(authorities: &[String], slot: usize) -> Proxy {
    let index = Arc::new(KvIndex::new(IndexConfig::default()));
    let telemetry = Arc::new(Telemetry::new(&TelemetryConfig::default()).expect("telemetry"));
    let mut proxy = Proxy::new(index, telemetry, Default::default());
    let pods = authorities.iter().map(|a| (a.clone(), None)).collect();
    let pool = Pool::new("m".into(), 16, Policy::Precise, pods);
    pool.count_peers_exactly();
    proxy.add_pool(
        "p",
        pool,
        TokenSource::Approximate,
        SessionSource::default(),
    );
    proxy.stagger.set_position(slot);
    proxy
}

/// A cold request of 64 blocks (1,024 tokens: about 120 ms predicted by the cost model's prior,
/// so a hold of 2 ms is under its 5 %).
fn cold() -> RequestCtx {
    RequestCtx {
        keys: (1..=64).map(RouterKey).collect(),
        ..RequestCtx::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_held_cold_request_is_ranked_again_with_what_a_peer_placed_meanwhile() {
    let proxy = clustered(&["a:1".to_string(), "b:1".to_string()], 1);
    let runtime = &proxy.pools[0];
    let mut policy = RoutePolicy::from(Policy::Precise);
    policy.peers_route = true;
    let ctx = cold();
    let mut endpoints = runtime.pool.endpoints();
    let mut c = candidates(&proxy.index, runtime, &endpoints, &ctx, policy.kind);
    let first = rank(policy, &ctx, &c, &runtime.pool.rotation).expect("a pod");
    let picked = first.ranked[0].0;
    let other = 1 - picked;
    // During the hold a peer (an earlier slot) reports a cold request on the first pick.
    let pod = endpoints[picked].clone();
    let peer = async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let load = AgentLoad {
            in_flight: 1,
            queued_prefill_blocks: 64,
        };
        pod.set_peer_load("node-a", load, Instant::now());
    };
    let start = tokio::time::Instant::now();
    let (held, ()) = tokio::join!(
        stagger(
            &proxy,
            runtime,
            policy,
            &ctx,
            &first,
            &mut endpoints,
            &mut c
        ),
        peer
    );
    let (hold, again) = held.expect("cold, in slot 1, predicted well over 40 ms");
    assert_eq!(hold, Duration::from_millis(2));
    assert_eq!(start.elapsed(), Duration::from_millis(2));
    assert_eq!(
        again.expect("a pod").ranked[0].0,
        other,
        "the peer's request counts on its pod"
    );
    assert_eq!(
        runtime.staggered.status(),
        HoldStatus {
            requests: 1,
            seconds: 0.002,
            bursting: false
        }
    );
    // The first slot never holds; nor does a warm pick, nor an agent whose pools hear no peer.
    proxy.stagger.set_position(0);
    let d = rank(policy, &ctx, &c, &runtime.pool.rotation).expect("a pod");
    assert!(
        stagger(&proxy, runtime, policy, &ctx, &d, &mut endpoints, &mut c)
            .await
            .is_none()
    );
    proxy.stagger.set_position(1);
    let mut warm = d.clone();
    warm.prefix_blocks = 40;
    assert!(
        stagger(&proxy, runtime, policy, &ctx, &warm, &mut endpoints, &mut c)
            .await
            .is_none()
    );
    policy.peers_route = false;
    assert!(
        stagger(&proxy, runtime, policy, &ctx, &d, &mut endpoints, &mut c)
            .await
            .is_none()
    );
    assert_eq!(
        runtime.staggered.status().requests,
        1,
        "only the first held"
    );
}

/// An engine on a loopback port that answers each request it reads with `{}`: as many as
/// `requests`, then it stops.
fn engine(requests: usize) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let authority = l.local_addr().expect("bound").to_string();
    std::thread::spawn(move || {
        for _ in 0..requests {
            let Ok((mut s, _)) = l.accept() else { return };
            // Each request whole (head, and its 2-byte body) before the answer.
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.ends_with(b"\r\n\r\n{}") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
            if s.write_all(answer).is_err() {
                return;
            }
        }
    });
    authority
}

/// Sends a cold request, prompt `n` (64 blocks of its own: no pod holds them, whatever went
/// before), arrived `at`, through `forward` and returns its `x-warmpath-stagger-ms`.
async fn stagger_header(proxy: &Proxy, n: u64, at: Instant) -> Option<String> {
    let runtime = &proxy.pools[0];
    let ctx = RequestCtx {
        keys: (1..=64).map(|k| RouterKey(n * 1000 + k)).collect(),
        ..RequestCtx::default()
    };
    let head = RequestHead::new(
        http::Method::POST,
        Bytes::from_static(b"/v1/completions"),
        http::Version::HTTP_11,
        Headers::default(),
    )
    .expect("an origin-form target");
    let answer = forward(
        proxy,
        runtime,
        &Action::base("p"),
        &ctx,
        &head,
        Bytes::from_static(b"{}"),
        &mut Attempt {
            start: at,
            ..attempt(proxy, runtime)
        },
        false,
    )
    .await
    .expect("the engine answers");
    assert_eq!(answer.status, StatusCode::OK);
    answer
        .extra
        .iter()
        .find(|(k, _)| k == "x-warmpath-stagger-ms")
        .map(|(_, v)| v.to_str().expect("ascii").to_string())
}

#[tokio::test]
async fn a_held_answer_says_how_long_it_was_held() {
    let authority = engine(4);
    let mut proxy = clustered(&[authority], 1);
    proxy.explain = true;
    let t0 = Instant::now();
    // Arrivals seconds apart, a steady stream: not held, no header.
    assert_eq!(stagger_header(&proxy, 1, t0).await, None);
    assert_eq!(
        stagger_header(&proxy, 2, t0 + Duration::from_secs(5)).await,
        None
    );
    // Instants of two requests 260 ms apart (noted as the data path notes arrivals), then
    // one half a millisecond after the last: bursts. Slot 1 holds it one step, and says so.
    let instants = t0 + Duration::from_secs(6);
    for k in 0..3u32 {
        let instant = instants + Duration::from_millis(260) * k;
        for _ in 0..2 {
            proxy.pools[0].staggered.arrived(instant);
        }
    }
    let burst = instants + Duration::from_millis(520) + Duration::from_micros(500);
    assert_eq!(
        stagger_header(&proxy, 3, burst).await.as_deref(),
        Some("2.0")
    );
    assert_eq!(proxy.pools[0].staggered.status().requests, 1);
    // The first slot: not held, no header.
    proxy.stagger.set_position(0);
    let later = burst + Duration::from_millis(100);
    assert_eq!(stagger_header(&proxy, 4, later).await, None);
    assert_eq!(proxy.pools[0].staggered.status().requests, 1);
}
