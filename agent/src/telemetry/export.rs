//! Where OTLP goes: the collector's URL, protocol, headers, timeout and push interval from
//! flags or the standard `OTEL_EXPORTER_OTLP_*` variables (flags win), and the resource that
//! names this agent (`service.name=warmpath`, `k8s.node.name`, `host.name`, plus
//! `OTEL_RESOURCE_ATTRIBUTES` / `OTEL_SERVICE_NAME`). [`super::push`] does the pushing.

use std::{path::PathBuf, time::Duration};

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use super::{
    Error,
    tls::{OtlpTls, Setting},
};

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

/// Body compression of each export (`OTEL_EXPORTER_OTLP_COMPRESSION`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

/// Where and how often to push.
#[derive(Clone, PartialEq)]
pub struct OtlpConfig {
    /// The URL requests go to: for HTTP the full `/v1/metrics` URL, for gRPC the server.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    pub interval: Duration,
    /// Per-export timeout.
    pub timeout: Duration,
    /// Sent with every export (`OTEL_EXPORTER_OTLP_[METRICS_]HEADERS`), names lowercase.
    /// Values are secrets (API keys): `Debug` prints the names only.
    pub headers: Vec<(String, String)>,
    /// Present exactly when the endpoint is `https://`.
    pub tls: Option<OtlpTls>,
    pub compression: Compression,
}

impl std::fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("OtlpConfig")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field("headers", &names)
            .field("tls", &self.tls)
            .field("compression", &self.compression)
            .finish()
    }
}

/// What a flag or configuration field set; each unset one falls back to its standard
/// variable (`OTEL_EXPORTER_OTLP_METRICS_*`, then `OTEL_EXPORTER_OTLP_*`).
#[derive(Debug, Clone, Default)]
pub struct OtlpSettings {
    pub endpoint: Option<String>,
    pub protocol: Option<OtlpProtocol>,
    pub interval: Option<Duration>,
    /// PEM CAs trusted for the collector (`..._CERTIFICATE`).
    pub certificate: Option<PathBuf>,
    /// PEM client certificate for mTLS (`..._CLIENT_CERTIFICATE`).
    pub client_certificate: Option<PathBuf>,
    /// PEM private key of the client certificate (`..._CLIENT_KEY`).
    pub client_key: Option<PathBuf>,
    pub compression: Option<Compression>,
    /// How errors name these settings: `--otlp-` flags or `telemetry.otlp.` fields.
    pub origin: SettingsOrigin,
}

/// Where [`OtlpSettings`] came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SettingsOrigin {
    #[default]
    Flags,
    File,
}

impl SettingsOrigin {
    /// The user-facing name of a setting (`client-certificate` -> `--otlp-client-certificate`
    /// or `telemetry.otlp.clientCertificate`).
    fn name(self, kebab: &str) -> String {
        match self {
            Self::Flags => format!("--otlp-{kebab}"),
            Self::File => {
                let mut out = String::from("telemetry.otlp.");
                let mut upper = false;
                for c in kebab.chars() {
                    match (c, upper) {
                        ('-', _) => upper = true,
                        (c, true) => {
                            out.push(c.to_ascii_uppercase());
                            upper = false;
                        }
                        (c, false) => out.push(c),
                    }
                }
                out
            }
        }
    }
}

