//! The kernel table writer: keeps `WARMPATH_AFFINITY` and `WARMPATH_BACKENDS` equal to what
//! the agent knows — which pods served each intercepted client, which pods are members, ready
//! and not overloaded — so fail-open and steer mode send connects where the agent would have
//! (docs/ebpf.md "Fail-open", "Steer mode").
//!
//! Every [`TABLE_INTERVAL`], and at once when a pool's members change or one of them becomes
//! ready or unready ([`crate::pool::Pool::changes`]) or a policy set is published, the writer
//! reads its inputs, computes the table it wants with [`desired`] (pure) and writes only the
//! difference ([`diff`], also pure). The rule:
//!
//! - A pod is *usable* when it is a member of a pool, ready (its watcher wants it, and its
//!   `/metrics` answered at least once in the last [`crate::pool::FAILED_SCRAPES`] scrapes)
//!   and not *shed*.
//! - Shedding is the hysteresis ([`shed`]): a ready pod is shed when its load (requests
//!   running and waiting at the engine, or in flight from this agent if more) is at least
//!   [`SHED_FACTOR`] times the mean of its pool's other ready pods plus [`SHED_FLOOR`]; it is
//!   usable again only once its load is at most [`UNSHED_FACTOR`] times that mean plus
//!   [`UNSHED_FLOOR`]. Between the two thresholds nothing moves, so entries do not flap. A
//!   pool never sheds all its ready pods.
//! - `AFFINITY[(cgroup, VIP)]`: the client's learned pods ([`crate::proxy::clients`]) that are
//!   usable and of the VIP's family, repeated in proportion to how many of its requests they
//!   answered ([`slots`]: at most [`BACKENDS_MAX`] slots). A client not seen for
//!   [`AFFINITY_TTL`] has no entry; one whose pods are all unusable has none either, so the
//!   kernel falls back to the VIP's backend set, then to the VIP untouched.
//! - `BACKENDS[VIP]`, for every intercepted VIP: the usable pods of the VIP's pool (all its
//!   ready pods when every one is shed), the [`BACKENDS_MAX`] least loaded; those within
//!   [`LOAD_BAND`] of the least loaded one's load count twice.
//!
//! - `STEER[VIP]`: a VIP is steered when `--steer` names it, or when the policy deciding
//!   every request of its pool says `mode: steer` ([`policy_steered`];
//!   [`crate::policy::compiled::PolicySet::connection_mode`]); a policy change is applied at once (the
//!   writer wakes on every published policy set), and a VIP whose policy no longer says
//!   steer goes back through the agent.
//!
//! A pod that leaves its pool, or stops being ready, is out of every entry in the round it
//! wakes (and a pod that left is forgotten by the learner); an entry left empty is deleted. The kernel reads the tables only at connect(), so
//! a rewrite moves new connections and never an existing one. Entries an earlier agent wrote
//! (pinned maps) are adopted as learned at start and age out like any other.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use warmpath_common::BACKENDS_MAX;

use crate::{ebpf, policy::resources::DataPathMode, proxy::Proxy};

/// How often the table is recomputed for load changes (membership and readiness changes, and
/// policy sets, wake the writer at once).
pub const TABLE_INTERVAL: Duration = Duration::from_millis(500);
/// An affinity entry whose client sent nothing through the agent for this long is removed:
/// long enough to ride out an agent restart, short enough that the pods it names still hold
/// the client's prefixes.
pub const AFFINITY_TTL: Duration = Duration::from_secs(10 * 60);
/// A pod is shed at `SHED_FACTOR x` its pool's others' mean load `+ SHED_FLOOR` ...
pub const SHED_FACTOR: f64 = 2.0;
pub const SHED_FLOOR: f64 = 4.0;
/// ... and usable again at `UNSHED_FACTOR x` that mean `+ UNSHED_FLOOR`.
pub const UNSHED_FACTOR: f64 = 1.5;
pub const UNSHED_FLOOR: f64 = 2.0;
/// Backend-set pods within this load of the least loaded one count twice.
pub const LOAD_BAND: u32 = 2;

