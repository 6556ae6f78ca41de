//! Stalled event streams: a local source that owes events (a routed request the engine
//! answered added blocks it did not hold) and sends no batch for `stall_after` is untrusted
//! until its next batch; one whose requests add nothing owes nothing, however hot and quiet,
//! and so does one whose attempts failed.

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

/// A request routed to `id` at `at` that the engine answered (2xx).
fn answered(index: &KvIndex, id: SourceId, keys: &[RouterKey], at: Instant) {
    if let Some(s) = index.speculate(id, keys, at) {
        index.owe(s);
    }
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
    answered(&index, id, &owed, t0);
    index.sweep(t0 + AFTER - Duration::from_millis(1));
    assert!(
        index.trusted(id),
        "not yet: owed for less than the stall period"
    );
    // More requests meanwhile do not move the start of the debt.
    let (_, more) = stored(3, 3);
    answered(&index, id, &more, t0 + Duration::from_secs(2));
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
        let held = index.speculate(id, &keys[..1 + (s as usize % keys.len())], at);
        assert!(held.is_none(), "every block held: no speculation to settle");
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
    answered(&index, waiting, &keys, t0);
    // Remote: the owner says whether its stream stalled, the replica never guesses.
    let remote = index.add_remote_source(SourceInfo {
        pod: "pod-r".into(),
        rank: None,
    });
    index.load_snapshot(remote, &[]);
    answered(&index, remote, &keys, t0);
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
    answered(&history, h, &keys, t0);
    history.sweep(t0 + AFTER * 2);
    assert_eq!(state(&history, h), "healthy");
}

#[test]
fn a_failed_attempt_owes_nothing_and_withdraws_the_blocks_it_added() {
    let index = index();
    let id = source(&index);
    let (first, held) = stored(2, 1);
    index.apply(id, &first, 0);
    let t0 = Instant::now();
    // The held chain plus two new blocks; the engine never answers (a 503, a head
    // timeout, a connect error: the retry served it elsewhere).
    let (_, new) = stored(2, 5);
    let chain: Vec<RouterKey> = held.iter().chain(&new).copied().collect();
    let attempt = index
        .speculate(id, &chain, t0)
        .expect("two blocks new to the pod");
    assert_eq!(index.holders(new[0]), vec![(id, Tier::Gpu, true)]);
    index.withdraw(attempt);
    // Gone, and the chain the engine reported kept.
    assert!(index.holders(new[0]).is_empty());
    assert!(index.holders(new[1]).is_empty());
    assert_eq!(index.holders(held[0]), vec![(id, Tier::Gpu, false)]);
    // A quiet pod long after: nothing was owed.
    index.sweep(t0 + AFTER * 3);
    assert!(index.trusted(id));
    assert_eq!(state(&index, id), "healthy");
    // Unsettled (dropped) is no debt either.
    let (_, other) = stored(3, 6);
    drop(index.speculate(id, &other, t0 + AFTER * 3));
    index.sweep(t0 + AFTER * 5);
    assert_eq!(state(&index, id), "healthy");
}

#[test]
fn an_answered_attempt_owes_from_its_routing_instant() {
    let index = index();
    let id = source(&index);
    let (first, _) = stored(2, 1);
    index.apply(id, &first, 0);
    let t0 = Instant::now();
    let (_, new) = stored(3, 2);
    let attempt = index.speculate(id, &new, t0).expect("new blocks");
    // The head comes 3 s after the pick: the debt still starts at the pick.
    index.sweep(t0 + Duration::from_secs(3));
    assert_eq!(state(&index, id), "healthy", "no debt before the answer");
    index.owe(attempt);
    index.sweep(t0 + AFTER - Duration::from_millis(1));
    assert_eq!(state(&index, id), "healthy");
    index.sweep(t0 + AFTER);
    assert_eq!(state(&index, id), "stalled");
}

#[test]
fn a_batch_before_the_answer_has_paid_the_debt() {
    let index = index();
    let id = source(&index);
    let (first, _) = stored(2, 1);
    index.apply(id, &first, 0);
    let t0 = Instant::now();
    let (late, new) = stored(3, 2);
    let attempt = index.speculate(id, &new, t0).expect("new blocks");
    // A non-streaming answer's head comes after the prefill's events.
    index.apply(id, &late, 1);
    index.owe(attempt);
    index.sweep(t0 + AFTER * 2);
    assert_eq!(state(&index, id), "healthy");
    // Withdrawn after the engine confirmed them, the blocks stay held.
    let (_, more) = stored(4, 3);
    let attempt = index.speculate(id, &more, t0).expect("new blocks");
    let (confirm, _) = stored(4, 3);
    index.apply(id, &confirm, 2);
    index.withdraw(attempt);
    assert_eq!(index.holders(more[3]), vec![(id, Tier::Gpu, false)]);
}

#[test]
fn a_settlement_on_a_removed_source_touches_its_successor_not() {
    let index = index();
    let id = source(&index);
    let (first, _) = stored(1, 1);
    index.apply(id, &first, 0);
    let t0 = Instant::now();
    let (_, new) = stored(2, 2);
    let attempt = index.speculate(id, &new, t0).expect("new blocks");
    index.remove_source(id);
    // The slot is reused by another pod, which holds the same keys speculatively.
    let next = source(&index);
    assert_eq!(next, id, "the free slot is reused");
    index.apply(next, &first, 0);
    let _ = index.speculate(next, &new, t0);
    index.withdraw(attempt);
    assert_eq!(index.holders(new[0]), vec![(next, Tier::Gpu, true)]);
}
