//! TTFT of a shared-prefix workload with the agent SIGKILLed halfway: warmpath's affinity
//! fail-open versus the plain VIP fallback of a cluster without warmpath's table.
//!
//! A node `<tag>f<v>n` with three pods: the clients in pod 0 (client `k` in cgroup
//! `client-k`, with its own long system prompt: the demo workload's shared-prefix shape, one
//! group per client), simulators in pods 1 and 2 (caches too small to hold every client's
//! prefix, large enough for half of them each). kube-proxy's iptables mode is emulated for
//! the VIP in the clients' namespace (nat OUTPUT DNAT, `-m statistic --mode random`), what a
//! connect reaches once nothing rewrites it. Per variant, fresh simulators and a fresh agent
//! (precise routing, pinned): every client sends the first half of its requests through the
//! agent, then the agent is SIGKILLed; "plain VIP fallback" then also removes every warmpath
//! program and map (`warmpath agent --cleanup`), "affinity fail-open" keeps them. Once the
//! heartbeat is stale, every client sends its second half; those requests are measured.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use warmpath_tokenizer::text::TextGen;

use super::{
    client::{Answer, Ask, Client},
    report::{FailoverRow, quantiles_ms},
    requests::START_WITHIN,
    setup::{Cgroups, Netns, Node, Pins, iptables_installed, run_tool, wait_log},
};
use crate::{Error, logs::Logs, process::self_exe, workload::question_prompt};

const VIP: &str = "10.96.0.12:8000";
const SIM_PORT: u16 = 8000;
const EVENTS_PORT: u16 = 5557;
const SIMS: usize = 2;
/// Characters per token of generated text (as the bench workloads assume).
const CHARS_PER_TOKEN: f64 = 3.85;
/// After the first half: time for the agent to write its table (it does every ~500 ms).
const TABLE_SETTLE: Duration = Duration::from_millis(1500);
/// After the kill: the kernel calls a heartbeat stale after 1 s.
const STALE_AFTER: Duration = Duration::from_millis(1500);

/// The agent's log filter: its table writes too (`kernel table updated`).
const TABLE_LOG: &[(&str, &str)] =
    &[("RUST_LOG", "info,warmpath_agent::agent::kernel_table=debug")];

pub const AFFINITY: &str = "affinity fail-open";
pub const PLAIN: &str = "plain VIP fallback";

/// Settings of this part.
#[derive(Debug, Clone)]
pub struct Settings {
    pub tag: String,
    pub clients: usize,
    pub half: usize,
    pub system_tokens: usize,
    pub num_gpu_blocks: usize,
    pub profile: String,
    pub time_scale: f64,
    pub seed: u64,
}

