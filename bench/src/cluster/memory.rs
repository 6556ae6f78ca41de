//! The memory part: what a replica costs. This process joins the cluster as the owner of
//! `pods` pods (an in-process `warmpath_agent::cluster` node over plain UDP on loopback,
//! its index fed synthetic engine batches); one `warmpath agent` process replicates them
//! (`--remote-endpoint` for each). At each size of `blocks` the owner's pods hold that many
//! cached blocks each; once the replica's `/status` shows them all, its resident set
//! (`VmRSS`) and its index's own accounting (`index_bytes`: the store's tables and every
//! source's key map, as allocated) are read. Figures are growth over the replica's state
//! with the same pods empty, so the process's fixed cost (tokenizer, runtime) drops out.

use std::{sync::Arc, time::Duration};

use warmpath_agent::{
    cluster::{ClusterNode, join},
    kv_index::{
        IndexConfig, KvIndex, SourceId, SourceInfo, Tier,
        wire::{Batch, EngineHash, Event, Stored},
    },
};

use crate::{
    Error,
    logs::Logs,
    process::{Logged, free_port, self_exe, spawn_exe, wait_child_ready},
};

/// Blocks per synthetic batch (one chain continued).
const BATCH_BLOCKS: usize = 64;
const BLOCK: usize = 16;
const CLUSTER_ID: &str = "bench-memory";

/// One measured point.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemoryPoint {
    pub pods: usize,
    pub blocks_per_pod: usize,
    /// (block, pod) entries the replica holds.
    pub entries: usize,
    /// Growth over the same replica with its pods empty.
    pub rss_bytes: i64,
    pub index_bytes: i64,
}

/// What the memory part measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryFigures {
    pub points: Vec<MemoryPoint>,
    /// Least-squares slopes through the origin: bytes per (block, pod) entry.
    pub rss_per_entry: f64,
    pub index_per_entry: f64,
}

/// The least-squares slope through the origin of `(x, y)` points; 0 without any x.
pub fn slope_through_origin(points: impl IntoIterator<Item = (f64, f64)>) -> f64 {
    let (xy, xx) = points
        .into_iter()
        .fold((0.0, 0.0), |(xy, xx), (x, y)| (xy + x * y, xx + x * x));
    if xx > 0.0 { xy / xx } else { 0.0 }
}

/// A process's resident set in bytes (`VmRSS` in `/proc/PID/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

/// Runs the memory part: one replica process per pod count, every block count in turn.
pub async fn run(pods: &[usize], blocks: &[usize], logs: &Logs) -> Result<MemoryFigures, Error> {
    let mut blocks = blocks.to_vec();
    blocks.sort_unstable();
    blocks.dedup();
    let mut points = Vec::new();
    for &p in pods {
        points.extend(one_replica(p, &blocks, logs).await?);
    }
    let fit = |f: fn(&MemoryPoint) -> i64| {
        slope_through_origin(points.iter().map(|p| (p.entries as f64, f(p) as f64)))
    };
    Ok(MemoryFigures {
        rss_per_entry: fit(|p| p.rss_bytes),
        index_per_entry: fit(|p| p.index_bytes),
        points,
    })
}

/// The owner in this process: `pods` local sources and the cluster node serving them.
struct Owner {
    node: ClusterNode,
    index: Arc<KvIndex>,
    sources: Vec<SourceId>,
    ids: Vec<String>,
    /// Blocks stored per pod so far.
    stored: usize,
}

async fn owner(pods: usize, gossip: u16, grpc: u16) -> Result<Owner, Error> {
    let index = Arc::new(KvIndex::new(IndexConfig::default()));
    // Pod ids: loopback addresses nothing listens on (the replica routes nothing here).
    let ids: Vec<String> = (0..pods)
        .map(|i| format!("127.0.{}.{}:8000", 100 + i / 200, 1 + i % 200))
        .collect();
    let mut set = join::Pods::default();
    let sources: Vec<SourceId> = ids
        .iter()
        .map(|id| {
            let s = index.add_source(SourceInfo {
                pod: id.clone(),
                rank: None,
            });
            set.local(id, "sim-llama", s);
            s
        })
        .collect();
    let listen = ([127, 0, 0, 1], gossip).into();
    let j = join::Join {
        cluster_id: CLUSTER_ID,
        node_id: "owner",
        gossip_listen: listen,
        gossip_advertise: listen,
        seeds: &[],
        key_file: None,
        grpc_listen: ([127, 0, 0, 1], grpc).into(),
        grpc_advertise: None,
        gossip_interval: Duration::from_millis(100),
        proxy: None,
    };
    let node = join::join(j, index.clone(), set)
        .await
        .map_err(|e| Error::Setup(format!("the memory owner: {e}")))?;
    Ok(Owner {
        node,
        index,
        sources,
        ids,
        stored: 0,
    })
}

impl Owner {
    /// Stores blocks on every pod until each holds `blocks` (a chain per pod, continued).
    fn fill(&mut self, blocks: usize) {
        for (p, &source) in self.sources.iter().enumerate() {
            let mut b = self.stored;
            while b < blocks {
                let n = BATCH_BLOCKS.min(blocks - b);
                let hash = |k: usize| EngineHash(((p as u64) << 32) | k as u64);
                let tokens: Vec<u32> = (0..n * BLOCK)
                    .map(|t| (p * 1_000_000 + (b * BLOCK + t) % 999_983) as u32)
                    .collect();
                let batch = Batch {
                    ts: 0.0,
                    events: vec![Event::Stored(Stored {
                        hashes: (b..b + n).map(hash).collect(),
                        parent: (b > 0).then(|| hash(b - 1)),
                        token_ids: tokens,
                        block_size: BLOCK as u32,
                        lora_name: None,
                        tier: Tier::Gpu,
                        extra_keys: Vec::new(),
                        reusable: true,
                    })],
                    dp_rank: None,
                };
                self.index.apply(source, &batch, (b / BATCH_BLOCKS) as u64);
                b += n;
            }
        }
        self.stored = self.stored.max(blocks);
    }
}

