//! The index's health and ingestion counters as observable instruments, read from
//! [`KvIndex::status`] at each collection (nothing on the ingestion path).

use std::sync::Arc;

use opentelemetry::{KeyValue, metrics::Meter};

use crate::kv_index::KvIndex;

/// Registers `warmpath.index.*` on `meter`; the callbacks live as long as the provider.
pub fn observe(meter: &Meter, index: Arc<KvIndex>) {
    let pod = |s: &crate::kv_index::SourceStatus| {
        let mut a = vec![KeyValue::new("pod", s.pod.clone())];
        if let Some(rank) = s.rank {
            a.push(KeyValue::new("rank", i64::from(rank)));
        }
        a
    };
    let ix = index.clone();
    meter
        .u64_observable_gauge("warmpath.index.healthy")
        .with_description("1 when the pod's index is trusted for prefix scores, 0 when unsure")
        .with_callback(move |o| {
            for (id, s) in ix.status() {
                let mut a = pod(&s);
                a.push(KeyValue::new("state", s.state));
                o.observe(u64::from(ix.trusted(id)), &a);
            }
        })
        .build();
    let ix = index.clone();
    meter
        .u64_observable_gauge("warmpath.index.entries")
        .with_unit("{block}")
        .with_description("Blocks the index holds per pod")
        .with_callback(move |o| {
            for (_, s) in ix.status() {
                o.observe(s.entries as u64, &pod(&s));
            }
        })
        .build();
    let ix = index.clone();
    meter
        .u64_observable_counter("warmpath.index.events")
        .with_unit("{block}")
        .with_description("KV events ingested per pod: blocks stored and removed")
        .with_callback(move |o| {
            for (_, s) in ix.status() {
                for (kind, n) in [("stored", s.blocks_stored), ("removed", s.blocks_removed)] {
                    let mut a = pod(&s);
                    a.push(KeyValue::new("event", kind));
                    o.observe(n, &a);
                }
            }
        })
        .build();
    let ix = index;
    meter
        .u64_observable_counter("warmpath.index.dropped")
        .with_unit("{event}")
        .with_description("KV events dropped per pod, by reason")
        .with_callback(move |o| {
            for (_, s) in ix.status() {
                for (reason, n) in [
                    ("malformed", s.malformed),
                    ("orphan", s.orphans),
                    ("unknown_removal", s.unknown_removals),
                    ("unrecoverable_gap", s.unrecoverable_gaps),
                    ("block_size_mismatch", s.block_size_mismatches),
                ] {
                    let mut a = pod(&s);
                    a.push(KeyValue::new("reason", reason));
                    o.observe(n, &a);
                }
            }
        })
        .build();
}
