//! `warmpath agent`: the node agent's main loop.
//!
//! Runs the routing proxy (with `--endpoint`s: KV index subscriptions, proxy and admin
//! listeners) and/or the kernel redirect path (with `--redirect`s: connect4 attached to a
//! cgroup), then serves until SIGINT/SIGTERM.

use tokio::signal::unix::{SignalKind, signal};

use crate::{cli::AgentArgs, ebpf};

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "nothing to do: give --endpoint URL (routing proxy) and/or --redirect VIP:PORT=TARGET:PORT"
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
    Tokenizer(#[from] warmpath_sim::tokenizer::Error),
    #[error("kernel data path unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Ebpf(#[from] ebpf::Error),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::Error),
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
}

/// Runs the agent until a termination signal.
pub async fn run(args: AgentArgs) -> Result<(), Error> {
    if args.redirects.is_empty() && args.endpoints.is_empty() {
        return Err(Error::NothingToDo);
    }
    let _routing = if args.endpoints.is_empty() {
        None
    } else {
        Some(start_routing(&args).await?)
    };
    let _redirector = if args.redirects.is_empty() {
        None
    } else {
        Some(start_redirect(&args)?)
    };
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    Ok(())
}

/// A running routing proxy: its bound addresses, state and tasks (aborted on drop).
#[derive(Debug)]
pub struct Routing {
    pub listen: std::net::SocketAddr,
    pub admin: std::net::SocketAddr,
    pub proxy: std::sync::Arc<crate::proxy::Proxy>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Routing {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts index subscriptions, the proxy and the admin listener.
pub async fn start_routing(args: &AgentArgs) -> Result<Routing, Error> {
    use std::sync::Arc;

    use crate::{kv_index, pool::Pool, proxy};

    let n = args.endpoints.len();
    for (flag, count) in [
        ("--kv-events", args.kv_events.len()),
        ("--kv-replay", args.kv_replay.len()),
    ] {
        if count != 0 && count != n {
            return Err(Error::Config(format!(
                "{flag} given {count} times for {n} --endpoint: give it once per endpoint, in the same order, or not at all"
            )));
        }
    }
    if args.kv_replay.len() > args.kv_events.len() {
        return Err(Error::Config("--kv-replay needs --kv-events".into()));
    }
    let tokenizer = Arc::new(match &args.tokenizer {
        Some(dir) => warmpath_sim::tokenizer::Tokenizer::from_dir(dir)?,
        None => warmpath_sim::tokenizer::Tokenizer::builtin(),
    });
    let index = Arc::new(kv_index::KvIndex::new(kv_index::IndexConfig {
        block_size: args.block_size,
        ..Default::default()
    }));
    let mut tasks = Vec::new();
    let mut endpoints = Vec::new();
    for (i, url) in args.endpoints.iter().enumerate() {
        let authority = url
            .parse::<http::Uri>()
            .ok()
            .filter(|u| u.scheme_str() == Some("http"))
            .and_then(|u| u.authority().map(|a| a.to_string()))
            .ok_or_else(|| Error::Config(format!("--endpoint {url}: expected http://host:port")))?;
        let source = match args.kv_events.get(i) {
            Some(events) => {
                let cfg = kv_index::subscriber::SourceConfig {
                    pod: authority.clone(),
                    rank: None,
                    endpoint: events.clone(),
                    bind: false,
                    replay: args.kv_replay.get(i).cloned(),
                    topic: String::new(),
                };
                let id = index.add_source(kv_index::SourceInfo {
                    pod: authority.clone(),
                    rank: None,
                });
                tasks.push(kv_index::subscriber::spawn(index.clone(), id, cfg).await?);
                Some(id)
            }
            None => None,
        };
        endpoints.push((authority, source));
    }
    let pool = Pool::new(
        args.model.clone(),
        args.block_size,
        args.route_policy(),
        endpoints,
    );
    let (tenants, telemetry_config) = args.telemetry.build()?;
    let telemetry = Arc::new(crate::telemetry::Telemetry::new(&telemetry_config)?);
    crate::telemetry::index::observe(telemetry.meter(), index.clone());
    if let Some(otlp) = &telemetry_config.otlp {
        tracing::info!(endpoint = otlp.endpoint.as_deref().unwrap_or("(from OTEL_EXPORTER_OTLP_*)"), protocol = ?otlp.protocol, interval = ?otlp.interval, "pushing OTLP metrics");
    }
    let mut proxy = proxy::Proxy::new(
        pool,
        index.clone(),
        tokenizer,
        args.explain,
        telemetry,
        tenants,
    );
    proxy.inject_usage = !args.no_inject_usage;
    proxy.session = proxy::SessionSource {
        header: args.session_header.clone(),
        cookie: args.session_cookie.clone(),
    };
    let proxy = Arc::new(proxy);
    let listen = |addr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen { addr, source })
    };
    let (main, admin) = (listen(args.listen).await?, listen(args.admin).await?);
    let addr = |l: &tokio::net::TcpListener, asked| {
        l.local_addr().map_err(|source| Error::Listen {
            addr: asked,
            source,
        })
    };
    let (listen_addr, admin_addr) = (addr(&main, args.listen)?, addr(&admin, args.admin)?);
    tracing::info!(listen = %listen_addr, admin = %admin_addr, endpoints = n, policy = ?args.policy, "routing proxy ready");
    tasks.push(tokio::spawn(proxy::serve(main, proxy.clone())));
    tasks.push(tokio::spawn(proxy::serve_admin(admin, proxy.clone())));
    tasks.push(tokio::spawn(proxy::scrape_loop(proxy.clone())));
    tasks.push(tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
        loop {
            tick.tick().await;
            index.sweep(std::time::Instant::now());
        }
    }));
    Ok(Routing {
        listen: listen_addr,
        admin: admin_addr,
        proxy,
        tasks,
    })
}

/// Loads and attaches connect4 with the `--redirect` rules; detached when dropped.
fn start_redirect(args: &AgentArgs) -> Result<ebpf::Redirector, Error> {
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
    let mut redirector = ebpf::Redirector::load()?;
    redirector.forward_logs()?;
    for rule in &args.redirects {
        redirector.set_redirect(rule.vip, rule.target)?;
        tracing::info!(vip = %rule.vip, target = %rule.target, "intercepting");
    }
    redirector.attach(&cgroup)?;
    tracing::info!(cgroup = %cgroup.display(), "connect4 attached");
    Ok(redirector)
}
