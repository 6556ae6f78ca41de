//! The options of `warmpath agent` and the configuration they describe.
//!
//! Flags build a [`Config`]; the config module never sees them.

use std::path::PathBuf;

use clap::{Args, Parser};

use crate::config::{
    Config, ConfigError, EndpointConfig, FLAGS, PoolConfig, TokenSourceConfig, authority_of,
};

/// Options of `warmpath agent`.
#[derive(Debug, Parser)]
#[command(name = "agent")]
pub struct AgentArgs {
    /// Where the routing proxy listens (with at least one --endpoint).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,

    /// Admin listener: /status, /metrics, /ready, /live. On a non-loopback address
    /// --admin-token-file is required.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
    pub admin: std::net::SocketAddr,

    /// File holding the bearer token `/status` and `/metrics` require (one line, at least
    /// 16 characters; docs/security.md).
    #[arg(long, value_name = "PATH", env = "WARMPATH_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// Data-path threads, each serving its share of client connections (default: one per
    /// CPU this process may use). Overrides `proxy.workers` of a --config file.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,

    /// A configuration file (YAML; docs/config.md) instead of the one-pool flags below.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// A directory of RoutePolicy and Tenant files (YAML; docs/policy.md), watched and
    /// hot-reloaded: an invalid update is rejected and the last good version keeps serving.
    #[arg(long, value_name = "DIR", env = "WARMPATH_POLICY_DIR")]
    pub policy_dir: Option<PathBuf>,

    /// File whose contents key isolated tenants' cache salts (agents sharing it agree on
    /// salts); default: the cluster key, else a key of this process (docs/policy.md).
    #[arg(long, value_name = "PATH", env = "WARMPATH_CACHE_SALT_KEY_FILE")]
    pub cache_salt_key_file: Option<PathBuf>,

    /// Served model name of the pool.
    #[arg(long, default_value = "sim-llama")]
    pub model: String,

    /// A vLLM endpoint (`http://host:port`). Repeatable; the n-th --kv-events and
    /// --kv-replay belong to the n-th endpoint.
    #[arg(long = "endpoint", value_name = "URL")]
    pub endpoints: Vec<String>,

    /// KV events endpoint of the matching --endpoint (`tcp://host:port`).
    #[arg(long = "kv-events", value_name = "ZMQ")]
    pub kv_events: Vec<String>,

    /// Replay endpoint of the matching --endpoint.
    #[arg(long = "kv-replay", value_name = "ZMQ")]
    pub kv_replay: Vec<String>,

    /// HuggingFace tokenizer directory (default: the built-in one the simulator uses).
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,

    /// Where prompt tokens come from: the local tokenizer, the engine's /tokenize, or
    /// character chunks (approximate policy only).
    #[arg(long, value_enum, default_value_t = TokensFlag::Local)]
    pub tokens: TokensFlag,

    /// Tokens per KV block; must match vLLM --block-size.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,

    /// How endpoints are chosen.
    #[arg(long, value_enum, default_value_t = crate::routing::Policy::Precise)]
    pub policy: crate::routing::Policy,

    /// Override one scorer weight of the policy's preset: `NAME=W` with NAME one of prefix,
    /// queue, kv-usage, lora, session, in-flight (docs/routing.md). Repeatable.
    #[arg(long = "weight", value_name = "NAME=W", value_parser = parse_weight)]
    pub weights: Vec<(String, f64)>,

    /// The longest a cold request waits at the router, while the pod it was ranked to has no
    /// KV room, for warm requests to go first (precise and approximate
    /// only; 0: never; default: the preset's, 150 ms; docs/routing.md, "Cold requests
    /// yield").
    #[arg(long, value_name = "MS")]
    pub cold_yield_ms: Option<u64>,

    /// Header carrying the session key (session affinity).
    #[arg(long, value_name = "NAME", default_value = crate::routing::DEFAULT_SESSION_HEADER)]
    pub session_header: http::HeaderName,

    /// Cookie carrying the session key, when the header is absent.
    #[arg(long, value_name = "NAME")]
    pub session_cookie: Option<String>,

    /// Protocol to the engines: http1 (keep-alive pools; vLLM's own server) or h2 (h2c with
    /// prior knowledge: requests multiplexed over one connection per engine).
    #[arg(long, value_enum, default_value_t = crate::pool::UpstreamProtocol::Http1)]
    pub upstream_protocol: crate::pool::UpstreamProtocol,

