//! The admission wait queue's order: strict priority, then start-time fair queueing among
//! the tenants of a priority, first come first served within a tenant. Pure data: the
//! caller ([`super::Admission`]) holds it under a lock and hands each popped waiter its
//! slot.
//!
//! The algorithm (Goyal et al., "Start-time fair queueing", 1996), per priority level:
//!
//! - The level has a virtual time `v`: the start tag of the waiter granted last.
//! - A waiter of tenant `t` arriving gets start tag `S = max(v, F_t)`, where `F_t` is the
//!   finish tag of `t`'s previous waiter, and finish tag `F_t = S + 1 / weight_t`.
//! - The next slot goes to the waiter with the highest priority, then the smallest start
//!   tag, then the earliest arrival.
//!
//! So within a level each backlogged tenant is granted slots in proportion to its weight,
//! within one request of its share over any interval; a tenant that was idle starts at
//! `v`, banking no credit for the time it sent nothing. A higher priority always goes first,
//! so sustained overload at one priority starves the ones below it (by design: that is
//! what priority means here). A level whose last waiter leaves is forgotten (its clock
//! restarts at 0), so virtual times stay small.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, HashMap},
};

/// The fixed-point unit of virtual time: one grant at weight 1.
const UNIT: u64 = 1 << 20;
/// Tenants remembered per level (or twice its waiters, if more) before those without a
/// waiter are forgotten: first the ones whose finish tags have passed (no loss: they would
/// start at the virtual time anyway), then, if that was not enough, all of them (costing
/// each at most one request of credit). Pruning thus runs at most once per this many
/// arrivals.
const FLOWS_SOFT_LIMIT: usize = 1024;

/// Who is waiting, for the order of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    /// Any stable small id of the tenant (telemetry's tenant id, for instance).
    pub tenant: u32,
    /// Higher is served first.
    pub priority: i32,
    /// Share among tenants of the same priority (0 counts as 1).
    pub weight: u32,
}

impl Default for Class {
    /// Priority 0, weight 1, tenant 0: one FIFO queue when every request has it.
    fn default() -> Self {
        Self {
            tenant: 0,
            priority: 0,
            weight: 1,
        }
    }
}

/// A waiter's place: priority (highest first), start tag, arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    priority: Reverse<i32>,
    start: u64,
    seq: u64,
}

#[derive(Debug)]
struct Entry<T> {
    tenant: u32,
    finish: u64,
    value: T,
}

#[derive(Debug, Default)]
struct Level {
    vtime: u64,
    waiting: usize,
    flows: HashMap<u32, Flow>,
}

/// A tenant's state at one level.
#[derive(Debug, Clone, Copy, Default)]
struct Flow {
    finish: u64,
    waiting: usize,
}

/// Waiters in grant order.
#[derive(Debug)]
pub struct FairQueue<T> {
    waiters: BTreeMap<Key, Entry<T>>,
    levels: HashMap<i32, Level>,
    seq: u64,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            waiters: BTreeMap::new(),
            levels: HashMap::new(),
            seq: 0,
        }
    }
}

