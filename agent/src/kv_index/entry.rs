//! One index entry: the holders of a router key, packed into 12 bytes.
//!
//! A holder is a `u32`: source id (bits 0..24), tier (24..27), speculative flag (bit 27).
//! Two holders live inline; from three on, all but the first spill into a per-shard slab.
//! Most keys are held by one or two pods, so most entries never allocate.

use std::sync::atomic::{AtomicU32, Ordering};

use super::Tier;

const EMPTY: u32 = u32::MAX;
const SOURCE_MASK: u32 = 0x00ff_ffff;
const TIER_SHIFT: u32 = 24;
const SPEC_BIT: u32 = 1 << 27;
/// Marks `Entry::b` as a spill list index (holders never set bit 31).
const SPILL: u32 = 1 << 31;

/// Largest source id a holder can carry.
pub const MAX_SOURCES: u32 = SOURCE_MASK;

/// A (source, tier, speculative) triple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder(u32);

impl Holder {
    pub fn new(source: u32, tier: Tier, speculative: bool) -> Self {
        debug_assert!(source <= SOURCE_MASK);
        Self(
            (source & SOURCE_MASK)
                | ((tier as u32) << TIER_SHIFT)
                | if speculative { SPEC_BIT } else { 0 },
        )
    }

    pub fn source(self) -> u32 {
        self.0 & SOURCE_MASK
    }

    pub fn tier(self) -> Tier {
        Tier::from_index(self.tier_bits() as u8)
    }

    /// The raw tier field (0..8), for tables indexed by tier.
    #[inline]
    pub fn tier_bits(self) -> usize {
        ((self.0 >> TIER_SHIFT) & 0x7) as usize
    }

    pub fn speculative(self) -> bool {
        self.0 & SPEC_BIT != 0
    }

    fn same_slot(self, source: u32, tier: Tier) -> bool {
        self.source() == source && self.tier() == tier
    }
}

/// Spilled holder lists of one shard.
#[derive(Debug, Default)]
pub struct Spill {
    lists: Vec<Vec<Holder>>,
    free: Vec<u32>,
}

impl Spill {
    fn alloc(&mut self) -> u32 {
        match self.free.pop() {
            Some(i) => i,
            None => {
                self.lists.push(Vec::new());
                (self.lists.len() - 1) as u32
            }
        }
    }

    fn release(&mut self, i: u32) {
        self.lists[i as usize] = Vec::new();
        self.free.push(i);
    }

    /// Bytes held by spilled lists (for memory accounting).
    pub fn bytes(&self) -> usize {
        self.lists.capacity() * std::mem::size_of::<Vec<Holder>>()
            + self.lists.iter().map(|l| l.capacity() * 4).sum::<usize>()
            + self.free.capacity() * 4
    }
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    /// A new (source, tier) holder.
    New,
    /// A real store confirmed a speculative holder.
    Confirmed,
    /// Nothing changed.
    Existing,
}

/// The holders of one key plus its last-touched epoch (for LRU eviction).
///
/// `a` holds a holder or `EMPTY`; `b` holds a second holder, `EMPTY`, or `SPILL | i`: the
/// index of a spill list with the second and later holders (at least two of them).
/// Invariant: `a` is only `EMPTY` when `b` is too.
#[derive(Debug)]
pub struct Entry {
    a: u32,
    b: u32,
    epoch: AtomicU32,
}

impl Default for Entry {
    fn default() -> Self {
        Self::new(0)
    }
}

#[inline]
fn is_spill(b: u32) -> bool {
    b != EMPTY && b & SPILL != 0
}

#[inline]
fn spill_index(b: u32) -> usize {
    (b & !SPILL) as usize
}

impl Entry {
    pub fn new(epoch: u32) -> Self {
        Self {
            a: EMPTY,
            b: EMPTY,
            epoch: AtomicU32::new(epoch),
        }
    }

    pub fn touch(&self, epoch: u32) {
        if self.epoch.load(Ordering::Relaxed) != epoch {
            self.epoch.store(epoch, Ordering::Relaxed);
        }
    }

    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Calls `f` for every holder.
    pub fn for_each(&self, spill: &Spill, mut f: impl FnMut(Holder)) {
        if self.a != EMPTY {
            f(Holder(self.a));
        }
        if is_spill(self.b) {
            spill.lists[spill_index(self.b)].iter().copied().for_each(f);
        } else if self.b != EMPTY {
            f(Holder(self.b));
        }
    }

    /// The best tier weight at which `source` holds this key, if it does.
    #[inline(always)]
    pub fn best_weight(&self, spill: &Spill, source: u32, weights: &[f64; 8]) -> Option<f64> {
        // The common case: `source` is the only holder.
        if self.b == EMPTY {
            let a = Holder(self.a);
            return (self.a != EMPTY && a.source() == source).then(|| weights[a.tier_bits()]);
        }
        let mut best: Option<f64> = None;
        let mut see = |h: u32| {
            if h != EMPTY && Holder(h).source() == source {
                let w = weights[Holder(h).tier_bits()];
                best = Some(best.map_or(w, |b| b.max(w)));
            }
        };
        see(self.a);
        if is_spill(self.b) {
            spill.lists[spill_index(self.b)]
                .iter()
                .for_each(|h| see(h.0));
        } else {
            see(self.b);
        }
        best
    }

    pub fn is_empty(&self) -> bool {
        self.a == EMPTY
    }

