//! `KvIndex`: the store plus its sources — applying decoded batches in order per source,
//! speculative entries, clearing and removing sources, and health.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::{Mutex, RwLock};

use super::{
    DEFAULT_TIER_WEIGHTS, RouterKey, Tier,
    engine_map::{EngineMap, Removal},
    entry::{MAX_SOURCES, Upsert},
    health::{HealthState, SourceStatus},
    keys::block_key,
    store::{Match, Store, Writer},
    wire::{Batch, Event, Removed, Stored},
};

mod journal;
mod loads;
mod remote;
mod speculative;

use journal::Journal;
pub use journal::{DELTA_RING, DELTA_RING_KEYS, KeyDelta, Since, Watermark};
pub use loads::{AgentLoad, LoadSink, PeerLoadSink};
pub use remote::PlacementSink;
use speculative::Pending;

/// Default cap on (block, source) entries.
pub const DEFAULT_MAX_ENTRIES: usize = 20_000_000;
/// How long a speculative entry waits for the engine's event.
pub const DEFAULT_SPECULATIVE_TTL: Duration = Duration::from_secs(2);
/// How long a source stays unsure after an unrecoverable gap (its entries were cleared).
pub const DEFAULT_UNSURE_SETTLE: Duration = Duration::from_secs(10);
/// How long the engine may owe events without sending a batch before its stream counts as
/// stalled: a request routed there added blocks the pod did not hold (its prefill will
/// store them), so a live stream reports within about one prefill.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(5);

/// Index settings.
#[derive(Debug, Clone)]
pub struct IndexConfig {
    /// Tokens per block; must match vLLM's --block-size.
    pub block_size: usize,
    pub max_entries: usize,
    pub tier_weights: [f64; Tier::COUNT],
    pub speculative_ttl: Duration,
    pub unsure_settle: Duration,
    /// A local source owing events for this long without a batch is stalled (`None`:
    /// never, for indexes no engine feeds, like the routing history).
    pub stall_after: Option<Duration>,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            max_entries: DEFAULT_MAX_ENTRIES,
            tier_weights: DEFAULT_TIER_WEIGHTS,
            speculative_ttl: DEFAULT_SPECULATIVE_TTL,
            unsure_settle: DEFAULT_UNSURE_SETTLE,
            stall_after: Some(DEFAULT_STALL_AFTER),
        }
    }
}

/// A source's identity in the index (dense, reused after removal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(pub u32);

/// Who a source is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    pub pod: String,
    pub rank: Option<u32>,
}

#[derive(Debug)]
struct SourceState {
    /// engine hash -> (router key, tiers held).
    engine: EngineMap,
    /// A batch's router keys, kept between events (no allocation per event).
    keys: Vec<RouterKey>,
    /// Speculated keys and their latest deadlines (held once per key, however many requests
    /// renew it).
    speculative: Pending,
    health: HealthState,
    /// Since when the engine owes events: the first request routed here after the last
    /// batch whose speculation added a key this source did not hold and that the engine
    /// answered (2xx, [`KvIndex::owe`]), or a peer placed.
    owed_since: Option<Instant>,
    /// How often the debt was settled (a batch, a restart, a reconnect, lost events): a
    /// speculation made before the latest settlement owes nothing when it is answered.
    settled: u64,
    status: SourceStatus,
    last_event_block_size: Option<u32>,
    /// Applied batches in router keys, when peers replicate this (local) source.
    journal: Option<Journal>,
}

#[derive(Debug)]
struct Source {
    info: SourceInfo,
    /// Replicated from the peer that owns the pod (docs/cluster.md), not subscribed here: its
    /// health is the owner's word, never settled by [`KvIndex::sweep`].
    remote: bool,
    state: Mutex<SourceState>,
}

