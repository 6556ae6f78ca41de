//! OTLP push: every interval (and on flush or shutdown) one export request carries warmpath's
//! own families and whatever other subsystems registered on the SDK meter, over gRPC or
//! HTTP/protobuf, cumulative.
//!
//! Pushing runs on its own thread with its own small runtime: a slow or dead collector never
//! delays a request. A failed push is logged (a warning on the first failure of a streak, then
//! debug); the next one carries the cumulative totals again, so nothing is lost but freshness.

use std::{
    sync::{Arc, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        ExportMetricsServiceRequest, metrics_service_client::MetricsServiceClient,
    },
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value},
    metrics::v1::{
        AggregationTemporality, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
        ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
    },
};
use prost::Message as _;

use super::{
    Error, SCOPE, Sources,
    export::{Compression, OtlpConfig, OtlpProtocol},
    prometheus::SdkReader,
    series::{FAMILIES, Point, PointValue, Value, points},
    tls::OtlpTls,
};

/// Longest a flush or the final push at shutdown waits beyond the export timeout.
const GRACE: Duration = Duration::from_secs(1);

enum Command {
    /// Push now; answer when done.
    Flush(mpsc::SyncSender<()>),
}

/// The pushing thread; a final push happens when this is dropped.
#[derive(Debug)]
pub struct Pusher {
    commands: Option<mpsc::SyncSender<Command>>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread has finished (behind a lock only to be `Sync`).
    finished: parking_lot::Mutex<mpsc::Receiver<()>>,
    timeout: Duration,
}

impl Pusher {
    pub fn start(
        config: &OtlpConfig,
        sources: Arc<Sources>,
        sdk: SdkReader,
    ) -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Exporter(format!("OTLP runtime: {e}")))?;
        let transport = {
            let _entered = runtime.enter();
            Transport::new(config)?
        };
        let (commands, received) = mpsc::sync_channel(4);
        let interval = config.interval;
        let timeout = config.timeout;
        let exporter = Exporter {
            transport,
            sources,
            sdk,
            timeout,
            failing: false,
            mtls_hint: config.tls.as_ref().is_some_and(|t| t.client.is_none()),
        };
        let (finishing, finished) = mpsc::sync_channel::<()>(0);
        let thread = std::thread::Builder::new()
            .name("warmpath-otlp".into())
            .spawn(move || {
                let _finishing = finishing;
                exporter.run(&runtime, &received, interval);
            })
            .map_err(|e| Error::Exporter(format!("OTLP thread: {e}")))?;
        Ok(Self {
            commands: Some(commands),
            thread: Some(thread),
            finished: parking_lot::Mutex::new(finished),
            timeout,
        })
    }

    /// Pushes now and waits for it (at most the export timeout and a grace second).
    pub fn flush(&self) {
        let (done, wait) = mpsc::sync_channel(1);
        let Some(commands) = &self.commands else {
            return;
        };
        if commands.try_send(Command::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(self.timeout + GRACE);
        }
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        // Closing the channel asks for the final push; the thread is joined when it is done
        // in time, and left to finish on its own otherwise.
        drop(self.commands.take());
        let done = matches!(
            self.finished.get_mut().recv_timeout(self.timeout + GRACE),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
        if let Some(thread) = self.thread.take().filter(|_| done) {
            let _ = thread.join();
        }
    }
}

struct Exporter {
    transport: Transport,
    sources: Arc<Sources>,
    sdk: SdkReader,
    timeout: Duration,
    /// The last push failed (log the first failure of a streak only at warning level).
    failing: bool,
    /// TLS without a client certificate: a connection the collector closes after the
    /// handshake is most likely its mTLS refusal (TLS 1.3 sends that alert after the
    /// client's handshake is done, and h2/hyper report only the closed connection).
    mtls_hint: bool,
}

/// The hint a closed TLS connection gets when no client certificate is configured.
const MTLS_HINT: &str = "no client certificate is configured: if the collector requires client certificates (mTLS), set OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY (or --otlp-client-certificate and --otlp-client-key)";

impl Exporter {
    fn run(
        mut self,
        runtime: &tokio::runtime::Runtime,
        commands: &mpsc::Receiver<Command>,
        every: Duration,
    ) {
        let mut next = Instant::now() + every;
        loop {
            match commands.recv_timeout(next.saturating_duration_since(Instant::now())) {
                Ok(Command::Flush(done)) => {
                    runtime.block_on(self.push());
                    let _ = done.send(());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    runtime.block_on(self.push());
                    next = Instant::now() + every;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    runtime.block_on(self.push());
                    return;
                }
            }
        }
    }

