//! `warmpath agent`: the node agent's main loop.
//!
//! Runs the routing proxy (with `--endpoint`s: KV index subscriptions, proxy and admin
//! listeners) and/or transparent interception (with `--redirect`s: the eBPF programs attached
//! to a cgroup and pinned, docs/ebpf.md), then serves until SIGINT/SIGTERM.

use tokio::signal::unix::{SignalKind, signal};

use crate::{args::AgentArgs, config::Config, ebpf};

mod intercept;
mod kernel_table;
mod kernel_traffic;
mod kubernetes;

pub use intercept::{Interception, start_intercept, start_interception};
use kubernetes::start_kubernetes;
pub use kubernetes::{KUBERNETES_SYNC_BOUND, Kubernetes};

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "nothing to do: give --endpoint URL or --config FILE (routing proxy) and/or --redirect VIP:PORT=TARGET:PORT"
    )]
    NothingToDo,
    #[error("{0}")]
    Config(String),
    #[error("listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Subscribe(#[from] crate::kv_index::subscriber::SubscribeError),
    #[error(transparent)]
    Tokenizer(#[from] warmpath_tokenizer::Error),
    #[error("kernel data path unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Ebpf(#[from] ebpf::Error),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::Error),
    #[error(transparent)]
    File(#[from] crate::config::ConfigError),
    #[error("cluster: {0}")]
    Cluster(#[from] crate::cluster::join::JoinError),
    #[error(transparent)]
    Policy(#[from] crate::policy::store::Error),
    #[error("cache salt key {}: {source}", path.display())]
    SaltKey {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
    #[error(transparent)]
    KubeClient(#[from] crate::k8s::client::ClientError),
    #[error(transparent)]
    Kubernetes(#[from] crate::k8s::Error),
}

/// Runs the agent until a termination signal.
pub async fn run(args: AgentArgs) -> Result<(), Error> {
    if args.cleanup {
        return cleanup(&args);
    }
    if args.redirects.is_empty() && args.endpoints.is_empty() && args.config.is_none() {
        return Err(Error::NothingToDo);
    }
    let _routing = if args.endpoints.is_empty() && args.config.is_none() {
        None
    } else {
        Some(start_routing(&args).await?)
    };
    let mut routing = _routing;
    let mut interception = start_interception(&args, routing.as_ref())?;
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let drain = std::time::Duration::from_secs(args.drain_timeout);
    tracing::info!(
        ?drain,
        "shutting down: refusing new connections, draining requests in flight"
    );
    if let Some(i) = &mut interception
        && let Err(err) = i.redirector.lock().stand_down()
    {
        tracing::warn!(%err, "could not mark the heartbeat stale; connects fail open within a second anyway");
    }
    if let Some(r) = &mut routing {
        // The status Lease handed back: the next agent writes statuses without waiting for
        // it to expire.
        let policies = r.kubernetes.as_ref().and_then(|k| k.policies.lock().take());
        if let Some(mut p) = policies {
            p.release_status().await;
        }
        let left = r.drain(drain).await;
        match left {
            0 => tracing::info!("drained"),
            n => tracing::warn!(
                requests = n,
                "drain timeout: exiting with requests in flight"
            ),
        }
    }
    Ok(())
}

/// A running routing proxy: its bound addresses, state and tasks (aborted on drop).
#[derive(Debug)]
pub struct Routing {
    /// The first proxy listener.
    pub listen: std::net::SocketAddr,
    /// Every proxy listener.
    pub listens: Vec<std::net::SocketAddr>,
    pub admin: std::net::SocketAddr,
    pub proxy: std::sync::Arc<crate::proxy::Proxy>,
    /// This agent's membership in a cluster (`--cluster-id`).
    pub cluster: Option<std::sync::Arc<crate::cluster::ClusterNode>>,
    /// The watched `--policy-dir`, if any.
    pub policy: Option<crate::policy::PolicyWatch>,
    /// The Kubernetes watchers (`kubernetes.enabled`).
    pub kubernetes: Option<std::sync::Arc<Kubernetes>>,
    /// The file's `intercept:` entries (interception starts from them and the flags).
    pub intercepts: Vec<crate::config::InterceptRule>,
    /// The proxy listeners' accept loops.
    listeners: Vec<tokio::task::JoinHandle<()>>,
    /// The data-path threads serving accepted connections (they outlive the accept loops
    /// while draining).
    _workers: std::sync::Arc<crate::proxy::Workers>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Routing {
    /// Stops accepting connections, answers `/ready` with 503, and waits (at most
    /// `timeout`) until no request waits for a slot or is at an engine (streams included);
    /// returns how many still are. Connections already accepted keep being served meanwhile.
    pub async fn drain(&mut self, timeout: std::time::Duration) -> usize {
        use std::sync::atomic::Ordering;
        self.proxy.draining.store(true, Ordering::Relaxed);
        for l in self.listeners.drain(..) {
            l.abort();
        }
        // Requests waiting for a slot (the agent's, or a pool's stage: those hold an agent
        // slot and are at no engine yet), and those at an engine (their streams included).
        let busy = |p: &crate::proxy::Proxy| {
            p.admission.waiting()
                + p.pools
                    .iter()
                    .filter_map(|pool| pool.admission.as_ref())
                    .map(|stage| stage.waiting())
                    .sum::<usize>()
                + p.pools
                    .iter()
                    .flat_map(|pool| pool.pool.endpoints().to_vec())
                    .map(|e| e.in_flight() as usize)
                    .sum::<usize>()
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(50));
        while busy(&self.proxy) > 0 && tokio::time::Instant::now() < deadline {
            tick.tick().await;
        }
        busy(&self.proxy)
    }
}

/// How long the agent waits for the listed pods to become pool members before serving.
const MEMBERS_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for Routing {
    fn drop(&mut self) {
        for t in self.tasks.iter().chain(&self.listeners) {
            t.abort();
        }
    }
}

/// Starts the routing proxy described by the flags (or by `--config`).
pub async fn start_routing(args: &AgentArgs) -> Result<Routing, Error> {
    let config = routing_config(args)?;
    start(&config).await
}

/// The routing configuration: the `--config` file, or the one-pool flags.
pub fn routing_config(args: &AgentArgs) -> Result<Config, Error> {
    match &args.config {
        Some(path) => {
            if !args.endpoints.is_empty() {
                return Err(Error::Config(
                    "give either --config FILE or --endpoint flags, not both".into(),
                ));
            }
            let mut config = crate::config::load(path)?;
            if let Some(n) = args.workers {
                config.workers = n;
                config.validate(crate::config::FLAGS)?;
            }
            // Each cluster flag given overrides that field of the file's section.
            config.cluster = args.cluster.over(config.cluster.take())?;
            if config.cluster.is_some() {
                config.validate(crate::config::FLAGS)?;
            }
            if args.policy_dir.is_some() {
                config.policy_dir = args.policy_dir.clone();
            }
            if args.cache_salt_key_file.is_some() {
                config.cache_salt_key_file = args.cache_salt_key_file.clone();
            }
            Ok(config)
        }
        None => Ok(args.config()?),
    }
}

/// Starts index subscriptions, one proxy listener per `listen` address, the admin listener,
/// the scrape loop and the index sweeper.
pub async fn start(config: &Config) -> Result<Routing, Error> {
    use std::sync::Arc;

    use crate::{
        config::TokenSourceConfig,
        kv_index,
        pool::Pool,
        proxy::{self, TokenSource},
    };
    use warmpath_tokenizer::{Tokenizer, segments::SegmentTokenizer};

    let block_sizes: std::collections::HashSet<usize> =
        config.pools.iter().map(|p| p.block_size).collect();
    if block_sizes.len() > 1 {
        return Err(Error::Config(
            "pools with different block sizes need separate agents for now (one index per agent)"
                .into(),
        ));
    }
    let index = Arc::new(kv_index::KvIndex::new(kv_index::IndexConfig {
        block_size: config.pools[0].block_size,
        ..Default::default()
    }));
    let telemetry = Arc::new(crate::telemetry::Telemetry::new(&config.telemetry)?);
    crate::telemetry::index::observe(telemetry.meter(), index.clone());
    if let Some(otlp) = &config.telemetry.otlp {
        tracing::info!(endpoint = %otlp.endpoint, protocol = ?otlp.protocol, interval = ?otlp.interval, "pushing OTLP metrics");
    }
    let mut proxy = proxy::Proxy::new(index.clone(), telemetry, config.tenants.clone());
    proxy.max_body = config.max_body;
    proxy.admission = proxy::admission::Admission::new(config.limits);
    proxy.admission.observe(proxy.telemetry.meter());
    proxy.retries = config.retries;
    proxy.explain = config.explain;
    proxy.inject_usage = config.inject_usage;
    let mut tasks = Vec::new();
    let mut builtin: Option<Arc<SegmentTokenizer>> = None;
    let mut pods = crate::cluster::join::Pods::default();
    // The same pods again, for the cluster's sets once discovered pods join them.
    let (mut static_local, mut static_remote) = (Vec::new(), Vec::new());
    let gated_pools = config
        .pools
        .iter()
        .filter(|p| p.cluster_max_concurrent > 0)
        .count();
    for pc in &config.pools {
        let mut endpoints = Vec::new();
        for e in &pc.endpoints {
            // A remote pod of a pool not replicated has no source: routed by load alone.
            let remote = config
                .cluster
                .as_ref()
                .is_some_and(|c| c.replicated_remote(&pc.name, &e.authority));
            let source = match &e.kv_events {
                None if remote => {
                    let source = pods.remote(&index, &e.authority);
                    static_remote.push((e.authority.clone(), source));
                    Some(source)
                }
                Some(events) => {
                    let info = kv_index::SourceInfo {
                        pod: e.authority.clone(),
                        rank: e.dp_rank,
                    };
                    let id = index.add_source(info);
                    let cfg = kv_index::subscriber::SourceConfig {
                        pod: e.authority.clone(),
                        rank: e.dp_rank,
                        endpoint: events.clone(),
                        bind: e.kv_bind,
                        replay: e.kv_replay.clone(),
                        topic: e.kv_topic.clone(),
                    };
                    tasks.push(kv_index::subscriber::spawn(index.clone(), id, cfg).await?);
                    pods.local(&e.authority, &pc.model, id);
                    static_local.push(crate::cluster::LocalPod {
                        id: e.authority.clone(),
                        model: pc.model.clone(),
                        source: id,
                    });
                    Some(id)
                }
                None => None,
            };
            endpoints.push((e.authority.clone(), source));
        }
        let pool = Pool::new(pc.model.clone(), pc.block_size, pc.policy, endpoints)
            .with_metrics_urls(pc.endpoints.iter().map(|e| e.metrics_url.clone()).collect());
        let tokens = match &pc.tokens {
            TokenSourceConfig::Builtin => TokenSource::Local(
                builtin
                    .get_or_insert_with(|| {
                        Arc::new(SegmentTokenizer::new(Arc::new(Tokenizer::builtin())))
                    })
                    .clone(),
            ),
            TokenSourceConfig::HuggingFace(dir) => TokenSource::Local(Arc::new(
                SegmentTokenizer::new(Arc::new(Tokenizer::from_dir(dir)?)),
            )),
            TokenSourceConfig::Engine => TokenSource::Engine,
            TokenSourceConfig::Approximate => TokenSource::Approximate,
        };
        let stage = (pc.cluster_max_concurrent > 0).then(|| {
            proxy::admission::Admission::for_pool(
                &proxy.admission,
                &pc.name,
                pc.cluster_max_concurrent,
                gated_pools,
            )
        });
        let added = proxy.add_pool(&pc.name, pool, tokens, pc.session.clone());
        added.protocol = pc.upstream;
        added.admission = stage;
        proxy
            .policy
            .set_pool_targets(&pc.name, pool_targets(pc, config.kubernetes.as_ref()));
    }
    proxy.salt = Arc::new(cache_salt(config)?);
    proxy.quotas.observe(proxy.telemetry.meter());
    if proxy.salt.origin == crate::policy::salt::SaltOrigin::Random {
        tracing::info!(
            "cache salts keyed per process (no --cache-salt-key-file or cluster key): isolated tenants' prefixes are not shared across agents"
        );
    }
    let policy_watch = match &config.policy_dir {
        Some(dir) => Some(crate::policy::watch_dir(
            dir,
            proxy.policy.clone(),
            proxy.telemetry.meter(),
        )?),
        None => None,
    };
    let proxy = Arc::new(proxy);
    proxy.follow_peer_placements();
    // Ends by itself with the proxy; idle until a cluster shares loads.
    drop(proxy.share_loads());
    let kubernetes = match &config.kubernetes {
        Some(k) if k.enabled => Some(start_kubernetes(k, config, &proxy).await?),
        _ => None,
    };
    let listen = |addr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen { addr, source })
    };
    let addr = |l: &tokio::net::TcpListener, asked| {
        l.local_addr().map_err(|source| Error::Listen {
            addr: asked,
            source,
        })
    };
    let workers = Arc::new(proxy::Workers::start(config.workers).map_err(|source| {
        Error::Config(format!(
            "starting {} data-path threads: {source}",
            config.workers
        ))
    })?);
    let mut listen_addrs = Vec::new();
    let mut listeners = Vec::new();
    for &asked in &config.listen {
        let l = listen(asked).await?;
        listen_addrs.push(addr(&l, asked)?);
        listeners.push(tokio::spawn(proxy::serve(
            l,
            proxy.clone(),
            workers.clone(),
        )));
    }
    let admin = listen(config.admin).await?;
    let admin_addr = addr(&admin, config.admin)?;
    let endpoints: usize = config.pools.iter().map(|p| p.endpoints.len()).sum();
    tracing::info!(listen = ?listen_addrs, admin = %admin_addr, pools = config.pools.len(), endpoints, workers = workers.len(), "routing proxy ready");
    tasks.push(tokio::spawn(proxy::serve_admin(
        admin,
        proxy.clone(),
        config.admin_token.clone(),
    )));
    tasks.push(tokio::spawn(proxy::scrape_loop(proxy.clone())));
    tasks.push(tokio::spawn(proxy::recount_loop(proxy.clone())));
    let cluster = match &config.cluster {
        Some(c) => Some(Arc::new(
            crate::cluster::join::join(c.join(Some(listen_addrs[0])), index.clone(), pods).await?,
        )),
        None => None,
    };
    if let Some(k) = &kubernetes {
        // Alone (no cluster) the agent subscribes to every discovered pod's KV events; in a
        // cluster, to its own node's, and replicates the others' from their agents.
        let cluster = cluster.as_ref().map(|node| crate::discovery::ClusterPods {
            node: node.clone(),
            local: static_local.clone(),
            remote: static_remote.clone(),
            unreplicated: config
                .pools
                .iter()
                .filter(|p| {
                    config
                        .cluster
                        .as_ref()
                        .is_some_and(|c| !c.replicates(&p.name))
                })
                .map(|p| p.name.clone())
                .collect(),
        });
        let (task, mut applied) =
            crate::discovery::spawn(proxy.clone(), k.watchers.members.clone(), cluster);
        tasks.push(task);
        // Serving (and intercepting) only once the listed pods are members.
        if tokio::time::timeout(MEMBERS_BOUND, applied.wait_for(|n| *n > 0))
            .await
            .is_err()
        {
            tracing::warn!("pool membership not applied within {MEMBERS_BOUND:?}; serving anyway");
        }
    }
    if let Some(node) = &cluster {
        // The replicas' and placements' lag histograms on /metrics (and OTLP).
        node.lags().observe(proxy.telemetry.meter());
        // Cold decisions staggered by this agent's place among the live members.
        tasks.push(crate::cluster::spawn_order_watch(
            node,
            proxy.stagger.clone(),
        ));
        // Quotas hold cluster-wide: each agent's share follows the others' demand.
        tasks.push(crate::cluster::spawn_usage_exchange(
            node,
            proxy.quotas.clone(),
            node.gossip_interval(),
        ));
        // Tenants contending for the cluster-wide concurrency share it by priority then
        // weight: each agent's gate follows the others' demand.
        let pools_gated = config.pools.iter().any(|p| p.cluster_max_concurrent > 0);
        if config.limits.cluster_max_concurrent > 0 || pools_gated {
            tasks.push(crate::cluster::spawn_contention_exchange(
                node,
                proxy.clone(),
                node.gossip_interval(),
            ));
        }
        // What the cluster refused, its peers and the owners' word on remote pods, in
        // /status (CLUSTER) and on /metrics; this agent's pods' loads (its own scrapes) to
        // the peers over gossip.
        let report = node.report();
        report.observe(proxy.telemetry.meter());
        proxy
            .sections
            .set("cluster", Arc::new(move || report.status()));
        let scraped = proxy.clone();
        tasks.push(crate::cluster::spawn_load_publisher(
            node,
            Arc::new(move |pod: &str| {
                let engine = scraped.pools.iter().find_map(|p| {
                    let endpoints = p.pool.endpoints();
                    let e = endpoints.iter().find(|e| e.authority == pod)?;
                    e.snapshot().engine
                })?;
                Some(crate::cluster::load_fact(
                    engine.running,
                    engine.waiting,
                    engine.kv_cache_usage,
                ))
            }),
        ));
    }
    tasks.push(tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
        loop {
            tick.tick().await;
            index.sweep(std::time::Instant::now());
        }
    }));
    Ok(Routing {
        listen: listen_addrs[0],
        listens: listen_addrs,
        admin: admin_addr,
        proxy,
        cluster,
        policy: policy_watch,
        kubernetes,
        intercepts: config.intercept.clone(),
        listeners,
        _workers: workers,
        tasks,
    })
}

/// The cache-salt key: `--cache-salt-key-file`, else the cluster key file, else a key of
/// this process (docs/policy.md, "Cache isolation").
fn cache_salt(config: &Config) -> Result<crate::policy::salt::CacheSalt, Error> {
    use crate::policy::salt::CacheSalt;
    let path = config
        .cache_salt_key_file
        .as_ref()
        .or_else(|| config.cluster.as_ref().and_then(|c| c.key_file.as_ref()));
    let Some(path) = path else {
        return Ok(CacheSalt::random());
    };
    let bytes = std::fs::read(path).map_err(|source| Error::SaltKey {
        path: path.clone(),
        source,
    })?;
    let key = bytes.trim_ascii();
    if key.len() < 16 {
        return Err(Error::SaltKey {
            path: path.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "needs at least 16 bytes of key material",
            ),
        });
    }
    // Domain-separated from the key's other uses (gossip HMAC, gRPC token).
    let mut material = b"warmpath cache salt\0".to_vec();
    material.extend_from_slice(key);
    Ok(CacheSalt::new(&material))
}

/// The pin directory: `--pin-dir`, else `<bpffs>/warmpath`.
pub(crate) fn pin_dir(args: &AgentArgs) -> std::path::PathBuf {
    args.pin_dir
        .clone()
        .unwrap_or_else(|| ebpf::default_pin_dir(&args.bpffs))
}

/// `warmpath agent --cleanup`: detaches and unpins everything this agent pinned.
pub fn cleanup(args: &AgentArgs) -> Result<(), Error> {
    let dir = pin_dir(args);
    let cleaned = ebpf::cleanup(&dir)?;
    tracing::info!(dir = %dir.display(), links = cleaned.links, maps = cleaned.maps, "removed pinned interception state");
    Ok(())
}

/// What `RoutePolicy` targets name pool `pc` by: the file's labels and Services, and on
/// Kubernetes the `InferencePool` it follows, its selector's labels (every member carries
/// them) and the Services `kubernetes.intercept` sends to it, each in its namespace.
fn pool_targets(
    pc: &crate::config::PoolConfig,
    kubernetes: Option<&crate::config::KubernetesConfig>,
) -> crate::policy::compiled::PoolTargets {
    use crate::config::PoolMembers;
    let mut t = crate::policy::compiled::PoolTargets {
        labels: pc.labels.clone(),
        namespace: pc.members.as_ref().map(|m| m.namespace().to_string()),
        inference_pool: None,
        services: pc
            .services
            .iter()
            .map(|(name, port)| (None, name.clone(), *port))
            .collect(),
    };
    match &pc.members {
        Some(PoolMembers::InferencePool { namespace, name }) => {
            t.inference_pool = Some((namespace.clone(), name.clone()));
        }
        Some(PoolMembers::Selector { match_labels, .. }) => {
            t.labels.extend(match_labels.clone());
        }
        None => {}
    }
    if let Some(k) = kubernetes.filter(|k| k.enabled) {
        t.services.extend(
            k.intercept
                .iter()
                .filter(|i| i.pool == pc.name)
                .map(|i| (Some(i.namespace.clone()), i.name.clone(), i.port)),
        );
    }
    t
}
