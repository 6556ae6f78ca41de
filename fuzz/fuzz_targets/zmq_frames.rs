//! ZeroMQ multipart messages as the KV event subscriber reads them: live messages
//! `[topic, seq, payload]` and replay replies (`[b"", seq, payload]`, `[b"", topic, seq,
//! payload]`, the END marker), then the batches through sequence tracking (gaps, restarts,
//! replay) into an index with a small entry cap.
//!
//! Input: records `[kind][frame count]` then each frame as `[len u16 LE][bytes]`; an even
//! kind is a live message, an odd one a reply of the replay endpoint (answered in order).
//!
//! Properties: a live message splits iff it has three frames with an 8-byte sequence, and
//! the parts are those frames; a replay reply is END iff its sequence frame is all 0xff, and
//! its sequence and payload are the frames before last and last; after every live message
//! the tracker expects the next sequence number; the index never holds more entries than its
//! cap, counts every unsplittable message as malformed, and answers lookups.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use warmpath_agent::{
    fuzzing::{replay_entry, split_frames},
    kv_index::{
        IndexConfig, KvIndex, RouterKey, SourceInfo,
        subscriber::{Replay, on_batch},
        tracker::SeqTracker,
    },
};
use warmpath_fuzz::net;

const MAX_ENTRIES: usize = 64;

/// Replies of the replay endpoint, as `fetch_replay` reads them.
struct Replies(Vec<Vec<Bytes>>);

impl Replay for Replies {
    async fn fetch(&self, from: u64, until: u64) -> Result<Vec<(u64, Bytes)>, String> {
        let mut out = Vec::new();
        for frames in &self.0 {
            match replay_entry(frames)? {
                None => return Ok(out),
                Some((seq, payload)) if (from..until).contains(&seq) => {
                    out.push((seq, payload.clone()))
                }
                Some(_) => {}
            }
        }
        Err("no END".into())
    }
}

fn records(mut data: &[u8]) -> Vec<(u8, Vec<Bytes>)> {
    let mut out = Vec::new();
    while let [kind, count, rest @ ..] = data {
        data = rest;
        let mut frames = Vec::new();
        for _ in 0..*count {
            let [a, b, rest @ ..] = data else { break };
            let len = usize::from(u16::from_le_bytes([*a, *b])).min(rest.len());
            frames.push(Bytes::copy_from_slice(&rest[..len]));
            data = &rest[len..];
        }
        out.push((*kind, frames));
    }
    out
}

fn check_reply(frames: &[Bytes]) {
    let body = match frames.split_first() {
        Some((first, rest)) if first.is_empty() => rest,
        _ => frames,
    };
    match replay_entry(frames) {
        Ok(entry) => {
            assert!(
                matches!(body.len(), 2 | 3),
                "a reply of {} frames taken",
                frames.len()
            );
            let seq_frame = &body[body.len() - 2];
            match entry {
                None => assert_eq!(&seq_frame[..], &[0xff; 8], "END"),
                Some((seq, payload)) => {
                    assert_eq!(&seq_frame[..], &seq.to_be_bytes(), "the sequence frame");
                    assert_eq!(payload, &body[body.len() - 1], "the payload frame");
                }
            }
        }
        Err(msg) => {
            assert!(!msg.is_empty());
            assert!(
                !matches!(body.len(), 2 | 3) || body[body.len() - 2].len() != 8,
                "a well-formed reply refused: {msg}"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let records = records(data);
    let (live, replies): (Vec<_>, Vec<_>) = records.into_iter().partition(|(k, _)| k % 2 == 0);
    let replies = Replies(replies.into_iter().map(|(_, f)| f).collect());
    for frames in &replies.0 {
        check_reply(frames);
    }
    let index = KvIndex::new(IndexConfig {
        max_entries: MAX_ENTRIES,
        ..IndexConfig::default()
    });
    let id = index.add_source(SourceInfo {
        pod: "pod-0".into(),
        rank: None,
    });
    let mut tracker = SeqTracker::default();
    let mut unsplit = 0u64;
    for (_, frames) in &live {
        match split_frames(frames) {
            Some((seq, payload)) => {
                assert!(frames.len() == 3 && frames[1].len() == 8);
                assert_eq!(seq.to_be_bytes(), frames[1][..]);
                assert_eq!(payload, &frames[2][..]);
                net::block_on(on_batch(
                    &index,
                    id,
                    &mut tracker,
                    seq,
                    payload,
                    Some(&replies),
                ));
                assert_eq!(
                    tracker.next(),
                    Some(seq.saturating_add(1)),
                    "the next expected sequence"
                );
            }
            None => {
                assert!(
                    frames.len() != 3 || frames[1].len() != 8,
                    "a live message refused"
                );
                unsplit += 1;
                index.note_malformed(id);
            }
        }
        assert!(
            index.len() <= MAX_ENTRIES,
            "{} entries over a cap of {MAX_ENTRIES}",
            index.len()
        );
    }
    let status = index.status();
    let [(sid, st)] = &status[..] else {
        panic!("one source, {} statuses", status.len());
    };
    assert_eq!(*sid, id);
    assert!(
        st.malformed >= unsplit,
        "malformed {} < {unsplit}",
        st.malformed
    );
    let keys: Vec<RouterKey> = index
        .source_keys(id)
        .into_iter()
        .map(|(_, k, _)| k)
        .collect();
    let mut out = Vec::new();
    index.lookup(&keys, &mut out);
});
