//! The agent's configuration: one validated [`Config`], built either from a versioned file
//! (YAML or JSON, schema in docs/config.md) or from the one-pool command-line flags. Both go
//! through the same validation; errors name the field path (`pools[0].endpoints[1].kvEvents`).

mod admin;
mod cluster;
mod file;
mod intercept;
mod kubernetes;

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

pub use admin::{AdminToken, MIN_TOKEN_LEN, read_token_file};
pub use cluster::{
    ClusterConfig, DEFAULT_GOSSIP_LISTEN, DEFAULT_GRPC_LISTEN, Derived, POD_IP_VAR, Replicate,
    host_name,
};
pub use file::{load, parse, parse_in};
pub use intercept::InterceptRule;
pub use kubernetes::{
    Environment, IdentityScope, InterceptConfig, KubernetesConfig, MAX_SELECTOR_LABELS,
    NODE_NAME_VAR, PoolMembers, SERVICE_ACCOUNT_TOKEN, check_label_key, check_label_name,
    check_label_value, check_match_labels, check_subdomain,
};

use crate::{
    http::worker::MAX_WORKERS,
    pool::UpstreamProtocol,
    routing::{RoutePolicy, SessionSource},
    telemetry::TelemetryConfig,
    tenant::TenantPolicy,
};

/// Largest request body accepted (413 beyond): twice the largest prompt plus room for the
/// other members, well below memory.
pub const DEFAULT_MAX_BODY: usize = 8 * 1024 * 1024;
/// Largest `prompt` or `messages` member, in JSON bytes, checked before tokenization (413
/// beyond): about a million tokens of English text, more than any served context window.
pub const DEFAULT_MAX_PROMPT_BYTES: usize = 4 * 1024 * 1024;
/// Requests admitted at once per agent (routed requests, streams included, until their body
/// ends): above the 10,000 idle streams the soak holds, far above what a node's engines
/// serve at once.
pub const DEFAULT_MAX_CONCURRENT: usize = 16 * 1024;
/// Requests that may wait for an admission slot; beyond it they get 429 at once.
pub const DEFAULT_MAX_QUEUED: usize = 1024;
/// An engine's response body that sends nothing for this long is given up (the stream ends
/// with an error event): long enough for vLLM's longest preemption or prefill pauses.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);
/// An engine that sends no complete response head for this long (connect included) is given
/// up: a non-streaming answer's head comes only once its whole completion is generated, so
/// this covers a long generation queued behind others.
pub const DEFAULT_UPSTREAM_HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
/// How long a request waits for an admission slot before it gets 429.
pub const DEFAULT_QUEUE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Other endpoints tried when one fails before the first response byte.
pub const DEFAULT_RETRIES: usize = 2;
/// Name of the pool configured by flags.
pub const DEFAULT_POOL: &str = "default";

/// Data-path threads: one per CPU this process may use (cgroup quotas included).
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_WORKERS)
}

/// The agent's capacity ([`crate::proxy`]'s admission): routed requests admitted at once,
/// how many may wait for a slot and for how long, and the largest prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// 0: no limit (and no queue).
    pub max_concurrent: usize,
    /// Routed requests in flight through all agents of the cluster together, shared among
    /// contending tenants by priority then weight (docs/policy.md, "Across agents"); 0: off
    /// (each agent's `max_concurrent` alone). Needs `max_concurrent > 0`.
    pub cluster_max_concurrent: usize,
    pub max_queued: usize,
    pub queue_timeout: std::time::Duration,
    pub max_prompt_bytes: usize,
    /// A started request head, or a stalled request body, is given up after this (408).
    pub read_timeout: std::time::Duration,
    /// An engine's response body silent this long (while the client waits for it) is cut off.
    pub upstream_idle_timeout: std::time::Duration,
    /// An engine's response head not complete this long after the attempt began: the
    /// attempt fails (504 when it was the last).
    pub upstream_head_timeout: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            cluster_max_concurrent: 0,
            max_queued: DEFAULT_MAX_QUEUED,
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
            max_prompt_bytes: DEFAULT_MAX_PROMPT_BYTES,
            read_timeout: crate::http::server::DEFAULT_READ_TIMEOUT,
            upstream_idle_timeout: DEFAULT_UPSTREAM_IDLE_TIMEOUT,
            upstream_head_timeout: DEFAULT_UPSTREAM_HEAD_TIMEOUT,
        }
    }
}

