//! The index's side of the cluster (docs/cluster.md): a local source's journal for the peers
//! that replicate it, and remote sources — pods whose truth is another agent — fed with
//! router keys instead of engine events.
//!
//! A remote source keeps its keys in the same engine map as a local one, with the router key
//! standing for the engine hash, so clearing and removals work unchanged.

use std::time::{Duration, Instant};

use super::{
    HealthState, Journal, KeyDelta, KvIndex, Since, SourceId, SourceInfo, Tier, Watermark,
};
use crate::kv_index::{RouterKey, engine_map::Removal};

/// Where the router's speculations go besides the index (the cluster's placement stream).
pub struct PlacementSink(Box<Placed>);

/// A placement: the pod's source, the prompt's keys, and how many of them were new to the
/// pod by the index (the blocks its prefill computes).
type Placed = dyn Fn(SourceId, &[RouterKey], usize) + Send + Sync;

impl PlacementSink {
    pub fn new(f: impl Fn(SourceId, &[RouterKey], usize) + Send + Sync + 'static) -> Self {
        Self(Box::new(f))
    }

    pub(super) fn placed(&self, id: SourceId, keys: &[RouterKey], new_blocks: usize) {
        (self.0)(id, keys, new_blocks)
    }
}

impl std::fmt::Debug for PlacementSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlacementSink")
    }
}

impl KvIndex {
    /// Sends every later [`KvIndex::speculate`] to `sink` too (once; false if one was set).
    pub fn set_placement_sink(&self, sink: PlacementSink) -> bool {
        self.placements.set(sink).is_ok()
    }

    /// Woken whenever a journaled source changes (create the `notified()` future before
    /// reading, so no change is missed).
    pub fn changes(&self) -> &tokio::sync::Notify {
        &self.changes
    }

    /// Sends every later [`KvIndex::speculate_remote`] to `sink` too (once; false if one was
    /// set): the proxy records a peer's placement in its routing history.
    pub fn set_peer_placement_sink(&self, sink: PlacementSink) -> bool {
        self.peer_placements.set(sink).is_ok()
    }

    /// A peer's placement: `keys` held speculatively on `id` for `ttl`, as if this agent had
    /// routed them (but not counted as its routing, and not passed on), and handed to the
    /// peer placement sink.
    pub fn speculate_remote(&self, id: SourceId, keys: &[RouterKey], ttl: Duration, now: Instant) {
        if !keys.is_empty() {
            let (_, new_blocks) = self.hold_speculatively(id, keys, now + ttl, now, false);
            if let Some(sink) = self.peer_placements.get() {
                sink.placed(id, keys, new_blocks);
            }
        }
    }

    /// Starts journaling a local source's batches for replicas, at `incarnation` (unique per
    /// agent start, so a restarted owner is never mistaken for the old one).
    pub fn enable_journal(&self, id: SourceId, incarnation: u64) {
        if let Some(source) = self.source(id) {
            source.state.lock().journal = Some(Journal::new(incarnation));
        }
    }

    /// A journaled source's watermark.
    pub fn watermark(&self, id: SourceId) -> Option<Watermark> {
        let source = self.source(id)?;
        let st = source.state.lock();
        st.journal.as_ref().map(Journal::watermark)
    }

    /// What a replica at `from` needs: the deltas since, or a snapshot when they are gone.
    /// `None` when the source is not journaled.
    pub fn since(&self, id: SourceId, from: Watermark) -> Option<Since> {
        let source = self.source(id)?;
        let st = source.state.lock();
        let journal = st.journal.as_ref()?;
        Some(match journal.since(from) {
            Some(deltas) => Since::Deltas(deltas),
            None => Since::Snapshot {
                at: journal.watermark(),
                held: st
                    .engine
                    .iter()
                    .map(|(_, key, tiers)| (key, tiers))
                    .collect(),
            },
        })
    }

    /// Registers a pod replicated from a peer (which one, gossip says later:
    /// [`KvIndex::set_owner`]); `Waiting` until its first snapshot.
    pub fn add_remote_source(&self, info: SourceInfo) -> SourceId {
        self.insert_source(info, true)
    }

    /// Names the peer a remote source is replicated from (shown in `/status`).
    pub fn set_owner(&self, id: SourceId, owner: Option<&str>) {
        if let Some(source) = self.source(id).filter(|s| s.remote) {
            source.state.lock().status.owner = owner.map(str::to_string);
        }
    }

    /// The peer a remote source is replicated from, when one claimed it.
    pub fn owner(&self, id: SourceId) -> Option<String> {
        self.source(id)?.state.lock().status.owner.clone()
    }

