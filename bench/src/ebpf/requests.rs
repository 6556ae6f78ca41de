//! Request latency direct to a pod, through the VIP in proxy mode (the agent's hop) and
//! through the VIP in steer mode (connect() rewritten to the pod in the kernel).
//!
//! A node `<tag>rn` with two pods: the client in pod 0 (its own cgroup, under the cgroup the
//! agent attaches to), one simulator in pod 1. One agent in the node namespace intercepts two
//! VIPs, one of them steered. Every request is on a new connection. Variants take turns
//! within each round (the order rotates), each sending short non-streamed requests then
//! short SSE ones.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use super::{
    client::{Ask, Client},
    report::{RequestRow, Spread, quantiles_ms},
    setup::{Cgroups, Node, Pins, wait_log},
};
use crate::{Error, logs::Logs, process::self_exe};

const PROXY_VIP: &str = "10.96.0.10:8000";
const STEER_VIP: &str = "10.96.0.11:8000";
const SIM_PORT: u16 = 8000;
/// How long a debug agent or simulator may take to start.
pub const START_WITHIN: Duration = Duration::from_secs(60);
/// Warm-up requests per path before measuring (the first may race the agent's start).
const WARM_TRIES: usize = 50;
/// The agent's log filter: one line per connection it accepts, with the VIP dialled.
const ACCEPT_LOG: &[(&str, &str)] = &[("RUST_LOG", "info,warmpath_agent::proxy::listener=debug")];
const PROMPT: &str = "Say hello to the benchmark in a few words.";
const MAX_TOKENS: usize = 8;

/// Settings of this part.
#[derive(Debug, Clone)]
pub struct Settings {
    pub tag: String,
    pub rounds: usize,
    pub requests: usize,
    pub profile: String,
    pub time_scale: f64,
}

pub async fn measure(
    s: &Settings,
    logs: &Logs,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<RequestRow>, Error> {
    let tag = format!("{}r", s.tag);
    let node = Node::create(&tag, 2)?;
    let cgroups = Cgroups::create(&tag, &["client"])?;
    let pins = Pins::new(&tag);
    let exe = self_exe()?;
    let sim_ip = Node::pod_ip(1);
    let sim_args: Vec<String> = [
        "sim",
        "--host",
        &sim_ip.to_string(),
        "--port",
        &SIM_PORT.to_string(),
        "--profile",
        &s.profile,
        "--time-scale",
        &s.time_scale.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut sim = node.pods[1].spawn(&exe, &sim_args, &[], "sim-requests", logs)?;
    wait_log(&mut sim, "\"engines\"", START_WITHIN).await?;
    let listener = format!("{}:8080", Node::IP);
    let agent_args: Vec<String> = [
        "agent",
        "--listen",
        "0.0.0.0:8080",
        "--admin",
        "127.0.0.1:9090",
        "--policy",
        "round-robin",
        "--endpoint",
        &format!("http://{sim_ip}:{SIM_PORT}"),
        "--redirect",
        &format!("{PROXY_VIP}={listener}"),
        "--redirect",
        &format!("{STEER_VIP}={listener}"),
        "--steer",
        STEER_VIP,
        "--cgroup",
        &cgroups.parent.path().display().to_string(),
        "--pin-dir",
        &pins.dir.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut agent = node
        .ns
        .spawn(&exe, &agent_args, ACCEPT_LOG, "agent-requests", logs)?;
    wait_log(&mut agent, "interception attached", START_WITHIN).await?;
    wait_log(&mut agent, "steering in the kernel", START_WITHIN).await?;
    let mut client = Client::start(
        &node.pods[0],
        cgroups.children[0].path(),
        "client-requests",
        logs,
    )?;

    let variants = [
        (
            "direct",
            format!("http://{sim_ip}:{SIM_PORT}/v1/completions"),
        ),
        ("proxy mode", format!("http://{PROXY_VIP}/v1/completions")),
        ("steer", format!("http://{STEER_VIP}/v1/completions")),
    ];
    for (name, url) in &variants {
        warm(&mut client, name, url).await?;
    }
    // [variant][kind: non-streamed, SSE]
    let mut seen: Vec<[Seen; 2]> = variants.iter().map(|_| Default::default()).collect();
    for round in 0..s.rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            for (kind, stream) in [(0, false), (1, true)] {
                let mut this = Vec::with_capacity(s.requests);
                for _ in 0..s.requests {
                    if stop.load(Ordering::Relaxed) {
                        return Err(Error::Setup("interrupted".into()));
                    }
                    let a = client.ask(&ask(&variants[i].1, stream)).await?;
                    if a.ok {
                        this.push(if stream { a.ttft } else { a.e2e } * 1000.0);
                    } else {
                        seen[i][kind].errors += 1;
                    }
                }
                seen[i][kind].medians.push(quantiles_ms(&this).p50);
                seen[i][kind].all.extend(this);
            }
        }
        agent.check_running()?;
    }
    drop(client);
    agent.stop(crate::agents::STOP_WITHIN).await;
    // Steered connects the kernel did not rewrite to the pod reached the agent instead.
    let log = tokio::fs::read_to_string(&agent.log.path)
        .await
        .unwrap_or_default();
    let steer_via_agent = log
        .lines()
        .filter(|l| l.contains("intercepted connection") && l.contains(&format!("vip={STEER_VIP}")))
        .count();
    sim.stop(crate::agents::STOP_WITHIN).await;
    let mut rows = Vec::new();
    for (kind_i, kind) in ["non-streamed", "SSE"].iter().enumerate() {
        for ((name, _), per) in variants.iter().zip(&seen) {
            let Seen {
                all,
                medians,
                errors,
            } = &per[kind_i];
            rows.push(RequestRow {
                variant: (*name).into(),
                kind: (*kind).into(),
                requests: all.len(),
                errors: *errors,
                latency_ms: quantiles_ms(all),
                round_p50_ms: medians.clone(),
                p50_ms_rounds: Spread::of(medians.iter().copied()),
                note: if *name == "steer" {
                    format!(
                        "{steer_via_agent} steered connections (of both kinds) reached the agent"
                    )
                } else {
                    String::new()
                },
            });
        }
    }
    Ok(rows)
}

/// What one variant saw of one kind.
#[derive(Debug, Default)]
struct Seen {
    /// Every answered request's latency (ms).
    all: Vec<f64>,
    /// Each round's median (ms).
    medians: Vec<f64>,
    errors: usize,
}

fn ask(url: &str, stream: bool) -> Ask {
    Ask {
        url: url.into(),
        prompt: PROMPT.into(),
        max_tokens: MAX_TOKENS,
        stream,
    }
}

/// Until one request on `url` succeeds (bounded): the agent may log that it attached a
/// moment before it serves.
async fn warm(client: &mut Client, name: &str, url: &str) -> Result<(), Error> {
    for _ in 0..WARM_TRIES {
        if client.ask(&ask(url, false)).await?.ok {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::Setup(format!(
        "{name}: no request to {url} succeeded in {WARM_TRIES} tries"
    )))
}