    async fn push(&mut self) {
        let request = request(&self.sources, &self.sdk);
        let result = match tokio::time::timeout(self.timeout, self.transport.send(request)).await {
            Ok(r) => r,
            Err(_) => Err(Failure::other(format!(
                "no answer within {:?}",
                self.timeout
            ))),
        };
        let result = result.map_err(|f| {
            if self.mtls_hint && f.dropped {
                format!("{} ({MTLS_HINT})", f.message)
            } else {
                f.message
            }
        });
        match result {
            Ok(()) => self.failing = false,
            Err(err) if !self.failing => {
                self.failing = true;
                tracing::warn!(%err, endpoint = %self.transport.endpoint(), "OTLP push failed; retrying at the next interval");
            }
            Err(err) => tracing::debug!(%err, "OTLP push failed again"),
        }
    }
}

/// The HTTP/protobuf client: hyper over rustls (or plain TCP for http://).
type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<bytes::Bytes>,
>;

enum Transport {
    Grpc {
        endpoint: String,
        client: MetricsServiceClient<tonic::transport::Channel>,
        headers: tonic::metadata::MetadataMap,
    },
    Http {
        endpoint: http::Uri,
        /// Boxed: the hyper client is most of the enum's size.
        client: Box<HttpClient>,
        headers: http::HeaderMap,
        gzip: bool,
    },
}

impl Transport {
    /// Builds the client; connections are made at the first push. Must run inside a runtime.
    fn new(config: &OtlpConfig) -> Result<Self, Error> {
        let bad = |e: &dyn std::fmt::Display| Error::Exporter(format!("{}: {e}", config.endpoint));
        let gzip = config.compression == Compression::Gzip;
        Ok(match config.protocol {
            OtlpProtocol::Grpc => {
                let mut endpoint = tonic::transport::Endpoint::from_shared(config.endpoint.clone())
                    .map_err(|e| bad(&e))?
                    .connect_timeout(config.timeout)
                    .timeout(config.timeout);
                if let Some(tls) = &config.tls {
                    endpoint = endpoint
                        .tls_config(grpc_tls(tls))
                        .map_err(|e| bad(&format!("TLS: {}", crate::error_chain(&e))))?;
                }
                let mut headers = tonic::metadata::MetadataMap::new();
                for (k, v) in &config.headers {
                    let key = tonic::metadata::MetadataKey::from_bytes(k.as_bytes())
                        .map_err(|e| bad(&e))?;
                    headers.insert(key, v.parse().map_err(|e| bad(&e))?);
                }
                let mut client = MetricsServiceClient::new(endpoint.connect_lazy());
                if gzip {
                    client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Transport::Grpc {
                    endpoint: config.endpoint.clone(),
                    client,
                    headers,
                }
            }
            OtlpProtocol::HttpProtobuf => {
                let mut headers = http::HeaderMap::new();
                for (k, v) in &config.headers {
                    headers.insert(
                        http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| bad(&e))?,
                        http::HeaderValue::from_str(v).map_err(|e| bad(&e))?,
                    );
                }
                headers.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/x-protobuf"),
                );
                if gzip {
                    headers.insert(
                        http::header::CONTENT_ENCODING,
                        http::HeaderValue::from_static("gzip"),
                    );
                }
                let tls = match &config.tls {
                    Some(tls) => tls.client_config().map_err(|e| bad(&e))?,
                    // Never used for http:// (no handshake happens); the connector needs one.
                    None => rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                        rustls::crypto::ring::default_provider(),
                    ))
                    .with_safe_default_protocol_versions()
                    .map_err(|e| bad(&e))?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
                };
                let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
                tcp.enforce_http(false);
                tcp.set_connect_timeout(Some(config.timeout));
                tcp.set_nodelay(true);
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(tcp);
                let client = hyper_util::client::legacy::Client::builder(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .build(connector);
                Transport::Http {
                    endpoint: config.endpoint.parse().map_err(|e| bad(&e))?,
                    client: Box::new(client),
                    headers,
                    gzip,
                }
            }
        })
    }

    fn endpoint(&self) -> String {
        match self {
            Transport::Grpc { endpoint, .. } => endpoint.clone(),
            Transport::Http { endpoint, .. } => endpoint.to_string(),
        }
    }

    async fn send(&mut self, request: ExportMetricsServiceRequest) -> Result<(), Failure> {
        match self {
            Transport::Grpc {
                client, headers, ..
            } => {
                let mut r = tonic::Request::new(request);
                *r.metadata_mut() = headers.clone();
                client.export(r).await.map(drop).map_err(|s| {
                    // A transport failure (refused connection, TLS handshake) is in the
                    // status's source chain, not its message.
                    match std::error::Error::source(&s) {
                        Some(cause) => {
                            let chain = crate::error_chain(cause);
                            let dropped = !chain.contains("refused")
                                && !chain.contains("invalid peer certificate");
                            Failure {
                                message: format!("{}: {}: {chain}", s.code(), s.message()),
                                dropped,
                            }
                        }
                        None => Failure::other(format!("{}: {}", s.code(), s.message())),
                    }
                })
            }
            Transport::Http {
                endpoint,
                client,
                headers,
                gzip,
            } => {
                let body = request.encode_to_vec();
                let body = if *gzip {
                    gzipped(&body).map_err(Failure::other)?
                } else {
                    body
                };
                let mut r = http::Request::post(endpoint.clone())
                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                    .map_err(|e| Failure::other(e.to_string()))?;
                *r.headers_mut() = headers.clone();
                let response = client.request(r).await.map_err(|e| Failure {
                    message: crate::error_chain(&e),
                    // Connected (TLS handshake included), then dropped.
                    dropped: !e.is_connect(),
                })?;
                if response.status().is_success() {
                    Ok(())
                } else {
                    Err(Failure::other(format!(
                        "the collector answered {}",
                        response.status()
                    )))
                }
            }
        }
    }
}

