//! Criterion benchmark of a pool's resident-prefix recount (`warmpath_agent::routing::resident`):
//! a full table (4,096 prefixes of 64 blocks, each held by one or two of 16 pods) counted on
//! its pods from the KV index. The proxy runs it every 100 ms on a background task, the
//! table held only to copy it and to install the counts (docs/benchmarks.md).

use std::{hint::black_box, time::Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use warmpath_agent::{
    kv_index::{IndexConfig, KvIndex, RouterKey, SourceInfo},
    routing::resident::{Resident, tally},
};

const PODS: u64 = 16;
const PREFIXES: u64 = 4096;
const BLOCKS: u64 = 64;

fn full_table() -> (KvIndex, Resident) {
    let index = KvIndex::new(IndexConfig::default());
    let ids: Vec<_> = (0..PODS)
        .map(|i| {
            index.add_source(SourceInfo {
                pod: format!("pod-{i}"),
                rank: None,
            })
        })
        .collect();
    let mut resident = Resident::default();
    let now = Instant::now();
    for p in 0..PREFIXES {
        let keys: Vec<RouterKey> = (0..BLOCKS).map(|b| RouterKey(p * 1_000 + b)).collect();
        index.speculate(ids[(p % PODS) as usize], &keys, now);
        if p % 3 == 0 {
            index.speculate(ids[((p + 1) % PODS) as usize], &keys, now);
        }
        resident.reused(&keys, keys.len(), now);
    }
    (index, resident)
}

fn recount(c: &mut Criterion) {
    let (index, mut resident) = full_table();
    let mut group = c.benchmark_group("resident_recount");
    group.bench_function("copy_4096", |b| {
        b.iter(|| black_box(resident.to_count(Instant::now()).len()))
    });
    let prefixes = resident.to_count(Instant::now());
    assert_eq!(
        prefixes.len(),
        PREFIXES as usize,
        "the table holds every prefix"
    );
    group.bench_function("tally_4096_prefixes_16_pods", |b| {
        b.iter(|| black_box(tally(&index, black_box(&prefixes)).len()))
    });
    group.finish();
}

criterion_group!(benches, recount);
criterion_main!(benches);
