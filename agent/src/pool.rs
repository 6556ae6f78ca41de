//! A pool: the endpoints (vLLM pods) serving one model, with the proxy's own live counters.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
};

use serde::Serialize;

use crate::{
    kv_index::SourceId,
    routing::{EndpointId, RoutePolicy},
};

/// How a pool talks to its engines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with keep-alive: one request per connection at a time (vLLM's default
    /// server, uvicorn, speaks only this).
    #[default]
    Http1,
    /// HTTP/2 over cleartext with prior knowledge (h2c): every request to an endpoint
    /// multiplexed over one connection (for engines behind an h2c-capable server).
    H2,
}

impl UpstreamProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http1 => "http1",
            Self::H2 => "h2",
        }
    }
}

/// One vLLM endpoint.
#[derive(Debug)]
pub struct Endpoint {
    pub id: EndpointId,
    /// `host:port` of its HTTP server.
    pub authority: String,
    /// Its Prometheus page.
    pub metrics_url: String,
    /// The authority as a shared label (telemetry attributes, no allocation per request).
    pub label: Arc<str>,
    /// Its KV event source in the index, when it publishes events.
    pub source: Option<SourceId>,
    in_flight: AtomicU32,
    queued_prefill_blocks: AtomicU64,
    requests: AtomicU64,
    failures: AtomicU64,
    /// From the engine's own /metrics (scraped): requests waiting and running, KV usage.
    engine_waiting: AtomicU32,
    engine_running: AtomicU32,
    engine_kv_permille: AtomicU32,
    scraped: AtomicBool,
    /// LoRA adapters the engine serves (`/v1/models` cards whose parent is the base model) and
    /// which are running or waiting (`vllm:lora_requests_info`).
    lora: parking_lot::RwLock<LoraInfo>,
}

/// What an engine says about its LoRA adapters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LoraInfo {
    /// Adapters it can serve.
    pub served: Vec<String>,
    /// Loaded and running (from `vllm:lora_requests_info`; `None`: not reported).
    pub running: Option<Vec<String>>,
    pub waiting: Vec<String>,
}

/// The endpoints of one model and how to choose among them.
#[derive(Debug)]
pub struct Pool {
    pub model: String,
    /// Tokens per KV block; must match vLLM --block-size.
    pub block_size: usize,
    pub policy: RoutePolicy,
    pub endpoints: Vec<Arc<Endpoint>>,
    pub rotation: AtomicUsize,
    /// Moving average of uncached prefill blocks per routed request, x16 (fixed point).
    mean_prefill_x16: AtomicU64,
}

impl Pool {
    /// Sets each endpoint's metrics URL (same order as the endpoints), before the pool is
    /// shared.
    pub fn with_metrics_urls(mut self, urls: Vec<String>) -> Self {
        for (e, url) in self.endpoints.iter_mut().zip(urls) {
            if let Some(e) = Arc::get_mut(e) {
                e.metrics_url = url;
            }
        }
        self
    }

    pub fn new(
        model: String,
        block_size: usize,
        policy: impl Into<RoutePolicy>,
        endpoints: Vec<(String, Option<SourceId>)>,
    ) -> Self {
        let endpoints = endpoints
            .into_iter()
            .enumerate()
            .map(|(i, (authority, source))| {
                Arc::new(Endpoint {
                    id: EndpointId(i),
                    label: Arc::from(authority.as_str()),
                    metrics_url: format!("http://{authority}/metrics"),
                    authority,
                    source,
                    in_flight: AtomicU32::new(0),
                    queued_prefill_blocks: AtomicU64::new(0),
                    requests: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                    engine_waiting: AtomicU32::new(0),
                    engine_running: AtomicU32::new(0),
                    engine_kv_permille: AtomicU32::new(0),
                    scraped: AtomicBool::new(false),
                    lora: parking_lot::RwLock::new(LoraInfo::default()),
                })
            })
            .collect();
        Self {
            model,
            block_size,
            policy: policy.into(),
            endpoints,
            rotation: AtomicUsize::new(0),
            mean_prefill_x16: AtomicU64::new(0),
        }
    }

    /// Folds a routed request's uncached prefill blocks into the moving average (1/8 weight).
    pub fn note_prefill(&self, blocks: u64) {
        let old = self.mean_prefill_x16.load(Ordering::Relaxed);
        let new = old - old / 8 + blocks * 16 / 8;
        self.mean_prefill_x16.store(new, Ordering::Relaxed);
    }

    /// Prefill work queued at an endpoint, in blocks: what this proxy sent that has not
    /// started answering, or — when the engine reports more waiting requests than that
    /// explains (other routers, other agents) — its waiting count times the mean prefill.
    pub fn work_ahead(&self, e: &Endpoint) -> u64 {
        let own = e.queued_prefill_blocks();
        if !e.scraped.load(Ordering::Relaxed) {
            return own;
        }
        let mean = self.mean_prefill_x16.load(Ordering::Relaxed) / 16;
        own.max(u64::from(e.engine_waiting.load(Ordering::Relaxed)) * mean)
    }
}

