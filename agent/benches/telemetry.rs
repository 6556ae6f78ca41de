//! Criterion benchmarks of per-request telemetry: tenant resolution plus recording one
//! finished request (counters, four histograms, the live window, the routing decision), with
//! and without an OTLP pusher configured (recording does not depend on it: both read the same
//! per-thread cells); and the SSE tap that reads usage from a 64-chunk stream. Target (issue
//! #7): <= 2 us per request at p50.

use std::{hint::black_box, sync::Arc, time::Duration};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use warmpath_agent::{
    proxy::tap::SseTap,
    telemetry::{
        Outcome, RequestRecord, Telemetry, TelemetryConfig, TokenUsage,
        export::{OtlpConfig, OtlpProtocol},
    },
    tenant::{CidrTable, TenantPolicy, parse_net},
};

const TENANTS: usize = 20;

fn setup(otlp: bool) -> (Telemetry, TenantPolicy) {
    let config = TelemetryConfig {
        otlp: otlp.then(|| OtlpConfig {
            // Nothing listens there and the interval is long: recording cost only.
            endpoint: "http://127.0.0.1:9".into(),
            protocol: OtlpProtocol::Grpc,
            interval: Duration::from_secs(3600),
            timeout: Duration::from_millis(100),
            headers: Vec::new(),
            tls: None,
            compression: Default::default(),
        }),
        ..TelemetryConfig::default()
    };
    let telemetry = Telemetry::new(&config).expect("telemetry builds");
    let table = CidrTable::new((0..TENANTS).map(|i| {
        (
            parse_net(&format!("127.0.{i}.0/24")).expect("cidr"),
            format!("team-{i}"),
        )
    }))
    .expect("valid table");
    let policy = TenantPolicy {
        directory: Arc::new(table),
        ..TenantPolicy::default()
    };
    (telemetry, policy)
}

fn record(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _guard = runtime.enter();
    let mut group = c.benchmark_group("telemetry_per_request");
    for otlp in [false, true] {
        let (telemetry, policy) = setup(otlp);
        let pool = telemetry.register_pool("default", "sim-llama");
        let peers: Vec<std::net::IpAddr> = (0..TENANTS)
            .map(|i| format!("127.0.{i}.7").parse().expect("addr"))
            .collect();
        let headers = warmpath_agent::http::Headers::default();
        let name = if otlp {
            "resolve_and_record_prom_otlp"
        } else {
            "resolve_and_record_prom"
        };
        let mut i = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                let (tenant, _) = policy.resolve(Some(peers[i % TENANTS]), &headers);
                let tenant = telemetry.tenant(&tenant);
                telemetry.record_decision(
                    pool,
                    warmpath_agent::telemetry::DecisionReason::Prefix,
                    12,
                );
                telemetry.record(
                    &tenant,
                    black_box(&RequestRecord {
                        pool,
                        pod: Some((1, "127.0.0.1:8101")),
                        outcome: Outcome::Ok,
                        usage: Some(TokenUsage {
                            prompt: 812,
                            cached: 640,
                            completion: 64,
                            cached_reported: true,
                        }),
                        receipt: None,
                        retries: 0,
                        queue: Some(Duration::from_micros(40)),
                        ttft: Some(Duration::from_millis(35)),
                        duration: Duration::from_millis(420),
                        at: std::time::Instant::now(),
                        streamed: true,
                    }),
                );
            })
        });
    }
    group.finish();
}

fn sse_tap(c: &mut Criterion) {
    let chunk = Bytes::from_static(b"data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"sim-llama\",\"choices\":[{\"index\":0,\"text\":\" word\",\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n");
    let usage = Bytes::from_static(b"data: {\"id\":\"cmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":812,\"completion_tokens\":64,\"total_tokens\":876,\"prompt_tokens_details\":{\"cached_tokens\":640}}}\n\ndata: [DONE]\n\n");
    let mut group = c.benchmark_group("telemetry_sse_tap_64_chunks");
    for strip in [false, true] {
        group.bench_function(
            if strip {
                "injected_usage_stripped"
            } else {
                "client_usage_observed"
            },
            |b| {
                b.iter(|| {
                    let mut tap = SseTap::new(strip);
                    let mut n = 0;
                    for _ in 0..64 {
                        n += tap.frame(chunk.clone()).len();
                    }
                    n += tap.frame(usage.clone()).len();
                    black_box((n, tap.usage))
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, record, sse_tap);
criterion_main!(benches);
