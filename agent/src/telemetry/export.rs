//! Where OTLP goes: the collector's URL, protocol, headers, timeout and push interval from
//! flags or the standard `OTEL_EXPORTER_OTLP_*` variables (flags win), and the resource that
//! names this agent (`service.name=warmpath`, `k8s.node.name`, `host.name`, plus
//! `OTEL_RESOURCE_ATTRIBUTES` / `OTEL_SERVICE_NAME`). [`super::push`] does the pushing.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use super::Error;

/// Default push interval (the OTel default is 60 s; per-tenant dashboards want fresher data).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);
/// Default per-export timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Wire protocol of the exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    #[value(name = "grpc")]
    Grpc,
    #[value(name = "http/protobuf")]
    HttpProtobuf,
}

/// Where and how often to push.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// The URL requests go to: for HTTP the full `/v1/metrics` URL, for gRPC the server.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    pub interval: Duration,
    /// Per-export timeout.
    pub timeout: Duration,
    /// Sent with every export (`OTEL_EXPORTER_OTLP_[METRICS_]HEADERS`), names lowercase.
    pub headers: Vec<(String, String)>,
}

impl OtlpConfig {
    /// From flags, falling back to the standard variables; `None` when nothing asks for OTLP.
    ///
    /// The endpoint is `--otlp-endpoint`, else `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (used
    /// as given), else `OTEL_EXPORTER_OTLP_ENDPOINT` (the base: HTTP adds `/v1/metrics`). A
    /// flag's HTTP URL gets `/v1/metrics` unless it ends with it.
    pub fn from_flags_and_env(
        endpoint: Option<String>,
        protocol: Option<OtlpProtocol>,
        interval: Option<Duration>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, Error> {
        let signal = |name: &str| {
            env(&format!("OTEL_EXPORTER_OTLP_METRICS_{name}"))
                .or_else(|| env(&format!("OTEL_EXPORTER_OTLP_{name}")))
                .filter(|s| !s.trim().is_empty())
        };
        let given = endpoint.filter(|e| !e.trim().is_empty());
        let metrics_endpoint = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").filter(|s| !s.is_empty());
        let base_endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|s| !s.is_empty());
        if given.is_none() && metrics_endpoint.is_none() && base_endpoint.is_none() {
            return Ok(None);
        }
        let protocol = match protocol {
            Some(p) => p,
            None => match signal("PROTOCOL").as_deref() {
                None | Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
                Some("grpc") => OtlpProtocol::Grpc,
                Some(other) => {
                    return Err(Error::Config(format!(
                        "OTEL_EXPORTER_OTLP_PROTOCOL={other}: supported are grpc and http/protobuf"
                    )));
                }
            },
        };
        let with_path = |e: &str| {
            let e = e.trim().trim_end_matches('/');
            if protocol == OtlpProtocol::Grpc || e.ends_with("/v1/metrics") {
                e.to_string()
            } else {
                format!("{e}/v1/metrics")
            }
        };
        let endpoint = match (given, metrics_endpoint, base_endpoint) {
            (Some(e), _, _) | (None, None, Some(e)) => with_path(&e),
            (None, Some(e), _) => e.trim().to_string(),
            (None, None, None) => unreachable!("returned above when no endpoint is set"),
        };
        // No TLS stack is built in: a node-local collector (or its sidecar) terminates TLS.
        if !endpoint.starts_with("http://") {
            return Err(Error::Config(format!(
                "OTLP endpoint `{endpoint}`: expected an http:// URL (TLS is not built in; \
                 push to a node-local collector)"
            )));
        }
        let interval = match interval {
            Some(i) => i,
            None => match env("OTEL_METRIC_EXPORT_INTERVAL") {
                Some(ms) => millis("OTEL_METRIC_EXPORT_INTERVAL", &ms)?,
                None => DEFAULT_INTERVAL,
            },
        };
        if interval.is_zero() {
            return Err(Error::Config("the OTLP export interval must be > 0".into()));
        }
        let timeout = match signal("TIMEOUT") {
            Some(ms) => millis("OTEL_EXPORTER_OTLP_TIMEOUT", &ms)?,
            None => DEFAULT_TIMEOUT,
        };
        let headers = match signal("HEADERS") {
            Some(h) => parse_headers(&h)?,
            None => Vec::new(),
        };
        Ok(Some(Self {
            endpoint,
            protocol,
            interval,
            timeout,
            headers,
        }))
    }
}

fn millis(var: &str, ms: &str) -> Result<Duration, Error> {
    ms.trim()
        .parse()
        .map(Duration::from_millis)
        .map_err(|_| Error::Config(format!("{var}={ms}: expected milliseconds")))
}

/// `key1=value1,key2=value2`, values percent-decoded (the OTLP exporter specification).
fn parse_headers(s: &str) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    for pair in s.split(',').filter(|p| !p.trim().is_empty()) {
        let bad = || {
            Error::Config(format!(
                "OTEL_EXPORTER_OTLP_HEADERS: `{pair}`: expected key=value with a valid header name and value"
            ))
        };
        let (k, v) = pair.split_once('=').ok_or_else(bad)?;
        let k = k.trim().to_ascii_lowercase();
        let v = percent_encoding::percent_decode_str(v.trim())
            .decode_utf8()
            .map_err(|_| bad())?
            .into_owned();
        if http::HeaderName::from_bytes(k.as_bytes()).is_err()
            || http::HeaderValue::from_str(&v).is_err()
        {
            return Err(bad());
        }
        out.push((k, v));
    }
    Ok(out)
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
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "Authorization=Bearer%20abc, x-scope=team-a",
            ),
        ];
        let c = OtlpConfig::from_flags_and_env(None, None, None, env(&vars))
            .unwrap()
            .unwrap();
        assert_eq!(c.protocol, OtlpProtocol::Grpc);
        assert_eq!(c.interval, Duration::from_millis(500));
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.endpoint, "http://127.0.0.1:4317");
        assert_eq!(
            c.headers,
            vec![
                ("authorization".to_string(), "Bearer abc".to_string()),
                ("x-scope".to_string(), "team-a".to_string())
            ]
        );
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
        assert_eq!(c.endpoint, "http://127.0.0.1:4318/v1/metrics");
    }

    #[test]
    fn http_endpoints_get_the_signal_path_unless_given_whole() {
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")];
        let c = OtlpConfig::from_flags_and_env(None, None, None, env(&base))
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://collector:4318/v1/metrics");
        let whole = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "http://collector:4318/custom",
            ),
        ];
        let c = OtlpConfig::from_flags_and_env(None, None, None, env(&whole))
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://collector:4318/custom");
        let flag = OtlpConfig::from_flags_and_env(
            Some("http://c:4318/v1/metrics".into()),
            None,
            None,
            env(&[]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(flag.endpoint, "http://c:4318/v1/metrics");
    }

    #[test]
    fn bad_env_is_a_clear_error() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
        ];
        let e = OtlpConfig::from_flags_and_env(None, None, None, env(&vars)).unwrap_err();
        assert!(e.to_string().contains("carrier-pigeon"), "{e}");
        for (var, value, says) in [
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon", "milliseconds"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue", "key=value"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "bad name=x", "key=value"),
        ] {
            let vars = [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                (var, value),
            ];
            let e = OtlpConfig::from_flags_and_env(None, None, None, env(&vars)).unwrap_err();
            assert!(e.to_string().contains(says), "{var}={value}: {e}");
        }
        let e = OtlpConfig::from_flags_and_env(Some("127.0.0.1:4317".into()), None, None, env(&[]))
            .unwrap_err();
        assert!(e.to_string().contains("http://"), "{e}");
    }
}