/// One routed attempt's speculative keys that its source did not hold, returned by
/// [`KvIndex::speculate`]: the attempt's outcome decides whether the engine owes their
/// events ([`KvIndex::owe`], a 2xx answer) or they are withdrawn ([`KvIndex::withdraw`]).
/// Dropped unsettled, the keys stay until their TTL and nothing is owed.
#[derive(Debug)]
pub struct Speculation {
    source: SourceId,
    on: Arc<Source>,
    at: Instant,
    /// The source's settlements at the routing instant ([`SourceState::settle`]).
    settled: u64,
    added: Vec<RouterKey>,
}

/// The index shared by ingestion and routing.
#[derive(Debug)]
pub struct KvIndex {
    store: Store,
    sources: RwLock<Vec<Option<Arc<Source>>>>,
    config: IndexConfig,
    /// Woken when a journaled source changes (replication streams wait on it).
    changes: tokio::sync::Notify,
    /// Told of every speculation the router makes (the cluster shares them with peers).
    placements: std::sync::OnceLock<PlacementSink>,
    /// Told of every peer's placement applied here (the proxy adds it to its routing history).
    peer_placements: std::sync::OnceLock<PlacementSink>,
    /// Told of this agent's loads on pods (the cluster shares them with peers).
    loads: std::sync::OnceLock<LoadSink>,
    /// Told of peers' loads (the proxy counts them on their pods).
    peer_loads: std::sync::OnceLock<PeerLoadSink>,
}

impl KvIndex {
    pub fn new(config: IndexConfig) -> Self {
        Self {
            store: Store::new(config.max_entries, config.tier_weights),
            sources: RwLock::new(Vec::new()),
            config,
            changes: tokio::sync::Notify::new(),
            placements: std::sync::OnceLock::new(),
            peer_placements: std::sync::OnceLock::new(),
            loads: std::sync::OnceLock::new(),
            peer_loads: std::sync::OnceLock::new(),
        }
    }

    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    /// Registers a source; its entries start empty and its state `Waiting`.
    pub fn add_source(&self, info: SourceInfo) -> SourceId {
        self.insert_source(info, false)
    }

    fn insert_source(&self, info: SourceInfo, remote: bool) -> SourceId {
        let source = Arc::new(Source {
            state: Mutex::new(SourceState {
                engine: EngineMap::default(),
                keys: Vec::new(),
                speculative: Pending::default(),
                health: HealthState::Waiting,
                owed_since: None,
                settled: 0,
                status: SourceStatus {
                    pod: info.pod.clone(),
                    rank: info.rank,
                    ..Default::default()
                },
                last_event_block_size: None,
                journal: None,
            }),
            info,
            remote,
        });
        let mut sources = self.sources.write();
        if let Some(free) = sources.iter().position(Option::is_none) {
            sources[free] = Some(source);
            return SourceId(free as u32);
        }
        assert!(
            (sources.len() as u32) < MAX_SOURCES,
            "more than {MAX_SOURCES} sources"
        );
        sources.push(Some(source));
        SourceId(sources.len() as u32 - 1)
    }

    fn source(&self, id: SourceId) -> Option<Arc<Source>> {
        self.sources.read().get(id.0 as usize).cloned().flatten()
    }

    /// Removes a source and all its entries (work proportional to its entries).
    pub fn remove_source(&self, id: SourceId) {
        self.clear(id);
        if let Some(slot) = self.sources.write().get_mut(id.0 as usize) {
            *slot = None;
        }
    }

    /// Drops every entry of a source (AllBlocksCleared, engine restart, lost events).
    pub fn clear(&self, id: SourceId) {
        let Some(source) = self.source(id) else {
            return;
        };
        let mut st = source.state.lock();
        let mut w = self.store.writer();
        // Taken, not drained: a cleared engine's map starts small again.
        for (key, tiers) in std::mem::take(&mut st.engine).take_all() {
            for tier in Tier::ALL.into_iter().filter(|t| tiers & t.bit() != 0) {
                w.remove(key, id.0, tier, false);
            }
        }
        for key in st.speculative.take_all() {
            w.remove(RouterKey(key), id.0, Tier::Gpu, true);
        }
    }