impl Endpoint {
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn queued_prefill_blocks(&self) -> u64 {
        self.queued_prefill_blocks.load(Ordering::Relaxed)
    }

    /// Records a scrape of the engine's /metrics.
    pub fn set_engine_load(&self, waiting: u32, running: u32, kv_usage: f64) {
        self.engine_waiting.store(waiting, Ordering::Relaxed);
        self.engine_running.store(running, Ordering::Relaxed);
        self.engine_kv_permille.store(
            (kv_usage.clamp(0.0, 1.0) * 1000.0) as u32,
            Ordering::Relaxed,
        );
        self.scraped.store(true, Ordering::Relaxed);
    }

    /// The engine's KV cache usage, 0..1 (0 before the first scrape).
    pub fn kv_usage(&self) -> f64 {
        f64::from(self.engine_kv_permille.load(Ordering::Relaxed)) / 1000.0
    }

    pub fn set_served_adapters(&self, served: Vec<String>) {
        let mut l = self.lora.write();
        if l.served != served {
            l.served = served;
        }
    }

    pub fn set_adapter_activity(&self, running: Vec<String>, waiting: Vec<String>) {
        let mut l = self.lora.write();
        l.running = Some(running);
        l.waiting = waiting;
    }

    /// Whether this engine serves `adapter`.
    pub fn serves(&self, adapter: &str) -> bool {
        self.lora.read().served.iter().any(|a| a == adapter)
    }

    /// The state of `adapter` on this engine, for the LoRA scorer.
    pub fn lora_state(&self, adapter: Option<&str>) -> crate::routing::LoraState {
        use crate::routing::LoraState;
        let Some(adapter) = adapter else {
            return LoraState::NotApplicable;
        };
        let l = self.lora.read();
        match &l.running {
            None => LoraState::NotApplicable,
            Some(running) if running.iter().any(|a| a == adapter) => LoraState::Loaded,
            Some(_) if l.waiting.iter().any(|a| a == adapter) => LoraState::Queued,
            Some(_) => LoraState::NotLoaded,
        }
    }

    pub fn lora_info(&self) -> LoraInfo {
        self.lora.read().clone()
    }

    pub fn note_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request sent here until the returned guard drops; its uncached prefill
    /// blocks count as queued until the first response byte.
    pub fn start(self: &Arc<Self>, prefill_blocks: u64) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.queued_prefill_blocks
            .fetch_add(prefill_blocks, Ordering::Relaxed);
        InFlight {
            endpoint: self.clone(),
            prefill_blocks,
        }
    }

    /// Counters for /status.
    pub fn snapshot(&self) -> EndpointStatus {
        EndpointStatus {
            endpoint: self.authority.clone(),
            in_flight: self.in_flight(),
            queued_prefill_blocks: self.queued_prefill_blocks(),
            requests: self.requests.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            engine: self.scraped.load(Ordering::Relaxed).then(|| EngineLoad {
                waiting: self.engine_waiting.load(Ordering::Relaxed),
                running: self.engine_running.load(Ordering::Relaxed),
                kv_cache_usage: f64::from(self.engine_kv_permille.load(Ordering::Relaxed)) / 1000.0,
            }),
        }
    }
}

/// An endpoint's counters as /status shows them.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointStatus {
    pub endpoint: String,
    pub in_flight: u32,
    pub queued_prefill_blocks: u64,
    pub requests: u64,
    pub failures: u64,
    /// The engine's own numbers, once scraped.
    pub engine: Option<EngineLoad>,
}

/// What an engine's /metrics says about its load.
#[derive(Debug, Clone, Serialize)]
pub struct EngineLoad {
    pub waiting: u32,
    pub running: u32,
    pub kv_cache_usage: f64,
}

/// A request in flight to an endpoint.
#[derive(Debug)]
pub struct InFlight {
    endpoint: Arc<Endpoint>,
    prefill_blocks: u64,
}

impl InFlight {
    /// The first response byte arrived: prefill is done.
    pub fn first_byte(&mut self) {
        let blocks = std::mem::take(&mut self.prefill_blocks);
        self.endpoint
            .queued_prefill_blocks
            .fetch_sub(blocks, Ordering::Relaxed);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.first_byte();
        self.endpoint.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_ahead_counts_engine_queues_the_proxy_did_not_fill() {
        let pool = Pool::new(
            "m".into(),
            16,
            crate::routing::Policy::Precise,
            vec![("a:1".into(), None)],
        );
        let e = pool.endpoints[0].clone();
        for _ in 0..64 {
            pool.note_prefill(10);
        }
        let _guard = e.start(7);
        assert_eq!(pool.work_ahead(&e), 7, "not scraped yet: own queue only");
        e.set_engine_load(5, 2, 0.5);
        let ahead = pool.work_ahead(&e);
        assert!(
            (45..=50).contains(&ahead),
            "5 waiting x ~10 blocks, got {ahead}"
        );
        e.set_engine_load(0, 2, 0.5);
        assert_eq!(pool.work_ahead(&e), 7);
    }
}
