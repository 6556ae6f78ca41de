//! How a cluster-wide concurrency is divided among the tenants that contend for it,
//! and a tenant's share among the agents it sends through (docs/policy.md, "Across
//! agents"). Pure and deterministic, in integers: agents with the same gossiped view compute
//! the same shares.
//!
//! The algorithm, for capacity `C` and each tenant's cluster-wide demand `D_t` (requests in
//! flight plus waiting, summed over agents), priority `p_t` and weight `w_t`:
//!
//! 1. **Priority.** Levels from the highest priority down: a level whose total demand fits
//!    in what is left gets its demand; the first level that does not fit divides what is
//!    left by weight ([`weighted_fill`]) and every lower level gets 0.
//! 2. **Weight** within that level: weighted max-min fair (water-filling). The level `λ` is
//!    raised until the capacity is spent: a tenant gets `min(D_t, λ x w_t)`. So a tenant
//!    asking less than its weighted part gets all it asks, and the others split the rest in
//!    proportion to their weights. Whole slots: `floor(λ x w_t)`, and the slots that leaves
//!    over go one each to the largest remainders (ties by tenant name).
//! 3. **Spare.** When every demand is met, the capacity left is shared by weight among the
//!    tenants with demand (room to grow until the next round, without a round trip).
//! 4. **Agents** ([`agent_share`]): a tenant's share is split in proportion to each agent's
//!    part of its demand, rounded down, at least 1 for an agent with demand.
//!
//! Guarantees: the tenants' shares add up to at most `C` (exactly `C` when anyone has
//! demand); a tenant never gets less than its demand while a tenant of lower priority gets
//! anything; among tenants of one priority that do not get their demand, shares follow the
//! weights within one slot. The agents' parts of one tenant add up to at most its share plus
//! one per agent whose proportional part rounds down to 0.

use std::cmp::Ordering;

/// One tenant's claim on the capacity, summed over the agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    pub tenant: &'a str,
    pub priority: i32,
    /// 0 counts as 1.
    pub weight: u32,
    /// Requests in flight plus waiting, cluster-wide.
    pub demand: u64,
}

impl Claim<'_> {
    fn weight(&self) -> u64 {
        u64::from(self.weight.max(1))
    }
}

/// Each claim's share of `capacity` (same order as `claims`), by priority, then weighted
/// max-min over demand, then spare capacity by weight.
pub fn allocate(capacity: u32, claims: &[Claim<'_>]) -> Vec<u64> {
    let mut shares = vec![0u64; claims.len()];
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by(|&a, &b| {
        claims[b]
            .priority
            .cmp(&claims[a].priority)
            .then_with(|| claims[a].tenant.cmp(claims[b].tenant))
    });
    let mut left = u64::from(capacity);
    for level in order.chunk_by(|&a, &b| claims[a].priority == claims[b].priority) {
        let demand = level
            .iter()
            .fold(0u64, |n, &i| n.saturating_add(claims[i].demand));
        if demand <= left {
            for &i in level {
                shares[i] = claims[i].demand;
            }
            left -= demand;
            continue;
        }
        let members: Vec<Claim<'_>> = level.iter().map(|&i| claims[i]).collect();
        for (&i, share) in level.iter().zip(weighted_fill(left, &members)) {
            shares[i] = share;
        }
        return shares;
    }
    let wanting: Vec<usize> = order
        .into_iter()
        .filter(|&i| claims[i].demand > 0)
        .collect();
    let members: Vec<Claim<'_>> = wanting.iter().map(|&i| claims[i]).collect();
    for (&i, extra) in wanting.iter().zip(proportional(left, &members)) {
        shares[i] = shares[i].saturating_add(extra);
    }
    shares
}

/// Weighted max-min division of `capacity` (less than the claims' total demand) among
/// `claims`, in whole slots.
pub fn weighted_fill(capacity: u64, claims: &[Claim<'_>]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..claims.len()).collect();
    // By demand per unit of weight, smallest first: D_a / w_a < D_b / w_b.
    order.sort_by(|&a, &b| {
        let (ca, cb) = (&claims[a], &claims[b]);
        (u128::from(ca.demand) * u128::from(cb.weight()))
            .cmp(&(u128::from(cb.demand) * u128::from(ca.weight())))
            .then_with(|| ca.tenant.cmp(cb.tenant))
    });
    let mut shares = vec![0u64; claims.len()];
    let mut left = capacity;
    let mut weights: u64 = claims.iter().map(Claim::weight).sum();
    let mut served = 0;
    for &i in &order {
        let c = &claims[i];
        // Met in full when D_t <= λ x w_t, λ = left / weights.
        if u128::from(c.demand) * u128::from(weights) > u128::from(left) * u128::from(c.weight()) {
            break;
        }
        shares[i] = c.demand;
        left -= c.demand;
        weights -= c.weight();
        served += 1;
    }
    let rest = &order[served..];
    let members: Vec<Claim<'_>> = rest.iter().map(|&i| claims[i]).collect();
    for (&i, share) in rest.iter().zip(proportional(left, &members)) {
        shares[i] = share;
    }
    shares
}

/// `capacity` in proportion to the claims' weights, in whole slots: each `floor(C x w /
/// W)`, the slots left over one each to the largest remainders (ties by tenant name).
fn proportional(capacity: u64, claims: &[Claim<'_>]) -> Vec<u64> {
    let total: u128 = claims.iter().map(|c| u128::from(c.weight())).sum();
    if total == 0 {
        return vec![0; claims.len()];
    }
    let exact: Vec<(u64, u128)> = claims
        .iter()
        .map(|c| {
            let n = u128::from(capacity) * u128::from(c.weight());
            // At most `capacity`: fits.
            ((n / total) as u64, n % total)
        })
        .collect();
    let mut shares: Vec<u64> = exact.iter().map(|e| e.0).collect();
    let given: u64 = shares.iter().sum();
    let mut by_remainder: Vec<usize> = (0..claims.len()).collect();
    by_remainder.sort_by(|&a, &b| match exact[b].1.cmp(&exact[a].1) {
        Ordering::Equal => claims[a].tenant.cmp(claims[b].tenant),
        o => o,
    });
    let leftover = capacity.saturating_sub(given);
    for &i in by_remainder
        .iter()
        .take(usize::try_from(leftover).unwrap_or(usize::MAX))
    {
        shares[i] += 1;
    }
    shares
}

/// One agent's part of a tenant's `share`: in proportion to the agent's `local` part of the
/// tenant's cluster-wide `demand`, rounded down, at least 1 when the agent has demand (so a
/// tenant is never locked out of an agent by rounding or by priority).
pub fn agent_share(share: u64, demand: u64, local: u64) -> u64 {
    if local == 0 || demand == 0 {
        return 0;
    }
    let part = u128::from(share) * u128::from(local.min(demand)) / u128::from(demand);
    u64::try_from(part).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests;