/// Where a pool's prompt tokens come from.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenSourceConfig {
    /// The tokenizer the simulator uses (built in).
    Builtin,
    /// A HuggingFace tokenizer directory (tokenizer.json, tokenizer_config.json).
    HuggingFace(PathBuf),
    /// The engine's own `POST /tokenize` (exact, one round trip per request).
    Engine,
    /// Character chunks (no tokenizer, no events): only the approximate policy can use them.
    Approximate,
}

/// One vLLM endpoint (a pod, or one data-parallel rank of it).
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointConfig {
    /// `host:port` of its HTTP server.
    pub authority: String,
    /// Its Prometheus page (default `http://<authority>/metrics`).
    pub metrics_url: String,
    pub kv_events: Option<String>,
    pub kv_replay: Option<String>,
    /// Bind the events socket (the engine connects to us).
    pub kv_bind: bool,
    pub kv_topic: String,
    pub dp_rank: Option<u32>,
}

/// One pool: the endpoints serving one model and how to choose among them.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    pub model: String,
    /// Must match vLLM --block-size.
    pub block_size: usize,
    pub tokens: TokenSourceConfig,
    pub policy: RoutePolicy,
    pub session: SessionSource,
    /// HTTP/1.1 or h2c to the engines.
    pub upstream: UpstreamProtocol,
    /// The configured endpoints; empty when `members` is set (the pool starts with none and
    /// the Kubernetes watchers fill it).
    pub endpoints: Vec<EndpointConfig>,
    /// Where the cluster finds its endpoints (`inferencePool` or `selector`); `None`: the
    /// endpoints listed.
    pub members: Option<PoolMembers>,
    /// Labels a `RoutePolicy` selector target matches (docs/policy.md).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Services (name, port) a `RoutePolicy` service target matches.
    pub services: Vec<(String, u16)>,
    /// Routed requests in flight to this pool through all agents together, shared among
    /// contending tenants by priority then weight (0: off; docs/policy.md, "Across agents").
    pub cluster_max_concurrent: usize,
}

/// Everything `warmpath agent` runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: Vec<SocketAddr>,
    /// Data-path threads ([`crate::proxy::Workers`]).
    pub workers: usize,
    pub admin: SocketAddr,
    /// Required on `/status` and `/metrics` when set; must be set when `admin` is not a
    /// loopback address.
    pub admin_token: Option<AdminToken>,
    pub pools: Vec<PoolConfig>,
    pub max_body: usize,
    /// Capacity, queue and size bounds.
    pub limits: Limits,
    pub retries: usize,
    pub explain: bool,
    pub inject_usage: bool,
    pub tenants: TenantPolicy,
    pub telemetry: TelemetryConfig,
    /// Agents sharing one index (docs/cluster.md); `None`: this agent alone.
    pub cluster: Option<ClusterConfig>,
    /// `RoutePolicy` and `Tenant` files, watched and hot-reloaded (docs/policy.md).
    pub policy_dir: Option<PathBuf>,
    /// The key isolated tenants' cache salts derive from; `None`: the cluster key, else a
    /// key of this process.
    pub cache_salt_key_file: Option<PathBuf>,
    /// The `kubernetes:` section (`enabled` resolved); `None`: the file has none (the flags
    /// never set it).
    pub kubernetes: Option<KubernetesConfig>,
    /// Addresses intercepted in the kernel (the file's `intercept:`; the flags' `--redirect`
    /// stay the flags').
    pub intercept: Vec<InterceptRule>,
}

/// A configuration that cannot run, with the field it is about.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {field}: {message}")]
    Field {
        file: String,
        field: String,
        message: String,
    },
}

impl ConfigError {
    pub fn field(file: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Field {
            file: file.to_string(),
            field: field.into(),
            message: message.into(),
        }
    }
}