/// The replica's view: per owned pod its entries and state, and its index bytes.
async fn replica_status(
    client: &reqwest::Client,
    admin: u16,
) -> Option<(Vec<(String, usize, String)>, i64)> {
    let status: serde_json::Value = client
        .get(format!("http://127.0.0.1:{admin}/status"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let pods = status["pods"]
        .as_array()?
        .iter()
        .filter_map(|p| {
            let i = &p["index"];
            Some((
                i["pod"].as_str()?.to_string(),
                i["entries"].as_u64()? as usize,
                i["state"].as_str().unwrap_or("").to_string(),
            ))
        })
        .collect();
    Some((pods, status["index_bytes"].as_i64()?))
}

/// Waits until the replica holds `blocks` healthy entries for every owner pod; its index
/// bytes then.
async fn await_replica(
    client: &reqwest::Client,
    replica: &mut Logged,
    admin: u16,
    ids: &[String],
    blocks: usize,
) -> Result<i64, Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        replica.check_running()?;
        if let Some((pods, bytes)) = replica_status(client, admin).await {
            let held = ids.iter().all(|id| {
                pods.iter()
                    .any(|(p, e, s)| p == id && *e == blocks && s == "healthy")
            });
            if held {
                return Ok(bytes);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(replica.failed(&format!(
                "did not hold {blocks} blocks of each of {} pods within 120 s",
                ids.len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn one_replica(
    pods: usize,
    blocks: &[usize],
    logs: &Logs,
) -> Result<Vec<MemoryPoint>, Error> {
    let udp = |_| {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .map(|a| a.port())
            .map_err(|source| Error::Io {
                what: "bind UDP 127.0.0.1:0".into(),
                source,
            })
    };
    let (owner_gossip, replica_gossip) = (udp(0)?, udp(1)?);
    let mut owner = owner(pods, owner_gossip, free_port()?).await?;
    let (listen, admin, grpc) = (free_port()?, free_port()?, free_port()?);
    let mut args: Vec<String> = [
        "agent",
        "--listen",
        &format!("127.0.0.1:{listen}"),
        "--admin",
        &format!("127.0.0.1:{admin}"),
        "--workers",
        "1",
        "--cluster-id",
        CLUSTER_ID,
        "--node-id",
        "replica",
        "--gossip-listen",
        &format!("127.0.0.1:{replica_gossip}"),
        "--seed",
        &format!("127.0.0.1:{owner_gossip}"),
        "--grpc-listen",
        &format!("127.0.0.1:{grpc}"),
        "--gossip-interval-ms",
        "100",
    ]
    .map(String::from)
    .to_vec();
    // The agent needs an endpoint of its own: one without KV events (no index source) that
    // nothing listens on.
    args.extend([
        "--endpoint".into(),
        format!("http://127.0.0.1:{}", free_port()?),
    ]);
    for id in &owner.ids {
        args.extend(["--remote-endpoint".into(), format!("http://{id}")]);
    }
    let mut replica = spawn_exe(&self_exe()?, &args, 1, "agent-replica", logs)?;
    let client = reqwest::Client::new();
    let result = async {
        let ready = format!("http://127.0.0.1:{admin}/ready");
        wait_child_ready(&mut replica, &client, &ready, Duration::from_secs(60)).await?;
        let base_index = await_replica(&client, &mut replica, admin, &owner.ids, 0).await?;
        let base_rss = settled_rss(replica.pid).await?;
        let mut points = Vec::new();
        for &b in blocks {
            owner.fill(b);
            let index = await_replica(&client, &mut replica, admin, &owner.ids, b).await?;
            let rss = settled_rss(replica.pid).await?;
            points.push(MemoryPoint {
                pods,
                blocks_per_pod: b,
                entries: pods * b,
                rss_bytes: rss as i64 - base_rss as i64,
                index_bytes: index - base_index,
            });
        }
        Ok(points)
    }
    .await;
    replica.stop(crate::agents::STOP_WITHIN).await;
    owner.node.shutdown();
    result
}

/// The resident set once it stopped moving: read every 200 ms until two readings agree
/// within 64 KiB (at most 5 s; the last reading then).
async fn settled_rss(pid: u32) -> Result<u64, Error> {
    let read = || {
        rss_bytes(pid).ok_or_else(|| Error::Setup(format!("cannot read VmRSS of process {pid}")))
    };
    let mut last = read()?;
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = read()?;
        if now.abs_diff(last) < 64 << 10 {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_is_the_slope_through_the_origin() {
        // y = 80 x exactly.
        let s = slope_through_origin([(1_000.0, 80_000.0), (10_000.0, 800_000.0)]);
        assert!((s - 80.0).abs() < 1e-9, "{s}");
        // Noise: sum(xy) / sum(xx) = (1*2 + 2*3) / (1 + 4) = 1.6.
        assert!((slope_through_origin([(1.0, 2.0), (2.0, 3.0)]) - 1.6).abs() < 1e-12);
        assert_eq!(slope_through_origin([]), 0.0);
    }

    #[test]
    fn this_process_has_a_resident_set() {
        let rss = rss_bytes(std::process::id()).expect("VmRSS on Linux");
        assert!(rss > 1 << 20, "{rss}");
        assert_eq!(rss_bytes(u32::MAX), None);
    }
}
