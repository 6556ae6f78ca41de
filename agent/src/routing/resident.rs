//! The prefixes each pod keeps for reuse, and so how much a request's new blocks would
//! evict of them there ([`super::KvRoom::evicted`], the `evict` scorer).
//!
//! An engine's prefix cache is LRU: once it is full, a prompt's new blocks evict the blocks
//! unused longest. A one-off tail (a question after a shared document, a request's output)
//! costs nothing to lose; a prefix that requests come back to does: its next request pays
//! its whole prefill again, and stalls the batch it joins. Several pods' caches serve as one
//! cache only when new prefixes go where there is room: on the 2,500-token RAG cells the
//! central agent sent new documents to the idle pod (least stall), which was idle because
//! its documents were the least requested, and it held seven documents where another held
//! four (docs/benchmarks.md, "New prefixes go where there is room").
//!
//! - **Resident prefix.** A prefix a request found held: the longest any live pod holds, at
//!   least [`Settings::min_blocks`] (a peer agent's placement: the blocks its pod held of the
//!   placed prompt); named by its last block's key (chained: the key names the whole prefix)
//!   with its length.
//! - **Replaced** by a longer one through it (a conversation's next turn): its blocks are
//!   counted once, in the longer; a request finding less of a resident prefix (its last
//!   blocks evicted where it looked) adds no shorter one.
//! - **Forgotten** after [`Settings::horizon`] without a request.
//! - **Per pod**, the resident blocks are the lengths of the resident prefixes whose last
//!   block the KV index says the pod holds on its GPU (engines evict a prefix's last blocks
//!   first; a speculative hold, a request just routed there, counts), recounted every
//!   [`REFRESH`] off the request path (`crate::proxy::recount_loop`): the index knows the
//!   evictions, so a pod that lost a prefix stops counting it at the next recount. Prefixes
//!   that branch are counted per branch: documents sharing a system prompt count it once
//!   each, and a prompt repeated whole replaces its document's entry with the longer one (an
//!   estimate, not an inventory).
//!
//! Bounded: at most [`Settings::max_entries`] prefixes (when full, the expired go, then, if
//! still at least three quarters full, the older half); a recount reads the index once per
//! prefix, the table held only while it is copied and while the counts are installed
//! (`cargo bench -p warmpath-bench --bench resident`: docs/benchmarks.md).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use crate::kv_index::{KvIndex, RouterKey, SourceId, Tier};

/// How often the proxy recounts each pod's resident blocks from the index.
pub const REFRESH: Duration = Duration::from_millis(100);

/// The resident-prefix settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Shortest prefix tracked, in blocks (as replication's: shorter ones cost little to
    /// recompute).
    pub min_blocks: usize,
    /// A prefix not requested for this long is not kept for.
    pub horizon: Duration,
    pub max_entries: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            min_blocks: 4,
            // A minute: a document requested every few seconds, or once in half a minute
            // (the tail of a Zipf popularity), is kept for; one from minutes ago is not.
            horizon: Duration::from_secs(60),
            max_entries: 4096,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    blocks: u64,
    last: Instant,
}

/// One pool's resident prefixes and each pod's resident blocks.
#[derive(Debug)]
pub struct Resident {
    settings: Settings,
    entries: HashMap<RouterKey, Entry, foldhash::fast::RandomState>,
    /// Index source -> resident blocks there, as of the last recount.
    pods: PodBlocks,
}

/// Index source -> resident blocks there.
pub type PodBlocks = HashMap<SourceId, u64, foldhash::fast::RandomState>;

/// Each pod's resident blocks for `prefixes` ([`Resident::to_count`]): the lengths of
/// those whose last block `index` says the pod holds on its GPU. One index read per prefix.
pub fn tally(index: &KvIndex, prefixes: &[(RouterKey, u64)]) -> PodBlocks {
    let mut pods = PodBlocks::default();
    for &(key, blocks) in prefixes {
        for (source, tier, _) in index.holders(key) {
            if tier == Tier::Gpu {
                *pods.entry(source).or_default() += blocks;
            }
        }
    }
    pods
}

impl Default for Resident {
    fn default() -> Self {
        Self::new(Settings::default())
    }
}

impl Resident {
    pub fn new(mut settings: Settings) -> Self {
        settings.min_blocks = settings.min_blocks.max(1);
        settings.max_entries = settings.max_entries.max(2);
        Self {
            settings,
            entries: HashMap::default(),
            pods: PodBlocks::default(),
        }
    }

    /// Blocks of resident prefixes on the pod whose index source is `source`, as of the last
    /// recount ([`Resident::set_counts`]).
    pub fn blocks(&self, source: SourceId) -> u64 {
        self.pods.get(&source).copied().unwrap_or(0)
    }

    /// Prefixes tracked (tests, status).
    pub fn tracked(&self) -> usize {
        self.entries.len()
    }