/// `http://host:port` -> `host:port`.
pub fn authority_of(url: &str) -> Option<String> {
    url.parse::<http::Uri>()
        .ok()
        .filter(|u| {
            u.scheme_str() == Some("http")
                && u.path_and_query()
                    .is_none_or(|p| p.as_str() == "/" || p.as_str().is_empty())
        })
        .and_then(|u| u.authority().map(|a| a.to_string()))
}

impl Config {
    /// Checks what types cannot: every path in `errors` names its field.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let err = |field: String, msg: String| Err(ConfigError::field(file, field, msg));
        if self.pools.is_empty() {
            return err("pools".into(), "at least one pool is needed".into());
        }
        if let Some(cluster) = &self.cluster {
            cluster.validate(file)?;
            cluster.validate_pools(file, &self.pools)?;
        }
        if self.listen.is_empty() {
            return err("listen".into(), "at least one address is needed".into());
        }
        if !self.admin.ip().is_loopback() && self.admin_token.is_none() {
            let (field, token) = if file == FLAGS {
                ("--admin", "--admin-token-file PATH")
            } else {
                ("admin", "adminTokenFile: PATH")
            };
            return err(
                field.into(),
                format!(
                    "{} is not a loopback address: the admin API (/status, /metrics) then needs a bearer token; give {token} (docs/security.md)",
                    self.admin
                ),
            );
        }
        let max = MAX_WORKERS;
        if !(1..=max).contains(&self.workers) {
            let field = if file == FLAGS {
                "--workers"
            } else {
                "proxy.workers"
            };
            return err(
                field.into(),
                format!("must be 1 to {max} (data-path threads)"),
            );
        }
        let l = &self.limits;
        let at = |flag: &str, key: &str| {
            if file == FLAGS {
                flag.to_string()
            } else {
                format!("proxy.{key}")
            }
        };
        if l.max_prompt_bytes == 0 || l.max_prompt_bytes > self.max_body {
            return err(
                at("--max-prompt-bytes", "maxPromptBytes"),
                format!("must be 1 to the body limit ({} bytes)", self.max_body),
            );
        }
        if l.cluster_max_concurrent > 0 && l.max_concurrent == 0 {
            return err(
                at("--cluster-max-concurrent", "clusterMaxConcurrent"),
                "needs admission on (maxConcurrent > 0): the gate shares its slots".into(),
            );
        }
        if l.cluster_max_concurrent > 0 && self.pools.len() > 1 {
            return err(
                at("--cluster-max-concurrent", "clusterMaxConcurrent"),
                format!(
                    "is agent-wide (one concurrency for every pool), so with {} pools a tenant \
                     busy on one would hold back tenants on the others; set it per pool \
                     (pools[].clusterMaxConcurrent) instead",
                    self.pools.len()
                ),
            );
        }
        if l.max_concurrent > 0 && l.max_queued > 0 && l.queue_timeout.is_zero() {
            return err(
                at("--queue-timeout-ms", "queueTimeoutMs"),
                "must be > 0 when requests may queue (or set the queue to 0)".into(),
            );
        }
        for (flag, key, d) in [
            ("--read-timeout-ms", "readTimeoutMs", l.read_timeout),
            (
                "--upstream-idle-timeout-ms",
                "upstreamIdleTimeoutMs",
                l.upstream_idle_timeout,
            ),
            (
                "--upstream-head-timeout-ms",
                "upstreamHeadTimeoutMs",
                l.upstream_head_timeout,
            ),
        ] {
            if d.is_zero() {
                return err(at(flag, key), "must be > 0".into());
            }
        }
        let mut names = std::collections::HashSet::new();
        let mut models = std::collections::HashSet::new();
        for (i, p) in self.pools.iter().enumerate() {
            let at = |f: &str| format!("pools[{i}].{f}");
            if !names.insert(&p.name) {
                return err(at("name"), format!("pool `{}` is defined twice", p.name));
            }
            if !models.insert(&p.model) {
                return err(
                    at("model"),
                    format!(
                        "model `{}` is served by two pools; requests would be ambiguous",
                        p.model
                    ),
                );
            }
            if p.block_size == 0 {
                return err(
                    at("blockSize"),
                    "must be > 0 (and match vLLM --block-size)".into(),
                );
            }
            if p.members.is_none() && p.endpoints.is_empty() {
                return err(
                    at("endpoints"),
                    "at least one endpoint is needed (or, in a cluster, `inferencePool` or `selector`)"
                        .into(),
                );
            }
            if p.tokens == TokenSourceConfig::Approximate
                && p.policy.kind != crate::routing::Policy::Approximate
                && p.policy.weights.prefix != 0.0
            {
                return err(
                    at("tokens.source"),
                    "approximate keys never match the KV event index: use policy preset `approximate` (routing history), or set the prefix weight to 0".into(),
                );
            }
            if matches!(
                p.policy.kind,
                crate::routing::Policy::LeastLoaded | crate::routing::Policy::Session
            ) && let Some((name, what)) = p.policy.weights.priced_in_seconds()
            {
                return err(
                    at(&format!("policy.weights.{name}")),
                    format!(
                        "{what} is priced only by presets precise and approximate (in seconds, from each pod's KV room; this preset ranks by requests): remove it or choose one of those"
                    ),
                );
            }
            if p.cluster_max_concurrent > 0 && l.max_concurrent == 0 {
                return err(
                    at("clusterMaxConcurrent"),
                    "needs admission on (proxy.maxConcurrent > 0): its queue bounds apply".into(),
                );
            }
            if p.cluster_max_concurrent > 0 && l.cluster_max_concurrent > 0 {
                return err(
                    at("clusterMaxConcurrent"),
                    "set the cluster concurrency once: per pool or agent-wide \
                     (proxy.clusterMaxConcurrent), not both (two gates would stack on the \
                     same requests)"
                        .into(),
                );
            }
            if p.cluster_max_concurrent > 0 && !fits_a_fact_key(&p.name) {
                return err(
                    at("clusterMaxConcurrent"),
                    format!(
                        "the pool's name `{}` is gossiped in `fair:TENANT@POOL` keys: it must be 1 to {MAX_GOSSIPED_POOL_NAME} bytes without whitespace, control characters, `=` or `@`",
                        p.name
                            .chars()
                            .take(MAX_GOSSIPED_POOL_NAME)
                            .collect::<String>()
                    ),
                );
            }
            let mut seen = std::collections::HashSet::new();
            for (j, e) in p.endpoints.iter().enumerate() {
                if !seen.insert((&e.authority, e.dp_rank)) {
                    return err(
                        format!("pools[{i}].endpoints[{j}].url"),
                        format!("{} is listed twice", e.authority),
                    );
                }
                if e.kv_replay.is_some() && e.kv_events.is_none() {
                    return err(
                        format!("pools[{i}].endpoints[{j}].kvReplay"),
                        "needs kvEvents".into(),
                    );
                }
            }
        }
        kubernetes::validate(self, file)
    }

    /// The `kubernetes:` section when the agent is to watch the cluster.
    pub fn kubernetes_enabled(&self) -> Option<&KubernetesConfig> {
        self.kubernetes.as_ref().filter(|k| k.enabled)
    }

    /// The tenant policy shared by every pool (one per agent for now).
    pub fn tenant_policy(&self) -> Arc<TenantPolicy> {
        Arc::new(self.tenants.clone())
    }
}

/// What errors in the flags' configuration name as their file.
pub const FLAGS: &str = "command line";

/// The longest pool name a per-pool `clusterMaxConcurrent` gossips (the facts' identifier
/// bound).
const MAX_GOSSIPED_POOL_NAME: usize = 128;

/// Whether a pool's name fits a `fair:TENANT@POOL` key: what the cluster's facts accept as
/// an identifier, and no `@` (the separator; tenant names hold none).
fn fits_a_fact_key(name: &str) -> bool {
    (1..=MAX_GOSSIPED_POOL_NAME).contains(&name.len())
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '=' || c == '@')
}
