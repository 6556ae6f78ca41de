//! The configuration file, version 1 (docs/config.md): serde types that mirror the document
//! exactly (unknown fields are errors), converted into a validated [`Config`].

use std::{collections::BTreeMap, net::SocketAddr, path::Path, time::Duration};

use serde::Deserialize;

use super::{
    Config, ConfigError, DEFAULT_MAX_BODY, DEFAULT_RETRIES, EndpointConfig, Limits, PoolConfig,
    TokenSourceConfig, authority_of,
    cluster::{self, ClusterFile},
    default_workers,
    kubernetes::{self, Environment, InferencePoolFile, KubernetesFile, SelectorFile},
};
use crate::{
    pool::UpstreamProtocol,
    routing::{Policy, RoutePolicy, SessionSource},
    telemetry::{
        DEFAULT_MAX_TENANTS, TelemetryConfig,
        export::{Compression, OtlpConfig, OtlpProtocol, OtlpSettings, SettingsOrigin},
    },
    tenant::{self, CidrTable, IdentitySource, TenantPolicy},
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    version: u32,
    #[serde(default = "default_listen")]
    listen: OneOrMany<SocketAddr>,
    #[serde(default = "default_admin")]
    admin: SocketAddr,
    /// The admin API's bearer token file (required when `admin` is not loopback).
    admin_token_file: Option<std::path::PathBuf>,
    #[serde(default)]
    proxy: ProxyFile,
    pools: Vec<PoolFile>,
    #[serde(default)]
    tenants: TenantsFile,
    #[serde(default)]
    telemetry: TelemetryFile,
    /// `RoutePolicy` / `Tenant` files, watched (docs/policy.md).
    policy_dir: Option<std::path::PathBuf>,
    /// The cache-salt key file (isolated tenants).
    cache_salt_key_file: Option<std::path::PathBuf>,
    /// Pods, Services and policies from the cluster (docs/config.md, "Kubernetes").
    kubernetes: Option<KubernetesFile>,
    /// Agents sharing one index (docs/config.md, "Cluster"; docs/cluster.md).
    cluster: Option<ClusterFile>,
    /// Addresses intercepted in the kernel off-cluster (docs/config.md, "Interception").
    #[serde(default)]
    intercept: Vec<super::intercept::InterceptFile>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

fn default_listen() -> OneOrMany<SocketAddr> {
    OneOrMany::One(SocketAddr::from(([127, 0, 0, 1], 8080)))
}

fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9090))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProxyFile {
    #[serde(default = "default_max_body")]
    max_body_bytes: usize,
    #[serde(default = "default_retries")]
    retries: usize,
    #[serde(default)]
    explain: bool,
    #[serde(default = "yes")]
    inject_usage: bool,
    /// Data-path threads (default: one per CPU).
    #[serde(default)]
    workers: Option<usize>,
    /// Admission and size bounds (defaults: [`Limits::default`]).
    max_prompt_bytes: Option<usize>,
    max_concurrent: Option<usize>,
    cluster_max_concurrent: Option<usize>,
    max_queued: Option<usize>,
    queue_timeout_ms: Option<u64>,
    read_timeout_ms: Option<u64>,
    upstream_idle_timeout_ms: Option<u64>,
    upstream_head_timeout_ms: Option<u64>,
}

impl Default for ProxyFile {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY,
            retries: DEFAULT_RETRIES,
            explain: false,
            inject_usage: true,
            workers: None,
            max_prompt_bytes: None,
            max_concurrent: None,
            cluster_max_concurrent: None,
            max_queued: None,
            queue_timeout_ms: None,
            read_timeout_ms: None,
            upstream_idle_timeout_ms: None,
            upstream_head_timeout_ms: None,
        }
    }
}