    /// Starts a remote source over (its owner came back as a new incarnation, or another
    /// peer claimed the pod): no entries, `Waiting` until the next snapshot.
    pub fn resync_remote(&self, id: SourceId) {
        let Some(source) = self.source(id).filter(|s| s.remote) else {
            return;
        };
        self.clear(id);
        source.state.lock().health = HealthState::Waiting;
    }

    /// Applies one of the owner's deltas to a remote source.
    pub fn apply_remote(&self, id: SourceId, delta: &KeyDelta) {
        if delta.cleared {
            self.clear(id);
        }
        let Some(source) = self.source(id) else {
            return;
        };
        self.store.tick();
        let mut st = source.state.lock();
        let mut w = self.store.writer();
        for &(key, tier) in &delta.stored {
            st.engine.store(key.0, key, tier);
            w.insert(key, id.0, tier, false);
        }
        for &(key, tier) in &delta.removed {
            if let Removal::Removed(key) = st.engine.remove(key.0, tier) {
                w.remove(key, id.0, tier, false);
            }
        }
        st.status.batches += 1;
        st.status.blocks_stored += delta.stored.len() as u64;
        st.status.blocks_removed += delta.removed.len() as u64;
    }

    /// Replaces a remote source's entries with the owner's snapshot; a source waiting for
    /// it is then trusted (the owner's own health is applied with
    /// [`KvIndex::set_remote_health`]).
    pub fn load_snapshot(&self, id: SourceId, held: &[(RouterKey, u8)]) {
        self.clear(id);
        let Some(source) = self.source(id) else {
            return;
        };
        self.store.tick();
        let mut st = source.state.lock();
        let mut w = self.store.writer();
        for &(key, tiers) in held {
            for tier in Tier::ALL.into_iter().filter(|t| tiers & t.bit() != 0) {
                st.engine.store(key.0, key, tier);
                w.insert(key, id.0, tier, false);
            }
        }
        st.status.blocks_stored += held.len() as u64;
        // Waiting for its first snapshot: now trusted. Unsure stays unsure: that is the
        // owner's word (or its loss), and only the owner's next word changes it.
        if st.health == HealthState::Waiting {
            st.health = HealthState::Healthy;
        }
    }

    /// The owner's word on a remote source: trusted, or unsure with its reason (the entries
    /// are kept: the owner still streams them, and they become usable again when it
    /// recovers). Local sources are left alone.
    pub fn set_remote_health(&self, id: SourceId, unsure: Option<String>, now: Instant) {
        let Some(source) = self.source(id) else {
            return;
        };
        if !source.remote {
            return;
        }
        let mut st = source.state.lock();
        st.health = match unsure {
            None if st.health == HealthState::Waiting => HealthState::Waiting,
            None => HealthState::Healthy,
            Some(reason) => match &st.health {
                HealthState::Unsure { reason: r, since } if *r == reason => HealthState::Unsure {
                    reason,
                    since: *since,
                },
                _ => HealthState::Unsure { reason, since: now },
            },
        };
    }