/// Why a push failed.
struct Failure {
    message: String,
    /// The connection was made and then dropped by the collector (not refused, not a
    /// certificate the agent rejected, not an answer).
    dropped: bool,
}

impl Failure {
    fn other(message: String) -> Self {
        Self {
            message,
            dropped: false,
        }
    }
}

/// tonic's TLS settings from the same PEM the HTTP client uses: the custom CA instead of
/// the system's roots, and the client identity.
fn grpc_tls(tls: &OtlpTls) -> tonic::transport::ClientTlsConfig {
    let mut t = tonic::transport::ClientTlsConfig::new();
    t = match &tls.ca {
        Some(pem) => t.ca_certificate(tonic::transport::Certificate::from_pem(pem)),
        None => t.with_native_roots(),
    };
    if let Some(id) = &tls.client {
        t = t.identity(tonic::transport::Identity::from_pem(&id.chain, &id.key));
    }
    t
}

fn gzipped(body: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::default(),
    );
    gz.write_all(body)
        .and_then(|()| gz.finish())
        .map_err(|e| format!("gzip: {e}"))
}

/// One export: the SDK's scopes as the SDK renders them, warmpath's families in its own scope.
pub fn request(sources: &Sources, sdk: &SdkReader) -> ExportMetricsServiceRequest {
    let mut scopes: Vec<ScopeMetrics> = match sdk.collect_now() {
        Some(rm) => rm.scope_metrics().map(Into::into).collect(),
        None => Vec::new(),
    };
    let (totals, pools) = sources.snapshot();
    let start = unix_nanos(sources.started);
    let now = unix_nanos(SystemTime::now());
    let ours: Vec<Metric> = FAMILIES
        .iter()
        .filter_map(|family| {
            let points = points(family, &totals, &pools);
            if points.is_empty() {
                return None;
            }
            let cumulative = AggregationTemporality::Cumulative as i32;
            let data = match family.value {
                Value::Counter { .. } => metric::Data::Sum(Sum {
                    data_points: points.iter().map(|p| number_point(p, start, now)).collect(),
                    aggregation_temporality: cumulative,
                    is_monotonic: true,
                }),
                Value::Histogram(_) => metric::Data::Histogram(Histogram {
                    data_points: points
                        .iter()
                        .filter_map(|p| histogram_point(p, start, now))
                        .collect(),
                    aggregation_temporality: cumulative,
                }),
            };
            Some(Metric {
                name: family.name.to_string(),
                description: family.description.to_string(),
                unit: family.unit.to_string(),
                metadata: Vec::new(),
                data: Some(data),
            })
        })
        .collect();
    match scopes
        .iter_mut()
        .find(|s| s.scope.as_ref().is_some_and(|s| s.name == SCOPE))
    {
        Some(scope) => scope.metrics.extend(ours),
        None => scopes.push(ScopeMetrics {
            scope: Some(InstrumentationScope {
                name: SCOPE.to_string(),
                ..InstrumentationScope::default()
            }),
            metrics: ours,
            schema_url: String::new(),
        }),
    }
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some((&sources.resource).into()),
            scope_metrics: scopes,
            schema_url: sources
                .resource
                .schema_url()
                .unwrap_or_default()
                .to_string(),
        }],
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn attributes(p: &Point<'_>) -> Vec<KeyValue> {
    p.labels
        .iter()
        .map(|(k, v)| KeyValue {
            key: (*k).to_string(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue((*v).to_string())),
            }),
            ..KeyValue::default()
        })
        .collect()
}