/// One learned client, as [`desired`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub cgroup_id: u64,
    pub vip: SocketAddr,
    /// Pods and how many of its requests each answered, most first.
    pub pods: Vec<(SocketAddr, u32)>,
    /// When it was last seen.
    pub last: Instant,
}

/// One pool member now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub addr: SocketAddr,
    pub ready: bool,
    /// Requests running and waiting there.
    pub load: u32,
}

/// Everything [`desired`] reads.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub now: Instant,
    pub ttl: Duration,
    pub clients: &'a [Client],
    /// Each intercepted VIP with the index of its pool in `pools`.
    pub vips: &'a [(SocketAddr, usize)],
    /// Each pool's members.
    pub pools: &'a [Vec<Member>],
}

/// The kernel's two tables as the agent wants them (a pod listed twice weighs twice).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub affinity: BTreeMap<(u64, SocketAddr), Vec<SocketAddr>>,
    pub backends: BTreeMap<SocketAddr, Vec<SocketAddr>>,
}

/// What to write to turn one table into another.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub set_affinity: Vec<((u64, SocketAddr), Vec<SocketAddr>)>,
    pub remove_affinity: Vec<(u64, SocketAddr)>,
    pub set_backends: Vec<(SocketAddr, Vec<SocketAddr>)>,
    pub remove_backends: Vec<SocketAddr>,
}

// === the rule ===

/// The shed pods now, given those shed before (the hysteresis; module docs).
pub fn shed(pools: &[Vec<Member>], before: &BTreeSet<SocketAddr>) -> BTreeSet<SocketAddr> {
    let mut out = BTreeSet::new();
    for members in pools {
        let ready: Vec<&Member> = members.iter().filter(|m| m.ready).collect();
        if ready.len() < 2 {
            continue;
        }
        let total: f64 = ready.iter().map(|m| f64::from(m.load)).sum();
        let mut pool_shed: Vec<SocketAddr> = Vec::new();
        for m in &ready {
            let load = f64::from(m.load);
            let others = (total - load) / (ready.len() - 1) as f64;
            let is_shed = if before.contains(&m.addr) {
                load > UNSHED_FACTOR * others + UNSHED_FLOOR
            } else {
                load >= SHED_FACTOR * others + SHED_FLOOR
            };
            if is_shed {
                pool_shed.push(m.addr);
            }
        }
        if pool_shed.len() < ready.len() {
            out.extend(pool_shed);
        }
    }
    out
}

/// The table the agent wants (module docs), from its inputs and the shed pods.
pub fn desired(inputs: &Inputs<'_>, shed: &BTreeSet<SocketAddr>) -> Table {
    let usable: BTreeSet<SocketAddr> = inputs
        .pools
        .iter()
        .flatten()
        .filter(|m| m.ready && !shed.contains(&m.addr))
        .map(|m| m.addr)
        .collect();
    let mut table = Table::default();
    let mut seen: BTreeMap<(u64, SocketAddr), Instant> = BTreeMap::new();
    for c in inputs.clients {
        if inputs.now.saturating_duration_since(c.last) > inputs.ttl {
            continue;
        }
        let key = (c.cgroup_id, c.vip);
        // The most recently seen wins when a client is listed twice (learned and adopted).
        if seen.get(&key).is_some_and(|&last| last >= c.last) {
            continue;
        }
        seen.insert(key, c.last);
        let pods: Vec<(SocketAddr, u32)> = c
            .pods
            .iter()
            .copied()
            .filter(|(pod, n)| *n > 0 && usable.contains(pod) && pod.is_ipv4() == c.vip.is_ipv4())
            .collect();
        let set = slots(&pods);
        if set.is_empty() {
            table.affinity.remove(&key);
        } else {
            table.affinity.insert(key, set);
        }
    }
    for &(vip, pool) in inputs.vips {
        let Some(members) = inputs.pools.get(pool) else {
            continue;
        };
        if let Some(set) = backend_set(vip, members, shed) {
            table.backends.insert(vip, set);
        }
    }
    table
}

