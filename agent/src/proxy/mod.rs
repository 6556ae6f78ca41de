//! The routing proxy: an OpenAI-compatible HTTP server (HTTP/1.1 keep-alive and h2c) that
//! picks an endpoint per request and streams the engine's response back. It adapts warmpath's
//! HTTP/1.1 layer ([`crate::http`]) to the application; nothing there depends on it.
//!
//! One request, top to bottom:
//!
//! 1. [`listener`]: accept, hand the connection to a worker ([`workers`]), tell HTTP/1.x from
//!    h2c; [`crate::http::server`] reads the request head and body.
//! 2. [`handle`]: the current policy set ([`crate::policy`]), the tenant
//!    ([`crate::tenant`]) and its rule, admission, the path (health, models, completions).
//! 3. [`handle`] (`route`): parse the body ([`request`]), find the pool ([`pools`]), the
//!    policy's action (a split may change pool and model), the tenant's quota and cache
//!    salt, token keys ([`tokens`]) and session key into the routing input.
//! 4. [`candidates`]: each endpoint's prefix match (index or history) and load.
//! 5. [`forward`]: rank ([`crate::routing::rank`]), try endpoints best first ([`upstream`]),
//!    retrying failures before the first response byte.
//! 6. [`tracked`]: the engine's body streams back through its [`tap`] (usage read, SSE
//!    rewritten when usage was injected).
//! 7. [`record`]: one telemetry record per request, when the body ends (or when the proxy
//!    answered with an error itself).

mod admin;
pub mod admission;
mod calibration;
mod candidates;
pub mod clients;
mod cold_yield;
mod contenders;
mod error;
mod forward;
mod handle;
mod listener;
mod members;
mod pools;
mod record;
mod recount;
pub mod request;
mod scrape;
pub mod tap;
pub mod tokens;
mod tracked;
pub mod unkeyed;
mod upstream;
pub mod workers;

use std::sync::Arc;

pub use admin::serve_admin;
pub use error::ProxyError;
pub use listener::{ClientOrigin, serve};
pub use pools::PoolRuntime;
pub use recount::recount_loop;
pub use scrape::scrape_loop;
pub use scrape::{parse_adapters, parse_kv_blocks, parse_load, parse_lora};
pub use tokens::TokenSource;
pub use workers::Workers;

use crate::{
    config::{DEFAULT_MAX_BODY, DEFAULT_RETRIES},
    kv_index::KvIndex,
    policy::{active::ActivePolicy, quota::Quotas, salt::CacheSalt},
    telemetry::Telemetry,
    tenant::TenantPolicy,
};

/// Everything a request needs.
#[derive(Debug)]
pub struct Proxy {
    /// Requests go to the pool whose model (or one of whose LoRA adapters) they name; the
    /// first pool takes requests without a model and other paths.
    pub pools: Vec<PoolRuntime>,
    pub index: Arc<KvIndex>,
    pub max_body: usize,
    pub retries: usize,
    /// Add x-warmpath-* headers explaining each decision.
    pub explain: bool,
    /// Ask streams for usage when the client did not (and strip it again), so token counts
    /// are always known.
    pub inject_usage: bool,
    pub telemetry: Arc<Telemetry>,
    /// Tenants, their rules, and the routing policies over the pools' configuration
    /// ([`crate::policy`]); read once per request, replaced whole on reload.
    pub policy: Arc<ActivePolicy>,
    /// The key of isolated tenants' cache salts ([`crate::policy::salt`]).
    pub salt: Arc<CacheSalt>,
    /// Tenants' quota state (kept across policy reloads; [`crate::policy::quota`]).
    pub quotas: Arc<Quotas>,
    /// Capacity, queue and size bounds ([`admission`]).
    pub admission: Arc<admission::Admission>,
    /// Sections other parts of the agent add to `/status` (e.g. `kubernetes`).
    pub sections: StatusSections,
    /// Set when the agent is told to stop: `/ready` answers 503 while requests drain.
    pub draining: std::sync::atomic::AtomicBool,
    /// This agent's slot in its cluster's order, for staggered cold decisions
    /// ([`crate::routing::stagger`]; kept by [`crate::cluster::spawn_order_watch`]).
    pub stagger: Arc<crate::routing::stagger::Slot>,
    /// Which pods answered each intercepted client ([`clients`]); read by the kernel-table
    /// writer.
    clients: Arc<clients::ClientPods>,
    upstreams: upstream::Upstreams,
}

/// A `/status` section: its value, computed when asked.
pub type StatusSection = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Named `/status` sections, added at start by the parts that own them.
#[derive(Default)]
pub struct StatusSections(parking_lot::RwLock<Vec<(&'static str, StatusSection)>>);

impl std::fmt::Debug for StatusSections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.read().iter().map(|(n, _)| *n).collect();
        f.debug_tuple("StatusSections").field(&names).finish()
    }
}

impl StatusSections {
    /// Adds (or replaces) the section `name`.
    pub fn set(&self, name: &'static str, section: StatusSection) {
        let mut sections = self.0.write();
        sections.retain(|(n, _)| *n != name);
        sections.push((name, section));
    }

    /// Every section's value now.
    pub fn values(&self) -> Vec<(&'static str, serde_json::Value)> {
        self.0.read().iter().map(|(n, f)| (*n, f())).collect()
    }
}

impl Proxy {
    /// A proxy without pools yet (see [`Proxy::add_pool`]).
    pub fn new(index: Arc<KvIndex>, telemetry: Arc<Telemetry>, tenants: TenantPolicy) -> Self {
        Self {
            pools: Vec::new(),
            index,
            max_body: DEFAULT_MAX_BODY,
            retries: DEFAULT_RETRIES,
            explain: false,
            inject_usage: true,
            telemetry,
            policy: Arc::new(ActivePolicy::new(tenants)),
            salt: Arc::new(CacheSalt::random()),
            quotas: Quotas::new(),
            admission: admission::Admission::new(crate::config::Limits::default()),
            sections: StatusSections::default(),
            draining: std::sync::atomic::AtomicBool::new(false),
            stagger: Arc::default(),
            clients: Arc::new(clients::ClientPods::default()),
            upstreams: upstream::Upstreams::new(),
        }
    }

    /// The client-affinity learner: fed by answered requests on intercepted connections.
    pub fn client_pods(&self) -> &Arc<clients::ClientPods> {
        &self.clients
    }
}
