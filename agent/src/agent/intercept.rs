//! Transparent interception while the agent runs: the eBPF programs loaded, attached and
//! pinned with the `--redirect` rules, steer mode, the kernel's affinity and backend tables
//! kept equal to what the proxy learned ([`super::kernel_table`]), and on Kubernetes the
//! intercepted VIPs kept equal to the watched Services' (docs/ebpf.md, docs/install.md).

use super::{Error, Routing, kernel_table, pin_dir};
use crate::{args::AgentArgs, ebpf};

/// Transparent interception while it runs: the attached programs, the kernel table writer
/// and, on Kubernetes, the task that keeps the intercepted VIPs equal to the watched
/// Services'.
#[derive(Debug)]
pub struct Interception {
    pub redirector: std::sync::Arc<parking_lot::Mutex<ebpf::Redirector>>,
    _services: Option<AbortOnDrop>,
    _table: Option<AbortOnDrop>,
    _kernel_traffic: Option<AbortOnDrop>,
}

/// Starts interception when there is anything to intercept: `--redirect` rules, the file's
/// `intercept:` entries, or Services named in `kubernetes.intercept` (followed as they change). With a routing proxy to fall
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
    // Checked before anything is loaded: a bad rule or target changes no kernel state.
    let rules = rules(args, routing)?;
    if rules.is_empty() && services.is_none() {
        return Ok(None);
    }
    let target = match (&services, routing) {
        (Some(_), Some(routing)) => intercept_target(routing.listen, "kubernetes.intercept")?,
        _ => std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    let redirector = match (start_intercept(args, &rules), routing) {
        (Ok(r), _) => r,
        (Err(err @ (Error::Unavailable(_) | Error::Ebpf(_))), Some(routing)) => {
            tracing::warn!(listen = ?routing.listens, "interception off: {}; serving as an explicit proxy", crate::error_chain(&err));
            return Ok(None);
        }
        (Err(err), _) => return Err(err),
    };
    let redirector = std::sync::Arc::new(parking_lot::Mutex::new(redirector));
    let table = routing.map(|routing| {
        let vips = vip_source(&rules, routing, services.clone(), target);
        start_table(
            &redirector,
            routing,
            vips,
            rules.iter().filter(|r| r.steer).map(|r| r.vip).collect(),
            // With several pools, a VIP whose pool was not named carries every model's
            // requests: no one pool's policy may steer it.
            rules
                .iter()
                .filter(|r| !r.pool_given && routing.proxy.pools.len() > 1)
                .map(|r| r.vip)
                .collect(),
        )
    });
    let services = match (services, routing) {
        (Some(services), Some(_)) => Some(AbortOnDrop(tokio::spawn(sync_intercepts(
            redirector.clone(),
            services,
            target,
            rules.iter().map(|r| r.vip).collect(),
        )))),
        _ => None,
    };
    let kernel_traffic =
        routing.map(|routing| AbortOnDrop(super::kernel_traffic::export(&redirector, routing)));
    Ok(Some(Interception {
        redirector,
        _services: services,
        _table: table,
        _kernel_traffic: kernel_traffic,
    }))
}

/// Writes the first kernel table now (so steered VIPs have their backend sets, and the VIPs
/// policies steer are steered, before this returns), then every [`kernel_table::TABLE_INTERVAL`]; its counters go to `/status`
/// (`kernel_table`).
fn start_table(
    redirector: &std::sync::Arc<parking_lot::Mutex<ebpf::Redirector>>,
    routing: &Routing,
    vips: kernel_table::VipSource,
    fixed_steer: std::collections::BTreeSet<std::net::SocketAddr>,
    unsteerable: std::collections::BTreeSet<std::net::SocketAddr>,
) -> AbortOnDrop {
    let mut writer = kernel_table::Writer::new(
        redirector.clone(),
        routing.proxy.clone(),
        vips,
        fixed_steer,
        unsteerable,
    );
    writer.round(std::time::Instant::now());
    let report = writer.report();
    routing
        .proxy
        .sections
        .set("kernel_table", std::sync::Arc::new(move || report.status()));
    AbortOnDrop(tokio::spawn(writer.run()))
}

