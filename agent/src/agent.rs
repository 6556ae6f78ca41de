//! `warmpath agent`: the node agent's main loop.
//!
//! Runs the routing proxy (with `--endpoint`s: KV index subscriptions, proxy and admin
//! listeners) and/or transparent interception (with `--redirect`s: the eBPF programs attached
//! to a cgroup and pinned, docs/ebpf.md), then serves until SIGINT/SIGTERM.

use tokio::signal::unix::{SignalKind, signal};

use crate::{args::AgentArgs, config::Config, ebpf};

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

/// Transparent interception while it runs: the attached programs and, on Kubernetes, the
/// task that keeps the intercepted VIPs equal to the watched Services'.
#[derive(Debug)]
pub struct Interception {
    pub redirector: std::sync::Arc<parking_lot::Mutex<ebpf::Redirector>>,
    _services: Option<AbortOnDrop>,
}

/// Starts interception when there is anything to intercept: `--redirect` rules, or Services
/// named in `kubernetes.intercept` (followed as they change). With a routing proxy to fall
/// back on, missing kernel features are not fatal: the agent serves as an explicit proxy and
/// says so once (docs/ebpf.md).
pub fn start_interception(
    args: &AgentArgs,
    routing: Option<&Routing>,
) -> Result<Option<Interception>, Error> {
    let services = routing
        .and_then(|r| r.kubernetes.as_ref())
        .filter(|k| k.intercepts)
        .map(|k| k.watchers.services.clone());
    if args.redirects.is_empty() && services.is_none() {
        return Ok(None);
    }
    // Checked before anything is loaded: a bad target changes no kernel state.
    let target = match (&services, routing) {
        (Some(_), Some(routing)) => intercept_target(routing.listen)?,
        _ => std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    let redirector = match (start_intercept(args), routing) {
        (Ok(r), _) => r,
        (Err(err @ (Error::Unavailable(_) | Error::Ebpf(_))), Some(routing)) => {
            tracing::warn!(listen = ?routing.listens, "interception off: {err}; serving as an explicit proxy");
            return Ok(None);
        }
        (Err(err), _) => return Err(err),
    };
    let redirector = std::sync::Arc::new(parking_lot::Mutex::new(redirector));
    let services = match (services, routing) {
        (Some(services), Some(_)) => Some(AbortOnDrop(tokio::spawn(sync_intercepts(
            redirector.clone(),
            services,
            target,
            args.redirects.iter().map(|r| r.vip).collect(),
        )))),
        _ => None,
    };
    Ok(Some(Interception {
        redirector,
        _services: services,
    }))
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
        // Requests waiting for a slot, and those at an engine (their streams included).
        let busy = |p: &crate::proxy::Proxy| {
            p.admission.waiting()
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

/// The agent's Kubernetes side: pods, InferencePools and Services watched into pool
/// membership and intercepted VIPs; RoutePolicy and Tenant objects into the active policy,
/// with their status written by the holder of the status Lease.
#[derive(Debug)]
pub struct Kubernetes {
    pub watchers: crate::k8s::Watchers,
    /// The pods that identify clients (Tenant selectors by namespace, service account,
    /// labels).
    _identity: crate::k8s::identity::IdentityHandle,
    /// Taken out at shutdown to hand the status Lease back.
    pub policies: parking_lot::Mutex<Option<crate::k8s::policies::PoliciesHandle>>,
    /// Whether `kubernetes.intercept` names Services (interception follows them).
    pub intercepts: bool,
}

/// How long the agent waits for the listed pods to become pool members before serving.
const MEMBERS_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// How long the agent waits for its first complete lists before serving anyway (watchers
/// keep retrying with backoff; pools stay empty until their pods are listed).
pub const KUBERNETES_SYNC_BOUND: std::time::Duration = std::time::Duration::from_secs(30);

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
            config.cluster = args.cluster.config()?;
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
    for pc in &config.pools {
        let mut endpoints = Vec::new();
        for e in &pc.endpoints {
            let remote = config
                .cluster
                .as_ref()
                .is_some_and(|c| c.remote_endpoints.contains(&e.authority));
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
        proxy
            .add_pool(&pc.name, pool, tokens, pc.session.clone())
            .protocol = pc.upstream;
        proxy
            .policy
            .set_pool_targets(&pc.name, pc.labels.clone(), pc.services.clone());
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
        // Quotas hold cluster-wide: each agent's share follows the others' demand.
        tasks.push(crate::cluster::spawn_usage_exchange(
            node,
            proxy.quotas.clone(),
            node.gossip_interval(),
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
        listeners,
        _workers: workers,
        tasks,
    })
}

/// Starts the Kubernetes watchers and policies (membership is applied by [`crate::discovery`]
/// once the cluster is joined), and waits (at most [`KUBERNETES_SYNC_BOUND`]) for their first
/// complete lists.
async fn start_kubernetes(
    k: &crate::config::KubernetesConfig,
    config: &Config,
    proxy: &std::sync::Arc<crate::proxy::Proxy>,
) -> Result<std::sync::Arc<Kubernetes>, Error> {
    if config.policy_dir.is_some() {
        return Err(Error::Config(
            "policyDir and kubernetes are exclusive: on Kubernetes, RoutePolicy and Tenant objects come from the API".into(),
        ));
    }
    let client = crate::k8s::client::client().await?;
    let watchers = crate::k8s::start(client.clone(), k, &config.pools).await?;
    // Client identity first, so that Tenant selectors match pods from the first policy set.
    let scope = match (k.identity, &k.node_name) {
        (crate::config::IdentityScope::Node, Some(node)) => {
            crate::k8s::identity::Scope::Node(node.clone())
        }
        (crate::config::IdentityScope::Node, None) => {
            tracing::warn!(
                "kubernetes.identity is node but there is no node name (nodeName or $NODE_NAME): identifying clients from every pod of the cluster"
            );
            crate::k8s::identity::Scope::Cluster
        }
        (crate::config::IdentityScope::Cluster, _) => crate::k8s::identity::Scope::Cluster,
    };
    let (workloads, identity) = crate::k8s::identity::spawn(client.clone(), scope);
    proxy.policy.set_workloads(workloads);
    let status = match (k.status_writes, &k.node_name) {
        (true, Some(node)) => Some(crate::k8s::status::Settings {
            holder: node.clone(),
            namespace: std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into()),
            timing: Default::default(),
        }),
        (true, None) => {
            tracing::warn!(
                "kubernetes.statusWrites without a node name (nodeName or $NODE_NAME): this agent writes no status"
            );
            None
        }
        (false, _) => None,
    };
    let policies = crate::k8s::policies::spawn(
        client,
        proxy.policy.clone(),
        k.namespaces.clone(),
        status,
        proxy.telemetry.meter(),
    );
    let synced = async {
        watchers.synced().await;
        identity.synced().await;
        policies.synced().await;
    };
    match tokio::time::timeout(KUBERNETES_SYNC_BOUND, synced).await {
        Ok(()) => tracing::info!(node = ?k.node_name, "kubernetes: first lists complete"),
        Err(_) => tracing::warn!(
            pending = watchers.pending(),
            "kubernetes: not every watcher has listed within {KUBERNETES_SYNC_BOUND:?}; serving, they keep retrying"
        ),
    }
    let kubernetes = std::sync::Arc::new(Kubernetes {
        watchers,
        _identity: identity,
        policies: parking_lot::Mutex::new(Some(policies)),
        intercepts: !k.intercept.is_empty(),
    });
    let shown = kubernetes.clone();
    proxy
        .sections
        .set("kubernetes", std::sync::Arc::new(move || shown.status()));
    kubernetes.observe(proxy.telemetry.meter());
    Ok(kubernetes)
}

impl Kubernetes {
    /// Registers the watchers' counters on `meter`: `warmpath.kubernetes.lists`,
    /// `.watch_restarts` and `.watch_errors` by `kind`, `.bad_annotations`, and
    /// `warmpath.kubernetes.status_leader` (1 while this agent writes statuses).
    pub fn observe(self: &std::sync::Arc<Self>, meter: &opentelemetry::metrics::Meter) {
        use opentelemetry::KeyValue;
        type Pick = fn(&crate::k8s::KindSnapshot) -> u64;
        let per_kind: [(&'static str, &'static str, Pick); 3] = [
            (
                "warmpath.kubernetes.lists",
                "Complete lists (the first, and each relist)",
                |k| k.lists,
            ),
            (
                "warmpath.kubernetes.watch_restarts",
                "Watches restarted (dropped, expired)",
                |k| k.restarts,
            ),
            (
                "warmpath.kubernetes.watch_errors",
                "Watch and list errors (retried with backoff)",
                |k| k.errors,
            ),
        ];
        for (name, description, pick) in per_kind {
            let k = self.clone();
            meter
                .u64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| {
                    let w = k.watchers.snapshot();
                    for (kind, snap) in [
                        ("Pod", w.pods),
                        ("InferencePool", w.inference_pools),
                        ("Service", w.services),
                    ] {
                        o.observe(pick(&snap), &[KeyValue::new("kind", kind)]);
                    }
                })
                .build();
        }
        let k = self.clone();
        meter
            .u64_observable_counter("warmpath.kubernetes.bad_annotations")
            .with_description(
                "Pod annotations that could not be used (the pod is routed without them)",
            )
            .with_callback(move |o| o.observe(k.watchers.snapshot().bad_annotations, &[]))
            .build();
        let k = self.clone();
        meter
            .u64_observable_gauge("warmpath.kubernetes.status_leader")
            .with_description("1 while this agent holds the status Lease and writes RoutePolicy and Tenant statuses")
            .with_callback(move |o| {
                let leads = k
                    .policies
                    .lock()
                    .as_ref()
                    .and_then(|p| p.status().map(|s| s.is_leader()))
                    .unwrap_or(false);
                o.observe(u64::from(leads), &[]);
            })
            .build();
    }

    /// The `kubernetes` section of `/status`: the watchers' counters, the policy reloads,
    /// and whether this agent writes statuses.
    pub fn status(&self) -> serde_json::Value {
        let w = self.watchers.snapshot();
        let kind = |k: crate::k8s::KindSnapshot| serde_json::json!({"lists": k.lists, "restarts": k.restarts, "errors": k.errors});
        let policies = self.policies.lock();
        let r = policies.as_ref().map(|p| p.counts()).unwrap_or_default();
        let status = policies
            .as_ref()
            .and_then(|p| p.status())
            .map(|s| serde_json::json!({"leader": s.is_leader(), "writes": s.writes()}));
        drop(policies);
        serde_json::json!({
            "pending": self.watchers.pending(),
            "pods": kind(w.pods), "inference_pools": kind(w.inference_pools),
            "services": kind(w.services), "bad_annotations": w.bad_annotations,
            "services_without_vip": w.services_without_vip,
            "services_intercepted": self.watchers.services.borrow().iter().map(|s| serde_json::json!({
                "service": format!("{}/{}", s.namespace, s.name), "port": s.port, "pool": s.pool,
                "vips": s.vips.iter().map(|v| v.to_string()).collect::<Vec<_>>(), "note": s.note,
            })).collect::<Vec<_>>(),
            "policy_reloads": {"applied": r.applied, "unchanged": r.unchanged, "rejected": r.rejected,
                "rejected_objects": r.rejected_objects},
            "status_writer": status,
        })
    }
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

/// Aborts a task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where intercepted connects are sent: the first proxy listener, which pods must be able to
/// reach — so when it listens on every address, the node's own (`$POD_IP` of a hostNetwork
/// agent, docs/install.md).
fn intercept_target(listen: std::net::SocketAddr) -> Result<std::net::SocketAddr, Error> {
    if !listen.ip().is_unspecified() {
        return Ok(listen);
    }
    let ip = std::env::var("POD_IP").map_err(|_| {
        Error::Config(format!(
            "kubernetes.intercept: the proxy listens on {listen}; set POD_IP (the node address pods reach) or listen on that address"
        ))
    })?;
    let ip: std::net::IpAddr = ip
        .parse()
        .map_err(|e| Error::Config(format!("POD_IP `{ip}`: {e}")))?;
    Ok(std::net::SocketAddr::new(ip, listen.port()))
}

/// Keeps the kernel's redirect table equal to the Services' VIPs (each redirected to
/// `target`), as the Service watcher reports them. VIPs of another family than `target` are
/// skipped (one family per rule); VIPs of `--redirect` rules (`fixed`) are the flags' and
/// never touched. A VIP whose install or removal failed is retried every
/// [`INTERCEPT_RETRY`] until it holds.
async fn sync_intercepts(
    redirector: std::sync::Arc<parking_lot::Mutex<ebpf::Redirector>>,
    mut services: tokio::sync::watch::Receiver<Vec<crate::k8s::services::InterceptedService>>,
    target: std::net::SocketAddr,
    fixed: std::collections::BTreeSet<std::net::SocketAddr>,
) {
    use std::{collections::BTreeSet, net::SocketAddr};
    let mut installed: BTreeSet<SocketAddr> = BTreeSet::new();
    let mut warned: BTreeSet<SocketAddr> = BTreeSet::new();
    loop {
        let want: BTreeSet<SocketAddr> = services
            .borrow_and_update()
            .iter()
            .flat_map(|s| s.vips.iter().copied())
            .filter(|vip| !fixed.contains(vip))
            .filter(|vip| {
                let same = vip.is_ipv4() == target.is_ipv4();
                if !same && warned.insert(*vip) {
                    tracing::warn!(%vip, %target, "not intercepted: the listener is of the other address family");
                }
                same
            })
            .collect();
        let mut failed = false;
        {
            let mut r = redirector.lock();
            let gone: Vec<SocketAddr> = installed.difference(&want).copied().collect();
            for vip in gone {
                match r.remove_redirect(vip) {
                    Ok(()) => {
                        installed.remove(&vip);
                        tracing::info!(%vip, "no longer intercepting (Service gone or changed)");
                    }
                    Err(err) => {
                        failed = true;
                        tracing::warn!(%vip, %err, "removing an intercepted VIP failed; retrying");
                    }
                }
            }
            let new: Vec<SocketAddr> = want.difference(&installed).copied().collect();
            for vip in new {
                match r.set_redirect(vip, target) {
                    Ok(()) => {
                        installed.insert(vip);
                        tracing::info!(%vip, %target, "intercepting (Service)");
                    }
                    Err(err) => {
                        failed = true;
                        tracing::warn!(%vip, %err, "intercepting a Service VIP failed; retrying");
                    }
                }
            }
        }
        let changed = async {
            if failed {
                tokio::select! {
                    r = services.changed() => r.is_ok(),
                    () = tokio::time::sleep(INTERCEPT_RETRY) => true,
                }
            } else {
                services.changed().await.is_ok()
            }
        };
        if !changed.await {
            return;
        }
    }
}

/// How soon a Service VIP that could not be (un)installed is tried again.
const INTERCEPT_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Loads and attaches the interception programs with the `--redirect` rules, excludes the
/// agent's own cgroup and lets the proxy listeners look up each accepted connection's VIP and
/// client cgroup. Everything is detached when the returned value drops (docs/ebpf.md).
pub fn start_intercept(args: &AgentArgs) -> Result<ebpf::Redirector, Error> {
    if let Some(reason) = ebpf::unavailable_reason() {
        return Err(Error::Unavailable(reason));
    }
    if ebpf::ensure_bpffs(&args.bpffs)? {
        tracing::info!(path = %args.bpffs.display(), "mounted bpffs");
    }
    let cgroup = match args.cgroup.clone() {
        Some(dir) => dir,
        None => ebpf::cgroup2_root()?,
    };
    let pin_dir = pin_dir(args);
    let mut redirector = ebpf::Redirector::load_pinned(&pin_dir)?;
    redirector.forward_logs()?;
    redirector.start_heartbeat();
    for rule in &args.redirects {
        redirector.set_redirect(rule.vip, rule.target)?;
        tracing::info!(vip = %rule.vip, target = %rule.target, "intercepting");
    }
    steer(args, &mut redirector)?;
    let own = ebpf::own_cgroup()?;
    let own_id = redirector.exclude_cgroup(&own)?;
    ebpf::Origins::install(redirector.origins());
    redirector.attach(&cgroup)?;
    tracing::info!(cgroup = %cgroup.display(), excluded = %own.display(), excluded_id = own_id, pinned = %pin_dir.display(), "interception attached (connect4/6, getpeername4/6, sock_ops)");
    Ok(redirector)
}

/// Steer mode for each `--steer` VIP: its backend set is the `--endpoint` pods of its address
/// family (IP literals, at most `BACKENDS_MAX`), chosen uniformly in the kernel.
fn steer(args: &AgentArgs, redirector: &mut ebpf::Redirector) -> Result<(), Error> {
    for vip in &args.steer {
        if !args.redirects.iter().any(|r| r.vip == *vip) {
            return Err(Error::Config(format!(
                "--steer {vip}: not intercepted (add --redirect {vip}=LISTENER)"
            )));
        }
        let pods: Vec<std::net::SocketAddr> = args
            .endpoints
            .iter()
            .filter_map(|url| endpoint_addr(url))
            .filter(|pod| pod.is_ipv4() == vip.is_ipv4())
            .take(warmpath_common::BACKENDS_MAX)
            .collect();
        if pods.is_empty() {
            return Err(Error::Config(format!(
                "--steer {vip}: no --endpoint with an IP address of the same family to steer to"
            )));
        }
        redirector.failopen().set_backends(*vip, &pods)?;
        redirector.set_steer(*vip, true)?;
        tracing::info!(%vip, ?pods, "steering in the kernel");
    }
    Ok(())
}

/// The `IP:PORT` of an `http://IP:PORT[/...]` endpoint URL (`None` for host names).
fn endpoint_addr(url: &str) -> Option<std::net::SocketAddr> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next()?.parse().ok()
}

/// The pin directory: `--pin-dir`, else `<bpffs>/warmpath`.
fn pin_dir(args: &AgentArgs) -> std::path::PathBuf {
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

#[cfg(test)]
mod tests {
    use super::endpoint_addr;

    #[test]
    fn endpoint_urls_with_ip_literals_give_addresses() {
        assert_eq!(
            endpoint_addr("http://10.231.0.3:8000"),
            Some("10.231.0.3:8000".parse().unwrap())
        );
        assert_eq!(
            endpoint_addr("http://[fd00:231::3]:8000/v1"),
            Some("[fd00:231::3]:8000".parse().unwrap())
        );
        assert_eq!(endpoint_addr("http://vllm-0.vllm:8000"), None);
        assert_eq!(endpoint_addr("http://10.0.0.1"), None);
    }
}
