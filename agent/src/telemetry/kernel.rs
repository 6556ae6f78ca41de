//! Per-tenant traffic as the kernel counted it (`WARMPATH_CGROUP_STATS`, docs/ebpf.md):
//! connects by how they were served — through the agent, steered straight to a pod, failed
//! open — and bytes of the rewritten sockets, so steered and failed-open traffic (which no
//! request record sees) is in the per-tenant series too.
//!
//! The kernel keeps monotonic counts per client cgroup in an LRU map. Every
//! [`DEFAULT_INTERVAL`] the agent reads it and [`KernelTraffic::apply`] adds each cgroup's
//! increase since the previous read to the totals of the tenant the cgroup resolves to now
//! (the default tenant when none does; [`KernelTraffic::unresolved`] counts those cgroups). A
//! count lower than the previous one is an entry that aged out and came back: its whole value
//! is new. Memory is bounded: the previous read (at most the map's capacity) and one total per
//! tenant (at most `max_tenants`, later ones in [`OTHER_TENANT`]). The totals are exported as
//! observable counters, read at collection time by both Prometheus and OTLP.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use opentelemetry::{KeyValue, metrics::Meter};
use parking_lot::Mutex;
use warmpath_common::CgroupStats;

use super::OTHER_TENANT;

/// How often the kernel's counters are read: per-tenant series move in steps of this.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);

/// The tenant of a client cgroup id, when one is known.
pub type Resolve = Arc<dyn Fn(u64) -> Option<Arc<str>> + Send + Sync>;

/// Reads every client cgroup's cumulative counts from the kernel.
pub type Read = Arc<dyn Fn() -> Result<Vec<(u64, CgroupStats)>, String> + Send + Sync>;

/// One tenant's kernel-counted traffic.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub connects_proxy: u64,
    pub connects_steered: u64,
    pub connects_failopen: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// The per-tenant totals, fed by [`apply`](Self::apply) and exported by
/// [`observe`](Self::observe).
#[derive(Debug)]
pub struct KernelTraffic {
    state: Mutex<State>,
    max_tenants: usize,
}

#[derive(Debug, Default)]
struct State {
    last: HashMap<u64, CgroupStats>,
    tenants: BTreeMap<Arc<str>, Totals>,
    unresolved: u64,
}

impl KernelTraffic {
    /// Totals for at most `max_tenants` tenant names (at least one).
    pub fn new(max_tenants: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            max_tenants: max_tenants.max(1),
        }
    }

    /// Adds what the kernel counted since the previous read (`read`: every cgroup's
    /// cumulative counts) to each cgroup's tenant: `resolve`'s answer, else `default`.
    pub fn apply(&self, read: &[(u64, CgroupStats)], resolve: &Resolve, default: &Arc<str>) {
        let mut state = self.state.lock();
        let mut last = HashMap::with_capacity(read.len());
        let mut unresolved = 0;
        for (cgroup_id, now) in read {
            let before = state.last.get(cgroup_id).copied().unwrap_or_default();
            let delta = increase(&before, now);
            last.insert(*cgroup_id, *now);
            let tenant = resolve(*cgroup_id).unwrap_or_else(|| {
                unresolved += 1;
                default.clone()
            });
            if delta == Totals::default() {
                continue;
            }
            let key = if state.tenants.len() >= self.max_tenants
                && !state.tenants.contains_key(&tenant)
            {
                Arc::from(OTHER_TENANT)
            } else {
                tenant
            };
            let t = state.tenants.entry(key).or_default();
            t.connects_proxy += delta.connects_proxy;
            t.connects_steered += delta.connects_steered;
            t.connects_failopen += delta.connects_failopen;
            t.bytes_sent += delta.bytes_sent;
            t.bytes_received += delta.bytes_received;
        }
        state.last = last;
        state.unresolved = unresolved;
    }

    /// Every tenant's totals so far.
    pub fn totals(&self) -> Vec<(Arc<str>, Totals)> {
        let state = self.state.lock();
        state.tenants.iter().map(|(n, t)| (n.clone(), *t)).collect()
    }

    /// Cgroups in the latest read that no tenant claimed (counted in the default tenant).
    pub fn unresolved(&self) -> u64 {
        self.state.lock().unresolved
    }

    /// Registers `warmpath.kernel.*` on `meter`.
    pub fn observe(self: &Arc<Self>, meter: &Meter) {
        let k = self.clone();
        meter
            .u64_observable_counter("warmpath.kernel.connections")
            .with_unit("{connection}")
            .with_description(
                "Connects to intercepted VIPs counted in the kernel, by tenant and mode (proxy, steer, failopen)",
            )
            .with_callback(move |o| {
                for (tenant, t) in k.totals() {
                    for (mode, n) in [
                        ("proxy", t.connects_proxy),
                        ("steer", t.connects_steered),
                        ("failopen", t.connects_failopen),
                    ] {
                        o.observe(n, &labels(&tenant, "mode", mode));
                    }
                }
            })
            .build();
        let k = self.clone();
        meter
            .u64_observable_counter("warmpath.kernel.bytes")
            .with_unit("By")
            .with_description(
                "TCP bytes of connections the kernel sent straight to a pod (steered or failed open), by tenant and direction (sent: acknowledged by the pod, received: the client's)",
            )
            .with_callback(move |o| {
                for (tenant, t) in k.totals() {
                    for (direction, n) in [("sent", t.bytes_sent), ("received", t.bytes_received)]
                    {
                        o.observe(n, &labels(&tenant, "direction", direction));
                    }
                }
            })
            .build();
        let k = self.clone();
        meter
            .u64_observable_gauge("warmpath.kernel.unresolved_cgroups")
            .with_unit("{cgroup}")
            .with_description(
                "Client cgroups in the latest kernel read that no tenant claimed (counted in the default tenant)",
            )
            .with_callback(move |o| o.observe(k.unresolved(), &[]))
            .build();
    }
}

