//! IndexSync messages as a replica receives them from a peer (`cluster::sync::client`):
//! arbitrary bytes decoded as the stream's prost messages and, when they decode, applied in
//! order to a replica of two pods ("a", "b") whose index is capped small.
//!
//! Input: length-delimited `ServerMsg`s (prost's varint length prefix, as in a gRPC frame's
//! body) one after another, at most `MAX_MESSAGES`; the whole input is also decoded as one
//! `ClientMsg` (what an owner reads from a subscriber).
//!
//! Properties: never a panic; a decoded message re-encodes to bytes that decode equal; the
//! index never holds more than its cap; a delta is applied iff it is the next sequence of its
//! copy's incarnation (the model below follows snapshots and deltas on its own), otherwise it
//! is refused and the copy starts over: no entries, untrusted, at watermark (0, 0); a
//! message for a pod the replica does not copy changes nothing.

#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use warmpath_agent::{
    cluster::sync::proto::{ClientMsg, ServerMsg, server_msg::Msg},
    fuzzing::SyncReplica,
    kv_index::Watermark,
};

/// The index bounds each of its 16 shards to its share of the cap, and at least 8 entries:
/// at 128 (8 a shard) the whole index is held to exactly this.
const MAX_ENTRIES: usize = 128;
const MAX_MESSAGES: usize = 64;
const PODS: [&str; 2] = ["a", "b"];

fn round_trips<M: Message + Default + PartialEq + std::fmt::Debug>(m: &M) {
    let bytes = m.encode_to_vec();
    assert_eq!(
        M::decode(bytes.as_slice()).as_ref(),
        Ok(m),
        "re-encoded {bytes:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ClientMsg::decode(data) {
        round_trips(&m);
    }
    let mut replica = SyncReplica::new(MAX_ENTRIES, &PODS);
    // The model: each copy's watermark as the stream's rules give it.
    let mut at: HashMap<&str, Watermark> =
        PODS.iter().map(|p| (*p, Watermark::default())).collect();
    let mut buf = data;
    for _ in 0..MAX_MESSAGES {
        let Ok(m) = ServerMsg::decode_length_delimited(&mut buf) else {
            break;
        };
        round_trips(&m);
        let Some(msg) = m.msg else {
            continue;
        };
        let copied = |pod: &str| PODS.iter().copied().find(|p| *p == pod);
        let expect: Option<(&str, Option<Watermark>)> = match &msg {
            Msg::Delta(d) => copied(&d.pod).map(|p| {
                let next = at[p].incarnation == d.incarnation
                    && at[p].sequence.checked_add(1) == Some(d.sequence);
                let got = Watermark {
                    incarnation: d.incarnation,
                    sequence: d.sequence,
                };
                (p, next.then_some(got))
            }),
            Msg::Snapshot(s) => copied(&s.pod).map(|p| {
                let done = Watermark {
                    incarnation: s.incarnation,
                    sequence: s.sequence,
                };
                (p, Some(if s.last { done } else { at[p] }))
            }),
            Msg::Placement(p) => copied(&p.pod).map(|pod| (pod, Some(at[pod]))),
            Msg::Load(l) => copied(&l.pod).map(|pod| (pod, Some(at[pod]))),
        };
        let before: Vec<_> = PODS.iter().map(|p| replica.watermark(p)).collect();
        let result = replica.apply(msg);
        match expect {
            None => {
                assert!(result.is_ok(), "{result:?}");
                let after: Vec<_> = PODS.iter().map(|p| replica.watermark(p)).collect();
                assert_eq!(before, after, "a message for another pod moved a copy");
            }
            Some((pod, Some(next))) => {
                assert!(result.is_ok(), "refused: {result:?}");
                assert_eq!(replica.watermark(pod), Some(next));
                at.insert(pod, next);
            }
            Some((pod, None)) => {
                assert!(result.is_err(), "a delta out of order was applied");
                assert_eq!(replica.watermark(pod), Some(Watermark::default()));
                let source = replica.source(pod).expect("a copied pod has a source");
                assert!(
                    replica.index().source_keys(source).is_empty(),
                    "entries kept"
                );
                assert!(!replica.index().trusted(source), "still trusted");
                at.insert(pod, Watermark::default());
            }
        }
        let len = replica.index().len();
        assert!(
            len <= MAX_ENTRIES,
            "{len} entries over a cap of {MAX_ENTRIES}"
        );
    }
});
