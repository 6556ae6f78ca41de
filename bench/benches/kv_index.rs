//! Criterion benchmarks of the KV index: ingestion (decode + key + apply) and lookups of
//! 128/512/2048-block chains over 64 pods holding ~10^6 blocks. `warmpath bench index`
//! prints the same measurements as a table (docs/benchmarks.md).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use warmpath_agent::kv_index::{IndexConfig, KvIndex, SourceInfo};
use warmpath_bench::index::{churn_payloads, ingest, populated};

fn ingestion(c: &mut Criterion) {
    let (payloads, hashes) = churn_payloads(20_000, 7);
    let mut group = c.benchmark_group("kv_index_ingest");
    group.throughput(Throughput::Elements(hashes as u64));
    group.sample_size(10);
    group.bench_function("decode_key_apply", |b| {
        b.iter(|| {
            let index = KvIndex::new(IndexConfig::default());
            let id = index.add_source(SourceInfo {
                pod: "engine".into(),
                rank: None,
            });
            black_box(ingest(&index, id, &payloads))
        })
    });
    group.finish();
}

fn lookup(c: &mut Criterion) {
    let (index, chains) = populated(64, 1_000_000, 7);
    let mut group = c.benchmark_group("kv_index_lookup");
    let mut out = Vec::new();
    for len in [128usize, 512, 2048] {
        group.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, &len| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % chains.len();
                index.lookup(black_box(&chains[i][..len]), &mut out);
                black_box(out.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, ingestion, lookup);
criterion_main!(benches);