/// A VIP's backend set from its pool's members (module docs); `None` when none is ready.
fn backend_set(
    vip: SocketAddr,
    members: &[Member],
    shed: &BTreeSet<SocketAddr>,
) -> Option<Vec<SocketAddr>> {
    let ready: Vec<Member> = members
        .iter()
        .copied()
        .filter(|m| m.ready && m.addr.is_ipv4() == vip.is_ipv4())
        .collect();
    let unshed: Vec<Member> = ready
        .iter()
        .copied()
        .filter(|m| !shed.contains(&m.addr))
        .collect();
    let mut pick = if unshed.is_empty() { ready } else { unshed };
    pick.sort_by_key(|m| (m.load, m.addr));
    pick.truncate(BACKENDS_MAX);
    let least = pick.first()?.load;
    let weights: Vec<(SocketAddr, u32)> = pick
        .iter()
        .map(|m| (m.addr, if m.load <= least + LOAD_BAND { 2 } else { 1 }))
        .collect();
    Some(slots(&weights))
}

/// Pods repeated in proportion to their weights within [`BACKENDS_MAX`] slots: the weights
/// divided by their greatest common divisor when they fit, else the largest-remainder
/// apportionment of the slots (ties to the earlier pod); pods left with no slot are dropped.
/// Order follows `weights`.
pub fn slots(weights: &[(SocketAddr, u32)]) -> Vec<SocketAddr> {
    let weights: Vec<(SocketAddr, u64)> = weights
        .iter()
        .filter(|(_, w)| *w > 0)
        .map(|&(p, w)| (p, u64::from(w)))
        .collect();
    let g = weights.iter().fold(0, |g, &(_, w)| gcd(g, w));
    if g == 0 {
        return Vec::new();
    }
    let reduced: Vec<u64> = weights.iter().map(|&(_, w)| w / g).collect();
    let sum: u64 = reduced.iter().sum();
    let max = BACKENDS_MAX as u64;
    let counts: Vec<u64> = if sum <= max {
        reduced
    } else {
        let mut counts: Vec<u64> = reduced.iter().map(|w| w * max / sum).collect();
        let mut left = max - counts.iter().sum::<u64>();
        let mut order: Vec<usize> = (0..reduced.len()).collect();
        // Largest remainder first; `sort_by_key` is stable, so ties keep the earlier pod.
        order.sort_by_key(|&i| std::cmp::Reverse(reduced[i] * max % sum));
        for i in order {
            if left == 0 {
                break;
            }
            counts[i] += 1;
            left -= 1;
        }
        counts
    };
    weights
        .iter()
        .zip(counts)
        .flat_map(|(&(pod, _), n)| std::iter::repeat_n(pod, n as usize))
        .collect()
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The writes that turn `written` into `want`.
pub fn diff(written: &Table, want: &Table) -> Diff {
    Diff {
        set_affinity: want
            .affinity
            .iter()
            .filter(|(k, v)| written.affinity.get(*k) != Some(*v))
            .map(|(k, v)| (*k, v.clone()))
            .collect(),
        remove_affinity: written
            .affinity
            .keys()
            .filter(|k| !want.affinity.contains_key(*k))
            .copied()
            .collect(),
        set_backends: want
            .backends
            .iter()
            .filter(|(k, v)| written.backends.get(*k) != Some(*v))
            .map(|(k, v)| (*k, v.clone()))
            .collect(),
        remove_backends: written
            .backends
            .keys()
            .filter(|k| !want.backends.contains_key(*k))
            .copied()
            .collect(),
    }
}

/// The VIPs to steer because their pool's policy says so (`steered(pool)`): every
/// intercepted VIP of such a pool, except `excluded` (those `--steer` already steers, and
/// those no pool's policy may steer).
pub fn policy_steered(
    vips: &[(SocketAddr, usize)],
    excluded: &BTreeSet<SocketAddr>,
    steered: impl Fn(usize) -> bool,
) -> BTreeSet<SocketAddr> {
    vips.iter()
        .filter(|(vip, pool)| !excluded.contains(vip) && steered(*pool))
        .map(|(vip, _)| *vip)
        .collect()
}

// === the writer ===

/// What the writer did, for `/status` (`kernel_table`).
#[derive(Debug, Default)]
pub struct Report {
    rounds: AtomicU64,
    affinity: AtomicU64,
    backends: AtomicU64,
    shed: AtomicU64,
    writes: AtomicU64,
    removals: AtomicU64,
    failures: AtomicU64,
    /// The steered VIPs (`--steer` and policy), as written.
    steered: parking_lot::Mutex<BTreeSet<SocketAddr>>,
    /// The backend sets written (one per intercepted VIP: bounded by the VIPs).
    sets: parking_lot::Mutex<BTreeMap<SocketAddr, Vec<SocketAddr>>>,
}

impl Report {
    /// The counters as JSON.
    pub fn status(&self) -> serde_json::Value {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "rounds": get(&self.rounds),
            "affinity_entries": get(&self.affinity),
            "backend_sets": get(&self.backends),
            "shed_pods": get(&self.shed),
            "writes": get(&self.writes),
            "removals": get(&self.removals),
            "failures": get(&self.failures),
            "steered": self.steered.lock().iter().map(|v| v.to_string()).collect::<Vec<_>>(),
            "backends": self
                .sets
                .lock()
                .iter()
                .map(|(vip, pods)| (vip.to_string(), serde_json::json!(pods)))
                .collect::<serde_json::Map<_, _>>(),
        })
    }
}

