//! A pool: the endpoints (vLLM pods) serving one model, with the proxy's own live counters.

use std::sync::{
    Arc,
    atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering},
};

use serde::Serialize;

use crate::{
    kv_index::SourceId,
    routing::{EndpointId, Policy},
};

/// One vLLM endpoint.
#[derive(Debug)]
pub struct Endpoint {
    pub id: EndpointId,
    /// `host:port` of its HTTP server.
    pub authority: String,
    /// Its KV event source in the index, when it publishes events.
    pub source: Option<SourceId>,
    in_flight: AtomicU32,
    queued_prefill_blocks: AtomicU64,
    requests: AtomicU64,
    failures: AtomicU64,
}

/// The endpoints of one model and how to choose among them.
#[derive(Debug)]
pub struct Pool {
    pub model: String,
    /// Tokens per KV block; must match vLLM --block-size.
    pub block_size: usize,
    pub policy: Policy,
    pub endpoints: Vec<Arc<Endpoint>>,
    pub rotation: AtomicUsize,
}

impl Pool {
    pub fn new(
        model: String,
        block_size: usize,
        policy: Policy,
        endpoints: Vec<(String, Option<SourceId>)>,
    ) -> Self {
        let endpoints = endpoints
            .into_iter()
            .enumerate()
            .map(|(i, (authority, source))| {
                Arc::new(Endpoint {
                    id: EndpointId(i),
                    authority,
                    source,
                    in_flight: AtomicU32::new(0),
                    queued_prefill_blocks: AtomicU64::new(0),
                    requests: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                })
            })
            .collect();
        Self {
            model,
            block_size,
            policy,
            endpoints,
            rotation: AtomicUsize::new(0),
        }
    }
}

impl Endpoint {
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn queued_prefill_blocks(&self) -> u64 {
        self.queued_prefill_blocks.load(Ordering::Relaxed)
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
