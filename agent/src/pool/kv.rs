//! A pod's KV accounting: the blocks its requests in flight hold or will hold ([`Pinned`]),
//! peers' placements among them ([`Lease`]), the prefill peers queued there ([`Drain`]),
//! and the room one request finds ([`Room`], [`Endpoint::kv_room`]).

use std::sync::atomic::Ordering;

use super::Endpoint;
use crate::kv_index::RouterKey;

/// The KV blocks a pod's in-flight requests (this proxy's) hold or will hold while they
/// run: their prompts' blocks, each counted once however many requests share it (a
/// vLLM block with several users is one block), and each request's expected output; in a
/// cluster, peers' placements too ([`Lease`]). Bounded by the requests in flight (each
/// holds its own key list) and [`MAX_LEASES`].
#[derive(Debug, Default)]
pub(super) struct Pinned {
    refs: std::collections::HashMap<RouterKey, u32, foldhash::fast::RandomState>,
    output_blocks: u64,
    /// Peer agents' placements here (a cluster): held until their expected end, or until
    /// the peers' load reports say fewer of their requests run here ([`Pinned::keep_leases`]),
    /// the first due first, at most [`MAX_LEASES`].
    leases: std::collections::VecDeque<Lease>,
}

/// A peer's request as this agent counts its KV: it does not see the request end, so it
/// holds its blocks for the pool's mean lifetime, unless a peer's load report of a request
/// ended there ends it first ([`Endpoint::set_peer_load`]).
#[derive(Debug)]
struct Lease {
    /// When the placement arrived.
    placed: std::time::Instant,
    until: std::time::Instant,
    keys: Vec<RouterKey>,
    output_blocks: u64,
}

/// Blocks of prefill queued at a pod by peer agents, which this agent does not see start or
/// end: each placement adds the blocks new to the pod, and the queue drains at the pod's
/// calibrated prefill rate (the last placement's), first placed first done, as the engine
/// works through its waiting prompts.
#[derive(Debug, Default)]
pub(super) struct Drain {
    blocks: f64,
    at: Option<std::time::Instant>,
    secs_per_block: f64,
}

impl Drain {
    /// Blocks still queued at `now`.
    fn left(&self, now: std::time::Instant) -> f64 {
        let Some(at) = self.at else { return 0.0 };
        if !(self.secs_per_block.is_finite() && self.secs_per_block > 0.0) {
            return 0.0;
        }
        let done = now.saturating_duration_since(at).as_secs_f64() / self.secs_per_block;
        (self.blocks - done).max(0.0)
    }
}

/// How long a peer's placement may come before the load report that counts its request: the
/// placement is sent as the peer decides and its load when the request has started (after
/// a publishing gap of a millisecond), each on its own queue and through one or two stream
/// hops, so a lease younger than this is never taken for an ended request
/// ([`Pinned::keep_leases`]).
pub const PLACEMENT_REPORT_LAG: std::time::Duration = std::time::Duration::from_millis(200);

/// Peer placements a pod's KV accounting holds at most (beyond it, the first to end goes).
pub const MAX_LEASES: usize = 256;
/// Peer prefill a pod's queue counts at most, blocks (1M tokens at block size 16): a bound
/// on the estimate, far above any real queue.
pub const MAX_PEER_PREFILL_BLOCKS: f64 = 65_536.0;
/// Prompt keys a lease keeps (16k tokens at block size 16): its blocks beyond them count as
/// its own, never shared, so a pod's leases keep at most 2 MiB of keys.
pub const MAX_LEASE_KEYS: usize = 1024;

impl Pinned {
    pub(super) fn hold(&mut self, keys: &[RouterKey], output_blocks: u64) {
        for k in keys {
            *self.refs.entry(*k).or_insert(0) += 1;
        }
        self.output_blocks = self.output_blocks.saturating_add(output_blocks);
    }

    /// Blocks held: the distinct prompt blocks and the outputs.
    pub(super) fn blocks(&self) -> u64 {
        (self.refs.len() as u64).saturating_add(self.output_blocks)
    }