    /// A request of `keys` reused its first `depth` blocks (the longest prefix a live pod
    /// held, or for a peer's placement the blocks its pod held): resident, if long enough.
    pub fn reused(&mut self, keys: &[RouterKey], depth: usize, now: Instant) {
        let depth = depth.min(keys.len());
        if depth < self.settings.min_blocks {
            return;
        }
        let key = keys[depth - 1];
        if let Some(e) = self.entries.get_mut(&key) {
            e.last = e.last.max(now);
            return;
        }
        // A longer resident prefix through this one (its last blocks evicted where this
        // request looked): that one stays, and this one is counted in it.
        for k in &keys[depth..] {
            if let Some(e) = self.entries.get_mut(k) {
                e.last = e.last.max(now);
                return;
            }
        }
        if self.entries.len() >= self.settings.max_entries {
            self.shrink(now);
        }
        // The shorter resident prefixes this one extends are counted in it.
        for k in &keys[self.settings.min_blocks - 1..depth - 1] {
            self.entries.remove(k);
        }
        self.entries.insert(
            key,
            Entry {
                blocks: depth as u64,
                last: now,
            },
        );
    }

    /// Recounts each pod's resident blocks from `index` now (prefixes not requested within
    /// the horizon forgotten first): [`Resident::to_count`], [`tally`] and
    /// [`Resident::set_counts`] with the table held throughout (tests; the proxy recounts in
    /// the background, the table held only to copy and to install:
    /// `crate::proxy::recount_loop`).
    #[cfg(test)]
    pub fn count(&mut self, index: &KvIndex, now: Instant) {
        let prefixes = self.to_count(now);
        self.set_counts(tally(index, &prefixes));
    }

    /// The prefixes to recount, each its last block's key and its length: those requested
    /// within the horizon (the others are forgotten here). A copy, so the recount itself
    /// ([`tally`]) runs without the table.
    pub fn to_count(&mut self, now: Instant) -> Vec<(RouterKey, u64)> {
        self.expire(now);
        self.entries.iter().map(|(k, e)| (*k, e.blocks)).collect()
    }

    /// Installs each pod's resident blocks ([`tally`]).
    pub fn set_counts(&mut self, counts: PodBlocks) {
        self.pods = counts;
    }

    fn expire(&mut self, now: Instant) {
        let horizon = self.settings.horizon;
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.last) < horizon);
    }

    /// Full: the expired go, then, if still at least three quarters full, the older half.
    fn shrink(&mut self, now: Instant) {
        self.expire(now);
        if self.entries.len() * 4 < self.settings.max_entries * 3 {
            return;
        }
        let mut ages: Vec<(Instant, RouterKey)> =
            self.entries.iter().map(|(k, e)| (e.last, *k)).collect();
        let mid = ages.len() / 2;
        ages.select_nth_unstable_by_key(mid, |(last, _)| *last);
        for (_, k) in &ages[..mid] {
            self.entries.remove(k);
        }
    }
}

