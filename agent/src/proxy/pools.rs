//! The pools at run time: each [`Pool`] with its token source, session rule, routing history
//! and upstream protocol, and how a request finds its pool (by model or LoRA adapter).
//!
//! (This lives with the proxy, not with [`crate::pool`]: the token source reads parsed
//! requests, which are the proxy's.)

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Proxy, TokenSource, unkeyed::UnkeyedCounts};
use crate::{
    policy::compiled::PoolBase,
    pool::{Pool, UpstreamProtocol},
    routing::SessionSource,
    telemetry::PoolId,
};

/// One pool at run time: its endpoints and state, token source and session rule.
#[derive(Debug)]
pub struct PoolRuntime {
    pub name: String,
    pub pool: Pool,
    pub tokens: TokenSource,
    pub session: SessionSource,
    pub(super) telemetry_id: PoolId,
    /// Spreads `/tokenize` calls (engine token source) over the endpoints.
    tokenize_cursor: AtomicUsize,
    /// HTTP/1.1 or h2c to the engines.
    pub protocol: UpstreamProtocol,
    /// Requests routed without prefix keys, by reason.
    pub unkeyed: UnkeyedCounts,
}

impl PoolRuntime {
    /// The endpoint asked to tokenize (engine token source): the next one in rotation.
    pub(super) fn tokenize_target(&self) -> Option<String> {
        let endpoints = self.pool.endpoints();
        let routable: Vec<_> = endpoints.iter().filter(|e| e.routable()).collect();
        let n = routable.len();
        let i = self.tokenize_cursor.fetch_add(1, Ordering::Relaxed);
        (n > 0).then(|| routable[i % n].authority.clone())
    }
}

impl Proxy {
    /// Adds a pool (speaking HTTP/1.1 to its engines; see [`PoolRuntime::protocol`]).
    pub fn add_pool(
        &mut self,
        name: &str,
        pool: Pool,
        tokens: TokenSource,
        session: SessionSource,
    ) -> &mut PoolRuntime {
        let telemetry_id = self.telemetry.register_pool(name, &pool.model);
        self.policy.add_pool(PoolBase {
            name: name.to_string(),
            model: pool.model.clone(),
            labels: Default::default(),
            services: Vec::new(),
            policy: pool.policy,
        });
        self.pools.push(PoolRuntime {
            name: name.to_string(),
            pool,
            tokens,
            session,
            telemetry_id,
            tokenize_cursor: AtomicUsize::new(0),
            protocol: UpstreamProtocol::default(),
            unkeyed: UnkeyedCounts::new(name),
        });
        self.pools.last_mut().expect("a pool was just pushed")
    }

    /// The pool serving `model` (its index), and the LoRA adapter when `model` names one.
    pub(super) fn pool_for(&self, model: &str) -> Option<(usize, Option<String>)> {
        if let Some(i) = self.pools.iter().position(|p| p.pool.model == model) {
            return Some((i, None));
        }
        // A pool whose routable endpoints serve the adapter, else (everything draining) any
        // that serves it: its candidates then answer 503, not 404.
        let serves = |routable_only: bool| {
            self.pools.iter().position(|p| {
                p.pool
                    .endpoints()
                    .iter()
                    .any(|e| (!routable_only || e.routable()) && e.serves(model))
            })
        };
        serves(true)
            .or_else(|| serves(false))
            .map(|i| (i, Some(model.to_string())))
    }
}