    /// Adds or updates the holder for (source, tier).
    pub fn upsert(&mut self, spill: &mut Spill, h: Holder) -> Upsert {
        let (source, tier) = (h.source(), h.tier());
        // A real store confirms a speculative entry; speculation never downgrades one.
        let update = |slot: &mut u32| {
            let was_spec = Holder(*slot).speculative();
            if !h.speculative() {
                *slot = h.0;
            }
            if was_spec && !h.speculative() {
                Upsert::Confirmed
            } else {
                Upsert::Existing
            }
        };
        if self.a != EMPTY && Holder(self.a).same_slot(source, tier) {
            return update(&mut self.a);
        }
        if is_spill(self.b) {
            let list = &mut spill.lists[spill_index(self.b)];
            if let Some(existing) = list.iter_mut().find(|x| x.same_slot(source, tier)) {
                return update(&mut existing.0);
            }
            list.push(h);
        } else if self.b != EMPTY {
            if Holder(self.b).same_slot(source, tier) {
                return update(&mut self.b);
            }
            let i = spill.alloc();
            spill.lists[i as usize].extend([Holder(self.b), h]);
            self.b = SPILL | i;
        } else if self.a == EMPTY {
            self.a = h.0;
        } else {
            self.b = h.0;
        }
        Upsert::New
    }

    /// Removes the holder for (source, tier) if `only_speculative` is false or it is
    /// speculative. Returns whether one was removed.
    pub fn remove(
        &mut self,
        spill: &mut Spill,
        source: u32,
        tier: Tier,
        only_speculative: bool,
    ) -> bool {
        let matches =
            |h: Holder| h.same_slot(source, tier) && (!only_speculative || h.speculative());
        if self.a != EMPTY && matches(Holder(self.a)) {
            // Refill `a` from `b` (or the spill list) to keep the invariant.
            if is_spill(self.b) {
                let list = &mut spill.lists[spill_index(self.b)];
                self.a = list
                    .pop()
                    .expect("a spill list holds at least two holders")
                    .0;
                self.unspill_if_single(spill);
            } else {
                self.a = self.b;
                self.b = EMPTY;
            }
            return true;
        }
        if is_spill(self.b) {
            let list = &mut spill.lists[spill_index(self.b)];
            if let Some(i) = list.iter().position(|h| matches(*h)) {
                list.swap_remove(i);
                self.unspill_if_single(spill);
                return true;
            }
        } else if self.b != EMPTY && matches(Holder(self.b)) {
            self.b = EMPTY;
            return true;
        }
        false
    }

    /// A spill list down to one holder goes back inline.
    fn unspill_if_single(&mut self, spill: &mut Spill) {
        let i = spill_index(self.b);
        if let [h] = spill.lists[i][..] {
            spill.release(i as u32);
            self.b = h.0;
        }
    }

    /// Drops every holder (eviction); returns how many there were.
    pub fn clear(&mut self, spill: &mut Spill) -> usize {
        let mut n = usize::from(self.a != EMPTY);
        if is_spill(self.b) {
            n += spill.lists[spill_index(self.b)].len();
            spill.release(self.b & !SPILL);
        } else {
            n += usize::from(self.b != EMPTY);
        }
        self.a = EMPTY;
        self.b = EMPTY;
        n
    }
}

const _: () = assert!(std::mem::size_of::<Entry>() == 12);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_then_spill_then_back() {
        let mut spill = Spill::default();
        let mut e = Entry::new(0);
        for s in 0..5 {
            assert_eq!(
                e.upsert(&mut spill, Holder::new(s, Tier::Gpu, false)),
                Upsert::New
            );
        }
        assert_eq!(
            e.upsert(&mut spill, Holder::new(3, Tier::Gpu, true)),
            Upsert::Existing
        );
        assert_eq!(
            e.upsert(&mut spill, Holder::new(3, Tier::Cpu, false)),
            Upsert::New,
            "other tier is another slot"
        );
        let mut seen = Vec::new();
        e.for_each(&spill, |h| seen.push((h.source(), h.tier())));
        assert_eq!(seen.len(), 6);
        for s in 0..5 {
            assert!(e.remove(&mut spill, s, Tier::Gpu, false));
        }
        assert!(!e.remove(&mut spill, 3, Tier::Gpu, false));
        assert!(!e.is_empty());
        assert!(e.remove(&mut spill, 3, Tier::Cpu, false));
        assert!(e.is_empty());
        assert_eq!(spill.free.len(), spill.lists.len(), "spill list released");
    }

    #[test]
    fn speculation_is_confirmed_by_a_real_store_and_never_downgrades() {
        let mut spill = Spill::default();
        let mut e = Entry::new(0);
        e.upsert(&mut spill, Holder::new(1, Tier::Gpu, true));
        assert!(
            e.remove(&mut spill, 1, Tier::Gpu, true),
            "unconfirmed speculation expires"
        );
        e.upsert(&mut spill, Holder::new(1, Tier::Gpu, true));
        assert_eq!(
            e.upsert(&mut spill, Holder::new(1, Tier::Gpu, false)),
            Upsert::Confirmed
        );
        assert!(
            !e.remove(&mut spill, 1, Tier::Gpu, true),
            "confirmed: expiry must not remove it"
        );
        e.upsert(&mut spill, Holder::new(1, Tier::Gpu, true));
        let mut spec = None;
        e.for_each(&spill, |h| spec = Some(h.speculative()));
        assert_eq!(spec, Some(false));
        assert_eq!(e.clear(&mut spill), 1);
    }
}
