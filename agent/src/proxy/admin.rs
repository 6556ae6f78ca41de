//! The admin listener (127.0.0.1 by default): `/status` (JSON), `/metrics` (Prometheus),
//! `/ready`, `/live`. With a token configured, everything but `/live` and `/ready` (the
//! kubelet's probes, which say nothing) needs `Authorization: Bearer <token>`.

use std::{convert::Infallible, fmt::Write as _, sync::Arc};

use http::{Method, StatusCode};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use super::Proxy;
use crate::{
    config::AdminToken,
    http::{Body, message::full},
    routing::{cold_yield::ColdYieldStatus, stagger::HoldStatus},
};

/// Serves the admin endpoints until the task is dropped; `token`, when given, guards all
/// but the probes.
pub async fn serve_admin(listener: TcpListener, proxy: Arc<Proxy>, token: Option<AdminToken>) {
    let token = token.map(Arc::new);
    // Requests for paths or methods the admin API does not have.
    let unknown = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = unknown.clone();
    proxy
        .telemetry
        .meter()
        .u64_observable_counter("warmpath.admin.unknown_requests")
        .with_unit("{request}")
        .with_description("Admin requests for unknown paths or methods (404)")
        .with_callback(move |o| o.observe(seen.load(std::sync::atomic::Ordering::Relaxed), &[]))
        .build();
    // Requests refused for a missing or wrong token.
    let unauthorized = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let refused = unauthorized.clone();
    proxy
        .telemetry
        .meter()
        .u64_observable_counter("warmpath.admin.unauthorized_requests")
        .with_unit("{request}")
        .with_description("Admin requests refused for a missing or wrong bearer token (401)")
        .with_callback(move |o| o.observe(refused.load(std::sync::atomic::Ordering::Relaxed), &[]))
        .build();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let proxy = proxy.clone();
        let token = token.clone();
        let unknown = unknown.clone();
        let unauthorized = unauthorized.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let proxy = proxy.clone();
                let token = token.clone();
                let unknown = unknown.clone();
                let unauthorized = unauthorized.clone();
                async move {
                    let path = req.uri().path();
                    let resp = match authorize(token.as_deref(), path, req.headers()) {
                        Ok(()) => admin(&proxy, req.method(), path),
                        Err(denied) => {
                            unauthorized.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            denied.response()
                        }
                    };
                    if resp.status() == StatusCode::NOT_FOUND {
                        unknown.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok::<_, Infallible>(resp)
                }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Paths open without the token: liveness and readiness say nothing about the node.
const OPEN_PATHS: [&str; 2] = ["/live", "/ready"];

/// Why a request was not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Denied {
    /// No bearer token came with it.
    Missing,
    /// One came, and it is not the token.
    Wrong,
}

impl Denied {
    /// 401 with the challenge (RFC 6750: `invalid_request` without a token, else
    /// `invalid_token`) and an OpenAI-style body.
    fn response(self) -> http::Response<Body> {
        let (message, error) = match self {
            Denied::Missing => (
                "this admin endpoint needs `Authorization: Bearer <token>` (warmpath status --admin-token-file PATH)",
                "invalid_request",
            ),
            Denied::Wrong => ("the admin token was refused", "invalid_token"),
        };
        let mut resp = super::ProxyError::new(StatusCode::UNAUTHORIZED, message).into_response();
        let challenge = format!("Bearer realm=\"warmpath-admin\", error=\"{error}\"");
        if let Ok(v) = http::HeaderValue::from_str(&challenge) {
            resp.headers_mut().insert(http::header::WWW_AUTHENTICATE, v);
        }
        resp
    }
}

/// `Ok` when no token is configured, the path is a probe, or the request carries the token
/// (`Bearer`, scheme case-insensitive).
fn authorize(
    token: Option<&AdminToken>,
    path: &str,
    headers: &http::HeaderMap,
) -> Result<(), Denied> {
    let Some(token) = token else {
        return Ok(());
    };
    if OPEN_PATHS.contains(&path) {
        return Ok(());
    }
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .map(http::HeaderValue::as_bytes)
        .and_then(|v| {
            let (scheme, rest) = v.split_at(v.iter().position(|&b| b == b' ')?);
            scheme
                .eq_ignore_ascii_case(b"bearer")
                .then(|| rest.trim_ascii())
        });
    match presented {
        Some(t) if token.verify(t) => Ok(()),
        Some(_) => Err(Denied::Wrong),
        None => Err(Denied::Missing),
    }
}

fn admin(proxy: &Proxy, method: &Method, path: &str) -> http::Response<Body> {
    match (method, path) {
        (&Method::GET, "/live") => full(StatusCode::OK, "text/plain", "live\n"),
        (&Method::GET, "/ready") => {
            if proxy.draining.load(std::sync::atomic::Ordering::Relaxed) {
                full(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n")
            } else {
                full(StatusCode::OK, "text/plain", "ready\n")
            }
        }
        (&Method::GET, "/status") => full(
            StatusCode::OK,
            "application/json",
            status(proxy).to_string(),
        ),
        (&Method::GET, "/metrics") => {
            full(StatusCode::OK, "text/plain; version=0.0.4", metrics(proxy))
        }
        _ => super::ProxyError::new(StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

/// Pools and their pods (load, index health and size per pod), and the tenants' live figures.
pub fn status(proxy: &Proxy) -> serde_json::Value {
    let sources = proxy.index.status();
    let mut pods = Vec::new();
    let mut pools = Vec::new();
    for p in &proxy.pools {
        let endpoints = p.pool.endpoints();
        for e in endpoints.iter() {
            let index = e
                .source
                .and_then(|s| sources.iter().find(|(id, _)| *id == s))
                .map(|(_, st)| st.clone());
            let trusted = e.source.is_some_and(|s| proxy.index.trusted(s));
            // The signal its prefix is scored by (`routing::Candidate::prefix`).
            let prefix_source = match p.pool.policy.kind {
                crate::routing::Policy::Approximate => "history",
                _ if trusted => "index",
                _ => "history",
            };
            pods.push(
                serde_json::json!({"pool": p.name, "load": e.snapshot(), "index": index,
                "lora": e.lora_info(), "prefix_weight": u8::from(trusted),
                "prefix_source": prefix_source, "ttft_model": p.calibration.pod_status(e.serial),
                "resident_blocks": e.source.map_or(0, |s| p.resident.lock().blocks(s))}),
            );
        }
        pools.push(serde_json::json!({"name": p.name, "model": p.pool.model,
            "policy": format!("{:?}", p.pool.policy.kind), "weights": p.pool.policy.weights,
            "block_size": p.pool.block_size, "tokens": p.tokens.name(), "upstream": p.protocol.as_str(),
            "endpoints": endpoints.len(), "unkeyed": p.unkeyed.counts(),
            "unkeyed_first_error": p.unkeyed.first_errors(),
            "ttft_prediction": p.calibration.status(),
            "cold_yield_ms": p.pool.policy.cold_yield.as_millis(),
            "warm_share": p.pool.warm_share(),
            "cold_yields": p.cold_yields.status(),
            "stagger": p.staggered.status(),
            "hot_prefixes_tracked": p.replication.lock().tracked(),
            "resident_prefixes_tracked": p.resident.lock().tracked()}));
    }
    let first = &proxy.pools[0].pool;
    let mut v = serde_json::json!({"model": first.model, "policy": format!("{:?}", first.policy.kind),
        "block_size": first.block_size, "pools": pools, "index_entries": proxy.index.len(),
        "index_bytes": proxy.index.bytes(), "pods": pods, "tenants": proxy.telemetry.live(),
        "policies": policies(proxy), "stagger_slot": proxy.stagger.get()});
    if crate::ebpf::intercepting() || !proxy.client_pods().is_empty() {
        // The client-affinity learner behind the kernel's fail-open and steer tables.
        let learner = proxy.client_pods();
        v["client_affinity"] =
            serde_json::json!({"clients": learner.len(), "capacity": learner.capacity()});
    }
    for (name, value) in proxy.sections.values() {
        v[name] = value;
    }
    v
}

/// The declarative policy in effect: each object's conditions (`Accepted` from the policy
/// directory's load, `ResolvedRefs` from compiling), the files that could not be used, and
/// the declared tenants' rules with this agent's current share of their quotas.
fn policies(proxy: &Proxy) -> serde_json::Value {
    use crate::policy::{quota::Dimension, store::Serving};
    let set = proxy.policy.current();
    let accepted = proxy.policy.accepted();
    let resolved = &set.resolved;
    let mut objects = Vec::new();
    if let Some(a) = &accepted {
        for o in &a.objects {
            let mut conditions = o.conditions.clone();
            conditions.extend(
                resolved
                    .iter()
                    .filter(|(k, key, _)| *k == o.kind && *key == o.key)
                    .map(|(_, _, c)| c.clone()),
            );
            let serving = match o.serving {
                Serving::Current => "current".to_string(),
                Serving::LastGood { generation } => format!("last good (generation {generation})"),
                Serving::None => "none".to_string(),
            };
            objects.push(serde_json::json!({"kind": o.kind, "name": o.key,
                "file": o.file.display().to_string(), "observed_generation": o.observed_generation,
                "serving": serving, "conditions": conditions}));
        }
    }
    let files: Vec<_> = accepted
        .iter()
        .flat_map(|a| a.file_errors())
        .map(|f| serde_json::json!({"file": f.file.display().to_string(), "error": f.error}))
        .collect();
    let mut tenants: Vec<_> = set
        .tenants()
        .map(|t| {
            let share = |d| proxy.quotas.local_limit(&t.name, d);
            serde_json::json!({"name": &*t.name, "priority": t.priority, "weight": t.weight,
                "cache_isolation": if t.isolated { "isolated" } else { "shared" },
                "quotas": t.quotas.map(|q| serde_json::json!({
                    "requests_per_s": q.requests_per_s, "prompt_tokens_per_s": q.prompt_tokens_per_s,
                    "output_tokens_per_s": q.output_tokens_per_s,
                    "concurrent_streams": q.concurrent_streams, "burst_s": q.burst.as_secs_f64()})),
                "local_share": {"requests_per_s": share(Dimension::Requests),
                    "prompt_tokens_per_s": share(Dimension::PromptTokens),
                    "output_tokens_per_s": share(Dimension::OutputTokens),
                    "concurrent_streams": share(Dimension::ConcurrentStreams)}})
        })
        .collect();
    tenants.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    serde_json::json!({"generation": set.generation,
        "directory_generation": accepted.as_ref().map(|a| a.generation),
        "objects": objects, "file_errors": files, "tenants": tenants})
}

fn metrics(proxy: &Proxy) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# TYPE warmpath_endpoint_requests_total counter");
    for e in proxy.pools.iter().flat_map(|p| p.pool.endpoints().to_vec()) {
        let s = e.snapshot();
        let _ = writeln!(
            out,
            "warmpath_endpoint_requests_total{{endpoint=\"{}\"}} {}",
            s.endpoint, s.requests
        );
    }
    let _ = writeln!(out, "# TYPE warmpath_endpoint_in_flight gauge");
    for e in proxy.pools.iter().flat_map(|p| p.pool.endpoints().to_vec()) {
        let _ = writeln!(
            out,
            "warmpath_endpoint_in_flight{{endpoint=\"{}\"}} {}",
            e.authority,
            e.in_flight()
        );
    }
    let _ = writeln!(
        out,
        "# HELP warmpath_prefix_survival Share of the prefix a chosen pod held at decision that its engine still had at prefill (recent route receipts, every wait; 1 before any)\n# TYPE warmpath_prefix_survival gauge"
    );
    let figures: Vec<_> = proxy
        .pools
        .iter()
        .map(|p| (p.name.as_str(), p.calibration.survival_figures()))
        .collect();
    for (pool, (overall, _, _)) in &figures {
        let _ = writeln!(
            out,
            "warmpath_prefix_survival{} {}",
            crate::telemetry::prometheus::label_text(std::iter::once(("pool", *pool)), None),
            overall
        );
    }
    let _ = writeln!(
        out,
        "# HELP warmpath_prefix_survival_by_wait The same by the TTFT predicted at decision, per band below `le` seconds: the weight the prefix presets give a held prefix at that wait\n# TYPE warmpath_prefix_survival_by_wait gauge"
    );
    for (pool, (_, bands, _)) in &figures {
        for band in bands {
            let le = band
                .below_ms
                .map_or_else(|| "+Inf".to_string(), |ms| format!("{}", ms / 1000.0));
            let _ = writeln!(
                out,
                "warmpath_prefix_survival_by_wait{} {}",
                crate::telemetry::prometheus::label_text(
                    [("pool", *pool), ("le", le.as_str())].into_iter(),
                    None
                ),
                band.survival
            );
        }
    }
    holds(proxy, &mut out);
    let _ = writeln!(
        out,
        "# TYPE warmpath_index_entries gauge\nwarmpath_index_entries {}",
        proxy.index.len()
    );
    out.push_str(&proxy.telemetry.prometheus());
    out
}

/// The counters of requests held before their ranking, by pool: cold yields at a full pod
/// and cold decisions staggered across a cluster's agents; and this agent's slot.
fn holds(proxy: &Proxy, out: &mut String) {
    type Figure = fn(&ColdYieldStatus, &HoldStatus) -> f64;
    let counters: [(&str, &str, Figure); 5] = [
        (
            "warmpath_cold_yields_total",
            "Requests held back, cold, while the pod they were ranked to had no KV room",
            |y, _| y.requests as f64,
        ),
        (
            "warmpath_cold_yields_at_bound_total",
            "Of those, the ones sent when the policy's bound passed, still without room",
            |y, _| y.at_bound as f64,
        ),
        (
            "warmpath_cold_yield_seconds_total",
            "Seconds those requests were held back, all together",
            |y, _| y.seconds,
        ),
        (
            "warmpath_stagger_holds_total",
            "Cold requests held for this agent's slot in its cluster's order, then ranked again",
            |_, s| s.requests as f64,
        ),
        (
            "warmpath_stagger_hold_seconds_total",
            "Seconds those requests were held, all together",
            |_, s| s.seconds,
        ),
    ];
    let pools: Vec<_> = proxy
        .pools
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.cold_yields.status(),
                p.staggered.status(),
            )
        })
        .collect();
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (pool, yields, staggered) in &pools {
            let _ = writeln!(
                out,
                "{name}{} {}",
                crate::telemetry::prometheus::label_text(std::iter::once(("pool", *pool)), None),
                value(yields, staggered)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP warmpath_stagger_slot This agent's slot in its cluster's order (0: never holds)\n# TYPE warmpath_stagger_slot gauge\nwarmpath_stagger_slot {}",
        proxy.stagger.get()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(a) = authorization {
            h.insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_str(a).unwrap(),
            );
        }
        h
    }

    fn refusal(token: &AdminToken, path: &str, authorization: Option<&str>) -> Option<String> {
        authorize(Some(token), path, &headers(authorization))
            .err()
            .map(|d| {
                let r = d.response();
                assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
                r.headers()[http::header::WWW_AUTHENTICATE]
                    .to_str()
                    .unwrap()
                    .to_string()
            })
    }

    #[test]
    fn the_stagger_slot_and_holds_show_on_status_and_metrics() {
        use crate::{
            kv_index::{IndexConfig, KvIndex},
            pool::Pool,
            proxy::TokenSource,
            routing::{Policy, SessionSource},
            telemetry::{Telemetry, TelemetryConfig},
        };
        let index = std::sync::Arc::new(KvIndex::new(IndexConfig::default()));
        let telemetry =
            std::sync::Arc::new(Telemetry::new(&TelemetryConfig::default()).expect("telemetry"));
        let mut proxy = Proxy::new(index, telemetry, Default::default());
        let pool = Pool::new("m".into(), 16, Policy::Precise, vec![("a:1".into(), None)]);
        proxy.add_pool(
            "chat",
            pool,
            TokenSource::Approximate,
            SessionSource::default(),
        );
        proxy.stagger.set_position(2);
        // Three instants of two requests each, 260 ms apart: bursts, for the second after
        // the last (a minute ahead, so that a slow test machine still reads it within it).
        let at = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for k in 0..3u32 {
            let instant = at + std::time::Duration::from_millis(260) * k;
            proxy.pools[0].staggered.arrived(instant);
            proxy.pools[0].staggered.arrived(instant);
        }
        proxy.pools[0]
            .staggered
            .note(std::time::Duration::from_millis(4));
        proxy.pools[0]
            .staggered
            .note(std::time::Duration::from_millis(4));
        let s = status(&proxy);
        assert_eq!(s["stagger_slot"], 2);
        assert_eq!(
            s["pools"][0]["stagger"],
            serde_json::json!({"requests": 2, "seconds": 0.008, "bursting": true})
        );
        let text = metrics(&proxy);
        for line in [
            "warmpath_stagger_slot 2",
            "warmpath_stagger_holds_total{pool=\"chat\"} 2",
            "warmpath_stagger_hold_seconds_total{pool=\"chat\"} 0.008",
            "warmpath_cold_yields_total{pool=\"chat\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }

    #[test]
    fn the_token_guards_all_but_the_probes() {
        let token = AdminToken::new("0123456789abcdef-admin").unwrap();
        let good = Some("Bearer 0123456789abcdef-admin");
        assert_eq!(refusal(&token, "/status", good), None);
        assert_eq!(
            refusal(&token, "/metrics", Some("bearer  0123456789abcdef-admin ")),
            None
        );
        assert_eq!(refusal(&token, "/live", None), None);
        assert_eq!(refusal(&token, "/ready", None), None);
        let missing = refusal(&token, "/status", None).unwrap();
        assert!(
            missing.starts_with("Bearer realm=\"warmpath-admin\""),
            "{missing}"
        );
        assert!(missing.contains("invalid_request"), "{missing}");
        let wrong = refusal(&token, "/status", Some("Bearer nope")).unwrap();
        assert!(wrong.contains("invalid_token"), "{wrong}");
        for wrong in [
            "Bearer 0123456789abcdef-admiN",
            "Bearer 0123456789abcdef-admin-and-more",
            "Basic 0123456789abcdef-admin",
            "0123456789abcdef-admin",
            "Bearer",
        ] {
            assert!(
                refusal(&token, "/metrics", Some(wrong)).is_some(),
                "accepted `{wrong}`"
            );
        }
        // Unknown paths are refused before they are found missing: nothing is revealed.
        assert!(refusal(&token, "/nope", None).is_some());
        assert!(authorize(None, "/status", &headers(None)).is_ok());
    }
}