fn default_max_body() -> usize {
    DEFAULT_MAX_BODY
}
fn default_retries() -> usize {
    DEFAULT_RETRIES
}
fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PoolFile {
    name: String,
    model: String,
    #[serde(default = "default_block_size")]
    block_size: usize,
    #[serde(default)]
    tokens: TokensFile,
    #[serde(default)]
    policy: PolicyFile,
    #[serde(default)]
    session: SessionFile,
    /// `http1` (default) or `h2` (h2c, prior knowledge) to the engines.
    #[serde(default)]
    upstream_protocol: UpstreamProtocol,
    /// Exactly one of `endpoints`, `inference_pool` and `selector`.
    endpoints: Option<Vec<EndpointFile>>,
    /// The pods of a Gateway API Inference Extension `InferencePool`.
    inference_pool: Option<InferencePoolFile>,
    /// The pods a label selector picks.
    selector: Option<SelectorFile>,
    /// Labels `RoutePolicy` selectors match.
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// Services `RoutePolicy` service targets match.
    #[serde(default)]
    services: Vec<ServiceFile>,
    /// This pool's cluster-wide concurrency, shared by priority then weight (0: off).
    #[serde(default)]
    cluster_max_concurrent: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceFile {
    name: String,
    port: u16,
}

fn default_block_size() -> usize {
    16
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TokensFile {
    #[serde(default)]
    source: TokenSourceName,
    /// The tokenizer directory (source `huggingface`).
    dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
enum TokenSourceName {
    #[default]
    Builtin,
    Huggingface,
    Engine,
    Approximate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PolicyFile {
    #[serde(default = "default_preset")]
    preset: Policy,
    /// Overrides of the preset's weights, by scorer name.
    #[serde(default)]
    weights: BTreeMap<String, f64>,
    /// The longest a cold request yields at a full pod (default: the preset's).
    #[serde(default)]
    cold_yield_ms: Option<u64>,
}

impl Default for PolicyFile {
    fn default() -> Self {
        Self {
            preset: Policy::Precise,
            weights: BTreeMap::new(),
            cold_yield_ms: None,
        }
    }
}

fn default_preset() -> Policy {
    Policy::Precise
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SessionFile {
    header: Option<String>,
    cookie: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EndpointFile {
    url: String,
    metrics: Option<String>,
    kv_events: Option<String>,
    kv_replay: Option<String>,
    #[serde(default)]
    kv_bind: bool,
    #[serde(default)]
    kv_topic: String,
    dp_rank: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TenantsFile {
    #[serde(default = "default_order")]
    order: Vec<IdentitySource>,
    /// Tenant name -> source CIDRs of its workloads.
    #[serde(default)]
    cidrs: BTreeMap<String, Vec<String>>,
    /// Tenant name -> cgroup v2 directories of its workloads (intercepted clients).
    #[serde(default)]
    cgroups: BTreeMap<String, Vec<std::path::PathBuf>>,
    #[serde(default = "default_tenant_header")]
    header: String,
    #[serde(default)]
    trust_header_from: Vec<String>,
    #[serde(default = "default_tenant")]
    default: String,
    #[serde(default = "default_max_tenants")]
    max_tenants: usize,
}

impl Default for TenantsFile {
    fn default() -> Self {
        Self {
            order: default_order(),
            cidrs: BTreeMap::new(),
            cgroups: BTreeMap::new(),
            header: default_tenant_header(),
            trust_header_from: Vec::new(),
            default: default_tenant(),
            max_tenants: DEFAULT_MAX_TENANTS,
        }
    }
}

fn default_order() -> Vec<IdentitySource> {
    vec![IdentitySource::Workload, IdentitySource::Header]
}
fn default_tenant_header() -> String {
    tenant::DEFAULT_HEADER.into()
}
fn default_tenant() -> String {
    tenant::DEFAULT_TENANT.into()
}
fn default_max_tenants() -> usize {
    DEFAULT_MAX_TENANTS
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TelemetryFile {
    #[serde(default)]
    pod_attribute: bool,
    otlp: Option<OtlpFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct OtlpFile {
    endpoint: Option<String>,
    protocol: Option<OtlpProtocolName>,
    interval_ms: Option<u64>,
    /// PEM CAs trusted for an https collector.
    certificate: Option<std::path::PathBuf>,
    /// PEM client certificate and key (mTLS).
    client_certificate: Option<std::path::PathBuf>,
    client_key: Option<std::path::PathBuf>,
    compression: Option<CompressionName>,
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum CompressionName {
    Gzip,
    None,
}

#[derive(Debug, Deserialize, Clone, Copy)]
enum OtlpProtocolName {
    #[serde(rename = "grpc")]
    Grpc,
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// Reads and validates a configuration file (YAML; JSON is YAML too).
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates configuration text; `file` names it in errors. `kubernetes.enabled:
/// auto` is resolved from this process's environment.
pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
    parse_in(text, file, &Environment::process())
}

/// [`parse`] in the environment `env`.
pub fn parse_in(text: &str, file: &str, env: &Environment<'_>) -> Result<Config, ConfigError> {
    let de = serde_norway::Deserializer::from_str(text);
    let raw: File = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        // The YAML error may name the path itself; the field is said once.
        let message = e.into_inner().to_string();
        let message = message
            .strip_prefix(&format!("{path}: "))
            .map_or_else(|| message.clone(), str::to_string);
        ConfigError::field(
            file,
            if path == "." {
                "(document)".into()
            } else {
                path
            },
            message,
        )
    })?;
    let config = convert(raw, file, env)?;
    config.validate(file)?;
    Ok(config)
}

fn convert(f: File, file: &str, env: &Environment<'_>) -> Result<Config, ConfigError> {
    let err = |field: String, msg: String| ConfigError::field(file, field, msg);
    if f.version != 1 {
        return Err(err(
            "version".into(),
            format!("{}: this agent reads version 1", f.version),
        ));
    }
    let mut pools = Vec::new();
    for (i, p) in f.pools.into_iter().enumerate() {
        let at = |field: &str| format!("pools[{i}].{field}");
        let tokens = match (p.tokens.source, p.tokens.dir) {
            (TokenSourceName::Huggingface, Some(dir)) => TokenSourceConfig::HuggingFace(dir),
            (TokenSourceName::Huggingface, None) => {
                return Err(err(
                    at("tokens.dir"),
                    "source `huggingface` needs the tokenizer directory".into(),
                ));
            }
            (_, Some(_)) => {
                return Err(err(
                    at("tokens.dir"),
                    "only source `huggingface` takes a directory".into(),
                ));
            }
            (TokenSourceName::Builtin, None) => TokenSourceConfig::Builtin,
            (TokenSourceName::Engine, None) => TokenSourceConfig::Engine,
            (TokenSourceName::Approximate, None) => TokenSourceConfig::Approximate,
        };
        let mut policy = RoutePolicy::from(p.policy.preset);
        for (name, w) in &p.policy.weights {
            policy
                .weights
                .set(name, *w)
                .map_err(|m| err(at(&format!("policy.weights.{name}")), m))?;
        }
        if let Some(ms) = p.policy.cold_yield_ms {
            policy.cold_yield = crate::routing::cold_yield::check(policy.kind, ms)
                .map_err(|m| err(at("policy.coldYieldMs"), m))?;
        }
        let mut session = SessionSource::default();
        if let Some(h) = p.session.header {
            session.header = h
                .parse()
                .map_err(|_| err(at("session.header"), format!("`{h}` is not a header name")))?;
        }
        session.cookie = p.session.cookie;
        let members = kubernetes::members(p.inference_pool, p.selector, file, &at)?;
        if let Some(m) = &members
            && p.endpoints.is_some()
        {
            let other = match m {
                super::PoolMembers::InferencePool { .. } => "inferencePool",
                super::PoolMembers::Selector { .. } => "selector",
            };
            return Err(err(
                at("endpoints"),
                format!("give one of `endpoints` and `{other}`, not both"),
            ));
        }
        let mut endpoints = Vec::new();
        for (j, e) in p.endpoints.into_iter().flatten().enumerate() {
            let at = |field: &str| format!("pools[{i}].endpoints[{j}].{field}");
            let authority = authority_of(&e.url)
                .ok_or_else(|| err(at("url"), format!("`{}`: expected http://host:port", e.url)))?;
            let metrics_url = match e.metrics {
                Some(m) if m.starts_with("http://") => m,
                Some(m) => {
                    return Err(err(
                        at("metrics"),
                        format!("`{m}`: expected an http:// URL"),
                    ));
                }
                None => format!("http://{authority}/metrics"),
            };
            for (field, v) in [("kvEvents", &e.kv_events), ("kvReplay", &e.kv_replay)] {
                if let Some(v) = v
                    && !v.starts_with("tcp://")
                    && !v.starts_with("ipc://")
                {
                    return Err(err(
                        at(field),
                        format!("`{v}`: expected tcp://host:port or ipc://path"),
                    ));
                }
            }
            endpoints.push(EndpointConfig {
                authority,
                metrics_url,
                kv_events: e.kv_events,
                kv_replay: e.kv_replay,
                kv_bind: e.kv_bind,
                kv_topic: e.kv_topic,
                dp_rank: e.dp_rank,
            });
        }
        pools.push(PoolConfig {
            name: p.name,
            model: p.model,
            block_size: p.block_size,
            tokens,
            policy,
            session,
            upstream: p.upstream_protocol,
            endpoints,
            members,
            labels: p.labels,
            services: p.services.into_iter().map(|s| (s.name, s.port)).collect(),
            cluster_max_concurrent: p.cluster_max_concurrent,
        });
    }
    let t = f.tenants;
    let mut rules = Vec::new();
    for (name, nets) in &t.cidrs {
        tenant::check_name(name).map_err(|m| err(format!("tenants.cidrs.{name}"), m))?;
        for (k, n) in nets.iter().enumerate() {
            rules.push((
                tenant::parse_net(n).map_err(|m| err(format!("tenants.cidrs.{name}[{k}]"), m))?,
                name.clone(),
            ));
        }
    }
    let trusted = t
        .trust_header_from
        .iter()
        .enumerate()
        .map(|(k, n)| {
            tenant::parse_net(n).map_err(|m| err(format!("tenants.trustHeaderFrom[{k}]"), m))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut cgroup_dirs = Vec::new();
    for (name, dirs) in &t.cgroups {
        tenant::check_name(name).map_err(|m| err(format!("tenants.cgroups.{name}"), m))?;
        for (k, dir) in dirs.iter().enumerate() {
            if !dir.is_absolute() {
                return Err(err(
                    format!("tenants.cgroups.{name}[{k}]"),
                    format!(
                        "`{}`: expected an absolute cgroup v2 directory, e.g. /sys/fs/cgroup/team-a.slice",
                        dir.display()
                    ),
                ));
            }
            cgroup_dirs.push((dir.clone(), std::sync::Arc::<str>::from(name.as_str())));
        }
    }
    let cgroups = (!cgroup_dirs.is_empty()).then(|| {
        std::sync::Arc::new(tenant::cgroups::CgroupPaths::new(cgroup_dirs))
            as std::sync::Arc<dyn tenant::CgroupDirectory>
    });
    tenant::check_name(&t.default).map_err(|m| err("tenants.default".into(), m))?;
    let tenants = TenantPolicy {
        order: t.order,
        directory: std::sync::Arc::new(
            CidrTable::new(rules.clone()).map_err(|m| err("tenants.cidrs".into(), m))?,
        ),
        cgroups,
        cidrs: rules,
        header: t.header.parse().map_err(|_| {
            err(
                "tenants.header".into(),
                format!("`{}` is not a header name", t.header),
            )
        })?,
        trusted,
        header_sources: Default::default(),
        default_tenant: t.default.as_str().into(),
    };
    let settings = match f.telemetry.otlp {
        None => OtlpSettings::default(),
        Some(o) => OtlpSettings {
            endpoint: o.endpoint,
            protocol: o.protocol.map(|p| match p {
                OtlpProtocolName::Grpc => OtlpProtocol::Grpc,
                OtlpProtocolName::HttpProtobuf => OtlpProtocol::HttpProtobuf,
            }),
            interval: o.interval_ms.map(Duration::from_millis),
            certificate: o.certificate,
            client_certificate: o.client_certificate,
            client_key: o.client_key,
            compression: o.compression.map(|c| match c {
                CompressionName::Gzip => Compression::Gzip,
                CompressionName::None => Compression::None,
            }),
            origin: SettingsOrigin::File,
        },
    };
    let otlp = OtlpConfig::from_settings(settings, |k| std::env::var(k).ok())
        .map_err(|e| err("telemetry.otlp".into(), e.to_string()))?;
    let admin_token = f
        .admin_token_file
        .as_deref()
        .map(super::AdminToken::from_file)
        .transpose()
        .map_err(|m| err("adminTokenFile".into(), m))?;
    let kubernetes = kubernetes::convert(f.kubernetes, file, env)?;
    let watching = kubernetes.as_ref().filter(|k| k.enabled);
    let cluster = cluster::convert(f.cluster, file, watching, env)?;
    let intercept = super::intercept::convert(f.intercept, &pools, file)?;
    Ok(Config {
        listen: match f.listen {
            OneOrMany::One(a) => vec![a],
            OneOrMany::Many(v) => v,
        },
        admin: f.admin,
        admin_token,
        pools,
        max_body: f.proxy.max_body_bytes,
        limits: limits(&f.proxy),
        retries: f.proxy.retries,
        explain: f.proxy.explain,
        inject_usage: f.proxy.inject_usage,
        workers: f.proxy.workers.unwrap_or_else(default_workers),
        cluster,
        policy_dir: f.policy_dir,
        cache_salt_key_file: f.cache_salt_key_file,
        kubernetes,
        intercept,
        tenants,
        telemetry: TelemetryConfig {
            max_tenants: t.max_tenants,
            pod_attribute: f.telemetry.pod_attribute,
            otlp,
        },
    })
}

/// The `proxy` section's limits, each defaulted on its own.
fn limits(p: &ProxyFile) -> Limits {
    let d = Limits::default();
    Limits {
        max_concurrent: p.max_concurrent.unwrap_or(d.max_concurrent),
        cluster_max_concurrent: p.cluster_max_concurrent.unwrap_or(d.cluster_max_concurrent),
        max_queued: p.max_queued.unwrap_or(d.max_queued),
        queue_timeout: p
            .queue_timeout_ms
            .map_or(d.queue_timeout, Duration::from_millis),
        max_prompt_bytes: p.max_prompt_bytes.unwrap_or(d.max_prompt_bytes),
        read_timeout: p
            .read_timeout_ms
            .map_or(d.read_timeout, Duration::from_millis),
        upstream_idle_timeout: p
            .upstream_idle_timeout_ms
            .map_or(d.upstream_idle_timeout, Duration::from_millis),
        upstream_head_timeout: p
            .upstream_head_timeout_ms
            .map_or(d.upstream_head_timeout, Duration::from_millis),
    }
}

#[cfg(test)]
mod tests;
