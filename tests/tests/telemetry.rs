//! Per-tenant telemetry end to end: a scripted workload from several source addresses through
//! the proxy to the simulator, exported over OTLP (gRPC and HTTP/protobuf) to an in-process
//! receiver and through a real third-party collector (rotel), with exact values asserted;
//! over TLS and mTLS in `telemetry/tls.rs`.
#![allow(clippy::unwrap_used)] // test binary: a failed unwrap is a failed test

#[path = "telemetry/tls.rs"]
mod tls;

use std::{net::IpAddr, time::Duration};

use futures::StreamExt;
use serde_json::json;
use warmpath_e2e::{
    agent::proxy,
    agent_process::child_main,
    otlp::{Receiver, Snapshot},
    sim::{Fleet, get_json, metric, metrics_text, wait_for},
};

#[test]
#[ignore = "entry point of the agent child process (tests/src/agent_process.rs)"]
fn agent_process() {
    child_main();
}

const WAIT: Duration = Duration::from_secs(30);
const TENANT_FLAGS: [&str; 8] = [
    "--tenant-cidr",
    "team-a=127.0.0.2/32",
    "--tenant-cidr",
    "team-b=127.0.0.3/32",
    "--trust-tenant-header-from",
    "127.0.0.4",
    "--otlp-interval-ms",
    "200",
];

/// A client whose connections come from `source` (any 127/8 address is local).
fn client_from(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(source.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

async fn fleet() -> Fleet {
    Fleet::tiny(2, &[]).await
}

/// A non-streaming completion; returns the usage the client saw.
async fn complete(
    c: &reqwest::Client,
    base: &str,
    prompt: &str,
    tenant: Option<&str>,
) -> serde_json::Value {
    let mut req = c
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "sim-llama", "prompt": prompt, "max_tokens": 5}));
    if let Some(t) = tenant {
        req = req.header("x-warmpath-tenant", t);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json::<serde_json::Value>().await.unwrap()["usage"].clone()
}