    /// Add x-warmpath-pod / -prefix-blocks / -score headers to responses.
    #[arg(long)]
    pub explain: bool,

    /// Intercept connections to VIP:PORT and send them to TARGET:PORT instead, in the kernel
    /// (cgroup/connect4 and connect6; docs/ebpf.md). Repeatable; IPv4 or IPv6, one family per
    /// rule. Example: `--redirect 10.96.0.10:8000=10.231.0.1:8080`.
    #[arg(long = "redirect", value_name = "VIP:PORT=TARGET:PORT", value_parser = parse_redirect)]
    pub redirects: Vec<Redirect>,

    /// Steer mode for this intercepted VIP:PORT (also given in a --redirect): connects go
    /// straight to one of the --endpoint pods, chosen in the kernel, without the agent's hop
    /// (docs/ebpf.md). Repeatable.
    #[arg(long = "steer", value_name = "VIP:PORT")]
    pub steer: Vec<std::net::SocketAddr>,

    /// cgroup v2 directory whose processes are intercepted (default: the cgroup v2 root, i.e.
    /// every process on the node).
    #[arg(long, value_name = "DIR")]
    pub cgroup: Option<PathBuf>,

    /// Where bpffs is (mounted there if absent).
    #[arg(long, value_name = "DIR", default_value = crate::ebpf::DEFAULT_BPFFS)]
    pub bpffs: PathBuf,

    /// Where interception state is pinned (default: BPFFS/warmpath). A restarted agent adopts
    /// what it finds there (docs/ebpf.md).
    #[arg(long, value_name = "DIR")]
    pub pin_dir: Option<PathBuf>,

    /// Detach and unpin everything under the pin directory, then exit.
    #[arg(long)]
    pub cleanup: bool,

    /// Accelerate node-local hops with sk_msg + SOCKHASH: bytes between an intercepted
    /// client's socket and the agent's skip TCP (docs/ebpf.md). Off by default: `warmpath
    /// bench ebpf` measures whether it wins.
    #[arg(long)]
    pub sk_msg: bool,

    /// On SIGTERM/SIGINT: how long requests in flight may take to finish (new connections
    /// are refused, `/ready` answers 503 and intercepted connects fail open meanwhile)
    /// before the agent exits anyway. Keep it below the pod's termination grace period.
    #[arg(long, value_name = "SECONDS", default_value_t = 25)]
    pub drain_timeout: u64,

    /// Do not ask streams for usage on the client's behalf (token counters then miss streams
    /// whose clients did not ask for usage).
    #[arg(long)]
    pub no_inject_usage: bool,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub telemetry: TelemetryArgs,

    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Agents sharing one index without a central router (docs/cluster.md). Off unless
/// --cluster-id is given or the --config file has a `cluster:` section; each flag given
/// (or its variable) overrides that field of the file's section.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Join the cluster of agents with this id (members with another id are refused).
    #[arg(long, value_name = "ID")]
    pub cluster_id: Option<String>,

    /// This agent's member id (default: the host name).
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,

    /// UDP address for gossip [default: 0.0.0.0:7400].
    #[arg(long, value_name = "ADDR")]
    pub gossip_listen: Option<std::net::SocketAddr>,

    /// The gossip address peers use (default: --gossip-listen, which must then be specific).
    #[arg(long, value_name = "ADDR")]
    pub gossip_advertise: Option<std::net::SocketAddr>,

    /// A member to join through (`host:port`; DNS names are re-resolved). Repeatable; given,
    /// they replace the file's seeds.
    #[arg(long = "seed", value_name = "HOST:PORT")]
    pub seeds: Vec<String>,

    /// File holding the cluster's shared key (at least 32 bytes): HMAC on every gossip
    /// datagram, the token on every IndexSync stream. Required off loopback.
    #[arg(long, value_name = "PATH", env = "WARMPATH_CLUSTER_KEY_FILE")]
    pub cluster_key_file: Option<PathBuf>,

    /// TCP address of the IndexSync gRPC server [default: 0.0.0.0:7401].
    #[arg(long, value_name = "ADDR")]
    pub grpc_listen: Option<std::net::SocketAddr>,

