//! OTLP push: a periodic reader with the gRPC (tonic) or HTTP/protobuf exporter, configured by
//! flags or the standard `OTEL_EXPORTER_OTLP_*` variables (flags win), and the resource that
//! names this agent (`service.name=warmpath`, `k8s.node.name`, `host.name`, plus
//! `OTEL_RESOURCE_ATTRIBUTES` / `OTEL_SERVICE_NAME`).

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_otlp::{MetricExporter, WithExportConfig};
use opentelemetry_sdk::{Resource, metrics::PeriodicReader};

use super::Error;

/// Default push interval (the OTel default is 60 s; per-tenant dashboards want fresher data).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);
/// Default per-export timeout.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Wire protocol of the exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    #[value(name = "grpc")]
    Grpc,
    #[value(name = "http/protobuf")]
    HttpProtobuf,
}

/// Where and how often to push.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// Collector URL; `None` takes `OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT`.
    pub endpoint: Option<String>,
    pub protocol: OtlpProtocol,
    pub interval: Duration,
}

impl OtlpConfig {
    /// From flags, falling back to the standard variables; `None` when nothing asks for OTLP.
    pub fn from_flags_and_env(
        endpoint: Option<String>,
        protocol: Option<OtlpProtocol>,
        interval: Option<Duration>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, Error> {
        let env_endpoint = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .filter(|s| !s.is_empty());
        if endpoint.is_none() && env_endpoint.is_none() {
            return Ok(None);
        }
        let protocol = match protocol {
            Some(p) => p,
            None => match env("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
                .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
                .as_deref()
            {
                None | Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
                Some("grpc") => OtlpProtocol::Grpc,
                Some(other) => {
                    return Err(Error::Config(format!(
                        "OTEL_EXPORTER_OTLP_PROTOCOL={other}: supported are grpc and http/protobuf"
                    )));
                }
            },
        };
        let interval = match interval {
            Some(i) => i,
            None => match env("OTEL_METRIC_EXPORT_INTERVAL") {
                Some(ms) => Duration::from_millis(ms.parse().map_err(|_| {
                    Error::Config(format!(
                        "OTEL_METRIC_EXPORT_INTERVAL={ms}: expected milliseconds"
                    ))
                })?),
                None => DEFAULT_INTERVAL,
            },
        };
        if interval.is_zero() {
            return Err(Error::Config("the OTLP export interval must be > 0".into()));
        }
        Ok(Some(Self {
            endpoint,
            protocol,
            interval,
        }))
    }
}

/// The periodic reader pushing to the configured collector.
pub fn periodic_reader(config: &OtlpConfig) -> Result<PeriodicReader<MetricExporter>, Error> {
    let exporter = match config.protocol {
        OtlpProtocol::Grpc => {
            let mut b = MetricExporter::builder()
                .with_tonic()
                .with_timeout(EXPORT_TIMEOUT);
            if let Some(e) = &config.endpoint {
                b = b.with_endpoint(e.clone());
            }
            b.build()
        }
        OtlpProtocol::HttpProtobuf => {
            let mut b = MetricExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_timeout(EXPORT_TIMEOUT);
            if let Some(e) = &config.endpoint {
                // Programmatic endpoints are used as given: add the signal path.
                let e = e.trim_end_matches('/');
                let url = if e.ends_with("/v1/metrics") {
                    e.to_string()
                } else {
                    format!("{e}/v1/metrics")
                };
                b = b.with_endpoint(url);
            }
            b.build()
        }
    }
    .map_err(|e| Error::Exporter(e.to_string()))?;
    Ok(PeriodicReader::builder(exporter)
        .with_interval(config.interval)
        .build())
}

/// The resource describing this agent.
pub fn resource() -> Resource {
    let mut b = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        b = b.with_service_name("warmpath");
    }
    b = b.with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if let Some(node) = std::env::var("NODE_NAME")
        .ok()
        .or_else(|| std::env::var("K8S_NODE_NAME").ok())
    {
        b = b.with_attribute(KeyValue::new("k8s.node.name", node));
    }
    if let Ok(host) = nix::unistd::gethostname() {
        b = b.with_attribute(KeyValue::new(
            "host.name",
            host.to_string_lossy().into_owned(),
        ));
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn nothing_configured_means_no_exporter() {
        assert!(
            OtlpConfig::from_flags_and_env(None, None, None, env(&[]))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn env_configures_and_flags_win() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
        ];
        let c = OtlpConfig::from_flags_and_env(None, None, None, env(&vars))
            .unwrap()
            .unwrap();
        assert_eq!(c.protocol, OtlpProtocol::Grpc);
        assert_eq!(c.interval, Duration::from_millis(500));
        assert_eq!(c.endpoint, None, "the exporter reads the variable itself");
        let c = OtlpConfig::from_flags_and_env(
            Some("http://127.0.0.1:4318".into()),
            Some(OtlpProtocol::HttpProtobuf),
            Some(Duration::from_secs(1)),
            env(&vars),
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(c.interval, Duration::from_secs(1));
    }

    #[test]
    fn bad_env_is_a_clear_error() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
        ];
        let e = OtlpConfig::from_flags_and_env(None, None, None, env(&vars)).unwrap_err();
        assert!(e.to_string().contains("carrier-pigeon"), "{e}");
    }
}