    /// Applies one batch of a source's events, in order.
    pub fn apply(&self, id: SourceId, batch: &Batch, seq: u64) {
        let Some(source) = self.source(id) else {
            return;
        };
        self.store.tick();
        let mut st = source.state.lock();
        st.status.batches += 1;
        st.status.last_seq = Some(seq);
        // Any batch shows the stream is alive: nothing is owed any more.
        st.settle();
        if matches!(
            st.health,
            HealthState::Waiting | HealthState::Stalled { .. }
        ) {
            st.health = HealthState::Healthy;
        }
        let mut w = self.store.writer();
        for event in &batch.events {
            match event {
                Event::Stored(s) => self.apply_stored(id, &mut st, s, &mut w),
                Event::Removed(r) => self.apply_removed(id, &mut st, r, &mut w),
                Event::AllCleared => {
                    drop(w);
                    drop(st);
                    self.clear(id);
                    st = source.state.lock();
                    w = self.store.writer();
                    // A cleared engine is a known state: whatever was unsure is settled.
                    st.health = HealthState::Healthy;
                    if let Some(j) = &mut st.journal {
                        j.current = KeyDelta {
                            cleared: true,
                            ..Default::default()
                        };
                    }
                }
                Event::Unknown => st.status.malformed += 1,
            }
        }
        drop(w);
        if let Some(j) = &mut st.journal {
            j.current.event_unix_us = journal::micros_of_unix_seconds(batch.ts);
            j.commit();
            self.changes.notify_waiters();
        }
        let event_block_size = st.last_event_block_size;
        if st
            .status
            .check_mismatch(self.config.block_size, event_block_size)
        {
            tracing::warn!(pod = %source.info.pod, rank = ?source.info.rank, reason = st.status.key_mismatch.as_deref().unwrap_or(""), "KV index keys do not match this engine");
        }
    }

    fn apply_stored(&self, id: SourceId, st: &mut SourceState, s: &Stored, w: &mut Writer<'_>) {
        let bs = self.config.block_size;
        if !s.reusable {
            st.status.ignored_groups += 1;
            return;
        }
        if s.block_size as usize != bs {
            st.status.block_size_mismatches += 1;
            st.last_event_block_size = Some(s.block_size);
            return;
        }
        if s.token_ids.len() != s.hashes.len() * bs {
            st.status.malformed += 1;
            return;
        }
        let mut parent = match s.parent {
            None => None,
            Some(p) => match st.engine.key(p.0) {
                Some(key) => Some(key),
                None => {
                    // The parent chain is unknown (joined mid-stream or lost): these blocks
                    // cannot be keyed, and no request could reach them through the index.
                    st.status.orphans += s.hashes.len() as u64;
                    return;
                }
            },
        };
        // Keys first (each chains on the one before), then the writes, with the slots of
        // the blocks ahead prefetched so their cache misses overlap.
        let mut keys = std::mem::take(&mut st.keys);
        keys.clear();
        for (i, tokens) in s.token_ids.chunks_exact(bs).enumerate() {
            let extra = s
                .extra_keys
                .get(i)
                .and_then(|e| e.as_deref())
                .unwrap_or(&[]);
            let key = block_key(parent, tokens, extra.iter().map(String::as_str));
            keys.push(key);
            parent = Some(key);
        }
        w.each_prefetched(&keys, |w, i, key| {
            st.engine.store(s.hashes[i].0, key, s.tier);
            if w.insert(key, id.0, s.tier, false) == Upsert::Confirmed {
                st.status.confirmed += 1;
            }
        });
        if let Some(j) = &mut st.journal {
            j.current.stored.extend(keys.iter().map(|&k| (k, s.tier)));
        }
        st.keys = keys;
        st.status.blocks_stored += s.hashes.len() as u64;
    }

