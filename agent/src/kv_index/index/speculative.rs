//! One source's speculative keys and when each expires, in memory bounded by the distinct
//! keys speculated (never by the requests that speculated them).
//!
//! Every key has its latest deadline in a map and exactly one record in a min-heap of
//! deadlines. Renewing a key only moves its deadline in the map; when its record comes due
//! and the key was renewed meanwhile, the record is pushed again at the key's latest
//! deadline, so a key expires exactly at its latest deadline. A key is speculated by every
//! request that routes its prefix, so one record per request (what this replaced) grew with
//! the request rate times the TTL: 300 s of every request's key chain for the routing history.
//! At most `cap` keys are pending; one more expires the earliest first.

use std::{cmp::Reverse, collections::BinaryHeap, time::Instant};

use crate::kv_index::store::FastMap;

/// Pending speculative keys of one source (router key values).
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Key -> its latest deadline. Every key here has one record in `due`.
    deadline: FastMap<Instant>,
    /// (deadline when pushed, key), earliest first.
    due: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Pending {
    /// Keys pending (each counted once, however often it was renewed).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.deadline.len()
    }

    /// Records that `key` is speculative until `deadline` (a later one than it had, or its
    /// first). With `cap` keys already pending, the earliest expires first: returned, for
    /// the caller to drop from the store.
    pub(super) fn renew(&mut self, key: u64, deadline: Instant, cap: usize) -> Option<u64> {
        if let Some(d) = self.deadline.get_mut(&key) {
            *d = (*d).max(deadline);
            return None;
        }
        let evicted = (self.deadline.len() >= cap.max(1))
            .then(|| self.due.pop())
            .flatten()
            .map(|Reverse((_, k))| {
                self.deadline.remove(&k);
                k
            });
        self.deadline.insert(key, deadline);
        self.due.push(Reverse((deadline, key)));
        evicted
    }

    /// Removes the keys whose latest deadline is at or before `now`, calling `expired` for
    /// each; keys renewed since their record was pushed are pushed again.
    pub(super) fn expire(&mut self, now: Instant, mut expired: impl FnMut(u64)) {
        while let Some(&Reverse((at, key))) = self.due.peek() {
            if at > now {
                break;
            }
            self.due.pop();
            match self.deadline.get(&key) {
                Some(&latest) if latest > now => self.due.push(Reverse((latest, key))),
                Some(_) => {
                    self.deadline.remove(&key);
                    expired(key);
                }
                None => {}
            }
        }
    }

    /// Every pending key, leaving none (their memory is given back).
    pub(super) fn take_all(&mut self) -> impl Iterator<Item = u64> {
        self.due = BinaryHeap::new();
        std::mem::take(&mut self.deadline).into_keys()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const TTL: Duration = Duration::from_secs(300);

    #[test]
    fn the_same_keys_renewed_by_many_requests_are_held_once() {
        let mut p = Pending::default();
        let t0 = Instant::now();
        // 10,000 requests routing the same 40-block chain, one per millisecond.
        for i in 0..10_000u64 {
            let deadline = t0 + Duration::from_millis(i) + TTL;
            for key in 0..40 {
                assert_eq!(p.renew(key, deadline, 1_000), None);
            }
        }
        assert_eq!((p.len(), p.due.len()), (40, 40));
        // Due at the first deadline, but renewed since: nothing expires, one record each.
        let mut gone = Vec::new();
        p.expire(t0 + TTL, |k| gone.push(k));
        assert!(gone.is_empty());
        assert_eq!((p.len(), p.due.len()), (40, 40));
        // At the latest deadline every key expires, and nothing is left.
        p.expire(t0 + Duration::from_millis(9_999) + TTL, |k| gone.push(k));
        gone.sort_unstable();
        assert_eq!(gone, (0..40).collect::<Vec<u64>>());
        assert_eq!((p.len(), p.due.len()), (0, 0));
    }

    #[test]
    fn distinct_keys_stay_at_the_cap_and_the_earliest_goes_first() {
        let mut p = Pending::default();
        let t0 = Instant::now();
        let mut evicted = Vec::new();
        for key in 0..10_000u64 {
            let deadline = t0 + Duration::from_millis(key) + TTL;
            evicted.extend(p.renew(key, deadline, 100));
            assert!(p.len() <= 100 && p.due.len() <= 100);
        }
        assert_eq!(p.len(), 100);
        assert_eq!(evicted, (0..9_900).collect::<Vec<u64>>());
        let mut left: Vec<u64> = p.take_all().collect();
        left.sort_unstable();
        assert_eq!(left, (9_900..10_000).collect::<Vec<u64>>());
        assert_eq!((p.len(), p.due.len()), (0, 0));
    }

    #[test]
    fn a_key_expires_at_its_latest_deadline_not_its_first() {
        let mut p = Pending::default();
        let t0 = Instant::now();
        p.renew(7, t0 + Duration::from_secs(2), 10);
        p.renew(7, t0 + Duration::from_secs(5), 10);
        // An older deadline does not shorten it.
        p.renew(7, t0 + Duration::from_secs(3), 10);
        let mut gone = Vec::new();
        p.expire(t0 + Duration::from_secs(4), |k| gone.push(k));
        assert!(gone.is_empty());
        p.expire(t0 + Duration::from_secs(5), |k| gone.push(k));
        assert_eq!(gone, vec![7]);
    }
}