/// The intercepted VIPs, each with its pool: a rule's with its pool (a `--redirect` VIP goes
/// with the first pool, the one that takes requests without a model), a Service's with the
/// pool its entry names (Services of the other family than the listener are not
/// intercepted).
fn vip_source(
    rules: &[Rule],
    routing: &Routing,
    services: Option<tokio::sync::watch::Receiver<Vec<crate::k8s::services::InterceptedService>>>,
    target: std::net::SocketAddr,
) -> kernel_table::VipSource {
    let fixed: Vec<(std::net::SocketAddr, usize)> = rules.iter().map(|r| (r.vip, r.pool)).collect();
    let pools: Vec<String> = routing.proxy.pools.iter().map(|p| p.name.clone()).collect();
    Box::new(move || {
        let mut vips = fixed.clone();
        if let Some(services) = &services {
            for s in services.borrow().iter() {
                let Some(pool) = pools.iter().position(|p| *p == s.pool) else {
                    continue;
                };
                vips.extend(
                    s.vips
                        .iter()
                        .filter(|vip| {
                            vip.is_ipv4() == target.is_ipv4()
                                && !fixed.iter().any(|(f, _)| f == *vip)
                        })
                        .map(|vip| (*vip, pool)),
                );
            }
        }
        vips
    })
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
/// agent, docs/install.md). `what` names the setting that needs it, in the error.
fn intercept_target(
    listen: std::net::SocketAddr,
    what: &str,
) -> Result<std::net::SocketAddr, Error> {
    if !listen.ip().is_unspecified() {
        return Ok(listen);
    }
    let ip = std::env::var("POD_IP").map_err(|_| {
        Error::Config(format!(
            "{what}: the proxy listens on {listen}; set POD_IP (the node address pods reach), listen on that address or give the entry a target"
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

/// Loads and attaches the interception programs with `rules` (redirects, steer mode),
/// excludes the agent's own cgroup and lets the proxy listeners look up each accepted
/// connection's VIP and client cgroup. Everything is detached when the returned value drops
/// (docs/ebpf.md).
pub fn start_intercept(args: &AgentArgs, rules: &[Rule]) -> Result<ebpf::Redirector, Error> {
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
    for rule in rules {
        redirector.set_redirect(rule.vip, rule.target)?;
        tracing::info!(vip = %rule.vip, target = %rule.target, "intercepting");
        if rule.steer {
            // Connects go straight to a pod from the kernel table ([`kernel_table`]) while it
            // has an entry, else through the agent.
            redirector.set_steer(rule.vip, true)?;
            tracing::info!(vip = %rule.vip, "steering in the kernel");
        }
    }
    if args.sk_msg {
        redirector.enable_sk_msg()?;
        tracing::info!("sk_msg acceleration on: node-local hops bypass TCP (--sk-msg)");
    }
    let own = ebpf::own_cgroup()?;
    let own_id = redirector.exclude_cgroup(&own)?;
    ebpf::Origins::install(redirector.origins());
    redirector.attach(&cgroup)?;
    tracing::info!(cgroup = %cgroup.display(), excluded = %own.display(), excluded_id = own_id, pinned = %pin_dir.display(), "interception attached (connect4/6, getpeername4/6, sock_ops)");
    Ok(redirector)
}

/// The file's `intercept[i]` as a rule: not a VIP already given, its pool's index, its target
/// (the first listener by default) of the VIP's family.
fn file_rule(
    i: usize,
    e: &crate::config::InterceptRule,
    routing: &Routing,
    before: &[Rule],
) -> Result<Rule, Error> {
    if before.iter().any(|r| r.vip == e.vip) {
        return Err(Error::Config(format!(
            "intercept[{i}].vip: {} is also a --redirect",
            e.vip
        )));
    }
    let pool = match &e.pool {
        None => 0,
        Some(name) => routing
            .proxy
            .pools
            .iter()
            .position(|p| p.name == *name)
            .ok_or_else(|| Error::Config(format!("intercept[{i}].pool: no pool `{name}`")))?,
    };
    let target = match e.target {
        Some(t) => t,
        None => intercept_target(routing.listen, &format!("intercept[{i}]"))?,
    };
    if target.is_ipv4() != e.vip.is_ipv4() {
        return Err(Error::Config(format!(
            "intercept[{i}].target: {target} is of the other address family than {} (give the entry a target)",
            e.vip
        )));
    }
    Ok(Rule {
        vip: e.vip,
        target,
        pool,
        pool_given: e.pool.is_some(),
        steer: e.steer,
    })
}

/// One intercepted address: a `--redirect VIP=TARGET` (steered with `--steer VIP`) or an
/// entry of the file's `intercept:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub vip: std::net::SocketAddr,
    /// The agent listener connects are rewritten to.
    pub target: std::net::SocketAddr,
    /// Its pool's index in `Proxy::pools` (`--redirect`: the first).
    pub pool: usize,
    /// Whether the pool was named (an `intercept:` entry's `pool`), not defaulted.
    pub pool_given: bool,
    pub steer: bool,
}

/// The flags' and the file's intercepted addresses, checked: a VIP given once, a file entry's
/// pool known and its target resolved (of the VIP's family), every `--steer` VIP intercepted
/// and with pods to steer to.
pub fn rules(args: &AgentArgs, routing: Option<&Routing>) -> Result<Vec<Rule>, Error> {
    let mut out: Vec<Rule> = Vec::new();
    for r in &args.redirects {
        if out.iter().any(|o| o.vip == r.vip) {
            return Err(Error::Config(format!("--redirect {}: given twice", r.vip)));
        }
        out.push(Rule {
            vip: r.vip,
            target: r.target,
            pool: 0,
            pool_given: false,
            steer: false,
        });
    }
    if let Some(routing) = routing {
        for (i, e) in routing.intercepts.iter().enumerate() {
            out.push(file_rule(i, e, routing, &out)?);
        }
    }
    for vip in &args.steer {
        let Some(rule) = out.iter_mut().find(|r| r.vip == *vip) else {
            return Err(Error::Config(format!(
                "--steer {vip}: not intercepted (add --redirect {vip}=LISTENER or an intercept: entry)"
            )));
        };
        rule.steer = true;
    }
    if routing.is_none()
        && let Some(rule) = out.iter().find(|r| r.steer)
    {
        return Err(Error::Config(format!(
            "--steer {}: no pods to steer to (give --endpoint URLs or --config FILE)",
            rule.vip
        )));
    }
    Ok(out)
}
