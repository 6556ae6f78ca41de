//! The multi-agent precise rows of `warmpath bench compare` on cluster mode (docs/cluster.md):
//! agent `i` is node `i`, engine `j` sits on node `j mod N`. Each agent subscribes to the KV
//! events of its own node's engines and replicates the others' index state from their
//! owners over IndexSync, with gossip on loopback (no key file needed there). The run starts
//! only once every agent holds a healthy replica of every other node's engine, claimed by
//! that engine's node.

use std::{collections::BTreeMap, time::Duration};

use super::{Error, agents::Agents};
use warmpath_sim::fleet::RunningEngine;

/// Gossip rounds of the bench's clusters: 100 ms (production: `DEFAULT_GOSSIP_INTERVAL`,
/// 500 ms). Membership and claims then settle within about a second of the agents' start,
/// so the bench does not wait long for convergence; index state and placements do not wait
/// for rounds at all (they stream), so the interval changes how soon the cluster forms, not
/// what routing sees.
pub const GOSSIP_INTERVAL_MS: u64 = 100;

/// How long the agents may take to converge after all of them answered `/ready`.
const CONVERGE_WITHIN: Duration = Duration::from_secs(60);

/// How often `/status` is polled while waiting for convergence.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// The cluster id of every bench cluster (each row's agents are a cluster of their own,
/// on ports of their own).
const CLUSTER_ID: &str = "bench-compare";

/// The member id of agent `i`.
pub fn node_id(i: usize) -> String {
    format!("node-{i}")
}

/// The node engine `j` sits on, of `nodes`.
pub fn node_of(engine: usize, nodes: usize) -> usize {
    engine % nodes.max(1)
}

/// Refuses a cluster with more agents than engines up front: each agent owns the engines of
/// its node, and an agent with none has no endpoint of its own and cannot start.
pub fn check_nodes(agents: u16, engines: u16) -> Result<(), Error> {
    if agents > engines {
        return Err(Error::Setup(format!(
            "--cluster on: {agents} agents need at least {agents} engines (--replicas {engines}): engine j sits on node j mod {agents}, and an agent owning no engine cannot start; give --replicas >= --agents, or --cluster off"
        )));
    }
    Ok(())
}

/// `--endpoint` and its KV event (and replay) endpoints for an engine this agent subscribes to.
pub fn subscribed_engine_flags(e: &RunningEngine) -> Vec<String> {
    let mut flags = vec!["--endpoint".to_string(), format!("http://{}", e.http)];
    if let Some(p) = &e.publisher {
        flags.extend(["--kv-events".into(), p.events_endpoint.clone()]);
        flags.extend(
            p.replay_endpoint
                .iter()
                .flat_map(|r| ["--kv-replay".to_string(), r.clone()]),
        );
    }
    flags
}

/// Each of `nodes` agents' flags: `common`, then its cluster flags (free loopback ports for
/// gossip and IndexSync, every other agent as a seed) and its engines: its own subscribed,
/// the others' as `--remote-endpoint`.
pub fn agent_flags(
    common: &[String],
    engines: &[RunningEngine],
    nodes: usize,
) -> Result<Vec<Vec<String>>, Error> {
    let ports: Vec<(u16, u16)> = (0..nodes)
        .map(|_| Ok((free_udp_port()?, super::process::free_port()?)))
        .collect::<Result<_, Error>>()?;
    let mut all = Vec::with_capacity(nodes);
    for (i, (gossip, grpc)) in ports.iter().enumerate() {
        let mut flags = common.to_vec();
        flags.extend(
            [
                "--cluster-id",
                CLUSTER_ID,
                "--node-id",
                &node_id(i),
                "--gossip-listen",
                &format!("127.0.0.1:{gossip}"),
                "--grpc-listen",
                &format!("127.0.0.1:{grpc}"),
                "--gossip-interval-ms",
                &GOSSIP_INTERVAL_MS.to_string(),
            ]
            .map(String::from),
        );
        for (k, (seed, _)) in ports.iter().enumerate() {
            if k != i {
                flags.extend(["--seed".into(), format!("127.0.0.1:{seed}")]);
            }
        }
        for (j, e) in engines.iter().enumerate() {
            if node_of(j, nodes) == i {
                flags.extend(subscribed_engine_flags(e));
            } else {
                flags.extend(["--remote-endpoint".into(), format!("http://{}", e.http)]);
            }
        }
        all.push(flags);
    }
    Ok(all)
}