    fn apply_removed(&self, id: SourceId, st: &mut SourceState, r: &Removed, w: &mut Writer<'_>) {
        if !r.reusable {
            st.status.ignored_groups += 1;
            return;
        }
        // Two passes: the engine map resolves the hashes to router keys, then the store
        // drops them, prefetching ahead.
        let mut keys = std::mem::take(&mut st.keys);
        keys.clear();
        for hash in &r.hashes {
            match st.engine.remove(hash.0, r.tier) {
                Removal::Removed(key) => keys.push(key),
                Removal::Unknown => st.status.unknown_removals += 1,
            }
        }
        w.each_prefetched(&keys, |w, _, key| {
            w.remove(key, id.0, r.tier, false);
        });
        st.status.blocks_removed += keys.len() as u64;
        if let Some(j) = &mut st.journal {
            j.current.removed.extend(keys.iter().map(|&k| (k, r.tier)));
        }
        st.keys = keys;
        // The engine's cache may have shrunk well below its peak.
        st.engine.shrink_if_sparse();
    }

    /// Records that the router is sending a request with `keys` to `id`: the keys count as
    /// held (GPU) until the engine's event confirms them or the TTL expires. When it added a
    /// key the source did not hold, the returned speculation settles the attempt:
    /// [`Self::owe`] once the engine answered, [`Self::withdraw`] when the attempt failed.
    pub fn speculate(&self, id: SourceId, keys: &[RouterKey], now: Instant) -> Option<Speculation> {
        if keys.is_empty() {
            return None;
        }
        let (speculation, new_blocks) =
            self.hold_speculatively(id, keys, now + self.config.speculative_ttl, now, true);
        if let Some(sink) = self.placements.get() {
            sink.placed(id, keys, new_blocks);
        }
        speculation
    }

    /// The engine answered the speculated attempt (a 2xx head): its prefill stores the keys
    /// the pod did not hold, so from the routing instant it owes their events, unless a batch
    /// (or a restart, a reconnect, lost events) came since and settled it.
    pub fn owe(&self, s: Speculation) {
        let Some(source) = self.speculated_source(&s) else {
            return;
        };
        let mut st = source.state.lock();
        if !source.remote && st.settled == s.settled {
            st.owed_since = Some(st.owed_since.map_or(s.at, |o| o.min(s.at)));
        }
    }

    /// The speculated attempt failed (no answer, a 503, an error, a non-2xx answer): nothing
    /// reached the pod's cache, so the keys it added are held no more and nothing is owed.
    /// A key a later request renewed meanwhile goes too (a hint lost, not a wrong one).
    pub fn withdraw(&self, s: Speculation) {
        let Some(source) = self.speculated_source(&s) else {
            return;
        };
        self.store.tick();
        let _st = source.state.lock();
        let mut w = self.store.writer();
        for key in &s.added {
            // Only the speculative holding: a key the engine confirmed meanwhile stays. Its
            // pending deadline stays too and expires it as a no-op.
            w.remove(*key, s.source.0, Tier::Gpu, true);
        }
    }

    /// The source a speculation was made on, if it is still that one (not removed, its slot
    /// not reused).
    fn speculated_source(&self, s: &Speculation) -> Option<Arc<Source>> {
        self.source(s.source)
            .filter(|source| Arc::ptr_eq(source, &s.on))
    }

