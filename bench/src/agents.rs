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
}

impl Agents {
    /// Starts `count` agents with `flags` (everything but `--listen` and `--admin`), their
    /// output in `<role>-<n>.log`, and waits until each is ready.
    pub async fn start(
        flags: &[String],
        count: usize,
        role: &str,
        logs: &Logs,
    ) -> Result<Self, Error> {
        let exe = self_exe()?;
        let mut agents = Vec::with_capacity(count);
        let mut admins = Vec::with_capacity(count);
        for _ in 0..count {
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
            });
            admins.push(admin);
        }
        let client = reqwest::Client::new();
        // All started at once; ready one after another.
        for (agent, admin) in agents.iter_mut().zip(admins) {
            let url = format!("http://127.0.0.1:{admin}/ready");
            wait_child_ready(&mut agent.process, &client, &url, READY_WITHIN).await?;
        }
        Ok(Self { agents })
    }

    /// Each agent's proxy listener, in start order.
    pub fn listens(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.agents.iter().map(|a| a.listen)
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
