//! warmpath agents as processes of their own in front of a benchmark's fleet (as on that
//! many nodes): this binary's `agent` role on free loopback ports, each logging into its own
//! file, ready when its admin port answers `/ready`.

use std::{net::SocketAddr, time::Duration};

use super::{
    Error,
    logs::Logs,
    process::{Logged, free_port, self_exe, spawn_exe, wait_child_ready},
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

struct Agent {
    process: Logged,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Agents {
    /// Starts one agent per entry of `flags`, agent `n` with `flags[n]` (a cluster's agents
    /// differ in their node and engines), and waits until each answers `/ready`.
    pub async fn start(flags: &[Vec<String>], role: &str, logs: &Logs) -> Result<Self, Error> {
        let exe = self_exe()?;
        let mut agents = Vec::with_capacity(flags.len());
        for flags in flags {
            let (listen, admin) = (free_port()?, free_port()?);
            let mut args = vec![
                "agent".to_string(),
                "--listen".into(),
                format!("127.0.0.1:{listen}"),
                "--admin".into(),
                format!("127.0.0.1:{admin}"),
            ];
            args.extend_from_slice(flags);
            agents.push(Agent {
                process: spawn_exe(&exe, &args, CONTROL_THREADS, role, logs)?,
                listen: SocketAddr::from(([127, 0, 0, 1], listen)),
                admin: SocketAddr::from(([127, 0, 0, 1], admin)),
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

    /// An error naming the first agent that has exited, with the end of its log.
    pub fn check_running(&mut self) -> Result<(), Error> {
        self.agents
            .iter_mut()
            .try_for_each(|a| a.process.check_running())
    }
}