    pub(super) fn release(&mut self, keys: &[RouterKey], output_blocks: u64) {
        for k in keys {
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.refs.entry(*k) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        self.output_blocks = self.output_blocks.saturating_sub(output_blocks);
    }

    /// The peers report `live` requests running here at `now`: keeps that many leases, those
    /// due last, plus the ones placed within [`PLACEMENT_REPORT_LAG`] (their requests may not
    /// be in the reports yet), and ends the others, the first due first — taken as the
    /// requests that ended (a report says how many run, not which). Returns whether any
    /// ended.
    pub(super) fn keep_leases(&mut self, live: usize, now: std::time::Instant) -> bool {
        let settled = |l: &Lease| now.saturating_duration_since(l.placed) >= PLACEMENT_REPORT_LAG;
        let young = self.leases.iter().filter(|l| !settled(l)).count();
        let mut excess = self.leases.len().saturating_sub(live.saturating_add(young));
        let ended = excess > 0;
        let mut i = 0;
        while excess > 0 && i < self.leases.len() {
            if settled(&self.leases[i]) {
                let l = self.leases.remove(i).expect("in range");
                self.release(&l.keys, l.output_blocks);
                excess -= 1;
            } else {
                i += 1;
            }
        }
        ended
    }

    /// Ends the leases due by `now` (and the oldest beyond [`MAX_LEASES`]).
    pub(super) fn expire(&mut self, now: std::time::Instant) {
        while let Some(l) = self.leases.front() {
            if l.until > now && self.leases.len() <= MAX_LEASES {
                break;
            }
            let l = self.leases.pop_front().expect("front exists");
            self.release(&l.keys, l.output_blocks);
        }
    }
}

/// A pod's KV room as one request sees it ([`Endpoint::kv_room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// The engine's KV cache, blocks.
    pub capacity: u64,
    /// Blocks its requests in flight hold or will: this proxy's, or the engine's own last
    /// report if that is more (other routers).
    pub pinned: u64,
    /// Blocks of the request's prompt already held by one of them (shared, not new).
    pub shared: u64,
}

impl Endpoint {
    /// The pod's KV room for a request of `keys` (chained: a held key means its whole
    /// prefix is held), or `None` when the engine's KV size is unknown.
    pub fn kv_room(&self, keys: &[RouterKey]) -> Option<Room> {
        let mut p = self.pinned.lock();
        p.expire(std::time::Instant::now());
        let capacity = self.kv_capacity_blocks.load(Ordering::Relaxed);
        if capacity == 0 {
            return None;
        }
        // The held keys of a chained prompt are a prefix of it: binary search.
        let shared = keys.partition_point(|k| p.refs.contains_key(k)) as u64;
        let own = p.blocks();
        drop(p);
        let reported = (self.kv_usage() * capacity as f64) as u64;
        Some(Room {
            capacity,
            pinned: own.max(reported),
            shared,
        })
    }

    /// A peer agent's request here will prefill `blocks` (new to the pod): queued behind the
    /// peers' prefill still left, drained at `secs_per_block` from `now`.
    /// A placement that adds no block leaves the queue as it is; a rate no calibration gives
    /// (0, NaN, infinite) keeps the queue's last rate, and with none queues nothing.
    pub fn queue_peer_prefill(&self, blocks: u64, secs_per_block: f64, now: std::time::Instant) {
        if blocks == 0 {
            return;
        }
        let mut d = self.peer_prefill.lock();
        let valid = |r: f64| r.is_finite() && r > 0.0;
        let rate = match (valid(secs_per_block), valid(d.secs_per_block)) {
            (true, _) => secs_per_block,
            (false, true) => d.secs_per_block,
            (false, false) => return,
        };
        let left = d.left(now);
        // The whole queue is bounded (a sum of placements, however many).
        d.blocks = (left + blocks as f64).min(MAX_PEER_PREFILL_BLOCKS);
        d.at = Some(now);
        d.secs_per_block = rate;
    }