    /// The IndexSync address peers use (default: the address --grpc-listen bound).
    #[arg(long, value_name = "ADDR")]
    pub grpc_advertise: Option<std::net::SocketAddr>,

    /// Milliseconds between gossip rounds: a stopped agent is noticed after about 12-15
    /// rounds (docs/cluster.md) [default: 500].
    #[arg(long, value_name = "MS")]
    pub gossip_interval_ms: Option<u64>,

    /// An endpoint of the pool on another agent's node (`http://host:port`): routed to, its
    /// index state replicated from the agent that owns it instead of subscribed to.
    /// Repeatable; added to the flag-configured pool, or naming an endpoint of --config's
    /// (given, they replace the file's `remoteEndpoints`).
    #[arg(long = "remote-endpoint", value_name = "URL")]
    pub remote_endpoints: Vec<String>,

    /// Replicate the remote pods of this pool (by name); repeatable. Default: every pool
    /// (the file's `replicate`, else all). Remote pods of other pools are routed by load,
    /// with no replica.
    #[arg(long = "replicate", value_name = "POOL")]
    pub replicate: Vec<String>,
}

impl ClusterArgs {
    /// The cluster section these flags describe (`None` without --cluster-id).
    pub fn config(&self) -> Result<Option<crate::config::ClusterConfig>, ConfigError> {
        self.over(None)
    }

    /// The file's cluster section `file` with every flag given put over it (`None`: neither
    /// the file's section nor --cluster-id), checked again.
    pub fn over(
        &self,
        file: Option<crate::config::ClusterConfig>,
    ) -> Result<Option<crate::config::ClusterConfig>, ConfigError> {
        let Some(mut config) = file.map_or_else(|| self.flags_alone(), |c| Ok(Some(c)))? else {
            return Ok(None);
        };
        self.put_over(&mut config)?;
        config.validate(FLAGS)?;
        Ok(Some(config))
    }

    /// Without a file's section: the defaults under --cluster-id (`None` without it).
    fn flags_alone(&self) -> Result<Option<crate::config::ClusterConfig>, ConfigError> {
        let Some(id) = &self.cluster_id else {
            for (flag, given) in [
                ("--remote-endpoint", !self.remote_endpoints.is_empty()),
                ("--replicate", !self.replicate.is_empty()),
            ] {
                if given {
                    return Err(ConfigError::field(
                        FLAGS,
                        flag,
                        "needs --cluster-id (or a `cluster:` section in --config): only a cluster member learns other agents' pods",
                    ));
                }
            }
            return Ok(None);
        };
        let node_id = match &self.node_id {
            Some(n) => n.clone(),
            None => crate::config::host_name().ok_or_else(|| {
                ConfigError::field(
                    FLAGS,
                    "--node-id",
                    "no host name to default to: give --node-id",
                )
            })?,
        };
        Ok(Some(crate::config::ClusterConfig {
            id: id.clone(),
            node_id,
            gossip_listen: default_addr(crate::config::DEFAULT_GOSSIP_LISTEN),
            gossip_advertise: default_addr(crate::config::DEFAULT_GOSSIP_LISTEN),
            seeds: Vec::new(),
            key_file: None,
            grpc_listen: default_addr(crate::config::DEFAULT_GRPC_LISTEN),
            grpc_advertise: None,
            gossip_interval: crate::cluster::membership::DEFAULT_GOSSIP_INTERVAL,
            remote_endpoints: Vec::new(),
            replicate: crate::config::Replicate::Routed,
            derived: crate::config::Derived {
                gossip: true,
                grpc: true,
                host: None,
            },
        }))
    }

