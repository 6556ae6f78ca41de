//! The proxy's side of the contention exchange ([`ContentionExchange`]; docs/policy.md,
//! "Across agents"): the agent-wide cluster gate's tenants travel as `TENANT`, each pool's
//! second stage's as `TENANT@POOL` (tenant names hold no `@`, and config validation keeps
//! it out of the names of pools with a gate), so one exchange carries every gate's facts
//! and hands each gate its own.

use std::{collections::HashMap, sync::Arc, time::Duration};

use super::Proxy;
use crate::contention::{Contention, ContentionExchange};

/// The key of `tenant`'s contention in `pool`'s gate.
fn pool_key(tenant: &str, pool: &str) -> Arc<str> {
    Arc::from(format!("{tenant}@{pool}"))
}

impl ContentionExchange for Proxy {
    fn take_round(&self) -> Vec<(Arc<str>, Contention)> {
        let mut out = self.admission.take_round();
        for p in &self.pools {
            if let Some(stage) = &p.admission {
                let round = stage.take_round().into_iter();
                out.extend(round.map(|(t, c)| (pool_key(&t, &p.name), c)));
            }
        }
        out
    }

    fn set_remote_contention(
        &self,
        remote: HashMap<Arc<str>, Vec<Contention>>,
        fresh_for: Duration,
    ) {
        let gated: HashMap<&str, usize> = self
            .pools
            .iter()
            .enumerate()
            .filter(|(_, p)| p.admission.is_some())
            .map(|(i, p)| (p.name.as_str(), i))
            .collect();
        let mut agent = HashMap::new();
        let mut pools: Vec<HashMap<Arc<str>, Vec<Contention>>> =
            vec![HashMap::new(); self.pools.len()];
        for (key, cs) in remote {
            match key.split_once('@') {
                None => {
                    agent.insert(key, cs);
                }
                // A pool this agent does not gate (a peer's configuration differs): not ours.
                Some((tenant, pool)) => {
                    if let Some(&i) = gated.get(pool) {
                        pools[i].insert(Arc::from(tenant), cs);
                    }
                }
            }
        }
        self.admission.set_remote_contention(agent, fresh_for);
        // Every gated pool, with or without peers' facts: each view is fresh alike.
        for (p, remote) in self.pools.iter().zip(pools) {
            if let Some(stage) = &p.admission {
                stage.set_remote_contention(remote, fresh_for);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::Limits,
        kv_index::{IndexConfig, KvIndex},
        pool::Pool,
        proxy::{
            TokenSource,
            admission::{Admission, Class},
        },
        routing::{Policy, SessionSource},
        telemetry::{Telemetry, TelemetryConfig},
    };

    /// Pools `a` and `b`, each with its own cluster-wide concurrency of 4, and `c` without;
    /// the agent's admission on, without an agent-wide gate.
    fn proxy() -> Proxy {
        let index = Arc::new(KvIndex::new(IndexConfig::default()));
        let telemetry = Arc::new(Telemetry::new(&TelemetryConfig::default()).expect("telemetry"));
        let mut proxy = Proxy::new(index, telemetry, Default::default());
        proxy.admission = Admission::new(Limits {
            max_concurrent: 100,
            ..Limits::default()
        });
        for (name, model) in [("a", "m"), ("b", "n"), ("c", "o")] {
            let pool = Pool::new(model.into(), 16, Policy::Precise, Vec::new());
            let source = TokenSource::Approximate;
            proxy.add_pool(name, pool, source, SessionSource::default());
        }
        for (i, name) in [(0, "a"), (1, "b")] {
            proxy.pools[i].admission = Some(Admission::for_pool(&proxy.admission, name, 4, 2));
        }
        proxy
    }

    fn c(priority: i32, demand: u32) -> Contention {
        Contention {
            priority,
            weight: 1,
            demand,
        }
    }

    #[tokio::test]
    async fn each_pools_gate_publishes_and_gets_its_own_tenants() {
        let p = proxy();
        let stage = p.pools[0].admission.clone().expect("pool a is gated");
        let b = p.pools[1].admission.clone().expect("pool b is gated");
        let class = Class {
            tenant: 1,
            priority: 0,
            weight: 1,
        };
        let t1: Arc<str> = Arc::from("t1");
        let _held = stage.admit_as(class, &t1).await.expect("under its cap");
        let _in_b = b.admit_as(class, &t1).await.expect("under its cap");
        let mut published = p.take_round();
        published.sort_by(|x, y| x.0.cmp(&y.0));
        let one = c(0, 1);
        assert_eq!(
            published,
            [(Arc::from("t1@a"), one), (Arc::from("t1@b"), one)]
        );
        // Pool a: `t2` (priority 5) has 10 at a peer: C = 4 all its, `t1` the floor of 1.
        // Pool c's (not gated here) and the agent-wide facts are not pool a's; pool b has
        // none from peers: `t1` has b's 4 to itself (its 1, and the 3 spare), however
        // busy `t2` is on pool a.
        let others = [
            (Arc::from("t3@c"), vec![c(9, 10)]),
            (Arc::from("t1"), vec![c(9, 10)]),
        ];
        let mut remote = HashMap::from(others.clone());
        remote.insert(Arc::from("t2@a"), vec![c(5, 10)]);
        p.set_remote_contention(remote, Duration::from_secs(60));
        assert_eq!(stage.cluster_cap("t1"), Some(1));
        assert_eq!(b.cluster_cap("t1"), Some(4));
        // Without `t2`, `t1` (demand 1) has the 4 to itself: its 1, and the 3 spare.
        p.take_round();
        p.set_remote_contention(HashMap::from(others), Duration::from_secs(60));
        assert_eq!(stage.cluster_cap("t1"), Some(4));
        // The agent has no agent-wide gate: no cap there.
        assert_eq!(p.admission.cluster_cap("t1"), None);
    }
}