impl<T> FairQueue<T> {
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiters.len()
    }

    /// Queues `value` for `class`; the key removes it again.
    pub fn push(&mut self, class: Class, value: T) -> Key {
        let level = self.levels.entry(class.priority).or_default();
        if level.flows.len() >= FLOWS_SOFT_LIMIT.max(2 * level.waiting) {
            level.prune();
        }
        let vtime = level.vtime;
        let flow = level.flows.entry(class.tenant).or_default();
        let start = vtime.max(flow.finish);
        let finish = start.saturating_add((UNIT / u64::from(class.weight.max(1))).max(1));
        flow.finish = finish;
        flow.waiting += 1;
        level.waiting += 1;
        let key = Key {
            priority: Reverse(class.priority),
            start,
            seq: self.seq,
        };
        self.seq = self.seq.wrapping_add(1);
        self.waiters.insert(
            key,
            Entry {
                tenant: class.tenant,
                finish,
                value,
            },
        );
        key
    }

    /// The next waiter to grant a slot to.
    #[cfg(test)]
    pub fn pop(&mut self) -> Option<T> {
        self.pop_where(|_| true)
    }

    /// The next waiter to grant a slot to among those `eligible` says may start (the
    /// cluster gate's caps: a tenant at its cap is passed over, keeping its place). Scans
    /// past the ineligible ones: at most every waiter.
    pub fn pop_where(&mut self, mut eligible: impl FnMut(&T) -> bool) -> Option<T> {
        let key = *self
            .waiters
            .iter()
            .find(|(_, e)| eligible(&e.value))
            .map(|(k, _)| k)?;
        let entry = self.waiters.remove(&key)?;
        if let Some(level) = self.levels.get_mut(&key.priority.0) {
            level.vtime = level.vtime.max(key.start);
        }
        self.left(key, &entry, false);
        Some(entry.value)
    }

    /// Takes a waiter out (it gave up); `None` when it was granted already. When it was its
    /// tenant's last waiter, the tenant's finish tag goes back to its start: a request
    /// that was never served is not charged to its tenant.
    pub fn remove(&mut self, key: Key) -> Option<T> {
        let entry = self.waiters.remove(&key)?;
        self.left(key, &entry, true);
        Some(entry.value)
    }

    fn left(&mut self, key: Key, entry: &Entry<T>, unserved: bool) {
        let priority = key.priority.0;
        let Some(level) = self.levels.get_mut(&priority) else {
            return;
        };
        level.waiting = level.waiting.saturating_sub(1);
        if level.waiting == 0 {
            self.levels.remove(&priority);
            return;
        }
        if let Some(flow) = level.flows.get_mut(&entry.tenant) {
            flow.waiting = flow.waiting.saturating_sub(1);
            if unserved && flow.finish == entry.finish {
                flow.finish = key.start;
            }
            if flow.waiting == 0 && flow.finish <= level.vtime {
                level.flows.remove(&entry.tenant);
            }
        }
    }

    #[cfg(test)]
    fn flows(&self) -> usize {
        self.levels.values().map(|l| l.flows.len()).sum()
    }
}

