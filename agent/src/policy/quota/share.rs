//! How a cluster-wide limit is split among the agents that enforce it: max-min fair
//! water-filling over their demands, with a floor so that an agent whose demand the others
//! have not heard of yet is never starved.
//!
//! Every agent computes the same split from the same gossiped demands (the function is
//! pure and deterministic), so the shares add up to the limit; between gossip rounds each
//! agent knows its own demand fresher than the others do, which is the error bound of
//! docs/policy.md ("Quotas and fairness").

/// Each agent's share is at least this fraction of an equal split (`limit / agents`): a
/// newly busy agent admits something while its demand travels the gossip.
pub const FLOOR_FRACTION: f64 = 0.05;

/// Max-min fair division of `limit` among `demands` (one per agent, same unit).
///
/// - Total demand at or above the limit: agents whose demand is below the water level get
///   their demand, the rest split what remains equally (the level is the equal split of
///   the remainder); every share is at most its demand and the shares add up to `limit`.
/// - Total demand below the limit: every agent gets its demand plus an equal part of the
///   spare capacity (a bucket refilled at exactly its demand would refuse its ordinary
///   fluctuations); the shares again add up to `limit`.
///
/// Negative or NaN demands count as 0, infinite ones as wanting everything; a limit that is
/// not a positive finite number gives every agent 0.
pub fn water_fill(limit: f64, demands: &[f64]) -> Vec<f64> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    let limit = if limit.is_finite() && limit > 0.0 {
        limit
    } else {
        0.0
    };
    let d: Vec<f64> = demands
        .iter()
        .map(|&x| if x > 0.0 { x } else { 0.0 })
        .collect();
    let total: f64 = d.iter().sum();
    if total <= limit {
        let spare = (limit - total) / n as f64;
        return d.iter().map(|x| x + spare).collect();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| d[a].total_cmp(&d[b]));
    let mut out = vec![0.0; n];
    let mut remaining = limit;
    for (served, &i) in order.iter().enumerate() {
        let level = remaining / (n - served) as f64;
        let give = d[i].min(level).max(0.0);
        out[i] = give;
        remaining -= give;
    }
    out
}

/// This agent's share of `limit` given its own demand and the other agents' (the floor of
/// [`FLOOR_FRACTION`] applied to every agent first, so the shares still add up to the
/// limit). With no other agent it is the whole limit.
pub fn local_share(limit: f64, own: f64, remote: &[f64]) -> f64 {
    if remote.is_empty() {
        return limit;
    }
    let agents = remote.len() + 1;
    let floor = FLOOR_FRACTION * limit / agents as f64;
    let demands: Vec<f64> = std::iter::once(own)
        .chain(remote.iter().copied())
        .map(|d| if d > floor { d } else { floor })
        .collect();
    water_fill(limit, &demands)[0]
}

