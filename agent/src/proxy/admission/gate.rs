//! The cluster gate: each tenant's slots at this agent while tenants contend for a
//! cluster-wide concurrency (`clusterMaxConcurrent`: the agent's, or a pool's second stage;
//! docs/policy.md, "Across agents").
//! Pure state, held under the admission queue's lock: the requests each tenant has in flight
//! and waiting here, the peers' contention as last gossiped, and the caps computed from both
//! ([`super::allocate`]).
//!
//! - **Demand** published for a tenant is the most requests it had in flight plus waiting
//!   here at once during the last gossip round (a peak, so that a closed-loop client between
//!   two requests does not read as gone).
//! - **Caps** are recomputed when the peers' contention arrives (every round of this
//!   agent's), from this agent's demand in the round that just ended and the peers' facts as
//!   this agent's view holds them: up to the gossip lag old, from rounds not aligned with
//!   this agent's. So agents compute from different inputs while a change travels, and a cap
//!   that falls never revokes requests already in flight (docs/policy.md, "Error bound").
//!   A tenant that arrived since has a cap of 1.
//! - **Engaged** whenever the exchange's view is fresh, whether or not any peer has demand
//!   (a lone agent, or one whose peers are idle, divides the capacity over its own demand:
//!   the capacity is a maximum, and a tenant that filled it alone is already held to it
//!   when a peer's tenant appears). Only without a fresh view (no cluster, the exchange
//!   stopped) is there no cap per tenant: the agent's own slots and queue order.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    allocate::{Claim, agent_share, allocate},
    queue::Class,
};
use crate::contention::Contention;

/// Tenants published per round at most (the most demanding); the same bound applies to
/// each peer's facts.
pub const MAX_PUBLISHED: usize = 256;
/// Tenants remembered at most without a request here (their last round's peak not yet
/// published); beyond it an idle tenant is forgotten at once.
const MAX_IDLE: usize = 4096;

/// A tenant's requests at this agent.
#[derive(Debug, Clone, Copy, Default)]
struct Local {
    priority: i32,
    weight: u32,
    active: u32,
    waiting: u32,
    /// The most `active + waiting` since the last publication.
    peak: u32,
    /// Slots this agent may give the tenant while engaged (0: none computed yet).
    cap: u64,
}

impl Local {
    fn demand(&self) -> u32 {
        self.active.saturating_add(self.waiting)
    }
}

/// The gate's state.
#[derive(Debug)]
pub struct Gate {
    capacity: u32,
    tenants: HashMap<Arc<str>, Local>,
    /// This agent's contention as last published (what the caps were computed from).
    published: Vec<(Arc<str>, Contention)>,
    remote: HashMap<Arc<str>, Vec<Contention>>,
    fresh_until: Option<Instant>,
}