    /// Holds `keys` as speculative on `id` until `deadline`, as routed at `now`; `own`: this
    /// agent's routing decision (counted for the key-mismatch check; its debt waits for the
    /// answer: the returned speculation), not a peer's placement (a debt at once).
    fn hold_speculatively(
        &self,
        id: SourceId,
        keys: &[RouterKey],
        deadline: Instant,
        now: Instant,
        own: bool,
    ) -> (Option<Speculation>, usize) {
        let Some(source) = self.source(id) else {
            return (None, 0);
        };
        self.store.tick();
        // The source's state before the store's writer, as everywhere else.
        let mut st = source.state.lock();
        let mut w = self.store.writer();
        // Allocated only when a key is new to the source (a cold prefix).
        let mut added = Vec::new();
        for key in keys {
            if w.insert(*key, id.0, Tier::Gpu, true) == Upsert::New {
                added.push(*key);
            }
        }
        drop(w);
        if own {
            st.status.routed += 1;
        }
        // A prefill that fills a block the pod did not hold ends in a BlockStored event; a
        // request whose blocks were all held owes nothing (a hot pod can be quiet). Peers'
        // placements count too: on its owner, a pod only peers route to can stall.
        if !own && !added.is_empty() && !source.remote && st.owed_since.is_none() {
            st.owed_since = Some(now);
        }
        let new_blocks = added.len();
        let speculation = (own && !added.is_empty()).then(|| Speculation {
            source: id,
            on: source.clone(),
            at: now,
            settled: st.settled,
            added,
        });
        // At the cap, the earliest pending keys stop being speculative now (no allocation
        // unless one does).
        let mut evicted = Vec::new();
        for key in keys {
            evicted.extend(
                st.speculative
                    .renew(key.0, deadline, self.config.max_entries),
            );
        }
        if !evicted.is_empty() {
            let mut w = self.store.writer();
            for key in evicted {
                w.remove(RouterKey(key), id.0, Tier::Gpu, true);
            }
        }
        (speculation, new_blocks)
    }

