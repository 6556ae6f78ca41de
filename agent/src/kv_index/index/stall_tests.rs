//! Stalled event streams: a local source that owes events (a routed request added blocks it
//! did not hold) and sends no batch for `stall_after` is untrusted until its next batch; one
//! whose requests add nothing owes nothing, however hot and quiet.

use std::time::{Duration, Instant};

use super::*;
use crate::kv_index::{
    keys::block_key,
    wire::{EngineHash, Event, Stored},
};

const AFTER: Duration = DEFAULT_STALL_AFTER;

fn index() -> KvIndex {
    KvIndex::new(IndexConfig::default())
}

fn source(index: &KvIndex) -> SourceId {
    index.add_source(SourceInfo {
        pod: "pod-a".into(),
        rank: None,
    })
}

/// The engine storing a chain of `n` blocks of 16 tokens (token ids from `seed`), and its
/// router keys.
fn stored(n: usize, seed: u32) -> (Batch, Vec<RouterKey>) {
    let tokens: Vec<u32> = (0..n as u32 * 16).map(|t| t + seed * 1_000).collect();
    let mut keys = Vec::new();
    let mut parent = None;
    for block in tokens.chunks_exact(16) {
        let k = block_key(parent, block, std::iter::empty());
        keys.push(k);
        parent = Some(k);
    }
    let stored = Stored {
        hashes: (0..n as u64)
            .map(|h| EngineHash(h + u64::from(seed) * 100))
            .collect(),
        parent: None,
        token_ids: tokens,
        block_size: 16,
        lora_name: None,
        tier: Tier::Gpu,
        extra_keys: Vec::new(),
        reusable: true,
    };
    let batch = Batch {
        ts: 0.0,
        events: vec![Event::Stored(stored)],
        dp_rank: None,
    };
    (batch, keys)
}

fn state(index: &KvIndex, id: SourceId) -> &'static str {
    index
        .status()
        .into_iter()
        .find(|(s, _)| *s == id)
        .map_or("gone", |(_, st)| st.state)
}

#[test]
fn a_pod_that_owes_events_and_sends_none_turns_stalled_and_a_batch_clears_it() {
    let index = index();
    let id = source(&index);
    let (first, _) = stored(2, 1);
    index.apply(id, &first, 0);
    assert_eq!(state(&index, id), "healthy");
    let t0 = Instant::now();
    // A new prompt: its blocks are not held there, so the engine owes their events.
    let (_, owed) = stored(4, 2);
    index.speculate(id, &owed, t0);
    index.sweep(t0 + AFTER - Duration::from_millis(1));
    assert!(
        index.trusted(id),
        "not yet: owed for less than the stall period"
    );
    // More requests meanwhile do not move the start of the debt.
    let (_, more) = stored(3, 3);
    index.speculate(id, &more, t0 + Duration::from_secs(2));
    index.sweep(t0 + AFTER);
    assert!(
        !index.trusted(id),
        "owed for the stall period with no batch"
    );
    let status = &index.status()[0].1;
    assert_eq!(status.state, "stalled");
    assert!(
        status
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("no KV events for 5 s")),
        "{status:?}"
    );
    // The entries stay (the stream may only be late): the first chain is still held.
    assert_eq!(status.entries, 2);
    // Any batch shows the stream alive again.
    let (late, _) = stored(4, 2);
    index.apply(id, &late, 1);
    assert!(index.trusted(id));
    assert_eq!(state(&index, id), "healthy");
    // And nothing is owed any more: a later sweep finds nothing to flag.
    index.sweep(t0 + AFTER * 4);
    assert!(index.trusted(id));
}

#[test]
fn a_peers_placement_is_a_debt_too_on_the_owner() {
    let index = index();
    let id = source(&index);
    let (first, held) = stored(2, 1);
    index.apply(id, &first, 0);
    let t0 = Instant::now();
    // A peer placed the held chain: nothing owed.
    index.speculate_remote(id, &held, Duration::from_secs(2), t0);
    index.sweep(t0 + AFTER);
    assert!(index.trusted(id));
    // A peer routed a new prompt there (this agent routes nothing to the pod).
    let (_, owed) = stored(3, 2);
    index.speculate_remote(id, &owed, Duration::from_secs(2), t0 + AFTER);
    index.sweep(t0 + AFTER * 2);
    assert_eq!(state(&index, id), "stalled");
    assert_eq!(index.status()[0].1.routed, 0, "not this agent's routing");
}

#[test]
fn a_hot_pod_whose_requests_add_no_block_does_not_stall() {
    let index = index();
    let id = source(&index);
    let (cached, keys) = stored(8, 1);
    index.apply(id, &cached, 0);
    let t0 = Instant::now();
    // Many requests over a minute, every one a prefix the engine already reported: its
    // prefills fill no new block, so it has nothing to say, and says nothing.
    for s in 0..600u64 {
        let at = t0 + Duration::from_millis(100 * s);
        index.speculate(id, &keys[..1 + (s as usize % keys.len())], at);
        index.sweep(at);
    }
    assert!(index.trusted(id));
    assert_eq!(state(&index, id), "healthy");
    assert_eq!(index.status()[0].1.routed, 600);
}

#[test]
fn only_local_sources_that_received_events_stall() {
    let index = index();
    let t0 = Instant::now();
    let (_, keys) = stored(2, 1);
    // Never a batch: waiting (untrusted already), not stalled.
    let waiting = source(&index);
    index.speculate(waiting, &keys, t0);
    // Remote: the owner says whether its stream stalled, the replica never guesses.
    let remote = index.add_remote_source(SourceInfo {
        pod: "pod-r".into(),
        rank: None,
    });
    index.load_snapshot(remote, &[]);
    index.speculate(remote, &keys, t0);
    index.sweep(t0 + AFTER * 2);
    assert_eq!(state(&index, waiting), "waiting");
    assert_eq!(state(&index, remote), "healthy");
    // An index nobody feeds (the routing history) never stalls.
    let history = KvIndex::new(IndexConfig {
        stall_after: None,
        ..IndexConfig::default()
    });
    let h = source(&history);
    let (first, _) = stored(1, 9);
    history.apply(h, &first, 0);
    history.speculate(h, &keys, t0);
    history.sweep(t0 + AFTER * 2);
    assert_eq!(state(&history, h), "healthy");
}
