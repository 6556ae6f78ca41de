//! The latency part, across processes: `agents` warmpath agents (this binary's `agent`
//! role, as `bench compare` starts them on cluster mode) in front of simulator engines in
//! this process, engine `j` on node `j mod agents`; real UDP gossip and gRPC on loopback.
//!
//! Two kinds of request take turns, one after another:
//!
//! - **Batches.** `events` completions straight at the engines (each a new prompt, so its
//!   engine stores new blocks and publishes a batch): the owner applies it and streams the
//!   delta; each other agent records, once it applied it, the lag from the owner's apply
//!   (`warmpath_cluster_delta_lag_seconds`) and from the engine's own timestamp of the batch
//!   (`warmpath_cluster_event_lag_seconds`: event to remote index).
//! - **Placements.** `placements` completions through the agents in turn (cold prompts):
//!   each agent's pick is a placement that the others record on arrival
//!   (`warmpath_cluster_placement_lag_seconds`, `hops` 1 straight from the router, 2 when the
//!   pod's owner relayed it). Their engines' batches are deltas too.
//!
//! Figures are what the agents' histograms gained over the run (scraped from `/metrics`
//! before and after), so every event is measured by the receiver itself, not by polling.
//! Same machine: one clock for every stamp.

use std::time::Duration;

use serde_json::json;

use super::histogram::{self, Buckets, Quantile};
use crate::{
    Error,
    agents::Agents,
    cluster_agents,
    logs::Logs,
    process::{fleet_flags, start_fleet},
    progress::Phase,
};

/// What to run.
#[derive(Debug, Clone)]
pub struct LatencySettings {
    pub agents: usize,
    pub engines_per_agent: usize,
    pub events: usize,
    pub placements: usize,
    /// The longest each phase may take (requests and the counts arriving).
    pub within: Duration,
}

/// One lag's figures over a phase, all receiving agents together.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Lag {
    pub samples: u64,
    pub mean_s: Option<f64>,
    pub p50: Option<Quantile>,
    pub p99: Option<Quantile>,
}

impl Lag {
    fn of(b: &Buckets) -> Self {
        Self {
            samples: b.count,
            mean_s: b.mean(),
            p50: b.quantile(0.5),
            p99: b.quantile(0.99),
        }
    }
}

/// What the latency part measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LatencyFigures {
    pub agents: usize,
    pub engines: usize,
    pub events_sent: usize,
    pub placements_sent: usize,
    /// The machine's 1-minute load average before and after (`/proc/loadavg`): on a shared
    /// machine the tails follow it.
    pub load_average: String,
    /// The owner applied a batch -> a replica applied it.
    pub delta: Lag,
    /// The engine published a batch -> a replica applied it.
    pub event: Lag,
    /// A placement made -> held by another agent: straight from the router (1 hop), relayed
    /// by the owner (2 hops), and both.
    pub placement_direct: Lag,
    pub placement_relayed: Lag,
    pub placement_all: Lag,
}

const DELTA: &str = "warmpath_cluster_delta_lag_seconds";
const EVENT: &str = "warmpath_cluster_event_lag_seconds";
const PLACEMENT: &str = "warmpath_cluster_placement_lag_seconds";