/// The intercepted VIPs now, each with its pool's index in `Proxy::pools`.
pub type VipSource = Box<dyn Fn() -> Vec<(SocketAddr, usize)> + Send + Sync>;

/// The writer's state between rounds.
pub struct Writer {
    redirector: Arc<parking_lot::Mutex<ebpf::Redirector>>,
    proxy: Arc<Proxy>,
    vips: VipSource,
    /// What the kernel holds, as far as this writer knows.
    written: Table,
    shed: BTreeSet<SocketAddr>,
    /// Entries found in the pinned map at start, kept as learned until they age out.
    adopted: Vec<Client>,
    members: BTreeSet<SocketAddr>,
    /// VIPs steered by `--steer` (set at start, never turned off here).
    fixed_steer: BTreeSet<SocketAddr>,
    /// VIPs this writer steers because their pool's policy says so.
    policy_steer: BTreeSet<SocketAddr>,
    /// VIPs no policy may steer (a VIP whose pool was not named, on an agent with several
    /// pools: it carries every model's requests).
    unsteerable: BTreeSet<SocketAddr>,
    /// VIPs whose steer write failed, warned about once (until one succeeds).
    steer_warned: BTreeSet<SocketAddr>,
    report: Arc<Report>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("written", &self.written)
            .field("shed", &self.shed)
            .finish_non_exhaustive()
    }
}

/// Why the writer woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    Tick,
    Policy,
    Members,
    /// The policy's sender is gone: the proxy is shutting down.
    Exit,
}

/// Waits for the writer's next round: the tick, a published policy set, or a change of any
/// pool's members or readiness (a pool whose sender is gone stops waking it).
pub async fn next_round<T>(
    tick: &mut tokio::time::Interval,
    policies: &mut tokio::sync::watch::Receiver<T>,
    pools: &mut Vec<tokio::sync::watch::Receiver<u64>>,
) -> Wake {
    let members = async {
        loop {
            if pools.is_empty() {
                return std::future::pending::<()>().await;
            }
            let changed = pools.iter_mut().map(|rx| Box::pin(rx.changed()));
            let (result, index, _) = futures::future::select_all(changed).await;
            if result.is_ok() {
                return;
            }
            pools.swap_remove(index);
        }
    };
    tokio::select! {
        _ = tick.tick() => Wake::Tick,
        changed = policies.changed() => match changed {
            Ok(()) => Wake::Policy,
            // The policy is the proxy's and lives as long as it: only at exit.
            Err(_) => Wake::Exit,
        },
        () = members => Wake::Members,
    }
}

