use proptest::prelude::*;

use super::*;

fn claim(tenant: &str, priority: i32, weight: u32, demand: u64) -> Claim<'_> {
    Claim {
        tenant,
        priority,
        weight,
        demand,
    }
}

#[test]
fn a_higher_priority_gets_its_demand_first() {
    // Capacity 8: `high` asks 6 and gets it; `low` gets the 2 left of its 6.
    let s = allocate(8, &[claim("low", 0, 1, 6), claim("high", 10, 1, 6)]);
    assert_eq!(s, vec![2, 6]);
    // `high` asking more than everything: `low` gets nothing.
    let s = allocate(8, &[claim("low", 0, 1, 6), claim("high", 10, 1, 20)]);
    assert_eq!(s, vec![0, 8]);
}

#[test]
fn equal_priorities_share_by_weight() {
    // Weights 3 and 1, both asking 8 of 8: 8 x 3/4 = 6 and 8 x 1/4 = 2.
    let s = allocate(8, &[claim("a", 0, 3, 8), claim("b", 0, 1, 8)]);
    assert_eq!(s, vec![6, 2]);
    // Capacity 10: 7.5 and 2.5; the one slot left over goes to the tie's first name.
    let s = allocate(10, &[claim("a", 0, 3, 20), claim("b", 0, 1, 20)]);
    assert_eq!(s, vec![8, 2]);
}

#[test]
fn a_small_demand_is_met_and_the_rest_split_by_weight() {
    // Capacity 12, weights 1/1/2. `small` asks 2, under its weighted part (12 x 1/4 = 3):
    // it gets 2, and 10 is split 1:2 between `b` and `c`: 3.33 and 6.67, so 3 and 6, and
    // the slot left over goes to the larger remainder (c: 0.67).
    let s = allocate(
        12,
        &[
            claim("small", 0, 1, 2),
            claim("b", 0, 1, 50),
            claim("c", 0, 2, 50),
        ],
    );
    assert_eq!(s, vec![2, 3, 7]);
}

#[test]
fn three_levels_each_met_in_turn() {
    // 10 slots: priority 5 asks 3 (met), priority 3 asks 4 (met), priority 0 gets the 3 left.
    let s = allocate(
        10,
        &[
            claim("p0", 0, 1, 9),
            claim("p3", 3, 1, 4),
            claim("p5", 5, 1, 3),
        ],
    );
    assert_eq!(s, vec![3, 4, 3]);
}

#[test]
fn spare_capacity_is_shared_by_weight_among_those_with_demand() {
    // Demand 2 + 1 of 10: 7 spare, split 3:1 = 5.25 and 1.75 -> 5 and 1, the leftover slot
    // to the larger remainder (b: 0.75). Nothing to the tenant without demand.
    let s = allocate(
        10,
        &[
            claim("a", 1, 3, 2),
            claim("b", 0, 1, 1),
            claim("idle", 0, 5, 0),
        ],
    );
    assert_eq!(s, vec![2 + 5, 1 + 2, 0]);
    assert_eq!(allocate(4, &[claim("idle", 0, 1, 0)]), vec![0]);
    assert!(allocate(4, &[]).is_empty());
}

#[test]
fn weight_zero_counts_as_one() {
    let s = allocate(4, &[claim("a", 0, 0, 9), claim("b", 0, 1, 9)]);
    assert_eq!(s, vec![2, 2]);
}

#[test]
fn an_agent_gets_its_part_of_its_tenants_share_and_at_least_one() {
    // Share 6 of demand 8: an agent with 6 of it gets 6 x 6/8 = 4.5 -> 4, one with 2 gets
    // 1.5 -> 1.
    assert_eq!(agent_share(6, 8, 6), 4);
    assert_eq!(agent_share(6, 8, 2), 1);
    // A share of 0 (a lower priority shut out) still leaves 1 at an agent with demand.
    assert_eq!(agent_share(0, 5, 5), 1);
    assert_eq!(agent_share(6, 8, 0), 0);
    assert_eq!(agent_share(6, 0, 0), 0);
}

#[test]
fn demands_that_overflow_when_summed_saturate() {
    // Two of one level each asking u64::MAX: the level's demand saturates (more than the 8
    // left), so the 8 slots go by weight: 4 and 4; a level below gets nothing.
    let claims = [
        claim("a", 1, 1, u64::MAX),
        claim("b", 1, 1, u64::MAX),
        claim("c", 0, 1, 1),
    ];
    assert_eq!(allocate(8, &claims), vec![4, 4, 0]);
}

fn claims() -> impl Strategy<Value = Vec<(i32, u32, u64)>> {
    prop::collection::vec((0i32..3, 0u32..6, 0u64..40), 1..8)
}

proptest! {
    #[test]
    fn shares_follow_priority_then_weight(capacity in 0u32..64, raw in claims()) {
        let names: Vec<String> = (0..raw.len()).map(|i| format!("t{i}")).collect();
        let cs: Vec<Claim<'_>> = raw
            .iter()
            .zip(&names)
            .map(|(&(p, w, d), n)| claim(n, p, w, d))
            .collect();
        let s = allocate(capacity, &cs);
        let total: u64 = s.iter().sum();
        let demand: u64 = cs.iter().map(|c| c.demand).sum();
        // Never more than the capacity; all of it once anyone asks.
        prop_assert!(total <= u64::from(capacity));
        if demand > 0 {
            prop_assert_eq!(total, u64::from(capacity));
        }
        for (i, a) in cs.iter().enumerate() {
            if a.demand == 0 {
                prop_assert_eq!(s[i], 0);
            }
            for (j, b) in cs.iter().enumerate() {
                // A higher priority short of its demand: nothing for any lower priority.
                if a.priority > b.priority && s[i] < a.demand {
                    prop_assert_eq!(s[j], 0, "{:?} -> {:?}", cs, s);
                }
                // Same priority, both short of their demand: shares by weight within a slot.
                if i != j && a.priority == b.priority && s[i] < a.demand && s[j] < b.demand {
                    let (wa, wb) = (a.weight() as f64, b.weight() as f64);
                    let gap = s[i] as f64 / wa - s[j] as f64 / wb;
                    prop_assert!(gap.abs() <= 1.0 / wa + 1.0 / wb + 1e-9, "{:?} -> {:?}", cs, s);
                }
            }
        }
    }

    #[test]
    fn agents_parts_stay_within_the_share_plus_the_floors(
        share in 0u64..64,
        locals in prop::collection::vec(0u64..20, 1..6),
    ) {
        let demand: u64 = locals.iter().sum();
        let parts: Vec<u64> = locals.iter().map(|&l| agent_share(share, demand, l)).collect();
        let floors = parts.iter().zip(&locals).filter(|(p, l)| **p == 1 && **l > 0).count();
        let sum: u64 = parts.iter().sum();
        prop_assert!(sum <= share + floors as u64, "{:?} of {}: {:?}", locals, share, parts);
        // Rounding down loses less than one slot per agent.
        if demand > 0 {
            prop_assert!(sum + locals.len() as u64 > share, "{:?} of {}: {:?}", locals, share, parts);
        }
        for (p, l) in parts.iter().zip(&locals) {
            prop_assert_eq!(*p == 0, *l == 0);
        }
    }
}
