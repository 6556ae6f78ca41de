//! `warmpath agent`: the node agent's main loop.
//!
//! Today it runs the kernel redirect path: load connect4, attach it to the chosen cgroup,
//! program the VIP table, then serve until SIGINT/SIGTERM and detach on the way out.

use tokio::signal::unix::{SignalKind, signal};

use crate::{cli::AgentArgs, ebpf};

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("nothing to do: give at least one --redirect VIP:PORT=TARGET:PORT")]
    NothingToDo,
    #[error("kernel data path unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Ebpf(#[from] ebpf::Error),
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
}

/// Runs the agent until a termination signal.
pub async fn run(args: AgentArgs) -> Result<(), Error> {
    if args.redirects.is_empty() {
        return Err(Error::NothingToDo);
    }
    if let Some(reason) = ebpf::unavailable_reason() {
        return Err(Error::Unavailable(reason));
    }
    if ebpf::ensure_bpffs(&args.bpffs)? {
        tracing::info!(path = %args.bpffs.display(), "mounted bpffs");
    }
    let cgroup = match args.cgroup {
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

    let mut term = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let counters = redirector.counters()?;
    redirector.detach_all();
    tracing::info!(
        seen = counters.seen,
        redirected = counters.redirected,
        "detached; shutting down"
    );
    Ok(())
}
