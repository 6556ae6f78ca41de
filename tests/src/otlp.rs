//! An in-process OTLP metrics receiver (gRPC from opentelemetry-proto's tonic stubs, and
//! HTTP/protobuf on `/v1/metrics`) that keeps every export, plus queries over the latest one.

use std::{net::SocketAddr, sync::Arc};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        metrics_service_server::{MetricsService, MetricsServiceServer},
    },
    common::v1::{AnyValue, KeyValue, any_value},
    metrics::v1::{Metric, metric},
};
use parking_lot::Mutex;
use prost::Message;

type Received = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

/// A running receiver; both servers stop when it is dropped.
#[derive(Debug)]
pub struct Receiver {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    received: Received,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[derive(Debug, Clone)]
struct Grpc(Received);

#[tonic::async_trait]
impl MetricsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.lock().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    pub async fn start() -> Self {
        let received = Received::default();
        let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let (grpc, http) = (
            grpc_listener.local_addr().expect("bound"),
            http_listener.local_addr().expect("bound"),
        );
        // Collectors compress by default (rotel: gzip).
        let svc = MetricsServiceServer::new(Grpc(received.clone()))
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        let grpc_task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                    grpc_listener,
                ))
                .await;
        });
        let store = received.clone();
        let app = axum::Router::new().route(
            "/v1/metrics",
            axum::routing::post(move |body: bytes::Bytes| {
                let store = store.clone();
                async move {
                    match ExportMetricsServiceRequest::decode(body) {
                        Ok(req) => {
                            store.lock().push(req);
                            (
                                axum::http::StatusCode::OK,
                                ExportMetricsServiceResponse {
                                    partial_success: None,
                                }
                                .encode_to_vec(),
                            )
                        }
                        Err(_) => (axum::http::StatusCode::BAD_REQUEST, Vec::new()),
                    }
                }
            }),
        );
        let http_task = tokio::spawn(async move {
            let _ = axum::serve(http_listener, app).await;
        });
        Self {
            grpc,
            http,
            received,
            tasks: vec![grpc_task, http_task],
        }
    }

    /// Exports received so far.
    pub fn exports(&self) -> usize {
        self.received.lock().len()
    }

    /// The latest export that carries metric `name` (cumulative: it holds the totals).
    pub fn latest(&self, name: &str) -> Option<Snapshot> {
        self.received
            .lock()
            .iter()
            .rev()
            .find(|r| metrics(r).any(|m| m.name == name))
            .cloned()
            .map(Snapshot)
    }
}

fn metrics(r: &ExportMetricsServiceRequest) -> impl Iterator<Item = &Metric> {
    r.resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
}

fn text(v: &Option<AnyValue>) -> Option<String> {
    match v.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

fn matches(attrs: &[KeyValue], want: &[(&str, &str)]) -> bool {
    want.iter().all(|(k, v)| {
        attrs
            .iter()
            .any(|a| a.key == *k && text(&a.value).as_deref() == Some(*v))
    })
}

/// One export, queried by metric name and attribute subset.
#[derive(Debug, Clone)]
pub struct Snapshot(pub ExportMetricsServiceRequest);

impl Snapshot {
    fn metric(&self, name: &str) -> Option<&Metric> {
        metrics(&self.0).find(|m| m.name == name)
    }

    /// Sum of a counter's points whose attributes include `want`.
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> u64 {
        match self.metric(name).and_then(|m| m.data.as_ref()) {
            Some(metric::Data::Sum(s)) => s
                .data_points
                .iter()
                .filter(|p| matches(&p.attributes, want))
                .map(|p| match p.value {
                    Some(
                        opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(i),
                    ) => i as u64,
                    Some(
                        opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(
                            d,
                        ),
                    ) => d as u64,
                    None => 0,
                })
                .sum(),
            _ => 0,
        }
    }

    /// Total count of a histogram's points whose attributes include `want`.
    pub fn count(&self, name: &str, want: &[(&str, &str)]) -> u64 {
        match self.metric(name).and_then(|m| m.data.as_ref()) {
            Some(metric::Data::Histogram(h)) => h
                .data_points
                .iter()
                .filter(|p| matches(&p.attributes, want))
                .map(|p| p.count)
                .sum(),
            _ => 0,
        }
    }

    /// Distinct values of attribute `key` on metric `name`.
    pub fn values(&self, name: &str, key: &str) -> Vec<String> {
        let attrs: Vec<&Vec<KeyValue>> = match self.metric(name).and_then(|m| m.data.as_ref()) {
            Some(metric::Data::Sum(s)) => s.data_points.iter().map(|p| &p.attributes).collect(),
            Some(metric::Data::Histogram(h)) => {
                h.data_points.iter().map(|p| &p.attributes).collect()
            }
            Some(metric::Data::Gauge(g)) => g.data_points.iter().map(|p| &p.attributes).collect(),
            _ => Vec::new(),
        };
        let mut out: Vec<String> = attrs
            .into_iter()
            .flat_map(|a| {
                a.iter()
                    .filter(|kv| kv.key == key)
                    .filter_map(|kv| text(&kv.value))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// A resource attribute of the exporting process.
    pub fn resource(&self, key: &str) -> Option<String> {
        self.0
            .resource_metrics
            .iter()
            .filter_map(|rm| rm.resource.as_ref())
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == key)
            .and_then(|kv| text(&kv.value))
    }
}

/// The variable naming the rotel collector binary (else found through `python3 -c 'import rotel'`).
pub const ROTEL_BIN: &str = "WARMPATH_ROTEL";
/// With `CI=true` or this set to 1, a missing collector fails the test instead of skipping it.
pub const REQUIRE_COLLECTOR: &str = "WARMPATH_REQUIRE_COLLECTOR";

/// The rotel binary, or why there is none (after printing the skip line, or panicking under
/// CI).
pub fn rotel_binary(test: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os(ROTEL_BIN)
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let out = std::process::Command::new("python3")
                .args([
                    "-c",
                    "import os, rotel; print(os.path.join(os.path.dirname(rotel.__file__), 'rotel-agent'))",
                ])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().into())
        })
        .filter(|p: &std::path::PathBuf| p.is_file());
    if found.is_none() {
        let required = std::env::var("CI").is_ok_and(|v| v == "true")
            || std::env::var(REQUIRE_COLLECTOR).is_ok_and(|v| v == "1");
        let why = "the rotel collector is not installed (pip install rotel; .ci/run does)";
        assert!(!required, "`{test}` cannot run: {why}");
        crate::gate::announce(&format!("SKIPPED {test}: {why}"));
    }
    found
}