impl Gate {
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity,
            tenants: HashMap::new(),
            published: Vec::new(),
            remote: HashMap::new(),
            fresh_until: None,
        }
    }

    /// Whether per-tenant caps apply at `now`: the exchange's view is fresh (with or
    /// without a peer's demand in it).
    pub fn engaged(&self, now: Instant) -> bool {
        self.fresh_until.is_some_and(|t| now < t)
    }

    /// Whether one more request of `tenant` may hold a slot now.
    pub fn may_start(&self, tenant: &str, now: Instant) -> bool {
        if !self.engaged(now) {
            return true;
        }
        let local = self.tenants.get(tenant).copied().unwrap_or_default();
        u64::from(local.active) < local.cap.max(1)
    }

    /// This agent's cap for `tenant` now (`None`: not engaged).
    pub fn cap(&self, tenant: &str, now: Instant) -> Option<u64> {
        self.engaged(now)
            .then(|| self.tenants.get(tenant).map_or(1, |l| l.cap.max(1)))
    }

    /// Every tenant's cap here while engaged (none otherwise), for the metrics.
    pub fn caps(&self, now: Instant) -> Vec<(Arc<str>, u64)> {
        if !self.engaged(now) {
            return Vec::new();
        }
        let caps = self.tenants.iter().map(|(t, l)| (t.clone(), l.cap.max(1)));
        caps.collect()
    }

    /// A request of `tenant` takes a slot without waiting.
    pub fn started(&mut self, tenant: &Arc<str>, class: Class) {
        self.touch(tenant, class, |l| l.active = l.active.saturating_add(1));
    }

    /// A request of `tenant` waits for a slot.
    pub fn queued(&mut self, tenant: &Arc<str>, class: Class) {
        self.touch(tenant, class, |l| l.waiting = l.waiting.saturating_add(1));
    }

    /// A waiting request of `tenant` was handed a slot.
    pub fn granted(&mut self, tenant: &str) {
        self.change(tenant, |l| {
            l.waiting = l.waiting.saturating_sub(1);
            l.active = l.active.saturating_add(1);
        });
    }

    /// A waiting request of `tenant` gave up.
    pub fn gave_up(&mut self, tenant: &str) {
        self.change(tenant, |l| l.waiting = l.waiting.saturating_sub(1));
    }

    /// A request of `tenant` released its slot.
    pub fn ended(&mut self, tenant: &str) {
        self.change(tenant, |l| l.active = l.active.saturating_sub(1));
    }

    fn touch(&mut self, tenant: &Arc<str>, class: Class, f: impl FnOnce(&mut Local)) {
        let l = self.tenants.entry(tenant.clone()).or_default();
        l.priority = class.priority;
        l.weight = class.weight.max(1);
        f(l);
        l.peak = l.peak.max(l.demand());
    }

    fn change(&mut self, tenant: &str, f: impl FnOnce(&mut Local)) {
        let Some(l) = self.tenants.get_mut(tenant) else {
            return;
        };
        f(l);
        if l.demand() == 0 && self.tenants.len() > MAX_IDLE {
            self.tenants.remove(tenant);
        }
    }

    /// This round's contention to publish (at most [`MAX_PUBLISHED`] tenants, the most
    /// demanding): each tenant's peak since the last round. Starts the next round's peaks;
    /// forgets tenants without a request here in the round that ended (one idle now but
    /// published keeps its entry, so the cap computed from this publication reaches it when
    /// it bursts again).
    pub fn publish(&mut self) -> Vec<(Arc<str>, Contention)> {
        let mut out: Vec<(Arc<str>, Contention)> = self
            .tenants
            .iter()
            .filter(|(_, l)| l.peak > 0)
            .map(|(t, l)| {
                let c = Contention {
                    priority: l.priority,
                    weight: l.weight,
                    demand: l.peak,
                };
                (t.clone(), c)
            })
            .collect();
        out.sort_by(|(a, ca), (b, cb)| cb.demand.cmp(&ca.demand).then_with(|| a.cmp(b)));
        out.truncate(MAX_PUBLISHED);
        self.tenants.retain(|_, l| l.peak > 0 || l.demand() > 0);
        for l in self.tenants.values_mut() {
            l.peak = l.demand();
        }
        self.published = out.clone();
        out
    }

    /// The peers' contention (bounded to [`MAX_PUBLISHED`] tenants per peer's worth), fresh
    /// until `now + fresh_for`; recomputes the caps.
    pub fn set_remote(
        &mut self,
        remote: HashMap<Arc<str>, Vec<Contention>>,
        fresh_for: Duration,
        now: Instant,
    ) {
        self.remote = remote;
        self.fresh_until = now.checked_add(fresh_for);
        self.recompute();
    }

    /// Each local tenant's cap: its part of its cluster-wide share.
    fn recompute(&mut self) {
        // Per tenant: (highest priority and weight reported, cluster demand, local demand).
        let mut all: HashMap<&str, (Contention, u64, u64)> = HashMap::new();
        let local = self.published.iter().map(|(t, c)| (t, c, true));
        let remote = self
            .remote
            .iter()
            .flat_map(|(t, cs)| cs.iter().map(move |c| (t, c, false)));
        for (tenant, c, mine) in local.chain(remote) {
            let e = all.entry(tenant).or_default();
            if e.1 == 0 {
                e.0 = *c;
            }
            e.0.priority = e.0.priority.max(c.priority);
            e.0.weight = e.0.weight.max(c.weight);
            e.1 = e.1.saturating_add(u64::from(c.demand));
            if mine {
                e.2 = e.2.saturating_add(u64::from(c.demand));
            }
        }
        let entries: Vec<(&str, (Contention, u64, u64))> = all.into_iter().collect();
        let claims: Vec<Claim<'_>> = entries
            .iter()
            .map(|(t, (c, demand, _))| Claim {
                tenant: t,
                priority: c.priority,
                weight: c.weight,
                demand: *demand,
            })
            .collect();
        let shares = allocate(self.capacity, &claims);
        let caps: HashMap<Arc<str>, u64> = entries
            .iter()
            .zip(shares)
            .filter(|((_, (_, _, local)), _)| *local > 0)
            .map(|((t, (_, demand, local)), share)| {
                (Arc::<str>::from(*t), agent_share(share, *demand, *local))
            })
            .collect();
        for (t, l) in &mut self.tenants {
            l.cap = caps.get(t).copied().unwrap_or(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(priority: i32, weight: u32) -> Class {
        Class {
            tenant: 0,
            priority,
            weight,
        }
    }

    fn peer(priority: i32, weight: u32, demand: u32) -> Contention {
        Contention {
            priority,
            weight,
            demand,
        }
    }

    #[test]
    fn alone_the_capacity_is_still_the_maximum() {
        // Capacity 2; `a` started 5 before any view (no caps then).
        let mut g = Gate::new(2);
        let now = Instant::now();
        let a: Arc<str> = Arc::from("a");
        for _ in 0..5 {
            assert!(g.may_start(&a, now));
            g.started(&a, class(0, 1));
        }
        // A fresh view without any peer: `a` alone has demand 5 for 2 slots: cap 2.
        assert_eq!(g.publish(), vec![(a.clone(), peer(0, 1, 5))]);
        g.set_remote(HashMap::new(), Duration::from_secs(1), now);
        assert!(g.engaged(now));
        assert_eq!(g.cap("a", now), Some(2));
        assert!(!g.may_start(&a, now), "5 in flight, cap 2");
        for _ in 0..3 {
            g.ended("a");
        }
        assert!(!g.may_start(&a, now), "2 in flight: at the cap");
        g.ended("a");
        assert!(g.may_start(&a, now), "1 in flight: under the cap");
        // Past the freshness the gate lets go.
        let later = now + Duration::from_secs(1);
        assert!(!g.engaged(later));
        assert_eq!(g.cap("a", later), None);
    }

    #[test]
    fn a_peers_higher_priority_holds_this_agents_tenant_to_what_is_left() {
        // Capacity 8; `high` has 6 at a peer; `low` has 6 here: `low` gets the 2 left.
        let mut g = Gate::new(8);
        let now = Instant::now();
        let low: Arc<str> = Arc::from("low");
        for _ in 0..6 {
            g.queued(&low, class(0, 1));
        }
        assert_eq!(g.publish(), vec![(low.clone(), peer(0, 1, 6))]);
        let remote = HashMap::from([(Arc::from("high"), vec![peer(5, 1, 6)])]);
        g.set_remote(remote, Duration::from_secs(1), now);
        assert_eq!(g.cap("low", now), Some(2));
        g.granted("low");
        assert!(g.may_start("low", now));
        g.granted("low");
        assert!(!g.may_start("low", now), "2 in flight: at the cap");
        // A tenant unknown when the caps were computed may start one.
        assert!(g.may_start("new", now));
        // Past the freshness, the agent is alone again.
        let later = now + Duration::from_secs(1);
        assert!(!g.engaged(later));
        assert!(g.may_start("low", later));
    }

    #[test]
    fn the_published_demand_is_the_rounds_peak() {
        let mut g = Gate::new(8);
        let a: Arc<str> = Arc::from("a");
        g.started(&a, class(1, 3));
        g.started(&a, class(1, 3));
        g.ended("a");
        g.ended("a");
        assert_eq!(g.publish(), vec![(a.clone(), peer(1, 3, 2))]);
        // Nothing since: nothing published, and the tenant is forgotten.
        assert!(g.publish().is_empty());
        assert!(g.tenants.is_empty());
    }

    #[test]
    fn a_tenant_idle_at_publication_keeps_the_cap_its_burst_earned() {
        // Capacity 8; `a` peaked at 2 during the round and is idle when it is published; a
        // peer's `b` (same class) has 2. Demand 4 of 8: each gets its 2, and the 4 spare
        // go by weight, 2 each: `a`'s cap here is 4, not the floor of 1.
        let mut g = Gate::new(8);
        let now = Instant::now();
        let a: Arc<str> = Arc::from("a");
        g.started(&a, class(0, 1));
        g.started(&a, class(0, 1));
        g.ended("a");
        g.ended("a");
        assert_eq!(g.publish(), vec![(a.clone(), peer(0, 1, 2))]);
        let remote = HashMap::from([(Arc::from("b"), vec![peer(0, 1, 2)])]);
        g.set_remote(remote, Duration::from_secs(1), now);
        assert_eq!(g.cap("a", now), Some(4));
        // The next burst: 4 start, the fifth waits.
        for _ in 0..4 {
            assert!(g.may_start(&a, now));
            g.started(&a, class(0, 1));
        }
        assert!(!g.may_start(&a, now));
    }
}