impl Level {
    /// Forgets tenants without a waiter ([`FLOWS_SOFT_LIMIT`]).
    fn prune(&mut self) {
        let vtime = self.vtime;
        self.flows.retain(|_, f| f.waiting > 0 || f.finish > vtime);
        if self.flows.len() >= FLOWS_SOFT_LIMIT.max(2 * self.waiting) / 2 {
            self.flows.retain(|_, f| f.waiting > 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn class(tenant: u32, priority: i32, weight: u32) -> Class {
        Class {
            tenant,
            priority,
            weight,
        }
    }

    fn drain(q: &mut FairQueue<u32>) -> Vec<u32> {
        std::iter::from_fn(|| q.pop()).collect()
    }

    #[test]
    fn backlogged_tenants_are_served_in_proportion_to_their_weights() {
        let mut q = FairQueue::default();
        for _ in 0..30 {
            q.push(class(1, 0, 3), 1);
            q.push(class(2, 0, 1), 2);
        }
        let order = drain(&mut q);
        // While both are backlogged (the first 40 grants: 30 of tenant 1 take 10 rounds of
        // 4), every window of 4 grants has 3 of tenant 1.
        for window in order[..40].chunks(4) {
            let ones = window.iter().filter(|&&t| t == 1).count();
            assert_eq!(ones, 3, "{order:?}");
        }
        assert!(order[40..].iter().all(|&t| t == 2));
    }

    #[test]
    fn a_higher_priority_goes_first_whatever_its_arrival() {
        let mut q = FairQueue::default();
        for i in 0..3 {
            q.push(class(i, 0, 1000), i);
        }
        q.push(class(9, 1, 1), 9);
        q.push(class(8, -1, 1000), 8);
        assert_eq!(drain(&mut q), [9, 0, 1, 2, 8]);
    }

    #[test]
    fn one_tenant_is_first_come_first_served() {
        let mut q = FairQueue::default();
        for i in 0..10 {
            q.push(class(7, 0, 5), i);
        }
        assert_eq!(drain(&mut q), (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn an_idle_tenant_banks_no_credit() {
        let mut q = FairQueue::default();
        // Tenant 1 alone for 20 grants, tenant 2 arriving only then: it is not owed 20.
        for _ in 0..30 {
            q.push(class(1, 0, 1), 1);
        }
        for _ in 0..20 {
            assert_eq!(q.pop(), Some(1));
        }
        for _ in 0..10 {
            q.push(class(2, 0, 1), 2);
        }
        let next: Vec<u32> = std::iter::from_fn(|| q.pop()).take(10).collect();
        let twos = next.iter().filter(|&&t| t == 2).count();
        assert!(
            (4..=6).contains(&twos),
            "alternating, not tenant 2 ten times: {next:?}"
        );
    }

    #[test]
    fn a_waiter_that_gives_up_costs_its_tenant_nothing() {
        let mut q = FairQueue::default();
        q.push(class(1, 0, 1), 10);
        let gone = q.push(class(2, 0, 1), 20);
        assert_eq!(q.remove(gone), Some(20));
        assert_eq!(q.remove(gone), None, "once");
        // Tenant 2's next waiter takes the place the first one left.
        q.push(class(2, 0, 1), 21);
        q.push(class(1, 0, 1), 11);
        assert_eq!(drain(&mut q), [10, 21, 11]);
        assert!(q.is_empty());
        assert_eq!(q.flows(), 0, "an empty queue remembers nothing");
    }

    #[test]
    fn tenants_remembered_stay_bounded() {
        let mut q = FairQueue::default();
        // 10,000 tenants pass through once each while the queue never empties (so the
        // level, and what it remembers, is never reset).
        for t in 0..10_000 {
            q.push(class(t, 0, 1), t);
            if q.len() > 1 {
                q.pop();
            }
            assert!(q.flows() <= FLOWS_SOFT_LIMIT, "{}", q.flows());
        }
        assert_eq!(q.len(), 1);
    }

    proptest! {
        /// The fairness bound of start-time fair queueing: while tenants `i` and `j` both
        /// have waiters, their grants normalised by weight differ by at most
        /// `1/w_i + 1/w_j` after every grant.
        #[test]
        fn backlogged_tenants_stay_within_one_request_of_their_shares(
            tenants in prop::collection::vec((1u32..20, 1usize..60), 2..6),
        ) {
            let mut q = FairQueue::default();
            let most = tenants.iter().map(|t| t.1).max().unwrap_or(0);
            // Arrivals interleaved (round robin over tenants), all before the first grant.
            for round in 0..most {
                for (t, &(weight, count)) in tenants.iter().enumerate() {
                    if round < count {
                        q.push(class(t as u32, 0, weight), t);
                    }
                }
            }
            let mut granted = vec![0usize; tenants.len()];
            while let Some(t) = q.pop() {
                granted[t] += 1;
                for i in 0..tenants.len() {
                    for j in 0..tenants.len() {
                        let backlogged = |k: usize| granted[k] < tenants[k].1;
                        if i == j || !backlogged(i) || !backlogged(j) {
                            continue;
                        }
                        let (wi, wj) = (f64::from(tenants[i].0), f64::from(tenants[j].0));
                        let gap = (granted[i] as f64 / wi - granted[j] as f64 / wj).abs();
                        prop_assert!(
                            gap <= 1.0 / wi + 1.0 / wj + 1e-3,
                            "tenants {:?}, granted {:?}", tenants, granted
                        );
                    }
                }
            }
        }
    }
}