/// A free loopback UDP port (bound, then released): gossip binds it itself. Taken as
/// [`super::process::free_port`] takes TCP ones, below the kernel's ephemeral range and in
/// turn: `bind(0)` could hand two agents of one row the same port (each bound and released
/// before the next asked), and did once — "Address already in use", a matrix lost at its
/// 92nd row.
fn free_udp_port() -> Result<u16, Error> {
    super::process::free_port_where(|port| std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok())
}

/// What one agent of a cluster row held when the run started, from its `/status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AgentPods {
    pub node: String,
    /// Pods whose KV events this agent subscribes to itself (no `owner` in its `/status`).
    pub subscribed: Vec<String>,
    /// Pods replicated from another agent: pod -> its owner.
    pub replicated: BTreeMap<String, String>,
}

/// One pod of an agent's `/status`: id, owner, index state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodView {
    pod: String,
    owner: Option<String>,
    state: String,
}

fn pods_of(status: &serde_json::Value) -> Vec<PodView> {
    let Some(pods) = status["pods"].as_array() else {
        return Vec::new();
    };
    pods.iter()
        .filter_map(|p| {
            let index = &p["index"];
            Some(PodView {
                pod: index["pod"].as_str()?.to_string(),
                owner: index["owner"].as_str().map(str::to_string),
                state: index["state"].as_str().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// Whether agent `node` of `nodes`, seeing `pods`, is ready for the run: it subscribes to
/// exactly its own engines and holds every other engine healthy from that engine's node.
/// `Err` says what is still missing.
fn converged(
    node: usize,
    nodes: usize,
    engines: &[String],
    pods: &[PodView],
) -> Result<AgentPods, String> {
    let mut out = AgentPods {
        node: node_id(node),
        subscribed: Vec::new(),
        replicated: BTreeMap::new(),
    };
    for (j, engine) in engines.iter().enumerate() {
        let Some(p) = pods.iter().find(|p| &p.pod == engine) else {
            return Err(format!("{engine} is not in its /status"));
        };
        let owner = node_of(j, nodes);
        match (&p.owner, owner == node) {
            (None, true) => out.subscribed.push(engine.clone()),
            (Some(o), true) => return Err(format!("its own {engine} is replicated from {o}")),
            (Some(o), false) if *o == node_id(owner) && p.state == "healthy" => {
                out.replicated.insert(engine.clone(), o.clone());
            }
            (o, false) => {
                return Err(format!(
                    "{engine}: owner {}, {} (expected healthy from {})",
                    o.as_deref().unwrap_or("none"),
                    p.state,
                    node_id(owner)
                ));
            }
        }
    }
    Ok(out)
}

/// Polls every agent's `/status` until each has converged ([`converged`]), for at most
/// [`CONVERGE_WITHIN`]; what each agent held then, in agent order, and how long it took.
pub async fn wait_converged(
    agents: &mut Agents,
    engines: &[RunningEngine],
) -> Result<(Vec<AgentPods>, Duration), Error> {
    wait_converged_on(agents, &engine_ids(engines)).await
}

/// The pod ids the agents' `/status` gives `engines` (their HTTP addresses), in order.
pub fn engine_ids(engines: &[RunningEngine]) -> Vec<String> {
    engines.iter().map(|e| e.http.to_string()).collect()
}

/// As [`wait_converged`], on the engines `ids` ([`engine_ids`]).
pub async fn wait_converged_on(
    agents: &mut Agents,
    ids: &[String],
) -> Result<(Vec<AgentPods>, Duration), Error> {
    let admins: Vec<_> = agents.admins().collect();
    let client = reqwest::Client::new();
    let started = tokio::time::Instant::now();
    let deadline = started + CONVERGE_WITHIN;
    loop {
        agents.check_running()?;
        let mut ready = Vec::with_capacity(admins.len());
        let mut missing = None;
        for (i, admin) in admins.iter().enumerate() {
            let status = client
                .get(format!("http://{admin}/status"))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            let status = match status {
                Ok(r) => r.json::<serde_json::Value>().await.ok(),
                Err(_) => None,
            };
            let pods = status.as_ref().map(pods_of).unwrap_or_default();
            match converged(i, admins.len(), ids, &pods) {
                Ok(p) => ready.push(p),
                Err(why) => {
                    missing = Some(format!("{}: {why}", node_id(i)));
                    break;
                }
            }
        }
        let Some(missing) = missing else {
            return Ok((ready, started.elapsed()));
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Setup(format!(
                "the cluster's agents did not converge within {CONVERGE_WITHIN:?}: {missing}"
            )));
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// What the gap lines judge of one compare row.
pub struct Judged<'a> {
    pub policy: &'a str,
    pub prefix_hit_ratio: f64,
    pub ttft_p90: f64,
}

/// The cluster row against the central one, under the table: the hit-rate gap in points
/// and the p90 TTFT ratio, each with PASS or MISS against issue #21's targets.
pub fn gap_lines(cluster: &Judged<'_>, central: &Judged<'_>) -> [String; 2] {
    let gap = (central.prefix_hit_ratio - cluster.prefix_hit_ratio) * 100.0;
    let ratio = cluster.ttft_p90 / central.ttft_p90;
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    let (size, side) = if gap >= 0.0 {
        (gap, "lower")
    } else {
        (-gap, "higher")
    };
    let vs = format!("{} vs {}", cluster.policy, central.policy);
    [
        format!(
            "{vs}: prefix hits {:.1} % vs {:.1} %, {size:.1} points {side} ({}: target at most {HIT_GAP_POINTS} points lower)",
            cluster.prefix_hit_ratio * 100.0,
            central.prefix_hit_ratio * 100.0,
            verdict(gap <= HIT_GAP_POINTS),
        ),
        format!(
            "{vs}: p90 TTFT {:.3} s vs {:.3} s, {ratio:.2}x ({}: target at most {P90_RATIO:.2}x)",
            cluster.ttft_p90,
            central.ttft_p90,
            verdict(ratio <= P90_RATIO),
        ),
    ]
}

/// Issue #21: N agents' prefix hit rate at most this many points below one central agent's.
const HIT_GAP_POINTS: f64 = 2.0;

/// Issue #21: N agents' p90 TTFT at most this multiple of one central agent's.
const P90_RATIO: f64 = 1.1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_gossip_ports_are_distinct_and_outside_the_ephemeral_range() {
        // Sixteen rows of four agents each: no port twice (each was bound and released
        // before the next was asked for, as a row's are), none where the kernel hands out
        // ports of its own.
        let ports: Vec<u16> = (0..64).map(|_| free_udp_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok());
        if let Some(low) = low.filter(|l| *l > 11_000) {
            assert!(
                ports.iter().all(|p| *p < low),
                "{ports:?} (range from {low})"
            );
        }
    }

    fn view(pod: &str, owner: Option<&str>, state: &str) -> PodView {
        PodView {
            pod: pod.into(),
            owner: owner.map(str::to_string),
            state: state.into(),
        }
    }

    #[test]
    fn more_agents_than_engines_is_refused_with_the_way_out() {
        assert!(check_nodes(4, 4).is_ok() && check_nodes(2, 8).is_ok());
        let err = check_nodes(3, 2).unwrap_err().to_string();
        assert!(
            err.starts_with("--cluster on: 3 agents need at least 3 engines (--replicas 2)"),
            "{err}"
        );
        assert!(err.ends_with("or --cluster off"), "{err}");
    }

    #[test]
    fn engines_go_round_the_nodes() {
        let nodes: Vec<usize> = (0..6).map(|j| node_of(j, 4)).collect();
        assert_eq!(nodes, [0, 1, 2, 3, 0, 1]);
    }

    #[test]
    fn an_agent_is_ready_once_it_holds_every_other_nodes_engine_from_its_owner() {
        let engines = ["a:1", "b:2", "c:3"].map(String::from);
        // Node 1 of 2: engine 1 is its own, 0 and 2 belong to node 0.
        let mut pods = vec![
            view("a:1", Some("node-0"), "healthy"),
            view("b:2", None, "healthy"),
            view("c:3", Some("node-0"), "waiting"),
        ];
        let err = converged(1, 2, &engines, &pods).unwrap_err();
        assert_eq!(
            err,
            "c:3: owner node-0, waiting (expected healthy from node-0)"
        );
        pods[2].state = "healthy".into();
        let ready = converged(1, 2, &engines, &pods).unwrap();
        assert_eq!(ready.node, "node-1");
        assert_eq!(ready.subscribed, ["b:2"]);
        assert_eq!(
            ready.replicated.into_iter().collect::<Vec<_>>(),
            [
                ("a:1".to_string(), "node-0".to_string()),
                ("c:3".to_string(), "node-0".to_string())
            ]
        );
    }

    #[test]
    fn a_wrong_owner_or_a_missing_pod_is_not_ready() {
        let engines = ["a:1", "b:2"].map(String::from);
        let pods = [view("a:1", None, "healthy"), view("b:2", None, "healthy")];
        // Node 0 of 2 subscribing to node 1's engine too.
        assert_eq!(
            converged(0, 2, &engines, &pods).unwrap_err(),
            "b:2: owner none, healthy (expected healthy from node-1)"
        );
        let pods = [view("a:1", Some("node-1"), "healthy")];
        assert_eq!(
            converged(0, 2, &engines, &pods).unwrap_err(),
            "its own a:1 is replicated from node-1"
        );
        let pods = [view("a:1", Some("node-0"), "healthy")];
        assert_eq!(
            converged(1, 2, &engines, &pods).unwrap_err(),
            "b:2 is not in its /status"
        );
    }

    fn row(policy: &str, hits: f64, p90: f64) -> Judged<'_> {
        Judged {
            policy,
            prefix_hit_ratio: hits,
            ttft_p90: p90,
        }
    }

    #[test]
    fn the_gap_to_the_central_row_is_judged_against_the_targets() {
        let central = row("Central", 0.85, 0.200);
        let [hits, p90] = gap_lines(&row("Cluster", 0.84, 0.215), &central);
        assert_eq!(
            hits,
            "Cluster vs Central: prefix hits 84.0 % vs 85.0 %, 1.0 points lower (PASS: target at most 2 points lower)"
        );
        assert_eq!(
            p90,
            "Cluster vs Central: p90 TTFT 0.215 s vs 0.200 s, 1.07x (PASS: target at most 1.10x)"
        );
        let [hits, p90] = gap_lines(&row("Cluster", 0.75, 0.250), &central);
        assert!(
            hits.ends_with("10.0 points lower (MISS: target at most 2 points lower)"),
            "{hits}"
        );
        assert!(p90.ends_with("1.25x (MISS: target at most 1.10x)"), "{p90}");
        // Better than central passes.
        let [hits, p90] = gap_lines(&row("Cluster", 0.88, 0.150), &central);
        assert!(
            hits.ends_with("3.0 points higher (PASS: target at most 2 points lower)"),
            "{hits}"
        );
        assert!(p90.contains("0.75x (PASS"), "{p90}");
    }

    #[test]
    fn status_pods_are_read_with_their_owner() {
        let status = serde_json::json!({"pods": [
            {"pool": "p", "index": {"pod": "a:1", "state": "healthy"}},
            {"pool": "p", "index": {"pod": "b:2", "owner": "node-1", "state": "waiting"}},
            {"pool": "p", "index": null},
        ]});
        assert_eq!(
            pods_of(&status),
            [
                view("a:1", None, "healthy"),
                view("b:2", Some("node-1"), "waiting")
            ]
        );
    }
}