/// Every agent's histograms of the three families now.
async fn scrape(
    client: &reqwest::Client,
    agents: &Agents,
) -> Result<Vec<[histogram::Family; 3]>, Error> {
    let mut out = Vec::new();
    for admin in agents.admins() {
        let text = client
            .get(format!("http://{admin}/metrics"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| Error::Setup(format!("scrape {admin}/metrics: {e}")))?
            .text()
            .await
            .map_err(|e| Error::Setup(format!("read {admin}/metrics: {e}")))?;
        out.push([
            histogram::parse(&text, DELTA),
            histogram::parse(&text, EVENT),
            histogram::parse(&text, PLACEMENT),
        ]);
    }
    Ok(out)
}

/// One family's series `labels` gained from `before` to `after`, summed over agents.
fn gained(
    before: &[[histogram::Family; 3]],
    after: &[[histogram::Family; 3]],
    family: usize,
    labels: &str,
) -> Buckets {
    let mut total = Buckets::default();
    for (b, a) in before.iter().zip(after) {
        let Some(now) = a[family].get(labels) else {
            continue;
        };
        let then = b[family].get(labels).cloned().unwrap_or_default();
        total = total.merge(&now.since(&then));
    }
    total
}

/// The 1-minute load average (`/proc/loadavg`'s first field), `?` when unreadable.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// A prompt no engine has seen: about 60 words, several 16-token blocks.
fn prompt(kind: &str, i: usize, run: u64) -> String {
    let words: String = (0..60)
        .map(|w| format!("w{}x{} ", (i * 61 + w) % 997, run % 1_000))
        .collect();
    format!("{kind} {i} of run {run}: {words}")
}

async fn complete(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    prompt: &str,
) -> Result<(), Error> {
    let body = json!({"model": model, "prompt": prompt, "max_tokens": 1});
    client
        .post(url)
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map(|_| ())
        .map_err(|e| Error::Setup(format!("POST {url}: {e}")))
}

/// Waits until `counted` (what the agents' histograms gained) reaches `want`, for at most
/// `within`; the scrape then (a shortfall is logged: its figures cover what arrived).
async fn await_counts(
    client: &reqwest::Client,
    agents: &Agents,
    counted: impl Fn(&[[histogram::Family; 3]]) -> u64,
    want: u64,
    within: Duration,
) -> Result<Vec<[histogram::Family; 3]>, Error> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let now = scrape(client, agents).await?;
        let got = counted(&now);
        if got >= want || tokio::time::Instant::now() >= deadline {
            if got < want {
                tracing::warn!(got, want, "not every lag sample arrived in time");
            }
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the latency part.
pub async fn run(s: &LatencySettings, logs: &Logs, phase: &Phase) -> Result<LatencyFigures, Error> {
    let engines_n = s.agents * s.engines_per_agent;
    let mut sim_flags = vec!["sim".to_string()];
    sim_flags.extend(fleet_flags(engines_n as u16, "llama-3.1-8b-h100", 0.05));
    sim_flags.extend(
        [
            "--num-gpu-blocks",
            "8192",
            "--kv-events-port",
            "0",
            "--kv-replay-port",
            "0",
        ]
        .map(String::from),
    );
    let (sim, engines) = start_fleet(sim_flags).await?;
    let result = measure(s, logs, phase, &engines, &sim.model).await;
    for e in engines {
        e.shutdown();
    }
    result
}

async fn measure(
    s: &LatencySettings,
    logs: &Logs,
    phase: &Phase,
    engines: &[warmpath_sim::fleet::RunningEngine],
    model: &str,
) -> Result<LatencyFigures, Error> {
    let common: Vec<String> = ["--policy", "precise", "--workers", "1"]
        .map(String::from)
        .to_vec();
    let flags = cluster_agents::agent_flags(&common, engines, s.agents)?;
    let mut agents = Agents::start(&flags, "agent-cluster", logs).await?;
    let result = async {
        let (_, took) = cluster_agents::wait_converged(&mut agents, engines).await?;
        phase.note(&format!(
            "  latency: {} agents converged {:.1} s after they were ready",
            s.agents,
            took.as_secs_f64()
        ));
        let client = reqwest::Client::new();
        let run = std::process::id() as u64;
        let peers = (s.agents - 1) as u64;

        let urls: Vec<String> = agents
            .listens()
            .map(|a| format!("http://{a}/v1/completions"))
            .collect();
        // One phase, the two kinds of request taking turns, so both see the same machine
        // (a shared one: its load moves): a batch straight at an engine, then a placement
        // through an agent. Both make batches (the placement's engine stores its prompt),
        // and every delta is a sample.
        let before = scrape(&client, &agents).await?;
        let load_before = load_average();
        let deadline = tokio::time::Instant::now() + s.within;
        let (mut sent, mut placed) = (0, 0);
        for i in 0..s.events.max(s.placements) {
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            if i < s.events {
                let url = format!("http://{}/v1/completions", engines[i % engines.len()].http);
                complete(&client, &url, model, &prompt("event", i, run)).await?;
                sent += 1;
                phase.inc();
            }
            if i < s.placements {
                let url = &urls[i % urls.len()];
                complete(&client, url, model, &prompt("placement", i, run)).await?;
                placed += 1;
                phase.inc();
            }
        }
        let counted = |m: &[[histogram::Family; 3]]| {
            let deltas = gained(&before, m, 0, "").count.min(sent as u64 * peers);
            let placements = gained(&before, m, 2, "hops=\"1\"").count
                + gained(&before, m, 2, "hops=\"2\"").count;
            deltas + placements.min(placed as u64 * peers)
        };
        let want = (sent + placed) as u64 * peers;
        let after = await_counts(&client, &agents, counted, want, s.within).await?;
        agents.check_running()?;
        let load = format!("{load_before} -> {}", load_average());

        let direct = gained(&before, &after, 2, "hops=\"1\"");
        let relayed = gained(&before, &after, 2, "hops=\"2\"");
        Ok(LatencyFigures {
            agents: s.agents,
            engines: engines.len(),
            events_sent: sent,
            placements_sent: placed,
            load_average: load,
            delta: Lag::of(&gained(&before, &after, 0, "")),
            event: Lag::of(&gained(&before, &after, 1, "")),
            placement_direct: Lag::of(&direct),
            placement_relayed: Lag::of(&relayed),
            placement_all: Lag::of(&direct.merge(&relayed)),
        })
    }
    .await;
    agents.stop().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_differ_per_request_and_run() {
        assert_ne!(prompt("event", 1, 7), prompt("event", 2, 7));
        assert_ne!(prompt("event", 1, 7), prompt("event", 1, 8));
        assert_ne!(prompt("event", 1, 7), prompt("placement", 1, 7));
        // Long enough for several 16-token blocks.
        assert!(prompt("event", 1, 7).split(' ').count() > 60);
    }

    #[test]
    fn a_phase_gains_what_every_agent_added() {
        let fam = |count: u64, le1: u64| {
            let mut f = histogram::Family::new();
            f.insert(
                String::new(),
                Buckets {
                    bounds: vec![(0.001, le1)],
                    count,
                    sum: count as f64 * 0.001,
                },
            );
            [f, histogram::Family::new(), histogram::Family::new()]
        };
        let before = vec![fam(1, 1), fam(0, 0)];
        let after = vec![fam(4, 3), fam(2, 2)];
        let g = gained(&before, &after, 0, "");
        assert_eq!(g.count, 5);
        assert_eq!(g.bounds, [(0.001, 4)]);
        assert_eq!(gained(&before, &after, 1, "").count, 0);
    }
}
