//! The client-affinity learner: which pods answered each intercepted client (its cgroup and
//! the Service address it dialled) recently. The kernel-table writer turns it into the
//! fail-open and steer entries (docs/ebpf.md "Fail-open"), so a client whose prefixes live on
//! a pod keeps reaching that pod when the agent is gone.
//!
//! The algorithm and its settings:
//!
//! - One entry per (cgroup id, VIP), holding the pool its requests went to and at most
//!   `per_client` pods with a count of answered requests each, most answered first (ties
//!   keep the pod that got there first ahead).
//! - A pod not yet in a full entry replaces the entry's least answered pod.
//! - Decay: when a pod's count reaches [`DECAY_AT`], every count of that entry is halved and
//!   pods at zero are dropped, so a client that moved to other pods follows them within about
//!   `DECAY_AT / 2` requests instead of after as many as it ever sent to the old ones.
//! - A request to another pool than the entry's starts the entry afresh (the old pool's pods
//!   are no backends of the new one).
//! - Bounded: least recently recorded clients are evicted beyond `max_clients` (at most the
//!   kernel map's capacity, [`warmpath_common::AFFINITY_CAPACITY`]). Entries are sharded by
//!   key for lock cost, and the bound is kept per shard: each of `n` shards holds at most
//!   `max_clients / n` clients, so eviction is least-recently-used within a shard.
//! - Only pods with an IP address are learned: fail-open and steering rewrite a connect() to
//!   an address, so endpoints given as host names are skipped by the caller (Kubernetes pods
//!   always have IPs).
//!
//! [`ClientPods::record`] runs once per answered request on an intercepted connection and
//! holds one shard's mutex for O(`per_client`) work; [`ClientPods::snapshot`] and
//! [`ClientPods::forget_pod`] walk every shard and are for the table writer, not the data
//! path.

use std::{hash::BuildHasher, net::SocketAddr, num::NonZeroUsize, sync::Arc, time::Instant};

use lru::LruCache;
use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::telemetry::PoolId;

/// A pod's count at which its entry's counts are halved: small enough that a client that
/// moved follows its new pods within a few requests, large enough to rank a handful of pods.
pub const DECAY_AT: u32 = 16;

/// Pods kept per client by default: as many as a kernel affinity entry holds
/// ([`warmpath_common::BACKENDS_MAX`]).
pub const DEFAULT_PER_CLIENT: usize = warmpath_common::BACKENDS_MAX;

/// Clients kept by default: as many as the kernel affinity map holds.
pub const DEFAULT_MAX_CLIENTS: usize = warmpath_common::AFFINITY_CAPACITY as usize;

/// At most this many shards ...
const MAX_SHARDS: usize = 16;
/// ... of at least this many clients each (smaller learners have one shard, so their bound is
/// exact).
const MIN_PER_SHARD: usize = 1024;

/// Which pods served each intercepted client (cgroup id, VIP) recently; bounded.
pub struct ClientPods {
    shards: Box<[Mutex<LruCache<Key, Learned>>]>,
    per_client: usize,
    hasher: foldhash::fast::FixedState,
}

/// One client as the table writer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientEntry {
    pub cgroup_id: u64,
    pub vip: SocketAddr,
    /// The pool its requests went to.
    pub pool: PoolId,
    /// Pods that answered its requests, most requests first, at most `per_client`.
    pub pods: Vec<(SocketAddr, u32)>,
    /// When a request of this client was last recorded.
    pub last: Instant,
}

type Key = (u64, SocketAddr);

/// One client's learned pods.
#[derive(Debug)]
struct Learned {
    pool: PoolId,
    pods: SmallVec<[(SocketAddr, u32); DEFAULT_PER_CLIENT]>,
    last: Instant,
}

// === impl ClientPods ===

impl ClientPods {
    /// A learner of at most `max_clients` clients (at least one) and `per_client` pods per
    /// client (at least one).
    pub fn new(max_clients: usize, per_client: usize) -> Self {
        let max_clients = max_clients.max(1);
        let shards = (max_clients / MIN_PER_SHARD).clamp(1, MAX_SHARDS);
        let per_shard = NonZeroUsize::new(max_clients / shards).unwrap_or(NonZeroUsize::MIN);
        Self {
            // Sparse: nothing is allocated for clients that never come (most agents).
            shards: (0..shards)
                .map(|_| Mutex::new(LruCache::sparse(per_shard)))
                .collect(),
            per_client: per_client.max(1),
            hasher: foldhash::fast::FixedState::default(),
        }
    }

