//! `warmpath bench index`: ingestion rate, lookup latency, bytes per entry and memory under
//! the cap of the KV index (the numbers in docs/benchmarks.md). Also used by the criterion
//! bench in `bench/benches/kv_index.rs`.

use std::time::{Duration, Instant};

use clap::Args;

use crate::run::report::duration_quantiles;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use warmpath_sim::{
    engine::kv_cache::{KvEvent, Medium},
    events::Encoder,
};

use warmpath_agent::kv_index::{
    IndexConfig, KvIndex, RequestExtras, RouterKey, SourceId, SourceInfo, request_keys,
    wire::decode_batch,
};

const BLOCK: usize = 16;

/// Options of `warmpath bench index`.
#[derive(Debug, Clone, Args)]
pub struct IndexBenchArgs {
    /// Pods in the lookup benchmark.
    #[arg(long, default_value_t = 64)]
    pub pods: usize,
    /// (block, pod) entries held in aggregate in the lookup benchmark.
    #[arg(long, default_value_t = 1_000_000)]
    pub blocks: usize,
    /// Lookups per chain length.
    #[arg(long, default_value_t = 20_000)]
    pub lookups: usize,
    /// Event batches in the ingestion benchmark (each stores 8 and evicts 8 blocks).
    #[arg(long, default_value_t = 200_000)]
    pub batches: usize,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

/// Pre-encoded event batches of one engine whose cache churns: every batch stores a run of
/// 8 new blocks (a 128-token prompt continuation) and evicts 8 old ones.
pub fn churn_payloads(batches: usize, seed: u64) -> (Vec<Vec<u8>>, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let encoder = Encoder::default();
    let mut live: std::collections::VecDeque<[u8; 32]> = Default::default();
    let mut hashes_total = 0;
    let mut parent: Option<[u8; 32]> = None;
    let payloads = (0..batches)
        .map(|b| {
            let hashes: Vec<[u8; 32]> = (0..8).map(|_| rng.random()).collect();
            let tokens: Vec<u32> = (0..8 * BLOCK)
                .map(|_| rng.random_range(0..128_000))
                .collect();
            // Start a new chain every 16 batches, like new conversations.
            if b % 16 == 0 {
                parent = None;
            }
            let mut events = vec![KvEvent::Stored {
                hashes: hashes.clone(),
                parent,
                token_ids: tokens,
                block_size: BLOCK,
                lora_name: None,
                extra_keys: vec![None; 8],
                medium: Medium::Gpu,
            }];
            parent = hashes.last().copied();
            live.extend(hashes.iter().copied());
            hashes_total += 8;
            if live.len() > 100_000 {
                let evicted: Vec<[u8; 32]> = live.drain(..8).collect();
                hashes_total += evicted.len();
                events.push(KvEvent::Removed {
                    hashes: evicted,
                    medium: Medium::Gpu,
                });
            }
            encoder.batch(1.0, &events)
        })
        .collect();
    (payloads, hashes_total)
}

/// Decodes and applies every payload to one source; returns the elapsed time.
pub fn ingest(index: &KvIndex, id: SourceId, payloads: &[Vec<u8>]) -> Duration {
    let start = Instant::now();
    for (seq, p) in payloads.iter().enumerate() {
        match decode_batch(p) {
            Ok(batch) => index.apply(id, &batch, seq as u64),
            Err(_) => index.note_malformed(id),
        }
    }
    start.elapsed()
}

/// An index of `pods` sources holding `blocks` (block, pod) entries in chains of 2048
/// blocks; returns it with the chains (each fully held by at least one pod).
pub fn populated(pods: usize, blocks: usize, seed: u64) -> (KvIndex, Vec<Vec<RouterKey>>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let index = KvIndex::new(IndexConfig {
        max_entries: blocks * 2,
        ..Default::default()
    });
    let ids: Vec<SourceId> = (0..pods)
        .map(|i| {
            index.add_source(SourceInfo {
                pod: format!("pod-{i}"),
                rank: None,
            })
        })
        .collect();
    let far = Instant::now() + Duration::from_secs(86_400);
    let mut chains = Vec::new();
    let mut held = 0;
    while held < blocks {
        let tokens: Vec<u32> = (0..2048 * BLOCK)
            .map(|_| rng.random_range(0..128_000))
            .collect();
        let keys = request_keys(&tokens, BLOCK, &RequestExtras::default());
        // The chain's owner holds it all; three other pods hold its first 64 blocks (a
        // shared system prompt).
        let owner = rng.random_range(0..pods);
        index.speculate(ids[owner], &keys, far);
        held += keys.len();
        for _ in 0..3 {
            index.speculate(ids[rng.random_range(0..pods)], &keys[..64], far);
            held += 64;
        }
        chains.push(keys);
    }
    (index, chains)
}

/// Latency percentiles (p50, p99) of `lookups` lookups of `len`-block chain prefixes.
pub fn lookup_latency(
    index: &KvIndex,
    chains: &[Vec<RouterKey>],
    len: usize,
    lookups: usize,
    seed: u64,
) -> (Duration, Duration) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::new();
    let samples: Vec<Duration> = (0..lookups)
        .map(|_| {
            let chain = &chains[rng.random_range(0..chains.len())][..len];
            let t = Instant::now();
            index.lookup(chain, &mut out);
            let d = t.elapsed();
            assert!(
                out.iter().any(|m| m.blocks == len),
                "a pod holds the whole chain"
            );
            d
        })
        .collect();
    let [p50, p99] = duration_quantiles(samples, [0.5, 0.99]);
    (p50, p99)
}