    /// Expires speculative entries whose TTL passed; settles unsure sources whose grace
    /// period passed; marks stalled the local sources that owe events for longer than
    /// `stall_after` without a batch.
    pub fn sweep(&self, now: Instant) {
        let sources: Vec<(SourceId, Arc<Source>)> = self
            .sources
            .read()
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.clone().map(|s| (SourceId(i as u32), s)))
            .collect();
        for (id, source) in sources {
            let mut st = source.state.lock();
            let mut w = self.store.writer();
            st.speculative.expire(now, |key| {
                w.remove(RouterKey(key), id.0, Tier::Gpu, true);
            });
            if let HealthState::Unsure { since, .. } = st.health
                && !source.remote
                && now.duration_since(since) >= self.config.unsure_settle
            {
                st.health = HealthState::Healthy;
            }
            if let (HealthState::Healthy, Some(owed), Some(after)) =
                (&st.health, st.owed_since, self.config.stall_after)
                && !source.remote
                && now.saturating_duration_since(owed) >= after
            {
                tracing::warn!(pod = %source.info.pod, rank = ?source.info.rank, owed_for = ?now.saturating_duration_since(owed), "KV events stalled: requests routed here owe events and none came");
                st.health = HealthState::Stalled { since: owed };
            }
        }
    }

    /// Marks a source unsure after lost events: its entries are dropped (they may include
    /// blocks the engine evicted meanwhile) and prefix scores are not to be trusted until the
    /// engine clears or restarts, or the settle period passes without new losses.
    pub fn mark_unsure(&self, id: SourceId, reason: String, now: Instant) {
        self.clear(id);
        let Some(source) = self.source(id) else {
            return;
        };
        let mut st = source.state.lock();
        if st.new_incarnation() {
            self.changes.notify_waiters();
        }
        st.status.unrecoverable_gaps += 1;
        st.settle();
        tracing::warn!(pod = %source.info.pod, rank = ?source.info.rank, %reason, "KV index unsure for this source");
        st.health = HealthState::Unsure { reason, since: now };
    }

    /// The engine restarted (seq back to 0): its cache is gone, so are its entries.
    pub fn restarted(&self, id: SourceId) {
        self.clear(id);
        if let Some(source) = self.source(id) {
            let mut st = source.state.lock();
            if st.new_incarnation() {
                self.changes.notify_waiters();
            }
            st.status.restarts += 1;
            st.settle();
            st.health = HealthState::Healthy;
        }
    }

    /// The subscription lost its publisher and connected again: what we hold may belong to
    /// a process that is gone, so start over as a fresh subscriber (replay from 0 if the
    /// engine's buffer reaches back, else a subset that fills as the engine stores).
    pub fn reconnected(&self, id: SourceId) {
        self.clear(id);
        if let Some(source) = self.source(id) {
            let mut st = source.state.lock();
            if st.new_incarnation() {
                self.changes.notify_waiters();
            }
            st.status.reconnects += 1;
            st.settle();
            if st.health != HealthState::Waiting {
                st.health = HealthState::Healthy;
            }
        }
    }

    /// Counts a garbage payload.
    pub fn note_malformed(&self, id: SourceId) {
        if let Some(s) = self.source(id) {
            s.state.lock().status.malformed += 1;
        }
    }

    /// Counts a gap and whether replay filled it.
    pub fn note_gap(&self, id: SourceId, replayed: u64) {
        if let Some(s) = self.source(id) {
            let mut st = s.state.lock();
            st.status.gaps += 1;
            st.status.replayed += replayed;
        }
    }

    /// Whether the router may use this source's prefix scores.
    pub fn trusted(&self, id: SourceId) -> bool {
        self.source(id)
            .is_some_and(|s| s.state.lock().health == HealthState::Healthy)
    }

    /// Status of every source, with entry counts.
    pub fn status(&self) -> Vec<(SourceId, SourceStatus)> {
        let sources = self.sources.read().clone();
        sources
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let s = s.as_ref()?;
                let st = s.state.lock();
                let mut status = st.status.clone();
                (status.state, status.reason) = match &st.health {
                    HealthState::Waiting => {
                        ("waiting", Some("no KV events received yet".to_string()))
                    }
                    HealthState::Healthy => ("healthy", None),
                    HealthState::Unsure { reason, .. } => ("unsure", Some(reason.clone())),
                    HealthState::Stalled { .. } => (
                        "stalled",
                        Some(format!(
                            "requests routed here added blocks the engine has not reported: no KV events for {} s while owed",
                            self.config.stall_after.unwrap_or_default().as_secs_f64()
                        )),
                    ),
                };
                status.entries = st.engine.len();
                Some((SourceId(i as u32), status))
            })
            .collect()
    }

    /// Longest consecutive prefix per source and tier-weighted score.
    pub fn lookup(&self, chain: &[RouterKey], out: &mut Vec<Match>) {
        self.store.lookup(chain, out);
    }

    /// Who holds `key`: (source, tier, speculative). Tests, diagnostics, and each pool's
    /// recount of the resident prefixes its pods hold ([`crate::routing::resident`]).
    pub fn holders(&self, key: RouterKey) -> Vec<(SourceId, Tier, bool)> {
        self.store
            .holders_of(key)
            .into_iter()
            .map(|h| (SourceId(h.source()), h.tier(), h.speculative()))
            .collect()
    }

    /// Every key a source holds per its events, with tiers (tests and diagnostics).
    pub fn source_keys(&self, id: SourceId) -> Vec<(u64, RouterKey, u8)> {
        let Some(source) = self.source(id) else {
            return Vec::new();
        };
        let st = source.state.lock();
        let mut v: Vec<_> = st.engine.iter().collect();
        v.sort_unstable();
        v
    }

    /// (block, source) entries in the store.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    pub fn evicted(&self) -> usize {
        self.store.evicted()
    }

    /// Bytes held: the store's tables plus every source's engine-hash map.
    pub fn bytes(&self) -> usize {
        let engine: usize = self
            .sources
            .read()
            .iter()
            .flatten()
            .map(|s| s.state.lock().engine.bytes())
            .sum();
        self.store.bytes() + engine
    }
}

// === impl SourceState ===

impl SourceState {
    /// Nothing is owed any more, nor by a speculation made before now.
    fn settle(&mut self) {
        self.owed_since = None;
        self.settled = self.settled.wrapping_add(1);
    }

    /// The entries were dropped outside the event stream: replicas must start over (the
    /// caller wakes them through `KvIndex::changes` when this returns true).
    fn new_incarnation(&mut self) -> bool {
        self.journal
            .as_mut()
            .map(Journal::new_incarnation)
            .is_some()
    }
}

#[cfg(test)]
mod stall_tests;
#[cfg(test)]
mod test_events;
#[cfg(test)]
mod tests;