impl Writer {
    /// A writer over the redirector's tables, adopting what they hold now.
    pub fn new(
        redirector: Arc<parking_lot::Mutex<ebpf::Redirector>>,
        proxy: Arc<Proxy>,
        vips: VipSource,
        fixed_steer: BTreeSet<SocketAddr>,
        unsteerable: BTreeSet<SocketAddr>,
    ) -> Self {
        let now = Instant::now();
        let mut written = Table::default();
        let mut adopted = Vec::new();
        {
            let mut r = redirector.lock();
            let table = r.failopen();
            match table.affinity_entries() {
                Ok(entries) => {
                    for (key, pods) in entries {
                        adopted.push(Client {
                            cgroup_id: key.0,
                            vip: key.1,
                            pods: counted(&pods),
                            last: now,
                        });
                        written.affinity.insert(key, pods);
                    }
                }
                Err(err) => tracing::warn!(%err, "reading the pinned affinity table failed"),
            }
            match table.backends_entries() {
                Ok(entries) => written.backends.extend(entries),
                Err(err) => tracing::warn!(%err, "reading the pinned backend sets failed"),
            }
        }
        if !adopted.is_empty() {
            tracing::info!(entries = adopted.len(), "adopted the pinned affinity table");
        }
        Self {
            redirector,
            proxy,
            vips,
            written,
            shed: BTreeSet::new(),
            adopted,
            members: BTreeSet::new(),
            report: Arc::new(Report {
                steered: parking_lot::Mutex::new(fixed_steer.clone()),
                ..Report::default()
            }),
            fixed_steer,
            policy_steer: BTreeSet::new(),
            unsteerable,
            steer_warned: BTreeSet::new(),
        }
    }

    /// Its counters.
    pub fn report(&self) -> Arc<Report> {
        self.report.clone()
    }

