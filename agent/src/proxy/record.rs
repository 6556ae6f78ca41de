//! One request's bookkeeping on its way through the proxy ([`Attempt`]), and the one place
//! its telemetry record is written ([`Attempt::record`]): by the handler when the proxy
//! answers itself (an error before any engine answered), else by the engine's response body
//! when it ends or is dropped ([`super::tracked`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::calibration::Prediction;
use crate::{
    policy::quota::QuotaPermit,
    telemetry::{Outcome, PoolId, Receipt, RequestRecord, Telemetry, Tenant, TokenUsage},
};

/// One request's bookkeeping.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// When the request (its body read) was handed to the proxy.
    pub start: Instant,
    /// The pool the request belongs to (the first pool until its model is known).
    pub pool: PoolId,
    pub tenant: Arc<Tenant>,
    /// Body complete -> first upstream request.
    pub queue: Option<Duration>,
    pub retries: u32,
    /// The prefix available and captured when the pod that answered was picked ([`Receipt`];
    /// set by [`super::forward`], none for the proxy's own answers).
    pub receipt: Option<Receipt>,
    /// What the decision that picked the pod that answered predicted of its TTFT (set by
    /// [`super::forward`]); checked against the measured TTFT of a stream when it ends.
    pub prediction: Option<Prediction>,
    /// The tenant's quota permit (a stream slot, charges settled from the engine's usage
    /// when the request ends); shared by the clones an answer's body carries.
    pub quota: Option<Arc<parking_lot::Mutex<QuotaPermit>>>,
    /// The intercepted client, whose answered requests teach the affinity learner which
    /// pods serve it; `None` for connections not intercepted.
    pub client: Option<super::clients::Learning>,
}

/// How a request ended.
#[derive(Debug)]
pub struct Ending<'a> {
    /// Endpoint index and authority of the pod that answered, if one did.
    pub pod: Option<(u16, &'a str)>,
    pub outcome: Outcome,
    pub usage: Option<TokenUsage>,
    /// Time to the first response body bytes.
    pub ttft: Option<Duration>,
    /// When it ended (or was abandoned).
    pub at: Instant,
    /// Streamed (SSE).
    pub streamed: bool,
}

impl Attempt {
    /// Writes the request's telemetry record (once per request), and settles its quota
    /// charges with the usage the engine reported.
    pub fn record(&self, telemetry: &Telemetry, end: Ending<'_>) {
        if let (Some(q), Some(u)) = (&self.quota, &end.usage) {
            q.lock().settle(u.prompt, u.completion, end.at);
        }
        if let (Some(p), Some(ttft), true) = (&self.prediction, end.ttft, end.streamed) {
            // From the upstream request, as the decision saw it.
            let measured = ttft.saturating_sub(self.queue.unwrap_or_default());
            let error = p.calibration.check(p, measured.as_secs_f64());
            telemetry.record_prediction_error(self.pool, error);
        }
        if let (Some(p), Some(r), Some(u)) = (&self.prediction, self.receipt, end.usage)
            && u.cached_reported
        {
            // Captured and delivered are both in tokens (blocks x the block size). vLLM never
            // serves a prompt's last token from its cache: of a prompt held whole it
            // delivers the whole blocks before that token, which is no loss.
            let block = p.block_size.max(1);
            let servable = u.prompt.saturating_sub(1) / block * block;
            p.calibration
                .note_delivery(r.captured.min(servable), u.cached, p.predicted);
        }
        if let (Some(p), Some(u), Outcome::Ok) = (&self.prediction, &end.usage, end.outcome) {
            // From the answered attempt's send, as its KV was held.
            let lifetime = end.at.saturating_duration_since(p.sent);
            p.calibration
                .note_answer(u.completion, lifetime.as_secs_f64());
        }
        if let (Some(client), Some((_, pod)), Outcome::Ok) = (&self.client, end.pod, end.outcome) {
            client.answered(self.pool, pod, end.at);
        }
        telemetry.record(
            &self.tenant,
            &RequestRecord {
                pool: self.pool,
                pod: end.pod,
                outcome: end.outcome,
                usage: end.usage,
                receipt: self.receipt,
                retries: self.retries,
                queue: self.queue,
                ttft: end.ttft,
                duration: end.at.saturating_duration_since(self.start),
                at: end.at,
                streamed: end.streamed,
            },
        );
    }
}