/// This agent's share of a cap on concurrent streams, by the same rule over request
/// demand: rounded down (so the agents' caps add up to at most the cap), at least 1.
pub fn local_streams(cap: u32, own_requests: f64, remote_requests: &[f64]) -> u32 {
    if remote_requests.is_empty() {
        return cap;
    }
    let share = local_share(f64::from(cap), own_requests, remote_requests);
    // A hair above the share: an exact split such as 10 / 2 must not round down to 4.
    let whole = (share + 1e-9).floor();
    if whole >= f64::from(cap) {
        cap
    } else if whole >= 1.0 {
        whole as u32
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn small_demands_are_met_and_the_rest_split_equally() {
        // Level: 100 - 10 = 90 over three agents, 30 each; 20 < 30 is met, so 70 over two.
        let s = water_fill(100.0, &[10.0, 20.0, 50.0, 80.0]);
        assert_eq!(s, vec![10.0, 20.0, 35.0, 35.0]);
    }

    #[test]
    fn spare_capacity_is_shared_equally_on_top_of_demand() {
        let s = water_fill(100.0, &[10.0, 30.0]);
        assert_eq!(s, vec![40.0, 60.0]);
        assert_eq!(water_fill(100.0, &[0.0, 0.0, 0.0, 0.0]), vec![25.0; 4]);
    }

    #[test]
    fn odd_inputs_neither_panic_nor_leak_capacity() {
        assert!(water_fill(100.0, &[]).is_empty());
        assert_eq!(water_fill(f64::NAN, &[5.0, 5.0]), vec![0.0, 0.0]);
        assert_eq!(water_fill(-1.0, &[5.0]), vec![0.0]);
        assert_eq!(water_fill(10.0, &[f64::NAN, -3.0]), vec![5.0, 5.0]);
        assert_eq!(water_fill(10.0, &[f64::INFINITY, 2.0]), vec![8.0, 2.0]);
    }

    #[test]
    fn a_lone_agent_has_the_whole_limit() {
        assert_eq!(local_share(500.0, 0.0, &[]), 500.0);
        assert_eq!(local_streams(7, 0.0, &[]), 7);
    }

    #[test]
    fn an_agent_unknown_to_the_others_keeps_its_floor() {
        // Four agents, three busy: the idle one is held at 5 % of 100 / 4 = 1.25, and the
        // busy ones split the rest.
        let idle = local_share(100.0, 0.0, &[1000.0, 1000.0, 1000.0]);
        assert!(close(idle, 1.25), "{idle}");
        let busy = local_share(100.0, 1000.0, &[0.0, 1000.0, 1000.0]);
        assert!(close(busy, (100.0 - 1.25) / 3.0), "{busy}");
    }

    #[test]
    fn stream_caps_round_down_but_never_to_zero() {
        assert_eq!(local_streams(10, 5.0, &[5.0]), 5);
        assert_eq!(local_streams(10, 5.0, &[5.0, 5.0]), 3);
        assert_eq!(local_streams(2, 1.0, &[1.0, 1.0, 1.0]), 1);
        assert_eq!(
            local_streams(3, 100.0, &[0.0]),
            2,
            "3 - floor 0.075, rounded down"
        );
    }

    proptest! {
        #[test]
        fn water_filling_is_max_min_fair(
            limit in 0.001f64..1e7,
            demands in prop::collection::vec(0.0f64..1e7, 1..40),
        ) {
            let s = water_fill(limit, &demands);
            prop_assert_eq!(s.len(), demands.len());
            let sum: f64 = s.iter().sum();
            prop_assert!(close(sum, limit), "sum {} limit {}", sum, limit);
            let total: f64 = demands.iter().sum();
            let level = s.iter().cloned().fold(0.0, f64::max);
            for (share, demand) in s.iter().zip(&demands) {
                prop_assert!(*share >= 0.0);
                if total >= limit {
                    prop_assert!(*share <= demand * (1.0 + 1e-9) + 1e-9);
                    // Max-min: an agent short of its demand has the largest share.
                    if *share < demand * (1.0 - 1e-9) {
                        prop_assert!(close(*share, level), "{} vs level {}", share, level);
                    }
                } else {
                    prop_assert!(*share >= *demand);
                }
            }
        }

        #[test]
        fn equal_demands_get_equal_shares(
            limit in 0.001f64..1e7,
            demand in 0.0f64..1e7,
            agents in 1usize..64,
        ) {
            let s = water_fill(limit, &vec![demand; agents]);
            for share in &s {
                prop_assert!(close(*share, limit / agents as f64));
            }
        }

        #[test]
        fn floored_shares_add_up_to_the_limit(
            limit in 0.001f64..1e7,
            own in 0.0f64..1e7,
            remote in prop::collection::vec(0.0f64..1e7, 0..16),
        ) {
            let mine = local_share(limit, own, &remote);
            let agents = remote.len() + 1;
            prop_assert!(mine >= FLOOR_FRACTION * limit / agents as f64 * (1.0 - 1e-9));
            // Every agent computing its own share from the same demands: the sum is the limit.
            let mut all = vec![own];
            all.extend(&remote);
            let sum: f64 = (0..agents)
                .map(|i| {
                    let others: Vec<f64> =
                        all.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, d)| *d).collect();
                    local_share(limit, all[i], &others)
                })
                .sum();
            prop_assert!(close(sum, limit), "sum {} limit {}", sum, limit);
        }
    }
}
