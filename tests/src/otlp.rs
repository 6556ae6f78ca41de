//! An in-process OTLP metrics receiver (gRPC from opentelemetry-proto's tonic stubs, and
//! HTTP/protobuf on `/v1/metrics`), plain or over TLS and mTLS (rotel, the collector the
//! suite also uses, serves its receivers without TLS), that keeps every export and its
//! headers, plus queries over the latest one.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

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
/// Request headers (gRPC metadata) of every export, lowercase names.
type Headers = Arc<Mutex<Vec<Vec<(String, String)>>>>;

/// A running receiver; both servers stop when it is dropped.
#[derive(Debug)]
pub struct Receiver {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    received: Received,
    headers: Headers,
    /// TLS handshakes that failed (a client without an accepted certificate, or one that
    /// does not trust the server's).
    handshake_failures: Arc<AtomicUsize>,
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
struct Grpc(Received, Headers);

fn header_pairs(h: &http::HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

#[tonic::async_trait]
impl MetricsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let headers = header_pairs(&request.metadata().clone().into_headers());
        self.1.lock().push(headers);
        self.0.lock().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

/// How a TLS receiver serves: the certificates and whether clients must present one.
#[derive(Debug, Clone, Copy)]
pub struct Tls<'a> {
    pub pki: &'a crate::pki::Pki,
    /// mTLS: only clients with a certificate from the same CA complete the handshake.
    pub client_auth: bool,
}

/// Accepts TLS on `listener`, handing finished handshakes to the returned stream and
/// counting failed ones.
fn tls_incoming(
    listener: tokio::net::TcpListener,
    config: rustls::ServerConfig,
    failures: Arc<AtomicUsize>,
) -> (
    tokio_stream::wrappers::ReceiverStream<
        std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>,
    >,
    tokio::task::JoinHandle<()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, tx, failures) = (acceptor.clone(), tx.clone(), failures.clone());
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Ok(tls) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    (tokio_stream::wrappers::ReceiverStream::new(rx), task)
}

/// The HTTP/protobuf receiver's routes: `/v1/metrics`, gzip bodies accepted.
fn http_app(store: Received, headers: Headers) -> axum::Router {
    axum::Router::new().route(
        "/v1/metrics",
        axum::routing::post(move |h: axum::http::HeaderMap, body: bytes::Bytes| {
            let (store, headers) = (store.clone(), headers.clone());
            async move {
                let gzip = h
                    .get(http::header::CONTENT_ENCODING)
                    .is_some_and(|v| v.as_bytes() == b"gzip");
                let body = if gzip {
                    let mut out = Vec::new();
                    match std::io::Read::read_to_end(
                        &mut flate2::read::GzDecoder::new(&body[..]),
                        &mut out,
                    ) {
                        Ok(_) => bytes::Bytes::from(out),
                        Err(_) => return (axum::http::StatusCode::BAD_REQUEST, Vec::new()),
                    }
                } else {
                    body
                };
                match ExportMetricsServiceRequest::decode(body) {
                    Ok(req) => {
                        headers.lock().push(header_pairs(&h));
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
    )
}

impl Receiver {
    /// Plain gRPC and HTTP on loopback ports.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// gRPC and HTTP/protobuf over TLS (`https://127.0.0.1:PORT`).
    pub async fn start_tls(tls: Tls<'_>) -> Self {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<Tls<'_>>) -> Self {
        let received = Received::default();
        let headers = Headers::default();
        let handshake_failures = Arc::new(AtomicUsize::new(0));
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
        let svc = MetricsServiceServer::new(Grpc(received.clone(), headers.clone()))
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        let app = http_app(received.clone(), headers.clone());
        let mut tasks = Vec::new();
        match tls {
            None => {
                tasks.push(tokio::spawn(async move {
                    let _ = tonic::transport::Server::builder()
                        .add_service(svc)
                        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                            grpc_listener,
                        ))
                        .await;
                }));
                tasks.push(tokio::spawn(async move {
                    let _ = axum::serve(http_listener, app).await;
                }));
            }
            Some(t) => {
                let (incoming, accept) = tls_incoming(
                    grpc_listener,
                    t.pki.server_config(t.client_auth, &[b"h2"]),
                    handshake_failures.clone(),
                );
                tasks.push(accept);
                tasks.push(tokio::spawn(async move {
                    let _ = tonic::transport::Server::builder()
                        .add_service(svc)
                        .serve_with_incoming(incoming)
                        .await;
                }));
                let (mut incoming, accept) = tls_incoming(
                    http_listener,
                    t.pki.server_config(t.client_auth, &[b"http/1.1"]),
                    handshake_failures.clone(),
                );
                tasks.push(accept);
                tasks.push(tokio::spawn(async move {
                    use futures::StreamExt as _;
                    while let Some(Ok(tls)) = incoming.next().await {
                        let service = hyper_util::service::TowerToHyperService::new(app.clone());
                        tokio::spawn(async move {
                            let _ = hyper_util::server::conn::auto::Builder::new(
                                hyper_util::rt::TokioExecutor::new(),
                            )
                            .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                            .await;
                        });
                    }
                }));
            }
        }
        Self {
            grpc,
            http,
            received,
            headers,
            handshake_failures,
            tasks,
        }
    }

    /// TLS handshakes that failed so far.
    pub fn handshake_failures(&self) -> usize {
        self.handshake_failures.load(Ordering::Relaxed)
    }

    /// Whether some export arrived with header `name` set to `value`.
    pub fn saw_header(&self, name: &str, value: &str) -> bool {
        self.headers
            .lock()
            .iter()
            .any(|h| h.iter().any(|(k, v)| k == name && v == value))
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