    /// Blocks of peers' prefill still queued here at `now` (0 without a cluster).
    pub fn peer_prefill_blocks(&self, now: std::time::Instant) -> u64 {
        self.peer_prefill.lock().left(now).ceil() as u64
    }

    /// Peer agents' requests here that this agent counts as still running: their placements
    /// whose lease has not ended ([`Endpoint::lease`]; 0 without a cluster).
    pub fn peer_in_flight(&self) -> u32 {
        let mut p = self.pinned.lock();
        p.expire(std::time::Instant::now());
        u32::try_from(p.leases.len()).unwrap_or(u32::MAX)
    }

    /// A peer agent's placement of a request of `keys` here arrived at `placed`: its blocks
    /// and `output_blocks` count as held until `until` (this agent does not see it end), or
    /// until the peers' load reports end the lease first ([`Endpoint::set_peer_load`]).
    pub fn lease(
        &self,
        keys: &[RouterKey],
        output_blocks: u64,
        placed: std::time::Instant,
        until: std::time::Instant,
    ) {
        // Sent here by a peer: not idle.
        self.mark_busy_at(placed);
        let (keys, rest) = keys.split_at(keys.len().min(MAX_LEASE_KEYS));
        let output_blocks = output_blocks.saturating_add(rest.len() as u64);
        let mut p = self.pinned.lock();
        p.hold(keys, output_blocks);
        // Kept in order of `until` (nearly always the back: lifetimes change slowly).
        let at = p.leases.partition_point(|l| l.until <= until);
        p.leases.insert(
            at,
            Lease {
                placed,
                until,
                keys: keys.to_vec(),
                output_blocks,
            },
        );
        if p.leases.len() > MAX_LEASES {
            p.expire(std::time::Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::tests::one_pod;

    #[test]
    fn kv_room_counts_shared_prompt_blocks_once_and_frees_them_with_the_last_user() {
        let pool = one_pod();
        let e = pool.endpoints()[0].clone();
        let keys = |doc: u64, question: u64| -> Vec<RouterKey> {
            // 60 blocks of a document, then 4 of the request's own (chained keys: the
            // question's blocks are its own even after a shared document).
            (0..60)
                .map(|i| RouterKey(doc * 1000 + i))
                .chain((0..4).map(|i| RouterKey(doc * 1000 + 500 + question * 10 + i)))
                .collect()
        };
        assert_eq!(e.kv_room(&keys(1, 0)), None, "KV size not reported yet");
        e.set_kv_capacity(253);
        let empty = Room {
            capacity: 253,
            pinned: 0,
            shared: 0,
        };
        assert_eq!(e.kv_room(&keys(1, 0)), Some(empty));
        let a = e.start(64, &keys(1, 0), 4);
        let b = e.start(4, &keys(1, 1), 4);
        // The document once, two questions, two outputs: 60 + 4 + 4 + 4 + 4.
        let room = e.kv_room(&keys(1, 2)).expect("sized");
        assert_eq!((room.pinned, room.shared), (76, 60));
        let other = e.kv_room(&keys(2, 0)).expect("sized");
        assert_eq!((other.pinned, other.shared), (76, 0));
        drop(a);
        assert_eq!(
            e.kv_room(&keys(1, 2)).expect("sized").pinned,
            68,
            "b still holds the document"
        );
        drop(b);
        assert_eq!(e.kv_room(&keys(1, 2)), Some(empty));
        // A peer agent's placement holds its blocks until its expected end; one already
        // due holds nothing.
        let now = std::time::Instant::now();
        e.lease(
            &keys(1, 0),
            4,
            now,
            now + std::time::Duration::from_secs(3600),
        );
        e.lease(&keys(2, 0), 4, now, now);
        let room = e.kv_room(&keys(1, 2)).expect("sized");
        assert_eq!((room.pinned, room.shared), (68, 60));
        // The engine's own report wins when it says more (requests of other routers).
        e.set_engine_load(0, 3, 0.5);
        assert_eq!(e.kv_room(&keys(1, 2)).expect("sized").pinned, 126);
    }

    #[test]
    fn peer_leases_are_bounded_the_first_to_end_going_first() {
        let pool = one_pod();
        let e = pool.endpoints()[0].clone();
        e.set_kv_capacity(10_000);
        let now = std::time::Instant::now();
        let hour = std::time::Duration::from_secs(3600);
        // More peer placements than a pod keeps, each of one block of its own, ending in
        // the order they came: the first ones are dropped.
        for i in 0..MAX_LEASES as u64 + 44 {
            e.lease(
                &[RouterKey(i)],
                0,
                now,
                now + hour + std::time::Duration::from_millis(i),
            );
        }
        let room = e.kv_room(&[RouterKey(0)]).expect("sized");
        assert_eq!(room.pinned, MAX_LEASES as u64);
        assert_eq!(room.shared, 0, "the first lease ended first");
        assert_eq!(
            e.kv_room(&[RouterKey(MAX_LEASES as u64 + 43)])
                .expect("sized")
                .shared,
            1
        );
    }

    #[test]
    fn a_long_peer_prompt_keeps_its_first_keys_and_counts_the_rest_as_its_own() {
        let pool = one_pod();
        let e = pool.endpoints()[0].clone();
        e.set_kv_capacity(100_000);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(3600);
        // Two peers' placements of the same 1,030-block prompt, 2 output blocks each: the
        // first 1,024 blocks are shared, the last 6 of each counted apart.
        let keys: Vec<RouterKey> = (0..1030).map(RouterKey).collect();
        e.lease(&keys, 2, until, until);
        e.lease(&keys, 2, until, until);
        let room = e.kv_room(&keys).expect("sized");
        assert_eq!(room.pinned, 1024 + 2 * (6 + 2));
        assert_eq!(room.shared, 1024);
    }

    #[test]
    fn peers_prefill_queues_at_a_pod_and_drains_at_its_rate() {
        let e = one_pod().endpoints()[0].clone();
        let t0 = std::time::Instant::now();
        let ms = std::time::Duration::from_millis;
        // 1/128 s a block: 250 ms drain 32 blocks, 500 ms 64.
        let rate = 1.0 / 128.0;
        e.queue_peer_prefill(100, rate, t0);
        assert_eq!(e.peer_prefill_blocks(t0), 100);
        assert_eq!(e.peer_prefill_blocks(t0 + ms(250)), 68);
        // 50 more queue behind the 68 left.
        e.queue_peer_prefill(50, rate, t0 + ms(250));
        assert_eq!(e.peer_prefill_blocks(t0 + ms(250)), 118);
        assert_eq!(e.peer_prefill_blocks(t0 + ms(750)), 54);
        assert_eq!(e.peer_prefill_blocks(t0 + ms(2000)), 0);
        // A rate no calibration gives (0, NaN) drains at the last good one: 10 blocks, 1/128 s
        // each, gone 1,280 ms later.
        e.queue_peer_prefill(10, 0.0, t0 + ms(2000));
        e.queue_peer_prefill(10, f64::NAN, t0 + ms(2000));
        assert_eq!(e.peer_prefill_blocks(t0 + ms(2000)), 20);
        assert_eq!(e.peer_prefill_blocks(t0 + ms(2000) + ms(1250)), 0);
        // Without any good rate, nothing is queued (it could never drain); nor by a placement
        // of nothing new.
        let fresh = one_pod().endpoints()[0].clone();
        fresh.queue_peer_prefill(10, f64::INFINITY, t0);
        fresh.queue_peer_prefill(0, rate, t0);
        assert_eq!(fresh.peer_prefill_blocks(t0), 0);
        // Bounded however much is placed.
        e.queue_peer_prefill(u64::MAX, rate, t0);
        assert_eq!(e.peer_prefill_blocks(t0), MAX_PEER_PREFILL_BLOCKS as u64);
    }
}