    /// Writes the table every [`TABLE_INTERVAL`], and at once when a policy set is
    /// published (a steer policy applied or withdrawn) or a pool's membership or readiness
    /// changes, until aborted.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(TABLE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut policies = self.proxy.policy.subscribe();
        let mut pools: Vec<_> = self.proxy.pools.iter().map(|p| p.pool.changes()).collect();
        while next_round(&mut tick, &mut policies, &mut pools).await != Wake::Exit {
            self.round(Instant::now());
        }
    }

    /// One round: read the inputs, compute, write the difference.
    pub fn round(&mut self, now: Instant) {
        let pools = self.members_now();
        let present: BTreeSet<SocketAddr> = pools.iter().flatten().map(|m| m.addr).collect();
        for gone in self.members.difference(&present) {
            self.proxy.client_pods().forget_pod(*gone);
        }
        self.adopted.retain_mut(|c| {
            c.pods.retain(|(pod, _)| present.contains(pod));
            !c.pods.is_empty() && now.saturating_duration_since(c.last) <= AFFINITY_TTL
        });
        self.members = present;
        let mut clients: Vec<Client> = self.adopted.clone();
        clients.extend(
            self.proxy
                .client_pods()
                .snapshot(None)
                .into_iter()
                .map(|e| Client {
                    cgroup_id: e.cgroup_id,
                    vip: e.vip,
                    pods: e.pods,
                    last: e.last,
                }),
        );
        let vips = (self.vips)();
        self.shed = shed(&pools, &self.shed);
        let want = desired(
            &Inputs {
                now,
                ttl: AFFINITY_TTL,
                clients: &clients,
                vips: &vips,
                pools: &pools,
            },
            &self.shed,
        );
        self.apply(&diff(&self.written, &want));
        let r = &self.report;
        r.rounds.fetch_add(1, Ordering::Relaxed);
        r.affinity
            .store(self.written.affinity.len() as u64, Ordering::Relaxed);
        r.backends
            .store(self.written.backends.len() as u64, Ordering::Relaxed);
        r.shed.store(self.shed.len() as u64, Ordering::Relaxed);
        let mut sets = r.sets.lock();
        if *sets != self.written.backends {
            sets.clone_from(&self.written.backends);
        }
        drop(sets);
        let set = self.proxy.policy.current();
        let excluded: BTreeSet<SocketAddr> =
            self.fixed_steer.union(&self.unsteerable).copied().collect();
        let want = policy_steered(&vips, &excluded, |pool| {
            set.connection_mode(pool) == DataPathMode::Steer
        });
        self.steer(&want);
    }

    /// Turns steering on for the VIPs in `want` and off for the others this writer
    /// steered (never a `--steer` VIP); a failed write is tried again next round.
    fn steer(&mut self, want: &BTreeSet<SocketAddr>) {
        let on: Vec<SocketAddr> = want.difference(&self.policy_steer).copied().collect();
        let off: Vec<SocketAddr> = self.policy_steer.difference(want).copied().collect();
        if on.is_empty() && off.is_empty() {
            return;
        }
        let mut r = self.redirector.lock();
        for (vips, steer) in [(on, true), (off, false)] {
            for vip in vips {
                let done = r.set_steer(vip, steer);
                if done.is_ok() {
                    self.steer_warned.remove(&vip);
                }
                match done {
                    Ok(()) if steer => {
                        self.policy_steer.insert(vip);
                        tracing::info!(%vip, source = "policy", "steering in the kernel");
                    }
                    Ok(()) => {
                        self.policy_steer.remove(&vip);
                        tracing::info!(%vip, source = "policy", "no longer steering: connections through the agent");
                    }
                    Err(err) => {
                        self.report.failures.fetch_add(1, Ordering::Relaxed);
                        if self.steer_warned.insert(vip) {
                            tracing::warn!(%vip, %err, steer, "writing the steer map failed; retrying every round (said once)");
                        } else {
                            tracing::debug!(%vip, %err, steer, "writing the steer map failed again");
                        }
                    }
                }
            }
        }
        drop(r);
        *self.report.steered.lock() = self
            .fixed_steer
            .union(&self.policy_steer)
            .copied()
            .collect();
    }

    /// Every pool's members with an IP address (host names cannot be written to the kernel).
    fn members_now(&self) -> Vec<Vec<Member>> {
        self.proxy
            .pools
            .iter()
            .map(|p| {
                p.pool
                    .endpoints()
                    .iter()
                    .filter_map(|e| {
                        let addr = e.authority.parse().ok()?;
                        let engine = e.snapshot().engine;
                        let engine = engine.map_or(0, |l| l.running.saturating_add(l.waiting));
                        Some(Member {
                            addr,
                            ready: e.scrape_healthy(),
                            load: engine.max(e.in_flight()),
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// Writes `d`, keeping `written` equal to what the kernel holds: a failed write is
    /// counted, logged once per round and tried again next round.
    fn apply(&mut self, d: &Diff) {
        let mut r = self.redirector.lock();
        let t = r.failopen();
        let mut failed: Option<ebpf::Error> = None;
        let (mut writes, mut removals, mut failures) = (0u64, 0u64, 0u64);
        let mut note = |res: Result<(), ebpf::Error>, n: &mut u64| match res {
            Ok(()) => {
                *n += 1;
                true
            }
            Err(err) => {
                failures += 1;
                failed.get_or_insert(err);
                false
            }
        };
        for (key, pods) in &d.set_affinity {
            if note(t.set_affinity(key.0, key.1, pods), &mut writes) {
                self.written.affinity.insert(*key, pods.clone());
            } else {
                self.written.affinity.remove(key);
            }
        }
        for key in &d.remove_affinity {
            if note(t.remove_affinity(key.0, key.1), &mut removals) {
                self.written.affinity.remove(key);
            }
        }
        for (vip, pods) in &d.set_backends {
            if note(t.set_backends(*vip, pods), &mut writes) {
                self.written.backends.insert(*vip, pods.clone());
            } else {
                self.written.backends.remove(vip);
            }
        }
        for vip in &d.remove_backends {
            if note(t.remove_backends(*vip), &mut removals) {
                self.written.backends.remove(vip);
            }
        }
        drop(r);
        if writes + removals > 0 {
            tracing::debug!(
                writes,
                removals,
                affinity = self.written.affinity.len(),
                backends = self.written.backends.len(),
                "kernel table updated"
            );
        }
        let rep = &self.report;
        rep.writes.fetch_add(writes, Ordering::Relaxed);
        rep.removals.fetch_add(removals, Ordering::Relaxed);
        rep.failures.fetch_add(failures, Ordering::Relaxed);
        if let Some(err) = failed {
            tracing::warn!(failures, %err, "writing the kernel table failed; retrying next round");
        }
    }
}

/// Slot repetitions as counts, in first-seen order.
fn counted(pods: &[SocketAddr]) -> Vec<(SocketAddr, u32)> {
    let mut out: Vec<(SocketAddr, u32)> = Vec::new();
    for pod in pods {
        match out.iter_mut().find(|(p, _)| p == pod) {
            Some((_, n)) => *n += 1,
            None => out.push((*pod, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests;