impl OtlpConfig {
    /// From flags (or the file's fields), falling back to the standard variables; `None`
    /// when nothing asks for OTLP.
    ///
    /// The endpoint is `--otlp-endpoint`, else `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (used
    /// as given), else `OTEL_EXPORTER_OTLP_ENDPOINT` (the base: HTTP adds `/v1/metrics`). A
    /// flag's HTTP URL gets `/v1/metrics` unless it ends with it.
    pub fn from_settings(
        settings: OtlpSettings,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, Error> {
        // The signal-specific variable first, then the general one: (name, value).
        let signal = |name: &str| {
            [
                format!("OTEL_EXPORTER_OTLP_METRICS_{name}"),
                format!("OTEL_EXPORTER_OTLP_{name}"),
            ]
            .into_iter()
            .find_map(|var| env(&var).filter(|s| !s.trim().is_empty()).map(|v| (var, v)))
        };
        let origin = settings.origin;
        let given = settings.endpoint.filter(|e| !e.trim().is_empty());
        let metrics_endpoint = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").filter(|s| !s.is_empty());
        let base_endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|s| !s.is_empty());
        if given.is_none() && metrics_endpoint.is_none() && base_endpoint.is_none() {
            return Ok(None);
        }
        let protocol = match settings.protocol {
            Some(p) => p,
            None => match signal("PROTOCOL") {
                None => OtlpProtocol::HttpProtobuf,
                Some((_, p)) if p == "http/protobuf" => OtlpProtocol::HttpProtobuf,
                Some((_, p)) if p == "grpc" => OtlpProtocol::Grpc,
                Some((var, other)) => {
                    return Err(Error::Config(format!(
                        "{var}={other}: supported are grpc and http/protobuf"
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
        let https = check_endpoint(&endpoint)?;
        let interval = match settings.interval {
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
            Some((var, ms)) => millis(&var, &ms)?,
            None => DEFAULT_TIMEOUT,
        };
        let headers = match signal("HEADERS") {
            Some((var, h)) => parse_headers(&var, &h)?,
            None => Vec::new(),
        };
        let compression = match settings.compression {
            Some(c) => c,
            None => match signal("COMPRESSION") {
                None => Compression::None,
                Some((_, c)) if c.trim() == "gzip" => Compression::Gzip,
                Some((_, c)) if c.trim() == "none" => Compression::None,
                Some((var, other)) => {
                    return Err(Error::Config(format!(
                        "{var}={other}: supported are gzip and none"
                    )));
                }
            },
        };
        // Each TLS file: the flag or field, else its variable; (name, path).
        let file = |given: Option<PathBuf>, kebab: &str, var: &str| {
            given
                .map(|p| (origin.name(kebab), p))
                .or_else(|| signal(var).map(|(v, p)| (v, PathBuf::from(p.trim()))))
        };
        let ca = file(settings.certificate, "certificate", "CERTIFICATE");
        let cert = file(
            settings.client_certificate,
            "client-certificate",
            "CLIENT_CERTIFICATE",
        );
        let key = file(settings.client_key, "client-key", "CLIENT_KEY");
        let tls = if https {
            fn setting(f: &Option<(String, PathBuf)>) -> Option<Setting<'_>> {
                f.as_ref().map(|(name, path)| Setting {
                    name,
                    path: path.as_path(),
                })
            }
            Some(
                OtlpTls::load(setting(&ca), setting(&cert), setting(&key))
                    .map_err(Error::Config)?,
            )
        } else {
            if let Some((name, _)) = ca.iter().chain(&cert).chain(&key).next() {
                return Err(Error::Config(format!(
                    "{name} is set but the OTLP endpoint `{endpoint}` is http://: TLS settings need an https:// endpoint"
                )));
            }
            None
        };
        Ok(Some(Self {
            endpoint,
            protocol,
            interval,
            timeout,
            headers,
            tls,
            compression,
        }))
    }
}

/// An `http://` or `https://` URL without credentials in it (they would end up in logs and
/// `Host` headers; `OTEL_EXPORTER_OTLP_HEADERS` carries them). Returns whether it is https.
fn check_endpoint(endpoint: &str) -> Result<bool, Error> {
    let https = if endpoint.starts_with("https://") {
        true
    } else if endpoint.starts_with("http://") {
        false
    } else {
        return Err(Error::Config(format!(
            "OTLP endpoint `{}`: expected an http:// or https:// URL",
            redact_userinfo(endpoint)
        )));
    };
    let authority = endpoint
        .split_once("://")
        .map_or("", |(_, rest)| rest.split('/').next().unwrap_or(""));
    if authority.contains('@') {
        return Err(Error::Config(format!(
            "OTLP endpoint `{}`: credentials in the URL are not supported; send them as a header (OTEL_EXPORTER_OTLP_HEADERS=authorization=...)",
            redact_userinfo(endpoint)
        )));
    }
    if endpoint.parse::<http::Uri>().is_err() || authority.is_empty() {
        return Err(Error::Config(format!(
            "OTLP endpoint `{endpoint}`: not a valid URL"
        )));
    }
    Ok(https)
}

/// `scheme://user:pass@host/...` -> `scheme://***@host/...` (anything before the last `@`
/// of the authority).
fn redact_userinfo(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((_, host)) if scheme.is_empty() => format!("***@{host}{path}"),
        Some((_, host)) => format!("{scheme}://***@{host}{path}"),
        None => url.to_string(),
    }
}

fn millis(var: &str, ms: &str) -> Result<Duration, Error> {
    ms.trim()
        .parse()
        .map(Duration::from_millis)
        .map_err(|_| Error::Config(format!("{var}={ms}: expected milliseconds")))
}

/// `key1=value1,key2=value2`, values percent-decoded (the OTLP exporter specification).
/// Errors name the variable and the header, never a value: values are credentials.
fn parse_headers(var: &str, s: &str) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    for (i, pair) in s.split(',').filter(|p| !p.trim().is_empty()).enumerate() {
        let name = pair.split_once('=').map(|(k, _)| k.trim());
        let bad = || {
            let which = match name {
                Some(k) if http::HeaderName::from_bytes(k.as_bytes()).is_ok() => {
                    format!("header `{k}`")
                }
                _ => format!("entry {}", i + 1),
            };
            Error::Config(format!(
                "{var}: {which}: expected key=value with a valid header name and value (values are not shown)"
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

    fn endpoint(url: &str) -> OtlpSettings {
        OtlpSettings {
            endpoint: Some(url.into()),
            ..OtlpSettings::default()
        }
    }

    #[test]
    fn nothing_configured_means_no_exporter() {
        assert!(
            OtlpConfig::from_settings(OtlpSettings::default(), env(&[]))
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
        let c = OtlpConfig::from_settings(OtlpSettings::default(), env(&vars))
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
        let c = OtlpConfig::from_settings(
            OtlpSettings {
                endpoint: Some("http://127.0.0.1:4318".into()),
                protocol: Some(OtlpProtocol::HttpProtobuf),
                interval: Some(Duration::from_secs(1)),
                ..OtlpSettings::default()
            },
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
        let c = OtlpConfig::from_settings(OtlpSettings::default(), env(&base))
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
        let c = OtlpConfig::from_settings(OtlpSettings::default(), env(&whole))
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://collector:4318/custom");
        let flag = OtlpConfig::from_settings(endpoint("http://c:4318/v1/metrics"), env(&[]))
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
        let e = OtlpConfig::from_settings(OtlpSettings::default(), env(&vars)).unwrap_err();
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
            let e = OtlpConfig::from_settings(OtlpSettings::default(), env(&vars)).unwrap_err();
            assert!(e.to_string().contains(says), "{var}={value}: {e}");
        }
        let e = OtlpConfig::from_settings(endpoint("127.0.0.1:4317"), env(&[])).unwrap_err();
        assert!(e.to_string().contains("http:// or https://"), "{e}");
    }

    #[test]
    fn compression_and_tls_settings_are_checked_with_their_names() {
        let http = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        let c = OtlpConfig::from_settings(
            OtlpSettings::default(),
            env(&[http, ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!((c.compression, c.tls.is_none()), (Compression::Gzip, true));
        let e = OtlpConfig::from_settings(
            OtlpSettings::default(),
            env(&[http, ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("OTEL_EXPORTER_OTLP_COMPRESSION=zstd"), "{e}");
        // A CA for an http:// endpoint is a mistake, not silently unused.
        let e = OtlpConfig::from_settings(
            OtlpSettings::default(),
            env(&[http, ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/ca.pem")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("OTEL_EXPORTER_OTLP_CERTIFICATE is set") && e.contains("https://"),
            "{e}"
        );
        // Files are read at start-up; errors name the setting that named the file.
        let https = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4318");
        let e = OtlpConfig::from_settings(
            OtlpSettings::default(),
            env(&[
                https,
                (
                    "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
                    "/nonexistent/ca.pem",
                ),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "/nonexistent/ca.pem (OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE): cannot read"
            ),
            "{e}"
        );
        let e = OtlpConfig::from_settings(
            OtlpSettings {
                client_certificate: Some("/nonexistent/client.pem".into()),
                origin: SettingsOrigin::File,
                ..OtlpSettings::default()
            },
            env(&[https]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("telemetry.otlp.clientCertificate is set without a client key"),
            "{e}"
        );
    }

    #[test]
    fn secrets_stay_out_of_errors_and_debug() {
        let e = OtlpConfig::from_settings(
            endpoint("https://otel:hunter2-secret@collector:4318"),
            env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("https://***@collector:4318") && !e.contains("hunter2"),
            "{e}"
        );
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%0Ahunter2-secret",
            ),
        ];
        let e = OtlpConfig::from_settings(OtlpSettings::default(), env(&vars))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("header `authorization`") && !e.contains("hunter2"),
            "{e}"
        );
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=hunter2-secret"),
        ];
        let c = OtlpConfig::from_settings(OtlpSettings::default(), env(&vars))
            .unwrap()
            .unwrap();
        let debug = format!("{c:?}");
        assert!(
            debug.contains("x-api-key") && !debug.contains("hunter2"),
            "{debug}"
        );
    }
}
