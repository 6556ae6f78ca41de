//! warmpath agents as processes of their own in front of a benchmark's fleet (as on that
//! many nodes): this binary's `agent` role on free loopback ports, each logging into its own
//! file, ready when its admin port answers `/ready`.

use std::{net::SocketAddr, time::Duration};

use super::{
    Error,
    logs::Logs,
    process::{Logged, free_port, self_exe, spawn_logged, wait_child_ready},
};

/// How long an agent may take to answer `/ready` (a debug build loads its tokenizer slowly).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// How long a stopped agent may take to exit.
pub const STOP_WITHIN: Duration = Duration::from_secs(5);

/// Tokio workers of each agent's control runtime (KV events, admin, scrapes); the data path
/// has its own threads (`--workers`).
const CONTROL_THREADS: usize = 1;

/// Running agents, stopped when dropped.
pub struct Agents {
    agents: Vec<Agent>,
}

/// Where [`Agents::start_at`] runs its agents.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Agent `n`'s proxy listener.
    pub listens: Vec<SocketAddr>,
    /// A network namespace (`/run/netns/<name>`) to start them in.
    pub netns: Option<std::path::PathBuf>,
    /// Variables added to their environment (e.g. `RUST_LOG`).
    pub env: Vec<(String, String)>,
}

struct Agent {
    process: Logged,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Agents {
    /// Starts one agent per entry of `flags`, agent `n` with `flags[n]` (a cluster's agents
    /// differ in their node and engines), on free loopback ports, and waits until each
    /// answers `/ready`.
    pub async fn start(flags: &[Vec<String>], role: &str, logs: &Logs) -> Result<Self, Error> {
        let listens = flags
            .iter()
            .map(|_| Ok(SocketAddr::from(([127, 0, 0, 1], free_port()?))))
            .collect::<Result<Vec<_>, Error>>()?;
        let placement = Placement {
            listens,
            netns: None,
            env: Vec::new(),
        };
        Self::start_at(flags, &placement, role, logs).await
    }

    /// As [`Agents::start`], agent `n` listening at `placement.listens[n]`, in
    /// `placement.netns` when given (`nsenter --net`: the caller must then be able to reach
    /// the admin ports, i.e. run in that namespace too), with `placement.env` added.
    pub async fn start_at(
        flags: &[Vec<String>],
        placement: &Placement,
        role: &str,
        logs: &Logs,
    ) -> Result<Self, Error> {
        if flags.len() != placement.listens.len() {
            return Err(Error::Setup(format!(
                "{} agents, {} listeners",
                flags.len(),
                placement.listens.len()
            )));
        }
        let exe = self_exe()?;
        let mut agents = Vec::with_capacity(flags.len());
        for (flags, &listen) in flags.iter().zip(&placement.listens) {
            let admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            let mut args = vec![
                "agent".to_string(),
                "--listen".into(),
                listen.to_string(),
                "--admin".into(),
                admin.to_string(),
            ];
            args.extend_from_slice(flags);
            let log = logs.open(role)?;
            let name = log.name();
            let mut command = match &placement.netns {
                Some(ns) => {
                    let mut c = tokio::process::Command::new("nsenter");
                    c.arg(format!("--net={}", ns.display())).arg("--").arg(&exe);
                    c
                }
                None => tokio::process::Command::new(&exe),
            };
            command
                .args(&args)
                .env("TOKIO_WORKER_THREADS", CONTROL_THREADS.to_string())
                .envs(placement.env.iter().map(|(k, v)| (k, v)));
            let process = spawn_logged(&mut command, &name, log, false)?;
            agents.push(Agent {
                process,
                listen,
                admin,
            });
        }
        let client = reqwest::Client::new();
        // All started at once; ready one after another.
        for agent in &mut agents {
            let url = format!("http://{}/ready", agent.admin);
            wait_child_ready(&mut agent.process, &client, &url, READY_WITHIN).await?;
        }
        Ok(Self { agents })
    }

    /// Each agent's proxy listener, in start order.
    pub fn listens(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.agents.iter().map(|a| a.listen)
    }

    /// Each agent's admin listener (`/status`), in start order.
    pub fn admins(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.agents.iter().map(|a| a.admin)
    }

    /// Stops every agent (SIGTERM) and waits for each, for at most [`STOP_WITHIN`] each, so
    /// the next run starts without them and their logs end with their shutdown.
    pub async fn stop(mut self) {
        for a in &mut self.agents {
            a.process.child.terminate();
        }
        for a in &mut self.agents {
            a.process.stop(STOP_WITHIN).await;
        }
    }

    /// Each agent's process, in start order (to read or wait on its log).
    pub fn processes(&mut self) -> impl Iterator<Item = &mut Logged> + '_ {
        self.agents.iter_mut().map(|a| &mut a.process)
    }

    /// An error naming the first agent that has exited, with the end of its log.
    pub fn check_running(&mut self) -> Result<(), Error> {
        self.agents
            .iter_mut()
            .try_for_each(|a| a.process.check_running())
    }
}