    /// Every flag given replaces its field of `config` (a list flag the whole list); an
    /// advertised address the section derived (not given) is derived again from the listen
    /// address as the flags leave it, a given one stays unless its flag replaces it.
    fn put_over(&self, config: &mut crate::config::ClusterConfig) -> Result<(), ConfigError> {
        if let Some(id) = &self.cluster_id {
            config.id.clone_from(id);
        }
        if let Some(n) = &self.node_id {
            config.node_id.clone_from(n);
        }
        if let Some(listen) = self.gossip_listen {
            config.gossip_listen = listen;
        }
        if let Some(a) = self.gossip_advertise {
            config.gossip_advertise = a;
            config.derived.gossip = false;
        }
        if !self.seeds.is_empty() {
            config.seeds.clone_from(&self.seeds);
        }
        if let Some(k) = &self.cluster_key_file {
            config.key_file = Some(k.clone());
        }
        if let Some(listen) = self.grpc_listen {
            config.grpc_listen = listen;
        }
        if let Some(a) = self.grpc_advertise {
            config.grpc_advertise = Some(a);
            config.derived.grpc = false;
        }
        if let Some(ms) = self.gossip_interval_ms {
            config.gossip_interval = std::time::Duration::from_millis(ms);
        }
        if !self.remote_endpoints.is_empty() {
            config.remote_endpoints = self
                .remote_endpoints
                .iter()
                .map(|url| {
                    authority_of(url).ok_or_else(|| {
                        ConfigError::field(
                            FLAGS,
                            "--remote-endpoint",
                            format!("{url}: expected http://host:port"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
        }
        if !self.replicate.is_empty() {
            config.replicate = crate::config::Replicate::Pools(self.replicate.clone());
        }
        config.derive_advertised();
        Ok(())
    }
}

fn default_addr(addr: &str) -> std::net::SocketAddr {
    addr.parse().expect("the default address parses")
}

/// Capacity and size bounds (docs/config.md, docs/reliability.md).
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Routed requests admitted at once (streams count until they end); more wait in the
    /// queue. 0: no limit.
    #[arg(long, value_name = "N", default_value_t = crate::config::DEFAULT_MAX_CONCURRENT)]
    pub max_concurrent: usize,

    /// Routed requests in flight through all agents of the cluster together, shared among
    /// contending tenants by priority then weight over the gossip; a tenant beyond its
    /// share here waits in the queue. 0: off (each agent's --max-concurrent alone).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub cluster_max_concurrent: usize,

    /// Requests that may wait for an admission slot; beyond it, 429 at once.
    #[arg(long, value_name = "N", default_value_t = crate::config::DEFAULT_MAX_QUEUED)]
    pub max_queued: usize,

    /// How long a request waits for a slot before it gets 429.
    #[arg(long, value_name = "MS", default_value_t = crate::config::DEFAULT_QUEUE_TIMEOUT.as_millis() as u64)]
    pub queue_timeout_ms: u64,

    /// Largest `prompt` or `messages` member (JSON bytes); larger ones get 413 before
    /// tokenization.
    #[arg(long, value_name = "BYTES", default_value_t = crate::config::DEFAULT_MAX_PROMPT_BYTES)]
    pub max_prompt_bytes: usize,

    /// Largest request body; larger ones get 413.
    #[arg(long, value_name = "BYTES", default_value_t = crate::config::DEFAULT_MAX_BODY)]
    pub max_body_bytes: usize,

    /// A started request head, or a request body that stops arriving, is given up after
    /// this (408).
    #[arg(long, value_name = "MS", default_value_t = crate::http::server::DEFAULT_READ_TIMEOUT.as_millis() as u64)]
    pub read_timeout_ms: u64,

    /// An engine's response that sends nothing for this long while the client waits is given
    /// up: a stream ends with an error event, other bodies are cut short.
    #[arg(long, value_name = "MS", default_value_t = crate::config::DEFAULT_UPSTREAM_IDLE_TIMEOUT.as_millis() as u64)]
    pub upstream_idle_timeout_ms: u64,

    /// An engine that sends no complete response head for this long (connect included) is
    /// given up: the next endpoint is tried, or 504 when none is left.
    #[arg(long, value_name = "MS", default_value_t = crate::config::DEFAULT_UPSTREAM_HEAD_TIMEOUT.as_millis() as u64)]
    pub upstream_head_timeout_ms: u64,
}

impl LimitArgs {
    /// The limits these flags describe (validated with the rest of the configuration).
    pub fn limits(&self) -> crate::config::Limits {
        use std::time::Duration;
        crate::config::Limits {
            max_concurrent: self.max_concurrent,
            cluster_max_concurrent: self.cluster_max_concurrent,
            max_queued: self.max_queued,
            queue_timeout: Duration::from_millis(self.queue_timeout_ms),
            max_prompt_bytes: self.max_prompt_bytes,
            read_timeout: Duration::from_millis(self.read_timeout_ms),
            upstream_idle_timeout: Duration::from_millis(self.upstream_idle_timeout_ms),
            upstream_head_timeout: Duration::from_millis(self.upstream_head_timeout_ms),
        }
    }
}

/// `--tokens`: the token source of the flag-configured pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TokensFlag {
    /// The in-process tokenizer (`--tokenizer DIR`, else the built-in one).
    Local,
    /// The engine's `POST /tokenize`.
    Engine,
    /// Character chunks (with `--policy approximate`).
    Approximate,
}

/// Tenant identity and telemetry export (docs/telemetry.md).
#[derive(Debug, Args)]
pub struct TelemetryArgs {
    /// Source addresses of a tenant's workloads: `NAME=CIDR`. Repeatable; longest prefix wins.
    #[arg(long = "tenant-cidr", value_name = "NAME=CIDR", value_parser = crate::tenant::parse_cidr_rule)]
    pub tenant_cidrs: Vec<(ipnet::IpNet, String)>,

    /// Header naming the tenant, believed only from --trust-tenant-header-from sources.
    #[arg(long, value_name = "NAME", default_value = crate::tenant::DEFAULT_HEADER)]
    pub tenant_header: http::HeaderName,

    /// Sources (CIDR or address) whose tenant header is believed, e.g. an authenticating
    /// gateway. Repeatable. Without it the header is never believed.
    #[arg(long = "trust-tenant-header-from", value_name = "CIDR", value_parser = crate::tenant::parse_net)]
    pub trusted_header_sources: Vec<ipnet::IpNet>,

    /// Identity sources in the order they are tried; the default tenant comes last.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "workload,header"
    )]
    pub tenant_order: Vec<crate::tenant::IdentitySource>,

    /// Tenant of requests nobody claims.
    #[arg(long, value_name = "NAME", default_value = crate::tenant::DEFAULT_TENANT, value_parser = parse_tenant_name)]
    pub default_tenant: String,

    /// Tenants with their own series; more are counted as `other`.
    #[arg(long, default_value_t = crate::telemetry::DEFAULT_MAX_TENANTS)]
    pub max_tenants: usize,

    /// Add a `pod` attribute to per-request metrics (series: tenants x pods).
    #[arg(long)]
    pub telemetry_pod_attribute: bool,

    /// OTLP collector URL (default: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or
    /// OTEL_EXPORTER_OTLP_ENDPOINT; no push when none is set).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf).
    #[arg(long, value_enum)]
    pub otlp_protocol: Option<crate::telemetry::export::OtlpProtocol>,

    /// Push interval in milliseconds (default: OTEL_METRIC_EXPORT_INTERVAL, else 15000).
    #[arg(long, value_name = "MS")]
    pub otlp_interval_ms: Option<u64>,

    /// PEM CA certificates trusted for an https collector instead of the system's roots
    /// (default: OTEL_EXPORTER_OTLP_[METRICS_]CERTIFICATE).
    #[arg(long, value_name = "FILE")]
    pub otlp_certificate: Option<PathBuf>,

    /// PEM client certificate for mTLS (default:
    /// OTEL_EXPORTER_OTLP_[METRICS_]CLIENT_CERTIFICATE).
    #[arg(long, value_name = "FILE")]
    pub otlp_client_certificate: Option<PathBuf>,

    /// PEM private key of the client certificate (default:
    /// OTEL_EXPORTER_OTLP_[METRICS_]CLIENT_KEY).
    #[arg(long, value_name = "FILE")]
    pub otlp_client_key: Option<PathBuf>,

    /// Export body compression (default: OTEL_EXPORTER_OTLP_[METRICS_]COMPRESSION, else
    /// none).
    #[arg(long, value_enum)]
    pub otlp_compression: Option<crate::telemetry::export::Compression>,
}

fn parse_weight(s: &str) -> Result<(String, f64), String> {
    let (name, w) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected NAME=WEIGHT, e.g. kv-usage=0.5"))?;
    let w: f64 = w
        .parse()
        .map_err(|_| format!("`{s}`: the weight must be a number"))?;
    // Validates the name and the value.
    crate::routing::Weights::default().set(name, w)?;
    Ok((name.to_string(), w))
}

impl AgentArgs {
    /// The pool policy these flags describe: the preset, then each --weight and
    /// --cold-yield-ms.
    pub fn route_policy(&self) -> Result<crate::routing::RoutePolicy, ConfigError> {
        let mut p = crate::routing::RoutePolicy::from(self.policy);
        for (name, w) in &self.weights {
            // Validated by the parser.
            let _ = p.weights.set(name, *w);
        }
        if let Some(ms) = self.cold_yield_ms {
            p.cold_yield = crate::routing::cold_yield::check(p.kind, ms)
                .map_err(|m| ConfigError::field(FLAGS, "--cold-yield-ms", m))?;
        }
        Ok(p)
    }
}

impl AgentArgs {
    /// The one-pool configuration these flags describe (validated).
    pub fn config(&self) -> Result<Config, ConfigError> {
        let n = self.endpoints.len();
        for (flag, count) in [
            ("--kv-events", self.kv_events.len()),
            ("--kv-replay", self.kv_replay.len()),
        ] {
            if count != 0 && count != n {
                return Err(ConfigError::field(
                    FLAGS,
                    flag,
                    format!(
                        "given {count} times for {n} --endpoint: give it once per endpoint, in the same order, or not at all"
                    ),
                ));
            }
        }
        if self.kv_replay.len() > self.kv_events.len() {
            return Err(ConfigError::field(
                FLAGS,
                "--kv-replay",
                "needs --kv-events",
            ));
        }
        let endpoints = self
            .endpoints
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let authority = authority_of(url).ok_or_else(|| {
                    ConfigError::field(
                        FLAGS,
                        "--endpoint",
                        format!("{url}: expected http://host:port"),
                    )
                })?;
                Ok(EndpointConfig {
                    metrics_url: format!("http://{authority}/metrics"),
                    authority,
                    kv_events: self.kv_events.get(i).cloned(),
                    kv_replay: self.kv_replay.get(i).cloned(),
                    kv_bind: false,
                    kv_topic: String::new(),
                    dp_rank: None,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let cluster = self.cluster.config()?;
        let mut endpoints = endpoints;
        for authority in cluster.iter().flat_map(|c| &c.remote_endpoints) {
            if !endpoints.iter().any(|e| e.authority == *authority) {
                endpoints.push(EndpointConfig {
                    metrics_url: format!("http://{authority}/metrics"),
                    authority: authority.clone(),
                    kv_events: None,
                    kv_replay: None,
                    kv_bind: false,
                    kv_topic: String::new(),
                    dp_rank: None,
                });
            }
        }
        let tokens = match (self.tokens, &self.tokenizer) {
            (TokensFlag::Local, Some(dir)) => TokenSourceConfig::HuggingFace(dir.clone()),
            (TokensFlag::Local, None) => TokenSourceConfig::Builtin,
            (TokensFlag::Engine, _) => TokenSourceConfig::Engine,
            (TokensFlag::Approximate, _) => TokenSourceConfig::Approximate,
        };
        let (tenants, telemetry) = self
            .telemetry
            .build()
            .map_err(|e| ConfigError::field(FLAGS, "telemetry flags", e.to_string()))?;
        let admin_token = self
            .admin_token_file
            .as_deref()
            .map(crate::config::AdminToken::from_file)
            .transpose()
            .map_err(|m| ConfigError::field(FLAGS, "--admin-token-file", m))?;
        let config = Config {
            listen: vec![self.listen],
            workers: self.workers.unwrap_or_else(crate::config::default_workers),
            admin: self.admin,
            admin_token,
            pools: vec![PoolConfig {
                name: crate::config::DEFAULT_POOL.into(),
                model: self.model.clone(),
                block_size: self.block_size,
                tokens,
                policy: self.route_policy()?,
                session: crate::routing::SessionSource {
                    header: self.session_header.clone(),
                    cookie: self.session_cookie.clone(),
                },
                upstream: self.upstream_protocol,
                endpoints,
                members: None,
                labels: Default::default(),
                services: Vec::new(),
                cluster_max_concurrent: 0,
            }],
            max_body: self.limits.max_body_bytes,
            limits: self.limits.limits(),
            retries: crate::config::DEFAULT_RETRIES,
            explain: self.explain,
            inject_usage: !self.no_inject_usage,
            tenants,
            telemetry,
            cluster,
            policy_dir: self.policy_dir.clone(),
            cache_salt_key_file: self.cache_salt_key_file.clone(),
            kubernetes: None,
            intercept: Vec::new(),
        };
        config.validate(FLAGS)?;
        Ok(config)
    }
}

fn parse_tenant_name(s: &str) -> Result<String, String> {
    crate::tenant::check_name(s).map(|()| s.to_string())
}

impl TelemetryArgs {
    /// The tenant policy and telemetry settings these flags describe.
    pub fn build(
        &self,
    ) -> Result<
        (
            crate::tenant::TenantPolicy,
            crate::telemetry::TelemetryConfig,
        ),
        crate::telemetry::Error,
    > {
        use crate::{
            telemetry::{
                TelemetryConfig,
                export::{OtlpConfig, OtlpSettings, SettingsOrigin},
            },
            tenant,
        };
        let directory = tenant::CidrTable::new(self.tenant_cidrs.iter().cloned())
            .map_err(crate::telemetry::Error::Config)?;
        let policy = tenant::TenantPolicy {
            order: self.tenant_order.clone(),
            directory: std::sync::Arc::new(directory),
            cgroups: None,
            cidrs: self.tenant_cidrs.clone(),
            header: self.tenant_header.clone(),
            trusted: self.trusted_header_sources.clone(),
            header_sources: Default::default(),
            default_tenant: self.default_tenant.as_str().into(),
        };
        let otlp = OtlpConfig::from_settings(
            OtlpSettings {
                endpoint: self.otlp_endpoint.clone(),
                protocol: self.otlp_protocol,
                interval: self.otlp_interval_ms.map(std::time::Duration::from_millis),
                certificate: self.otlp_certificate.clone(),
                client_certificate: self.otlp_client_certificate.clone(),
                client_key: self.otlp_client_key.clone(),
                compression: self.otlp_compression,
                origin: SettingsOrigin::Flags,
            },
            |k| std::env::var(k).ok(),
        )?;
        Ok((
            policy,
            TelemetryConfig {
                max_tenants: self.max_tenants,
                pod_attribute: self.telemetry_pod_attribute,
                otlp,
            },
        ))
    }
}

/// One `--redirect` rule: IPv4 to IPv4 or IPv6 to IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redirect {
    pub vip: std::net::SocketAddr,
    pub target: std::net::SocketAddr,
}

fn parse_redirect(s: &str) -> Result<Redirect, String> {
    let (vip, target) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected VIP:PORT=TARGET:PORT"))?;
    let parse = |what: &str, v: &str| {
        v.trim().parse::<std::net::SocketAddr>().map_err(|e| {
            format!(
                "{what} `{v}`: {e} (expected an address and port, e.g. 10.96.0.10:8000 or [fd00::10]:8000)"
            )
        })
    };
    let (vip, target) = (parse("VIP", vip)?, parse("target", target)?);
    if vip.is_ipv4() != target.is_ipv4() {
        return Err(format!(
            "`{s}`: VIP and target must be of one address family (a connect() keeps its family)"
        ));
    }
    Ok(Redirect { vip, target })
}

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redirect_rules() {
        let r = parse_redirect("127.77.0.1:8000=127.0.0.1:8100").unwrap();
        assert_eq!(r.vip, "127.77.0.1:8000".parse().unwrap());
        assert_eq!(r.target, "127.0.0.1:8100".parse().unwrap());
        assert!(
            parse_redirect("127.77.0.1:8000")
                .unwrap_err()
                .contains("VIP:PORT=TARGET:PORT")
        );
        assert!(
            parse_redirect("x=127.0.0.1:1")
                .unwrap_err()
                .contains("VIP `x`")
        );
        assert!(
            parse_redirect("127.0.0.1:1=[::1]:2")
                .unwrap_err()
                .contains("one address family")
        );
        let v6 = parse_redirect("[fd00:96::10]:8000=[fd00:231::1]:8080").unwrap();
        assert_eq!(v6.vip, "[fd00:96::10]:8000".parse().unwrap());
        assert_eq!(v6.target, "[fd00:231::1]:8080".parse().unwrap());
    }
}