/// A streaming chat request; returns the raw SSE text.
async fn stream_chat(c: &reqwest::Client, base: &str, text: &str, usage: bool) -> String {
    let mut body =
        json!({"messages": [{"role": "user", "content": text}], "max_tokens": 6, "stream": true});
    if usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

async fn bad_json(c: &reqwest::Client, base: &str) {
    let r = c
        .post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

/// Waits for an export whose request total is `total`, and returns it.
async fn export_with(receiver: &Receiver, total: u64) -> Snapshot {
    wait_for(
        &format!("an export with {total} requests"),
        WAIT,
        || async {
            receiver
                .latest("warmpath.requests")
                .filter(|s| s.sum("warmpath.requests", &[]) == total)
        },
    )
    .await
}

async fn engine_totals(fleet: &Fleet) -> (f64, f64, f64) {
    let client = reqwest::Client::new();
    let mut totals = (0.0, 0.0, 0.0);
    for i in 0..fleet.engines.len() {
        let url = fleet.url(i);
        totals.0 += metric(&client, &url, "vllm:prompt_tokens_total").await;
        totals.1 += metric(&client, &url, "vllm:generation_tokens_total").await;
        totals.2 += metric(&client, &url, "vllm:prefix_cache_hits_total").await;
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_tenant_counts_tokens_and_histograms_are_exact_over_otlp_grpc() {
    let fleet = fleet().await;
    let receiver = Receiver::start().await;
    let grpc = format!("http://{}", receiver.grpc);
    let mut flags = TENANT_FLAGS.to_vec();
    flags.extend(["--otlp-endpoint", &grpc, "--otlp-protocol", "grpc"]);
    let routing = proxy(&fleet, &flags).await;
    let base = format!("http://{}", routing.listen);
    let (a, b, gateway) = (
        client_from("127.0.0.2"),
        client_from("127.0.0.3"),
        client_from("127.0.0.4"),
    );

    // team-a: 3 completions, 2 streams without usage, 1 with, 2 malformed bodies.
    let mut a_prompt = 0;
    for i in 0..3 {
        let u = complete(
            &a,
            &base,
            &format!("team a asks question {i} about the weather"),
            None,
        )
        .await;
        a_prompt += u["prompt_tokens"].as_u64().unwrap();
    }
    for i in 0..2 {
        let sse = stream_chat(&a, &base, &format!("stream {i} please"), false).await;
        // The client did not ask for usage: it sees none, not even `"usage":null`.
        assert!(!sse.contains("usage"), "{sse}");
        assert!(sse.ends_with("data: [DONE]\n\n"), "{sse}");
    }
    let sse = stream_chat(&a, &base, "stream with usage", true).await;
    assert!(
        sse.contains("\"choices\":[]") && sse.contains("\"usage\":{"),
        "{sse}"
    );
    for _ in 0..2 {
        bad_json(&a, &base).await;
    }
    // team-b: 2 completions and one unknown model.
    let mut b_usage = (0, 0, 0);
    for i in 0..2 {
        let u = complete(
            &b,
            &base,
            &format!("team b wants summary {i} of the report"),
            None,
        )
        .await;
        b_usage.0 += u["prompt_tokens"].as_u64().unwrap();
        b_usage.1 += u["completion_tokens"].as_u64().unwrap();
        b_usage.2 += u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
    }
    let r = b
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "nope", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // A trusted gateway names team-c in the header.
    for i in 0..2 {
        complete(
            &gateway,
            &base,
            &format!("gateway user {i} says hello"),
            Some("team-c"),
        )
        .await;
    }
    // An unlisted source claims to be team-a: not believed, counted as the default tenant.
    complete(
        &client_from("127.0.0.5"),
        &base,
        "spoofing is futile",
        Some("team-a"),
    )
    .await;

    let s = export_with(&receiver, 14).await;
    let req = |tenant: &str, outcome: &str| {
        s.sum(
            "warmpath.requests",
            &[("tenant", tenant), ("outcome", outcome)],
        )
    };
    assert_eq!(req("team-a", "ok"), 6);
    assert_eq!(req("team-a", "client_error"), 2);
    assert_eq!(req("team-b", "ok"), 2);
    assert_eq!(req("team-b", "client_error"), 1);
    assert_eq!(req("team-c", "ok"), 2);
    assert_eq!(req("default", "ok"), 1);
    assert_eq!(
        s.sum("warmpath.requests", &[("outcome", "upstream_error")]),
        0
    );
    assert_eq!(
        s.values("warmpath.requests", "tenant"),
        ["default", "team-a", "team-b", "team-c"]
    );
    // Token sums equal the engines' own counters, and per tenant what the client saw.
    let (prompt, generated, hits) = engine_totals(&fleet).await;
    assert_eq!(s.sum("warmpath.prompt_tokens", &[]) as f64, prompt);
    assert_eq!(s.sum("warmpath.completion_tokens", &[]) as f64, generated);
    assert_eq!(s.sum("warmpath.cached_prompt_tokens", &[]) as f64, hits);
    let tb = [("tenant", "team-b")];
    assert_eq!(
        (
            s.sum("warmpath.prompt_tokens", &tb),
            s.sum("warmpath.completion_tokens", &tb),
            s.sum("warmpath.cached_prompt_tokens", &tb)
        ),
        b_usage
    );
    assert!(s.sum("warmpath.prompt_tokens", &[("tenant", "team-a")]) > a_prompt);
    // Histogram counts equal requests: every request has a duration, every served one a TTFT.
    for (tenant, all, ok) in [
        ("team-a", 8, 6),
        ("team-b", 3, 2),
        ("team-c", 2, 2),
        ("default", 1, 1),
    ] {
        let t = [("tenant", tenant)];
        assert_eq!(s.count("warmpath.request.duration", &t), all, "{tenant}");
        assert_eq!(s.count("warmpath.ttft", &t), ok, "{tenant}");
    }
    // Time per output token: the three team-a streams (6 tokens each).
    assert_eq!(s.count("warmpath.tpot", &[("tenant", "team-a")]), 3);
    assert_eq!(
        s.sum("warmpath.decisions", &[]),
        11,
        "one per routed request"
    );
    assert_eq!(s.resource("service.name").as_deref(), Some("warmpath"));
    assert!(s.values("warmpath.index.healthy", "pod").len() == 2);

    // The same data on the admin port.
    let admin = reqwest::Client::new();
    let prom = metrics_text(&admin, &format!("http://{}", routing.admin)).await;
    assert!(
        prom.lines()
            .any(|l| l.starts_with("warmpath_requests_total{")
                && l.contains("tenant=\"team-a\"")
                && l.contains("outcome=\"ok\"")
                && l.ends_with(" 6")),
        "{prom}"
    );
    assert!(prom.contains("# TYPE warmpath_ttft_seconds histogram"));
    // Every metric the Grafana dashboard queries is one the agent exports.
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/warmpath/dashboards/warmpath-tenants.json"
    ))
    .unwrap();
    let mut queried: Vec<&str> = dashboard
        .match_indices("warmpath_")
        .map(|(i, _)| {
            let rest = &dashboard[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|n| *n != "warmpath_")
        .collect();
    queried.sort_unstable();
    queried.dedup();
    assert!(queried.len() >= 10, "{queried:?}");
    for name in queried {
        let family = name.trim_end_matches("_bucket");
        assert!(
            prom.contains(&format!("# TYPE {family} ")),
            "dashboard queries {name}, which /metrics lacks"
        );
    }
    let status = get_json(&admin, &format!("http://{}/status", routing.admin)).await;
    let team_a = status["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "team-a")
        .unwrap();
    assert_eq!(team_a["requests"], 8);
    assert_eq!(team_a["errors"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_tenant_header_does_not_change_attribution() {
    let fleet = fleet().await;
    let routing = proxy(&fleet, &TENANT_FLAGS).await;
    let base = format!("http://{}", routing.listen);
    // From team-b's workload, claiming team-a: the workload wins.
    complete(
        &client_from("127.0.0.3"),
        &base,
        "i am team a, honest",
        Some("team-a"),
    )
    .await;
    // From an unknown source, claiming team-a: the default tenant.
    complete(&client_from("127.0.0.6"), &base, "me too", Some("team-a")).await;
    // From the trusted gateway: believed.
    complete(
        &client_from("127.0.0.4"),
        &base,
        "gateway for a",
        Some("team-a"),
    )
    .await;
    let ok = |prom: &str, tenant: &str| {
        prom.lines()
            .find(|l| {
                l.starts_with("warmpath_requests_total{")
                    && l.contains(&format!("tenant=\"{tenant}\""))
                    && l.contains("outcome=\"ok\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    // A request is recorded when its response body is dropped, just after the client
    // has read it: wait until each tenant's request is counted somewhere.
    let tenants = ["team-a", "team-b", "default"];
    let prom = scrape_until(&routing.admin, "one request per tenant", |p| {
        tenants.iter().all(|t| ok(p, t).is_some())
    })
    .await;
    for t in tenants {
        assert_eq!(ok(&prom, t).as_deref(), Some("1"), "{t}: {prom}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_export_counts_cancellations() {
    let fleet = Fleet::start(&["--port", "0", "--profile", "llama-3.1-8b-h100"]).await;
    let receiver = Receiver::start().await;
    let http = format!("http://{}", receiver.http);
    let mut flags = TENANT_FLAGS.to_vec();
    flags.extend(["--otlp-endpoint", &http, "--otlp-protocol", "http/protobuf"]);
    let routing = proxy(&fleet, &flags).await;
    let base = format!("http://{}", routing.listen);
    let a = client_from("127.0.0.2");
    complete(&a, &base, "a short one first", None).await;
    let resp = a
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "tell me a long story", "max_tokens": 2000, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(stream);
    let s = export_with(&receiver, 2).await;
    let t = [("tenant", "team-a")];
    assert_eq!(
        s.sum(
            "warmpath.requests",
            &[("tenant", "team-a"), ("outcome", "ok")]
        ),
        1
    );
    assert_eq!(
        s.sum(
            "warmpath.requests",
            &[("tenant", "team-a"), ("outcome", "cancelled")]
        ),
        1
    );
    assert_eq!(s.count("warmpath.request.duration", &t), 2);
    assert_eq!(
        s.count("warmpath.ttft", &t),
        2,
        "the cancelled stream had its first token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_collector_receives_the_metrics() {
    let test = "a_real_collector_receives_the_metrics";
    let Some(rotel) = warmpath_e2e::otlp::rotel_binary(test) else {
        return;
    };
    // warmpath --OTLP/gRPC--> rotel --OTLP/gRPC--> the in-process receiver.
    let receiver = Receiver::start().await;
    let port =
        || std::net::SocketAddr::from(([127, 0, 0, 1], warmpath_e2e::scratch::free_tcp_port()));
    let (rotel_grpc, rotel_http) = (port(), port());
    let mut cmd = std::process::Command::new(&rotel);
    cmd.args(["start", "--otlp-grpc-endpoint"])
        .arg(rotel_grpc.to_string())
        .arg("--otlp-http-endpoint")
        .arg(rotel_http.to_string())
        .args(["--exporter", "otlp", "--otlp-exporter-protocol", "grpc"])
        .arg("--otlp-exporter-endpoint")
        .arg(format!("http://{}", receiver.grpc))
        .args(["--batch-timeout", "100ms"]);
    let _collector = warmpath_e2e::process::OwnedChild::spawn(cmd).unwrap();
    wait_for("rotel listening", WAIT, || async move {
        tokio::net::TcpStream::connect(rotel_grpc)
            .await
            .ok()
            .map(|_| ())
    })
    .await;

    let fleet = fleet().await;
    let endpoint = format!("http://{rotel_grpc}");
    let mut flags = TENANT_FLAGS.to_vec();
    flags.extend(["--otlp-endpoint", &endpoint, "--otlp-protocol", "grpc"]);
    let routing = proxy(&fleet, &flags).await;
    let base = format!("http://{}", routing.listen);
    for i in 0..3 {
        complete(
            &client_from("127.0.0.2"),
            &base,
            &format!("via the collector {i}"),
            None,
        )
        .await;
    }
    let s = export_with(&receiver, 3).await;
    assert_eq!(
        s.sum(
            "warmpath.requests",
            &[("tenant", "team-a"), ("outcome", "ok")]
        ),
        3
    );
    assert_eq!(s.count("warmpath.ttft", &[("tenant", "team-a")]), 3);
    assert_eq!(s.resource("service.name").as_deref(), Some("warmpath"));
    warmpath_e2e::gate::announce(&format!(
        "rotel collector forwarded warmpath metrics ({} exports received)",
        receiver.exports()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_does_not_block_requests() {
    // Accepts connections and never reads or answers: the worst collector there is.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let _hole = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hole.accept().await {
            held.push(s);
        }
    });
    let fleet = fleet().await;
    let endpoint = format!("http://{hole_addr}");
    for protocol in ["grpc", "http/protobuf"] {
        let mut flags = TENANT_FLAGS.to_vec();
        flags.extend(["--otlp-endpoint", &endpoint, "--otlp-protocol", protocol]);
        let routing = proxy(&fleet, &flags).await;
        let base = format!("http://{}", routing.listen);
        let a = client_from("127.0.0.2");
        // Several export intervals pass while requests are served.
        for i in 0..10 {
            tokio::time::timeout(
                WAIT,
                complete(&a, &base, &format!("still served {i}"), None),
            )
            .await
            .unwrap();
        }
        let counted = |p: &str| {
            p.lines().any(|l| {
                l.starts_with("warmpath_requests_total{")
                    && l.contains("outcome=\"ok\"")
                    && l.ends_with(" 10")
            })
        };
        // Fails (times out) unless all ten are counted while the collector hangs.
        scrape_until(
            &routing.admin,
            &format!("ten requests counted ({protocol})"),
            counted,
        )
        .await;
    }
}

/// The admin port's Prometheus text once `done` holds for it (or a panic after [`WAIT`]).
async fn scrape_until(
    admin: &std::net::SocketAddr,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let url = format!("http://{admin}/metrics");
    wait_for(what, WAIT, || async {
        let prom = reqwest::get(&url).await.ok()?.text().await.ok()?;
        done(&prom).then_some(prom)
    })
    .await
}