pub async fn measure(
    s: &Settings,
    logs: &Logs,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<FailoverRow>, Error> {
    if !iptables_installed() {
        let absent = |v: &str| FailoverRow {
            variant: v.into(),
            requests: 0,
            errors: 0,
            ttft_ms: quantiles_ms(&[]),
            cached_share: f64::NAN,
            affinity_entries: 0,
            note: "iptables not installed (the VIP's fallback is kube-proxy's iptables rules)"
                .into(),
        };
        return Ok(vec![absent(AFFINITY), absent(PLAIN)]);
    }
    let mut rows = Vec::with_capacity(2);
    for (v, variant) in [AFFINITY, PLAIN].into_iter().enumerate() {
        rows.push(one_variant(s, &format!("{}f{v}", s.tag), variant, logs, stop).await?);
    }
    Ok(rows)
}

async fn one_variant(
    s: &Settings,
    tag: &str,
    variant: &str,
    logs: &Logs,
    stop: &Arc<AtomicBool>,
) -> Result<FailoverRow, Error> {
    let node = Node::create(tag, 1 + SIMS)?;
    kube_proxy(&node.pods[0])?;
    let names: Vec<String> = (0..s.clients).map(|k| format!("client-{k}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let cgroups = Cgroups::create(tag, &names)?;
    let pins = Pins::new(tag);
    let exe = self_exe()?;
    let mut sims = Vec::with_capacity(SIMS);
    for i in 0..SIMS {
        let args = sim_args(s, i);
        let mut sim = node.pods[1 + i].spawn(&exe, &args, &[], "sim-failover", logs)?;
        wait_log(&mut sim, "\"engines\"", START_WITHIN).await?;
        sims.push(sim);
    }
    let mut agent = node.ns.spawn(
        &exe,
        &agent_args(&cgroups, &pins),
        TABLE_LOG,
        "agent-failover",
        logs,
    )?;
    wait_log(&mut agent, "interception attached", START_WITHIN).await?;
    let mut clients = (0..s.clients)
        .map(|k| {
            Client::start(
                &node.pods[0],
                cgroups.children[k].path(),
                "client-failover",
                logs,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let prompts = prompts(s);

    let before = half(&mut clients, &prompts, 0..s.half, stop).await?;
    if before.iter().any(|a| !a.ok) {
        return Err(Error::Setup(format!(
            "{variant}: {} of the requests before the kill failed (see the agent's log under {})",
            before.iter().filter(|a| !a.ok).count(),
            logs.dir().display()
        )));
    }
    tokio::time::sleep(TABLE_SETTLE).await;
    agent.check_running()?;
    let _ = agent.child.0.start_kill();
    let _ = agent.exited().await;
    // What the dead agent left the kernel: this run's clients' affinity entries.
    let ids: Vec<u64> = cgroups
        .children
        .iter()
        .filter_map(|c| warmpath_agent::ebpf::cgroup_id(c.path()).ok())
        .collect();
    let entries = warmpath_agent::ebpf::FailOpen::open_pinned(&pins.dir)
        .and_then(|t| t.affinity_entries())
        .map_err(|e| Error::Setup(format!("read the pinned affinity table: {e}")))?;
    let affinity = entries
        .iter()
        .filter(|((id, _), _)| ids.contains(id))
        .count();
    if variant == PLAIN {
        let dir = pins.dir.display().to_string();
        run_tool(
            &exe.display().to_string(),
            &["agent", "--cleanup", "--pin-dir", &dir],
        )?;
    }
    tokio::time::sleep(STALE_AFTER).await;
    let after = half(&mut clients, &prompts, s.half..2 * s.half, stop).await?;
    drop(clients);
    for sim in &mut sims {
        sim.stop(crate::agents::STOP_WITHIN).await;
    }
    let ok: Vec<&Answer> = after.iter().filter(|a| a.ok).collect();
    let ttft: Vec<f64> = ok.iter().map(|a| a.ttft * 1000.0).collect();
    let (cached, prompt) = ok.iter().fold((0, 0), |(c, p), a| {
        (c + a.cached_tokens, p + a.prompt_tokens)
    });
    Ok(FailoverRow {
        variant: variant.into(),
        requests: ok.len(),
        errors: after.len() - ok.len(),
        ttft_ms: quantiles_ms(&ttft),
        cached_share: if prompt == 0 {
            f64::NAN
        } else {
            cached as f64 / prompt as f64
        },
        affinity_entries: affinity,
        note: format!(
            "{} clients x {} requests after the kill, {} x {}-token prefixes on {SIMS} pods of {} blocks; the dead agent's table held affinity entries for {affinity} of the {} clients{}",
            s.clients,
            s.half,
            s.clients,
            s.system_tokens,
            s.num_gpu_blocks,
            s.clients,
            if variant == PLAIN {
                ", removed with --cleanup"
            } else {
                ""
            }
        ),
    })
}

/// kube-proxy's iptables mode for the VIP in `ns`: a Service chain that DNATs to pod `i`
/// with probability 1/(n-i), so each pod gets 1/n.
fn kube_proxy(ns: &Netns) -> Result<(), Error> {
    let (ip, port) = VIP.split_once(':').unwrap_or((VIP, ""));
    ns.nat(&["-N", "WARMPATH-BENCH-SVC"])?;
    ns.nat(&[
        "-A",
        "OUTPUT",
        "-p",
        "tcp",
        "-d",
        ip,
        "--dport",
        port,
        "-j",
        "WARMPATH-BENCH-SVC",
    ])?;
    for i in 0..SIMS {
        let to = format!("{}:{SIM_PORT}", Node::pod_ip(1 + i));
        let probability = format!("{:.5}", 1.0 / (SIMS - i) as f64);
        let mut rule = vec!["-A", "WARMPATH-BENCH-SVC", "-p", "tcp"];
        if i + 1 < SIMS {
            rule.extend([
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &probability,
            ]);
        }
        rule.extend(["-j", "DNAT", "--to-destination", &to]);
        ns.nat(&rule)?;
    }
    Ok(())
}

fn sim_args(s: &Settings, i: usize) -> Vec<String> {
    [
        "sim",
        "--host",
        &Node::pod_ip(1 + i).to_string(),
        "--port",
        &SIM_PORT.to_string(),
        "--kv-events-port",
        &EVENTS_PORT.to_string(),
        "--profile",
        &s.profile,
        "--time-scale",
        &s.time_scale.to_string(),
        "--num-gpu-blocks",
        &s.num_gpu_blocks.to_string(),
        "--max-model-len",
        &(s.num_gpu_blocks * 16).min(32_768).to_string(),
        "--seed",
        &s.seed.to_string(),
    ]
    .map(String::from)
    .to_vec()
}

fn agent_args(cgroups: &Cgroups, pins: &Pins) -> Vec<String> {
    let mut args: Vec<String> = [
        "agent",
        "--listen",
        "0.0.0.0:8080",
        "--admin",
        "127.0.0.1:9090",
        "--policy",
        "precise",
        "--redirect",
        &format!("{VIP}={}:8080", Node::IP),
        "--cgroup",
        &cgroups.parent.path().display().to_string(),
        "--pin-dir",
        &pins.dir.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    for i in 0..SIMS {
        let ip = Node::pod_ip(1 + i);
        args.extend([
            "--endpoint".into(),
            format!("http://{ip}:{SIM_PORT}"),
            "--kv-events".into(),
            format!("tcp://{ip}:{EVENTS_PORT}"),
        ]);
    }
    args
}

/// Client `k`'s prompts: its own system prompt, then question `r`.
fn prompts(s: &Settings) -> Vec<Vec<String>> {
    let chars = (s.system_tokens as f64 * CHARS_PER_TOKEN) as usize;
    let mut questions = TextGen::new(s.seed ^ 0xabcdef);
    (0..s.clients)
        .map(|k| {
            let system = TextGen::new(s.seed ^ ((k as u64 + 1) * 7919)).text(chars);
            (0..2 * s.half)
                .map(|r| question_prompt(&system, k, r, &questions.text(64 * 4)))
                .collect()
        })
        .collect()
}

/// Every client sends its requests `rounds` one after another, the clients at once.
async fn half(
    clients: &mut [Client],
    prompts: &[Vec<String>],
    rounds: std::ops::Range<usize>,
    stop: &AtomicBool,
) -> Result<Vec<Answer>, Error> {
    let url = format!("http://{VIP}/v1/completions");
    let runs = clients.iter_mut().zip(prompts).map(|(client, mine)| {
        let (url, rounds) = (url.clone(), rounds.clone());
        async move {
            let mut answers = Vec::with_capacity(rounds.len());
            for r in rounds {
                if stop.load(Ordering::Relaxed) {
                    return Err(Error::Setup("interrupted".into()));
                }
                let ask = Ask {
                    url: url.clone(),
                    prompt: mine[r].clone(),
                    max_tokens: 16,
                    stream: true,
                };
                answers.push(client.ask(&ask).await?);
            }
            Ok::<_, Error>(answers)
        }
    });
    let all = futures::future::try_join_all(runs).await?;
    Ok(all.into_iter().flatten().collect())
}