impl super::KvRoom {
    /// Blocks of other resident prefixes ([`Resident`]) a request would evict there, holding
    /// `matched` of its `total` prompt blocks: what its prompt and output add, beyond the
    /// room the pod's resident prefixes and requests in flight leave, at most those other
    /// prefixes' blocks. Each would be prefilled again when its prefix is next requested.
    ///
    /// ```text
    /// adds    = total - matched + output
    /// evicted = min(max(resident, pinned) + adds - capacity, adds, resident - matched)
    /// ```
    ///
    /// The blocks in flight and the resident ones overlap (a running request pins its
    /// document), so the larger of the two is what the pod keeps.
    pub fn evicted(&self, matched: u64, total: u64) -> u64 {
        let adds = total.saturating_sub(matched).saturating_add(self.output);
        let over = self
            .resident
            .max(self.pinned)
            .saturating_add(adds)
            .saturating_sub(self.capacity);
        over.min(adds).min(self.resident.saturating_sub(matched))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_index::{IndexConfig, SourceInfo};

    /// A document of `doc_blocks` blocks, then `tail` blocks of one question.
    fn prompt(doc: u64, doc_blocks: u64, question: u64, tail: u64) -> Vec<RouterKey> {
        (0..doc_blocks)
            .map(|i| RouterKey(doc * 1_000_000 + i))
            .chain((0..tail).map(|i| RouterKey(doc * 1_000_000 + 500_000 + question * 100 + i)))
            .collect()
    }

    fn index(pods: usize) -> (KvIndex, Vec<SourceId>) {
        let index = KvIndex::new(IndexConfig::default());
        let ids = (0..pods)
            .map(|i| {
                index.add_source(SourceInfo {
                    pod: format!("pod-{i}"),
                    rank: None,
                })
            })
            .collect();
        (index, ids)
    }

    /// Counted now.
    fn counts(r: &mut Resident, index: &KvIndex, ids: &[SourceId], at: Instant) -> Vec<u64> {
        r.count(index, at);
        ids.iter().map(|&s| r.blocks(s)).collect()
    }

    #[test]
    fn a_reused_prefix_counts_on_the_pods_holding_it_until_one_loses_it() {
        let (index, ids) = index(3);
        let mut r = Resident::default();
        let t0 = Instant::now();
        // Document 1 (100 blocks): its first request, cold, went to pod 0; nothing is reused.
        let first = prompt(1, 100, 0, 8);
        let held = index.speculate(ids[0], &first, t0);
        assert_eq!(counts(&mut r, &index, &ids, t0), [0, 0, 0]);
        // Its second request reused the 100 on pod 0; a copy went to pod 2. Until the next
        // recount the pods' counts stay as they were.
        r.reused(&prompt(1, 100, 1, 8), 100, t0);
        index.speculate(ids[2], &prompt(1, 100, 1, 8), t0);
        assert_eq!(
            ids.iter().map(|&s| r.blocks(s)).collect::<Vec<_>>(),
            [0, 0, 0]
        );
        let t1 = t0 + REFRESH;
        assert_eq!(counts(&mut r, &index, &ids, t1), [100, 0, 100]);
        // A second document, 60 blocks, reused on pod 2: 160 there.
        let doc2 = prompt(2, 60, 0, 8);
        index.speculate(ids[2], &doc2, t1);
        r.reused(&prompt(2, 60, 1, 8), 60, t1);
        let t2 = t1 + REFRESH;
        assert_eq!(counts(&mut r, &index, &ids, t2), [100, 0, 160]);
        // Pod 0 lost document 1 (its blocks withdrawn from the index): not counted there.
        index.withdraw(held.expect("new blocks"));
        let t3 = t2 + REFRESH;
        assert_eq!(counts(&mut r, &index, &ids, t3), [0, 0, 160]);
        // Reused under 4 blocks: not resident.
        r.reused(&prompt(3, 100, 0, 8), 3, t3);
        assert_eq!(r.tracked(), 2);
    }

    #[test]
    fn a_conversations_next_turn_replaces_its_last() {
        let (index, ids) = index(1);
        let mut r = Resident::default();
        let t0 = Instant::now();
        // Turn 2 reused turn 1's 20 blocks; turn 3 reuses turn 2's 35. Pod 0 holds all 50.
        let turn3: Vec<RouterKey> = (0..50).map(RouterKey).collect();
        index.speculate(ids[0], &turn3, t0);
        r.reused(&turn3[..30], 20, t0);
        r.reused(&turn3, 35, t0);
        assert_eq!(
            counts(&mut r, &index, &ids, t0),
            [35],
            "counted once, the longer"
        );
        assert_eq!(r.tracked(), 1);
        // A request finding only 25 of them (the last 10 evicted where it looked) adds no
        // shorter prefix: the 35 stay resident where they are held.
        r.reused(&turn3, 25, t0);
        let t1 = t0 + REFRESH;
        assert_eq!(counts(&mut r, &index, &ids, t1), [35]);
        assert_eq!(r.tracked(), 1);
    }

    #[test]
    fn a_prefix_not_requested_within_the_horizon_is_forgotten() {
        let (index, ids) = index(1);
        let mut r = Resident::default();
        let t0 = Instant::now();
        index.speculate(ids[0], &prompt(1, 100, 0, 8), t0);
        index.speculate(ids[0], &prompt(2, 50, 0, 8), t0);
        r.reused(&prompt(1, 100, 1, 8), 100, t0);
        r.reused(&prompt(2, 50, 1, 8), 50, t0 + Duration::from_secs(30));
        // At 60 s document 1 is a minute old: gone; document 2 stays until 90 s. (The
        // index's speculative entries outlive this test's clock.)
        let t60 = t0 + Duration::from_secs(60);
        assert_eq!(counts(&mut r, &index, &ids, t60), [50]);
        let t90 = t0 + Duration::from_secs(90);
        assert_eq!(counts(&mut r, &index, &ids, t90), [0]);
        assert_eq!(r.tracked(), 0);
    }

    #[test]
    fn the_table_is_bounded_and_keeps_the_newest_when_full() {
        let mut r = Resident::new(Settings {
            max_entries: 8,
            ..Settings::default()
        });
        let t0 = Instant::now();
        for doc in 0..20u64 {
            r.reused(&prompt(doc, 10, 0, 2), 10, t0 + Duration::from_millis(doc));
            assert!(r.tracked() <= 8, "{} tracked", r.tracked());
        }
        // The newest document is among them: reused again, it adds no entry.
        let before = r.tracked();
        r.reused(&prompt(19, 10, 1, 2), 10, t0 + Duration::from_millis(20));
        assert_eq!(r.tracked(), before);
    }
}
