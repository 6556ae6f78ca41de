//! Peer routers for `warmpath bench compare`: `vllm-router` (kv_aware with the same KV event
//! sources, and cache_aware) and `sglang-router` (cache_aware), from PyPI, started in front of
//! the same fleet when their binaries are on PATH.

use std::time::Duration;

use warmpath_sim::fleet::RunningEngine;

use super::{
    Error,
    logs::Logs,
    process::{Logged, free_port, spawn_logged},
};

/// A peer router configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Row label.
    pub name: &'static str,
    pub program: &'static str,
    policy: &'static str,
}

/// Every peer warmpath compares against.
pub const PEERS: [Peer; 3] = [
    Peer {
        name: "vllm-router kv_aware",
        program: "vllm-router",
        policy: "kv_aware",
    },
    Peer {
        name: "vllm-router cache_aware",
        program: "vllm-router",
        policy: "cache_aware",
    },
    Peer {
        name: "sglang-router cache_aware",
        program: "sglang-router",
        policy: "cache_aware",
    },
];

/// One engine as a peer sees it.
#[derive(Debug, Clone)]
pub struct Worker {
    pub url: String,
    pub events: Option<String>,
    pub replay: Option<String>,
}

/// How long a peer gets to start answering.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

impl Peer {
    /// Whether its binary is installed.
    pub fn installed(&self) -> bool {
        std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join(self.program).is_file())
        })
    }

    fn args(&self, workers: &[Worker], port: u16, metrics_port: u16, model: &str) -> Vec<String> {
        let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
        let mut args: Vec<String> = Vec::new();
        if self.program == "sglang-router" {
            args.push("launch".into());
        }
        args.extend([
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
        ]);
        args.push("--worker-urls".into());
        args.extend(urls.iter().cloned());
        args.extend(["--policy".into(), self.policy.into()]);
        args.extend([
            "--prometheus-host".into(),
            "127.0.0.1".into(),
            "--prometheus-port".into(),
            metrics_port.to_string(),
        ]);
        if self.policy == "kv_aware" {
            for w in workers {
                if let Some(events) = &w.events {
                    args.extend(["--kv-event-source".into(), format!("{}={events}", w.url)]);
                }
                if let Some(r) = &w.replay {
                    args.extend(["--kv-event-replay-source".into(), format!("{}={r}", w.url)]);
                }
            }
            args.extend([
                "--kv-event-block-size".into(),
                "16".into(),
                "--kv-event-model".into(),
                model.into(),
            ]);
        }
        args
    }

    /// Starts the peer in front of in-process `engines`, its output in
    /// `<logs>/<program>-<policy>-<n>.log`.
    pub async fn start(
        &self,
        engines: &[RunningEngine],
        model: &str,
        logs: &Logs,
    ) -> Result<(Logged, String), Error> {
        let workers: Vec<Worker> = engines
            .iter()
            .map(|e| Worker {
                url: format!("http://{}", e.http),
                events: e.publisher.as_ref().map(|p| p.events_endpoint.clone()),
                replay: e.publisher.as_ref().and_then(|p| p.replay_endpoint.clone()),
            })
            .collect();
        self.start_logged(&workers, model, logs).await
    }

    /// Starts the peer in front of `workers`, its output in a log file of `logs`; returns it
    /// and its base URL once it answers. Fails at once, quoting its log, if it exits first.
    pub async fn start_logged(
        &self,
        workers: &[Worker],
        model: &str,
        logs: &Logs,
    ) -> Result<(Logged, String), Error> {
        let (port, metrics_port) = (free_port()?, free_port()?);
        let log = logs.open(&format!("{}-{}", self.program, self.policy))?;
        let mut command = tokio::process::Command::new(self.program);
        command.args(self.args(workers, port, metrics_port, model));
        let mut router = spawn_logged(&mut command, self.name, log, false)?;
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        // Ready when a tiny completion goes through (the peers discover workers
        // asynchronously; /v1/models alone is not enough).
        let probe = serde_json::json!({"model": model, "prompt": "ready?", "max_tokens": 1});
        loop {
            router.check_running()?;
            let ok = client
                .post(format!("{base}/v1/completions"))
                .json(&probe)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return Ok((router, base));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(router.failed(&format!("did not become ready in {READY_TIMEOUT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
