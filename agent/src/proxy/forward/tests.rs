//! The attempts' stall debt: an attempt that fails before an answer leaves the pod owing
//! nothing, and the speculative entries it added are withdrawn.

use std::{sync::Arc, time::Instant};

use super::*;
use crate::{
    http::Headers,
    kv_index::{DEFAULT_STALL_AFTER, IndexConfig, KvIndex, RouterKey, SourceInfo, wire::Batch},
    pool::Pool,
    proxy::TokenSource,
    routing::SessionSource,
    telemetry::{Telemetry, TelemetryConfig},
};

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
    let mut attempt = Attempt {
        start: Instant::now(),
        pool: runtime.telemetry_id,
        tenant: proxy.telemetry.tenant(&Arc::from("t")),
        queue: None,
        retries: 0,
        receipt: None,
        prediction: None,
        quota: None,
        client: None,
    };
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