/// `now - before` per field; a field that went down started again from zero (the entry aged
/// out of the LRU map and was created anew), so all of it is new.
fn increase(before: &CgroupStats, now: &CgroupStats) -> Totals {
    let d = |b: u64, n: u64| if n >= b { n - b } else { n };
    Totals {
        connects_proxy: d(before.connects_proxy, now.connects_proxy),
        connects_steered: d(before.connects_steered, now.connects_steered),
        connects_failopen: d(before.connects_failopen, now.connects_failopen),
        bytes_sent: d(before.bytes_sent, now.bytes_sent),
        bytes_received: d(before.bytes_received, now.bytes_received),
    }
}

fn labels(tenant: &str, key: &'static str, value: &'static str) -> [KeyValue; 2] {
    [
        KeyValue::new("tenant", tenant.to_owned()),
        KeyValue::new(key, value),
    ]
}

/// Reads the kernel's counters with `read` every `every` (on the blocking pool: a read walks
/// up to the map's capacity with two syscalls per entry) and applies them; `default` names the
/// default tenant at each read. A failed read is logged once per failure streak and retried
/// at the next tick. Runs until aborted.
pub fn spawn(
    traffic: Arc<KernelTraffic>,
    read: Read,
    resolve: Resolve,
    default: Arc<dyn Fn() -> Arc<str> + Send + Sync>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            let read = read.clone();
            let got = tokio::task::spawn_blocking(move || read())
                .await
                .unwrap_or_else(|e| Err(format!("the read task failed: {e}")));
            match got {
                Ok(stats) => {
                    failing = false;
                    traffic.apply(&stats, &resolve, &default());
                }
                Err(err) => {
                    if !failing {
                        tracing::warn!(%err, "reading the kernel's per-cgroup counters failed; retrying");
                    }
                    failing = true;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(proxy: u64, steered: u64, failopen: u64, sent: u64, received: u64) -> CgroupStats {
        CgroupStats {
            connects_proxy: proxy,
            connects_steered: steered,
            connects_failopen: failopen,
            bytes_sent: sent,
            bytes_received: received,
        }
    }

    fn resolver() -> Resolve {
        Arc::new(|id| match id {
            1 | 2 => Some(Arc::from("team-a")),
            3 => Some(Arc::from("team-b")),
            _ => None,
        })
    }

    fn of(k: &KernelTraffic, tenant: &str) -> Totals {
        k.totals()
            .into_iter()
            .find(|(n, _)| &**n == tenant)
            .map(|(_, t)| t)
            .unwrap_or_default()
    }

    #[test]
    fn increases_go_to_each_cgroups_tenant_and_unknown_ones_to_the_default() {
        let k = KernelTraffic::new(10);
        let default: Arc<str> = Arc::from("default");
        k.apply(
            &[
                (1, stats(3, 0, 0, 300, 900)),
                (2, stats(1, 2, 0, 100, 200)),
                (9, stats(0, 0, 4, 0, 0)),
            ],
            &resolver(),
            &default,
        );
        assert_eq!(
            of(&k, "team-a"),
            Totals {
                connects_proxy: 4,
                connects_steered: 2,
                connects_failopen: 0,
                bytes_sent: 400,
                bytes_received: 1100,
            }
        );
        assert_eq!(of(&k, "default").connects_failopen, 4);
        assert_eq!(k.unresolved(), 1);
        // The second read adds only what grew.
        k.apply(
            &[(1, stats(5, 0, 0, 500, 1000)), (9, stats(0, 0, 4, 0, 0))],
            &resolver(),
            &default,
        );
        assert_eq!(of(&k, "team-a").connects_proxy, 6);
        assert_eq!(of(&k, "team-a").bytes_sent, 600);
        assert_eq!(of(&k, "team-a").bytes_received, 1200);
        assert_eq!(of(&k, "default").connects_failopen, 4);
    }

    #[test]
    fn a_count_that_went_down_is_a_new_entry_counted_whole() {
        let k = KernelTraffic::new(10);
        let default: Arc<str> = Arc::from("default");
        k.apply(&[(3, stats(10, 0, 0, 0, 0))], &resolver(), &default);
        // Aged out and created again with 2 since.
        k.apply(&[(3, stats(2, 0, 0, 0, 0))], &resolver(), &default);
        assert_eq!(of(&k, "team-b").connects_proxy, 12);
        // Gone from the read and back later: counted whole as well.
        k.apply(&[], &resolver(), &default);
        k.apply(&[(3, stats(1, 0, 0, 0, 0))], &resolver(), &default);
        assert_eq!(of(&k, "team-b").connects_proxy, 13);
    }

    #[test]
    fn tenants_beyond_the_cap_share_the_other_bucket() {
        let k = KernelTraffic::new(1);
        let default: Arc<str> = Arc::from("default");
        k.apply(
            &[(1, stats(1, 0, 0, 0, 0)), (3, stats(2, 0, 0, 0, 0))],
            &resolver(),
            &default,
        );
        assert_eq!(of(&k, "team-a").connects_proxy, 1);
        assert_eq!(of(&k, OTHER_TENANT).connects_proxy, 2);
        assert_eq!(of(&k, "team-b"), Totals::default());
        assert_eq!(k.totals().len(), 2);
    }
}