    /// Counts one request of client (`cgroup_id`, `vip`) to `pool` answered by `pod`, at `at`.
    pub fn record(
        &self,
        cgroup_id: u64,
        vip: SocketAddr,
        pool: PoolId,
        pod: SocketAddr,
        at: Instant,
    ) {
        let key = (cgroup_id, vip);
        let mut shard = self.shard(&key).lock();
        let learned = shard.get_or_insert_mut(key, || Learned {
            pool,
            pods: SmallVec::new(),
            last: at,
        });
        if learned.pool != pool {
            learned.pool = pool;
            learned.pods.clear();
        }
        learned.last = learned.last.max(at);
        learned.count(pod, self.per_client);
    }

    /// Entries recorded since `since` (all when `None`), ordered by cgroup id then VIP.
    pub fn snapshot(&self, since: Option<Instant>) -> Vec<ClientEntry> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            out.extend(
                shard
                    .iter()
                    .filter(|(_, l)| since.is_none_or(|s| l.last >= s))
                    .map(|(&(cgroup_id, vip), l)| ClientEntry {
                        cgroup_id,
                        vip,
                        pool: l.pool,
                        pods: l.pods.to_vec(),
                        last: l.last,
                    }),
            );
        }
        out.sort_unstable_by_key(|e| (e.cgroup_id, e.vip));
        out
    }

    /// Drops a pod that left its pool from every entry; entries left without pods are
    /// removed.
    pub fn forget_pod(&self, pod: SocketAddr) {
        for shard in self.shards.iter() {
            shard.lock().retain(|_, l| {
                l.pods.retain(|(p, _)| *p != pod);
                !l.pods.is_empty()
            });
        }
    }

    /// Clients held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// No client held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most clients held.
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.lock().cap().get()).sum()
    }

    fn shard(&self, key: &Key) -> &Mutex<LruCache<Key, Learned>> {
        // The modulo keeps the index below `shards.len()`, which `new` makes at least one.
        let i = (self.hasher.hash_one(key) % self.shards.len() as u64) as usize;
        &self.shards[i]
    }
}

impl Default for ClientPods {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_CLIENTS, DEFAULT_PER_CLIENT)
    }
}

impl std::fmt::Debug for ClientPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientPods")
            .field("shards", &self.shards.len())
            .field("per_client", &self.per_client)
            .finish_non_exhaustive()
    }
}

/// An intercepted client a request came from, and the learner its answer goes to (carried
/// by the request's [`super::record::Attempt`]).
#[derive(Debug, Clone)]
pub struct Learning {
    clients: Arc<ClientPods>,
    cgroup_id: u64,
    vip: SocketAddr,
}

impl Learning {
    pub fn new(clients: &Arc<ClientPods>, cgroup_id: u64, vip: SocketAddr) -> Self {
        Self {
            clients: clients.clone(),
            cgroup_id,
            vip,
        }
    }

    /// The request was answered by the pod at `authority` (`ip:port`; a host name is
    /// skipped: the kernel table needs addresses).
    pub fn answered(&self, pool: PoolId, authority: &str, at: Instant) {
        if let Ok(pod) = authority.parse::<SocketAddr>() {
            self.clients.record(self.cgroup_id, self.vip, pool, pod, at);
        }
    }
}

// === impl Learned ===

impl Learned {
    /// One more request answered by `pod`; keeps `pods` ordered, at most `per_client` long,
    /// and decayed.
    fn count(&mut self, pod: SocketAddr, per_client: usize) {
        let mut i = match self.pods.iter().position(|(p, _)| *p == pod) {
            Some(i) => {
                self.pods[i].1 = self.pods[i].1.saturating_add(1);
                i
            }
            None => {
                if self.pods.len() >= per_client {
                    self.pods.truncate(per_client - 1);
                }
                self.pods.push((pod, 1));
                self.pods.len() - 1
            }
        };
        while i > 0 && self.pods[i].1 > self.pods[i - 1].1 {
            self.pods.swap(i, i - 1);
            i -= 1;
        }
        if self.pods[0].1 >= DECAY_AT {
            for (_, n) in &mut self.pods {
                *n /= 2;
            }
            self.pods.retain(|(_, n)| *n > 0);
        }
    }
}

#[cfg(test)]
mod tests;