    /// The owner is gone (declared dead, partitioned away): its pods' entries may be stale
    /// at any moment, so they are dropped and the source is unsure (prefix weight 0) until
    /// the owner returns and sends a snapshot.
    pub fn mark_remote_lost(&self, id: SourceId, reason: String, now: Instant) {
        let Some(source) = self.source(id) else {
            return;
        };
        if !source.remote {
            return;
        }
        self.clear(id);
        let mut st = source.state.lock();
        st.health = HealthState::Unsure { reason, since: now };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_index::{IndexConfig, Match, wire::Batch};

    fn info(pod: &str) -> SourceInfo {
        SourceInfo {
            pod: pod.into(),
            rank: None,
        }
    }

    fn lookup(index: &KvIndex, chain: &[RouterKey]) -> Vec<(u32, usize)> {
        let mut out: Vec<Match> = Vec::new();
        index.lookup(chain, &mut out);
        let mut v: Vec<_> = out.iter().map(|m| (m.source, m.blocks)).collect();
        v.sort_unstable();
        v
    }

    /// Stored events for a chain of `n` blocks of 16 tokens (token ids from `seed`).
    fn chain_batch(n: usize, seed: u32) -> (Batch, Vec<RouterKey>) {
        use crate::kv_index::wire::{EngineHash, Event, Stored};
        let tokens: Vec<u32> = (0..n as u32 * 16).map(|t| t + seed * 1_000).collect();
        let mut keys = Vec::new();
        let mut parent = None;
        for block in tokens.chunks_exact(16) {
            let k = crate::kv_index::keys::block_key(parent, block, std::iter::empty());
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
        (
            Batch {
                ts: 0.0,
                events: vec![Event::Stored(stored)],
                dp_rank: None,
            },
            keys,
        )
    }

    #[test]
    fn a_replica_fed_from_the_journal_matches_the_owner() {
        let owner = KvIndex::new(IndexConfig::default());
        let local = owner.add_source(info("pod-a"));
        owner.enable_journal(local, 100);
        let (batch, keys) = chain_batch(8, 1);
        owner.apply(local, &batch, 0);
        let (batch2, keys2) = chain_batch(4, 2);
        owner.apply(local, &batch2, 1);
        assert_eq!(
            owner.watermark(local),
            Some(Watermark {
                incarnation: 100,
                sequence: 2
            })
        );

        let replica = KvIndex::new(IndexConfig::default());
        let remote = replica.add_remote_source(info("pod-a"));
        assert!(!replica.trusted(remote), "waiting until its first snapshot");
        // A new replica starts with a snapshot...
        let Some(Since::Snapshot { at, held }) = owner.since(local, Watermark::default()) else {
            panic!("a fresh replica needs a snapshot");
        };
        replica.load_snapshot(remote, &held);
        assert!(replica.trusted(remote));
        assert_eq!(lookup(&replica, &keys), vec![(remote.0, 8)]);
        assert_eq!(lookup(&replica, &keys2), vec![(remote.0, 4)]);
        // ... then follows by deltas: the engine drops the second chain.
        let removed = crate::kv_index::wire::Removed {
            hashes: (200..204).map(crate::kv_index::wire::EngineHash).collect(),
            tier: Tier::Gpu,
            reusable: true,
        };
        let batch3 = Batch {
            ts: 0.0,
            events: vec![crate::kv_index::wire::Event::Removed(removed)],
            dp_rank: None,
        };
        owner.apply(local, &batch3, 2);
        let Some(Since::Deltas(deltas)) = owner.since(local, at) else {
            panic!("the replica's watermark is in the ring");
        };
        assert_eq!(deltas.len(), 1);
        assert_eq!(deltas[0].0, 3);
        assert_eq!(deltas[0].1.removed.len(), 4);
        replica.apply_remote(remote, &deltas[0].1);
        assert_eq!(lookup(&replica, &keys2), Vec::new());
        assert_eq!(lookup(&replica, &keys), vec![(remote.0, 8)]);
        assert_eq!(
            replica.source_keys(remote).len(),
            owner.source_keys(local).len()
        );
    }

    #[test]
    fn lost_events_start_a_new_incarnation_and_replicas_take_a_snapshot() {
        let owner = KvIndex::new(IndexConfig::default());
        let local = owner.add_source(info("pod-a"));
        owner.enable_journal(local, 5);
        let (batch, _) = chain_batch(2, 1);
        owner.apply(local, &batch, 0);
        let before = owner.watermark(local).expect("journaled");
        owner.mark_unsure(local, "lost".into(), Instant::now());
        let after = owner.watermark(local).expect("journaled");
        assert_eq!((after.incarnation, after.sequence), (6, 0));
        assert!(matches!(
            owner.since(local, before),
            Some(Since::Snapshot { .. })
        ));
    }

    #[test]
    fn a_lost_owner_makes_its_pods_unsure_and_the_sweep_does_not_settle_them() {
        let index = KvIndex::new(IndexConfig::default());
        let remote = index.add_remote_source(info("pod-c"));
        index.set_owner(remote, Some("agent-c"));
        let keys: Vec<RouterKey> = (1..=3).map(RouterKey).collect();
        index.load_snapshot(
            remote,
            &keys
                .iter()
                .map(|&k| (k, Tier::Gpu.bit()))
                .collect::<Vec<_>>(),
        );
        assert_eq!(lookup(&index, &keys), vec![(remote.0, 3)]);
        let t0 = Instant::now();
        index.mark_remote_lost(remote, "owner agent-c is dead".into(), t0);
        assert!(!index.trusted(remote));
        assert_eq!(lookup(&index, &keys), Vec::new());
        // A local source would settle after unsure_settle; a remote one waits for its owner.
        index.sweep(t0 + index.config().unsure_settle * 2);
        assert!(!index.trusted(remote));
        assert_eq!(index.status()[0].1.state, "unsure");
        assert_eq!(index.status()[0].1.owner.as_deref(), Some("agent-c"));
        // A snapshot does not overrule the loss; the owner's return (a resync) does.
        index.load_snapshot(remote, &[(keys[0], Tier::Gpu.bit())]);
        assert!(!index.trusted(remote));
        index.resync_remote(remote);
        index.load_snapshot(remote, &[(keys[0], Tier::Gpu.bit())]);
        assert!(index.trusted(remote));
        // The owner's own word: its pod's events are lost.
        index.set_remote_health(remote, Some("owner: stalled".into()), t0);
        assert!(!index.trusted(remote));
        index.set_remote_health(remote, None, t0);
        assert!(index.trusted(remote));
    }
}