fn number_point(p: &Point<'_>, start: u64, now: u64) -> NumberDataPoint {
    let v = match p.value {
        PointValue::Counter(v) => v,
        PointValue::Histogram(_) => 0,
    };
    NumberDataPoint {
        attributes: attributes(p),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(number_data_point::Value::AsInt(
            i64::try_from(v).unwrap_or(i64::MAX),
        )),
        ..NumberDataPoint::default()
    }
}

fn histogram_point(p: &Point<'_>, start: u64, now: u64) -> Option<HistogramDataPoint> {
    let PointValue::Histogram(h) = p.value else {
        return None;
    };
    let count = h.count();
    Some(HistogramDataPoint {
        attributes: attributes(p),
        start_time_unix_nano: start,
        time_unix_nano: now,
        count,
        sum: Some(h.sum),
        bucket_counts: h.counts.clone(),
        explicit_bounds: h.bounds.to_vec(),
        min: (count > 0).then_some(h.min),
        max: (count > 0).then_some(h.max),
        ..HistogramDataPoint::default()
    })
}

#[cfg(test)]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::{Resource, metrics::SdkMeterProvider};

    use super::*;
    use crate::telemetry::{
        Outcome, RequestRecord, Telemetry, TelemetryConfig, TokenUsage, cells::Labels,
    };

    #[test]
    fn one_request_carries_both_scopes_in_one_and_the_resource() {
        let reader = SdkReader::new();
        let provider = SdkMeterProvider::builder()
            .with_resource(Resource::builder().with_service_name("warmpath").build())
            .with_reader(reader.reader())
            .build();
        let _gauge = provider
            .meter(SCOPE)
            .u64_observable_gauge("warmpath.index.entries")
            .with_callback(|o| o.observe(7, &[]))
            .build();
        let telemetry = Telemetry::new(&TelemetryConfig::default()).unwrap();
        let pool = telemetry.register_pool("chat", "m");
        let tenant = telemetry.tenant(&Arc::from("team-a"));
        telemetry.record(
            &tenant,
            &RequestRecord {
                pool,
                pod: None,
                outcome: Outcome::Ok,
                usage: Some(TokenUsage {
                    prompt: 10,
                    cached: 4,
                    completion: 3,
                    cached_reported: true,
                }),
                receipt: None,
                retries: 1,
                queue: Some(Duration::from_micros(30)),
                ttft: Some(Duration::from_millis(20)),
                duration: Duration::from_millis(50),
                at: Instant::now(),
                streamed: true,
            },
        );
        let r = request(&telemetry.sources, &reader);
        let rm = &r.resource_metrics[0];
        let service = rm.resource.as_ref().unwrap().attributes.iter().any(|kv| {
            kv.key == "service.name"
                && kv.value.as_ref().and_then(|v| v.value.as_ref())
                    == Some(&any_value::Value::StringValue("warmpath".into()))
        });
        assert!(service, "the resource names the service");
        assert_eq!(rm.scope_metrics.len(), 1, "one `warmpath` scope");
        let metrics = &rm.scope_metrics[0].metrics;
        let find = |name: &str| metrics.iter().find(|m| m.name == name).unwrap();
        find("warmpath.index.entries");
        let Some(metric::Data::Sum(requests)) = &find("warmpath.requests").data else {
            panic!("requests is a sum");
        };
        assert!(requests.is_monotonic);
        let ok = requests
            .data_points
            .iter()
            .find(|p| {
                p.attributes
                    .iter()
                    .any(|kv| kv.key == "outcome" && format!("{:?}", kv.value).contains("\"ok\""))
            })
            .unwrap();
        assert_eq!(ok.value, Some(number_data_point::Value::AsInt(1)));
        assert_eq!(ok.attributes.len(), 4, "model, outcome, pool, tenant");
        let Some(metric::Data::Histogram(tpot)) = &find("warmpath.tpot").data else {
            panic!("tpot is a histogram");
        };
        let p = &tpot.data_points[0];
        assert_eq!(p.count, 1);
        assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
        assert_eq!(p.min, Some(0.015));
        assert!(p.start_time_unix_nano <= p.time_unix_nano);
        // A series recorded but never given a value in a histogram exports it empty.
        telemetry.sources.cells.with(
            crate::telemetry::cells::SeriesKey {
                kind: crate::telemetry::series::POOL,
                tenant: 0,
                pool: 0,
                pod: None,
            },
            &crate::telemetry::series::POOL_LAYOUT,
            Labels::default,
            |_| (),
        );
        let r = request(&telemetry.sources, &reader);
        let metrics = &r.resource_metrics[0].scope_metrics[0].metrics;
        let blocks = metrics
            .iter()
            .find(|m| m.name == "warmpath.prefix_blocks")
            .unwrap();
        let Some(metric::Data::Histogram(h)) = &blocks.data else {
            panic!("prefix blocks is a histogram");
        };
        assert_eq!((h.data_points[0].count, h.data_points[0].min), (0, None));
    }

    /// A one-request HTTP collector on a loopback port: returns what it read.
    fn collector() -> (String, std::thread::JoinHandle<Vec<u8>>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/metrics", listener.local_addr().unwrap());
        let thread = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // Head, then as many body bytes as content-length says.
            loop {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "the request ended early");
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if got.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .unwrap();
            got
        });
        (url, thread)
    }

    #[test]
    fn a_flush_pushes_protobuf_with_the_configured_headers() {
        let (url, collector) = collector();
        let config = OtlpConfig {
            endpoint: url,
            protocol: OtlpProtocol::HttpProtobuf,
            interval: Duration::from_secs(3600),
            timeout: Duration::from_secs(5),
            headers: vec![("authorization".into(), "Bearer abc".into())],
            tls: None,
            compression: Compression::None,
        };
        let telemetry = Telemetry::new(&TelemetryConfig {
            otlp: Some(config),
            ..TelemetryConfig::default()
        })
        .unwrap();
        let pool = telemetry.register_pool("chat", "m");
        telemetry.record_decision(pool, crate::telemetry::DecisionReason::Load, 0);
        telemetry.flush();
        let got = collector.join().unwrap();
        let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
        assert!(head.starts_with("post /v1/metrics "), "{head}");
        assert!(head.contains("authorization: bearer abc"), "{head}");
        assert!(
            head.contains("content-type: application/x-protobuf"),
            "{head}"
        );
        let request = ExportMetricsServiceRequest::decode(&got[end + 4..]).unwrap();
        let names: Vec<_> = request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "warmpath.prefix_blocks",
                "warmpath.ttft_prediction_error",
                "warmpath.decisions"
            ]
        );
    }

    #[test]
    fn a_dead_collector_does_not_hang_a_flush_or_the_shutdown() {
        // A port that was just free: nothing listens.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
            let telemetry = Telemetry::new(&TelemetryConfig {
                otlp: Some(OtlpConfig {
                    endpoint: format!("http://127.0.0.1:{port}"),
                    protocol,
                    interval: Duration::from_secs(3600),
                    timeout: Duration::from_millis(300),
                    headers: Vec::new(),
                    tls: None,
                    compression: Compression::None,
                }),
                ..TelemetryConfig::default()
            })
            .unwrap();
            let started = Instant::now();
            telemetry.flush();
            drop(telemetry);
            // The flush and the final push at drop each give up after the timeout (plus
            // grace) at the latest; the bound is loose, this is about not hanging.
            assert!(started.elapsed() < Duration::from_secs(10), "{protocol:?}");
        }
    }
}
