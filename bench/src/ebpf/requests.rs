//! Request latency direct to a pod, through the VIP in proxy mode (the agent's hop), in proxy
//! mode with sk_msg acceleration (the hop between the client's socket and the agent's in the
//! SOCKHASH) and in steer mode (connect() rewritten to the pod in the kernel).
//!
//! A node `<tag>rn` with two pods: the client in pod 0 (its own cgroup, under the cgroup the
//! agents attach to), one simulator in pod 1. Two agents in the node namespace, both in a
//! cgroup under that one too (as on a node, where the agent attaches to the root: their own
//! sockets pass the programs): one intercepts two VIPs, one of them steered; the other,
//! started with `--sk-msg`, a third VIP. Every request is on a new connection. Variants take
//! turns within each round (the order rotates), each sending short non-streamed requests then
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
    report::{RequestRow, SK_MSG, Spread, quantiles_ms},
    setup::{Cgroups, Node, Pins, wait_log},
};
use crate::{
    Error,
    logs::Logs,
    process::{Logged, self_exe},
};

const PROXY_VIP: &str = "10.96.0.10:8000";
const STEER_VIP: &str = "10.96.0.11:8000";
const SK_MSG_VIP: &str = "10.96.0.12:8000";
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
    let cgroups = Cgroups::create(&tag, &["client", "agent"])?;
    let pins = Pins::new(&tag);
    let sk_msg_pins = Pins::new(&format!("{tag}k"));
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
    let sim_url = format!("http://{sim_ip}:{SIM_PORT}");
    let agent_cgroup = cgroups.children[1].path();
    let listener = format!("{}:8080", Node::IP);
    let mut agent = start_agent(
        &node,
        &exe,
        agent_cgroup,
        "agent-requests",
        logs,
        &[
            "--listen",
            "0.0.0.0:8080",
            "--admin",
            "127.0.0.1:9090",
            "--endpoint",
            &sim_url,
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
        ],
    )?;
    let sk_msg_listener = format!("{}:8081", Node::IP);
    let mut sk_msg_agent = start_agent(
        &node,
        &exe,
        agent_cgroup,
        "agent-requests-sk-msg",
        logs,
        &[
            "--listen",
            "0.0.0.0:8081",
            "--admin",
            "127.0.0.1:9091",
            "--endpoint",
            &sim_url,
            "--redirect",
            &format!("{SK_MSG_VIP}={sk_msg_listener}"),
            "--sk-msg",
            "--cgroup",
            &cgroups.parent.path().display().to_string(),
            "--pin-dir",
            &sk_msg_pins.dir.display().to_string(),
        ],
    )?;
    wait_log(&mut agent, "interception attached", START_WITHIN).await?;
    wait_log(&mut agent, "steering in the kernel", START_WITHIN).await?;
    wait_log(&mut sk_msg_agent, "sk_msg acceleration on", START_WITHIN).await?;
    wait_log(&mut sk_msg_agent, "interception attached", START_WITHIN).await?;
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
        (SK_MSG, format!("http://{SK_MSG_VIP}/v1/completions")),
        ("steer", format!("http://{STEER_VIP}/v1/completions")),
    ];
    for (name, url) in &variants {
        warm(&mut client, name, url).await?;
    }
    let sk_msg_before = sk_msg_counters(&sk_msg_pins)?;
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
        sk_msg_agent.check_running()?;
    }
    drop(client);
    let sk_msg_note = sk_msg_note(&sk_msg_before, &sk_msg_counters(&sk_msg_pins)?);
    sk_msg_agent.stop(crate::agents::STOP_WITHIN).await;
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
                note: match *name {
                    "steer" => format!(
                        "{steer_via_agent} steered connections (of both kinds) reached the agent"
                    ),
                    SK_MSG => sk_msg_note.clone(),
                    _ => String::new(),
                },
            });
        }
    }
    Ok(rows)
}

/// An agent (`bench`'s own binary) in the node namespace, moved into `cgroup` before it
/// starts (a shell that joins the cgroup, then execs it), so that its sockets pass the
/// programs as on a node; its log in the next `<role>-<n>.log`.
fn start_agent(
    node: &Node,
    exe: &std::path::Path,
    cgroup: &std::path::Path,
    role: &str,
    logs: &Logs,
    flags: &[&str],
) -> Result<Logged, Error> {
    let procs = cgroup.join("cgroup.procs");
    let mut args: Vec<String> = vec![
        "-c".into(),
        r#"echo $$ > "$0" && exec "$@""#.into(),
        procs.display().to_string(),
        exe.display().to_string(),
        "agent".into(),
    ];
    args.extend(flags.iter().map(|f| (*f).to_string()));
    node.ns.spawn(
        std::path::Path::new("/bin/sh"),
        &args,
        ACCEPT_LOG,
        role,
        logs,
    )
}

/// The sk_msg agent's counters (its pinned map).
fn sk_msg_counters(pins: &Pins) -> Result<warmpath_agent::ebpf::Counters, Error> {
    warmpath_agent::ebpf::pinned_counters(&pins.dir)
        .map_err(|e| Error::Setup(format!("the sk_msg agent's counters: {e}")))
}

/// What sk_msg did over the measured requests (the evidence that the path was taken).
fn sk_msg_note(
    before: &warmpath_agent::ebpf::Counters,
    after: &warmpath_agent::ebpf::Counters,
) -> String {
    format!(
        "sk_msg over both kinds: {} messages redirected, {} over TCP, {} sockets added",
        after.sk_msg_redirected - before.sk_msg_redirected,
        after.sk_msg_tcp - before.sk_msg_tcp,
        after.sockhash_added - before.sockhash_added
    )
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