pub fn run(args: IndexBenchArgs) {
    println!("warmpath bench index (one thread; seed {})", args.seed);
    let (payloads, hashes) = churn_payloads(args.batches, args.seed);
    let index = KvIndex::new(IndexConfig::default());
    let id = index.add_source(SourceInfo {
        pod: "engine".into(),
        rank: None,
    });
    let elapsed = ingest(&index, id, &payloads);
    let rate = hashes as f64 / elapsed.as_secs_f64();
    println!();
    println!("| ingestion | batches | block hashes | seconds | block hashes/s |");
    println!("|---|---|---|---|---|");
    println!(
        "| decode + key + apply | {} | {hashes} | {:.2} | {:.2}M |",
        args.batches,
        elapsed.as_secs_f64(),
        rate / 1e6
    );

    let build = Instant::now();
    let (index, chains) = populated(args.pods, args.blocks, args.seed);
    let built = build.elapsed();
    println!();
    println!(
        "lookup index: {} pods, {} (block, pod) entries, {} chains, built in {:.1} s",
        args.pods,
        index.len(),
        chains.len(),
        built.as_secs_f64()
    );
    println!("| chain (blocks) | p50 | p99 |");
    println!("|---|---|---|");
    for len in [128, 512, 2048] {
        let (p50, p99) = lookup_latency(&index, &chains, len, args.lookups, args.seed);
        println!(
            "| {len} | {:.1} us | {:.1} us |",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        );
    }
    println!();
    println!("| memory | entries | bytes | bytes per (block, pod) entry |");
    println!("|---|---|---|---|");
    println!(
        "| store only (speculative entries, no engine maps) | {} | {} | {:.1} |",
        index.len(),
        index.bytes(),
        index.bytes() as f64 / index.len() as f64
    );
    let steady = index_with_engine_maps(&payloads);
    println!(
        "| store + engine-hash maps (from events, after churn) | {} | {} | {:.1} |",
        steady.len(),
        steady.bytes(),
        steady.bytes() as f64 / steady.len() as f64
    );

    // The same 512-block lookups while another thread ingests an engine's events into the
    // same index: how long readers wait for writers.
    let writer_id = index.add_source(SourceInfo {
        pod: "ingesting".into(),
        rank: None,
    });
    let (p50, p99, rate) = std::thread::scope(|s| {
        let ingesting = s.spawn(|| {
            let t = ingest(&index, writer_id, &payloads);
            hashes as f64 / t.as_secs_f64()
        });
        let (p50, p99) = lookup_latency(&index, &chains, 512, args.lookups, args.seed);
        (
            p50,
            p99,
            ingesting.join().expect("the ingesting thread panicked"),
        )
    });
    println!();
    println!("| lookups while another thread ingests | chain (blocks) | ingestion | p50 | p99 |");
    println!("|---|---|---|---|---|");
    println!(
        "| contended | 512 | {:.2}M hashes/s | {:.1} us | {:.1} us |",
        rate / 1e6,
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
    index.remove_source(writer_id);
    let cap = args.blocks / 4;
    let capped = KvIndex::new(IndexConfig {
        max_entries: cap,
        ..Default::default()
    });
    let id = capped.add_source(SourceInfo {
        pod: "engine".into(),
        rank: None,
    });
    let far = Instant::now() + Duration::from_secs(86_400);
    for chain in &chains {
        capped.speculate(id, chain, far);
    }
    println!();
    println!("| under a cap | cap | inserted | held | evicted | bytes |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| LRU eviction | {cap} | {} | {} | {} | {} |",
        chains.iter().map(Vec::len).sum::<usize>(),
        capped.len(),
        capped.evicted(),
        capped.bytes()
    );
}

fn index_with_engine_maps(payloads: &[Vec<u8>]) -> KvIndex {
    let index = KvIndex::new(IndexConfig::default());
    let id = index.add_source(SourceInfo {
        pod: "engine".into(),
        rank: None,
    });
    ingest(&index, id, payloads);
    index
}
