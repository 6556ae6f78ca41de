//! Steps 5 and 6 of a request: the attempts. Candidates are ranked (a cold request whose
//! pick has no KV room first yields to warm ones: [`super::cold_yield`]), then endpoints tried
//! best first until one answers (only failures before the first response byte are retried;
//! a 503 counts as one, and so does an engine that sends no complete response head within
//! the upstream head timeout: nothing has reached the client yet). The first pick notes the
//! prefill it brings and the routing decision, every pick its speculative index entry and
//! history. The index's stall debt for a pick's new blocks is committed only when the engine
//! answers 2xx; a failed attempt withdraws the speculative entries it added (its routing
//! history and the placement told to peers stay until their TTLs); the answer carries the engine's response through its tap ([`super::tracked`]).
//! The request's route receipt is noted here: the prefix available on any live pod before the
//! first pick, and the prefix the pod that answered held at its pick (a retry's own decision).
//! When every attempt failed, the last failure is the answer (502, 503, or 504 after a head
//! timeout).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::StatusCode;

use super::{
    Proxy, ProxyError,
    calibration::Prediction,
    candidates::{Candidates, available_blocks, candidates},
    pools::PoolRuntime,
    record::Attempt,
    tap::Tap,
    tracked::{Observer, Tracked},
    upstream::UpstreamResponse,
};
use crate::{
    http::{Answer, Outgoing, RequestHead},
    policy::{compiled::Action, resources::FailureMode},
    pool::{Endpoint, InFlight},
    routing::{
        Candidate, Decision, Policy, RequestCtx, RoutePolicy, cold_yield,
        cost::Features,
        idle, rank,
        replication::{MAX_HOMES, Pod},
        stagger,
    },
    telemetry::{DecisionReason, Receipt},
};

/// Holds a cold request for this agent's slot in the cluster's order and ranks it again
/// ([`stagger`]; the caller asks only while requests arrive in bursts), counting the hold in
/// the pool's [`stagger::Holds`]: `None` where it is not held (no peers routing here, another
/// preset, no keys, a warm pick, the hold too long beside its predicted TTFT); else the hold
/// and the new decision (`None`: no pod is left to rank).
async fn stagger(
    proxy: &Proxy,
    runtime: &PoolRuntime,
    policy: RoutePolicy,
    ctx: &RequestCtx,
    decision: &Decision,
    endpoints: &mut Arc<Vec<Arc<Endpoint>>>,
    candidates: &mut Candidates,
) -> Option<(Duration, Option<Decision>)> {
    let cold = policy.peers_route
        && matches!(policy.kind, Policy::Precise | Policy::Approximate)
        && !ctx.keys.is_empty()
        && !cold_yield::warm(decision.prefix_blocks, ctx.keys.len());
    if !cold {
        return None;
    }
    let hold = stagger::hold(proxy.stagger.get(), *decision.predicted.first()?)?;
    // Agents in earlier slots decide first: their placements count when this one ranks again.
    tokio::time::sleep(hold).await;
    runtime.staggered.note(hold);
    let pool = &runtime.pool;
    *endpoints = pool.endpoints();
    *candidates = super::candidates::candidates(&proxy.index, runtime, endpoints, ctx, policy.kind);
    // The first ranking stepped the rotation; the one that counts steps it again.
    pool.rotation
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    Some((hold, rank(policy, ctx, candidates, &pool.rotation)))
}

/// Ranks, then tries endpoints best first until one answers.
#[allow(clippy::too_many_arguments)]
pub async fn forward(
    proxy: &Proxy,
    runtime: &PoolRuntime,
    action: &Action,
    ctx: &RequestCtx,
    parts: &RequestHead,
    body: Bytes,
    attempt: &mut Attempt,
    strip_usage: bool,
) -> Result<Answer, ProxyError> {
    let pool = &runtime.pool;
    let mut policy = action.policy.unwrap_or(pool.policy);
    // Peer agents route to these pods too: near-ties go by this agent's turn.
    policy.peers_route = pool.counts_peers_exactly();
    let retries = action.retries.unwrap_or(proxy.retries);
    let head_timeout = action
        .head_timeout
        .unwrap_or(proxy.admission.limits().upstream_head_timeout);
    // One snapshot of the members for every attempt (a yield takes a newer one before the
    // first): candidate `i` is `endpoints[i]`.
    let mut endpoints = pool.endpoints();
    let mut candidates = candidates(&proxy.index, runtime, &endpoints, ctx, policy.kind);
    let counts_kv = policy.kind.prices_kv_room() || pool.policy.kind.prices_kv_room();
    if action.failure == FailureMode::FailClosed && !scorable(policy.kind, &candidates) {
        return Err(ProxyError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "No endpoint can be scored for this request and policy {} fails closed.",
                action.source
            ),
        ));
    }
    // Before any attempt excludes a pod: what the pool as a whole held (again after a
    // yield, at the ranking the request went by).
    let mut available = available_blocks(&candidates, ctx.keys.len());
    let tokens = |blocks: usize| (blocks as u64).saturating_mul(pool.block_size as u64);
    // Built only when an attempt fails (an error's message is a heap string).
    let mut last_error = None;
    let mut yielded = Duration::ZERO;
    let mut staggered = Duration::ZERO;
    // Staggered only while requests come in bursts: a steady stream's would wait for nothing.
    // Noted only where peers route here: a lone agent never holds, and its data path skips
    // the pool-wide atomic.
    let burst = policy.peers_route && runtime.staggered.arrived(attempt.start);
    for n in 0..=retries {
        let mut warmed_idle = false;
        let Some(mut decision) = rank(policy, ctx, &candidates, &pool.rotation) else {
            break;
        };
        if n == 0
            && burst
            && let Some((held, again)) = stagger(
                proxy,
                runtime,
                policy,
                ctx,
                &decision,
                &mut endpoints,
                &mut candidates,
            )
            .await
        {
            staggered = held;
            let Some(again) = again else {
                break;
            };
            decision = again;
            available = available_blocks(&candidates, ctx.keys.len());
        }
        if n == 0
            && !policy.cold_yield.is_zero()
            && cold_yield::yields(&decision, &candidates, ctx.keys.len(), pool.warm_share())
        {
            let (again, waited) = super::cold_yield::hold(
                &proxy.index,
                runtime,
                policy,
                ctx,
                &mut endpoints,
                &mut candidates,
            )
            .await;
            yielded = waited;
            available = available_blocks(&candidates, ctx.keys.len());
            let Some(again) = again else {
                break;
            };
            decision = again;
        }
        if n == 0 && matches!(policy.kind, Policy::Precise | Policy::Approximate) {
            replicate(runtime, ctx, &candidates, available, &mut decision);
            if let Some(idle) = idle::warm(&decision, &candidates, ctx.keys.len()) {
                tracing::info!(endpoint = %endpoints[idle.0].authority, "warming an idle pod that lacks a prefix the busy pods hold");
                warmed_idle = true;
                decision.promote(idle);
                follow_first(&mut decision, &candidates, ctx.keys.len());
            }
        }
        let chosen = decision.ranked[0];
        let endpoint = &endpoints[chosen.0];
        let uncached = ctx.keys.len().saturating_sub(decision.prefix_blocks) as u64;
        attempt.retries = n as u32;
        if n == 0 {
            // Once per request: retries are the same prefill, not more of it.
            pool.note_prefill(uncached);
            if policy.kind.prices_kv_room() {
                let now = Instant::now();
                runtime.resident.lock().reused(&ctx.keys, available, now);
            }
            if !ctx.keys.is_empty() {
                pool.note_warm(cold_yield::warm(decision.prefix_blocks, ctx.keys.len()));
            }
            let reason = if warmed_idle {
                DecisionReason::IdleWarm
            } else {
                decision_reason(policy.kind, decision.prefix_blocks)
            };
            proxy
                .telemetry
                .record_decision(runtime.telemetry_id, reason, decision.prefix_blocks);
        }
        let now = Instant::now();
        // An endpoint that left since this request's snapshot was taken may have handed its
        // source ids on: nothing is noted under them. The speculation's debt (the engine owes
        // the events of blocks the pod did not hold) waits for the attempt's outcome.
        let mut speculated = None;
        if endpoint.routable() {
            if let Some(source) = endpoint.source {
                speculated = proxy.index.speculate(source, &ctx.keys, now);
            }
            pool.history.record(endpoint.history, &ctx.keys, now);
        }
        let settle = |answered: bool| {
            if let Some(s) = speculated {
                if answered {
                    proxy.index.owe(s);
                } else {
                    proxy.index.withdraw(s);
                }
            }
        };
        if tracing::enabled!(tracing::Level::TRACE) {
            trace_ranking(&decision, &candidates, &endpoints, ctx, yielded);
        }
        tracing::debug!(endpoint = %endpoint.authority, prefix_blocks = decision.prefix_blocks, score = decision.score, blocks = ctx.keys.len(), first_key = ctx.keys.first().map_or(0, |k| k.0), "routing decision");
        // The chosen pod as the cost model saw it, before this request joins its queue.
        let features = {
            let c = &candidates[chosen.0];
            Features {
                work_tokens: tokens(c.queued_prefill_blocks as usize) as f64
                    + tokens(uncached as usize) as f64,
                running: f64::from(c.in_flight),
            }
        };
        // The KV this request holds counts for the decisions that price KV room: those of
        // the prefix presets, this request's or the pool's own.
        let guard = if counts_kv {
            endpoint.start(
                uncached,
                &ctx.keys,
                runtime.calibration.output_blocks(pool.block_size),
            )
        } else {
            endpoint.start(uncached, &[], 0)
        };
        if n == 0 {
            // The attempt starts when the body has been read.
            attempt.queue = Some(now.saturating_duration_since(attempt.start));
        }
        // Dropped at the timeout: the engine's connection (or h2 stream) closes with it.
        let sent = tokio::time::timeout(
            head_timeout,
            proxy.upstreams.send(
                runtime.protocol,
                &endpoint.label,
                Outgoing {
                    method: &parts.method,
                    target: parts.target(),
                    headers: &parts.headers,
                    body: &body,
                },
            ),
        )
        .await;
        let Ok(sent) = sent else {
            settle(false);
            endpoint.note_failure();
            proxy.admission.note_head_timeout();
            tracing::warn!(endpoint = %endpoint.authority, ?head_timeout, "no response head within the upstream head timeout; trying the next endpoint");
            last_error = Some(ProxyError::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "{} sent no response within {} ms (upstream head timeout).",
                    endpoint.authority,
                    head_timeout.as_millis()
                ),
            ));
            candidates[chosen.0].excluded = true;
            continue;
        };
        match sent {
            Ok(resp) if resp.status != StatusCode::SERVICE_UNAVAILABLE => {
                // Only a success starts a prefill; a 4xx or 5xx stored nothing.
                settle(resp.status.is_success());
                attempt.receipt = Some(Receipt {
                    available: tokens(available),
                    captured: tokens(decision.prefix_blocks),
                });
                attempt.prediction = Some(Prediction {
                    calibration: runtime.calibration.clone(),
                    serial: endpoint.serial,
                    features,
                    predicted: decision.predicted_ttft(),
                    block_size: pool.block_size as u64,
                    kv_wait: candidates[chosen.0].kv.map_or(0.0, |k| k.wait()),
                    sent: now,
                });
                let answered = Answered {
                    endpoint,
                    decision: &decision,
                    yielded,
                    staggered,
                    guard,
                    strip_usage,
                    action,
                };
                return Ok(answer(proxy, attempt, resp, answered));
            }
            Ok(_) => {
                settle(false);
                endpoint.note_failure();
                last_error = Some(ProxyError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{} is overloaded (503).", endpoint.authority),
                ));
            }
            Err(err) => {
                settle(false);
                endpoint.note_failure();
                tracing::warn!(endpoint = %endpoint.authority, %err, "upstream request failed before a response; trying the next endpoint");
                last_error = Some(ProxyError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("{} failed: {err}", endpoint.authority),
                ));
            }
        }
        candidates[chosen.0].excluded = true;
    }
    Err(last_error.unwrap_or_else(|| {
        ProxyError::new(StatusCode::SERVICE_UNAVAILABLE, "No endpoint is available.")
    }))
}

/// The attempt an engine answered.
struct Answered<'a> {
    endpoint: &'a Endpoint,
    decision: &'a Decision,
    /// How long the request yielded before it was sent (cold at a full pod).
    yielded: Duration,
    /// How long it was held for this agent's slot in the cluster (cold, [`stagger`]).
    staggered: Duration,
    guard: InFlight,
    strip_usage: bool,
    action: &'a Action,
}

/// Step 7: the engine's response as the client's answer, its body tapped and tracked.
fn answer(proxy: &Proxy, attempt: &Attempt, resp: UpstreamResponse, a: Answered<'_>) -> Answer {
    // Framing and hop-by-hop fields are each leg's own: the writers leave the engine's out.
    let extra = if a.action.explain.unwrap_or(proxy.explain) {
        explain(attempt, &a)
    } else {
        Vec::new()
    };
    let tap = Tap::for_response(resp.status, &resp.headers, a.strip_usage);
    let observer = Observer {
        telemetry: proxy.telemetry.clone(),
        // The request's pool is known by now (set when its model was read).
        attempt: attempt.clone(),
        pod: (a.endpoint.serial, a.endpoint.label.clone()),
        status: resp.status,
        tap,
        admission: proxy.admission.clone(),
        idle_timeout: a
            .action
            .idle_timeout
            .unwrap_or(proxy.admission.limits().upstream_idle_timeout),
    };
    Answer {
        status: resp.status,
        headers: resp.headers,
        extra,
        body: Tracked::boxed(resp.body, a.guard, observer),
    }
}

/// The `x-warmpath-*` headers explaining the decision an answered attempt went by
/// (docs/routing.md, "How a decision is made").
fn explain(attempt: &Attempt, a: &Answered<'_>) -> Vec<(http::HeaderName, http::HeaderValue)> {
    let mut extra = Vec::new();
    let mut set = |k: &'static str, v: String| {
        if let Ok(v) = http::HeaderValue::from_str(&v) {
            extra.push((http::HeaderName::from_static(k), v));
        }
    };
    set("x-warmpath-pod", a.endpoint.authority.clone());
    set(
        "x-warmpath-prefix-blocks",
        a.decision.prefix_blocks.to_string(),
    );
    set(
        "x-warmpath-prefix-source",
        a.decision.prefix_source.as_str().to_string(),
    );
    set("x-warmpath-score", format!("{:.6}", a.decision.score));
    set(
        "x-warmpath-predicted-ttft-ms",
        format!("{:.1}", a.decision.predicted_ttft() * 1000.0),
    );
    if !a.yielded.is_zero() {
        set(
            "x-warmpath-cold-yield-ms",
            format!("{:.1}", a.yielded.as_secs_f64() * 1000.0),
        );
    }
    if !a.staggered.is_zero() {
        set(
            "x-warmpath-stagger-ms",
            format!("{:.1}", a.staggered.as_secs_f64() * 1000.0),
        );
    }
    if let Some(r) = attempt.receipt {
        set("x-warmpath-available-tokens", r.available.to_string());
        set("x-warmpath-captured-tokens", r.captured.to_string());
    }
    set("x-warmpath-policy", a.action.source.to_string());
    extra
}

/// Hot-prefix replication ([`crate::routing::replication`]): the request's prefix demand is
/// counted, and a hot prefix's request goes to its homes first — to a new home first when
/// replication adds one (which warms it).
fn replicate(
    runtime: &PoolRuntime,
    ctx: &RequestCtx,
    candidates: &[Candidate],
    available: usize,
    decision: &mut Decision,
) {
    let mut replication = runtime.replication.lock();
    let Some(key) = replication.key(&ctx.keys, available) else {
        return;
    };
    let depth = available.min(ctx.keys.len());
    let pods: smallvec::SmallVec<[Pod; crate::routing::INLINE]> = decision
        .ranked
        .iter()
        .zip(&decision.predicted)
        .map(|(id, &predicted)| {
            let c = &candidates[id.0];
            Pod {
                affinity: c.affinity,
                holds: c.prefix().0 >= depth,
                predicted,
            }
        })
        .collect();
    let advice = replication.observe(key, Instant::now(), &pods);
    drop(replication);
    let of = |affinity: u64| candidates.iter().find(|c| c.affinity == affinity);
    if !advice.homes.is_empty() {
        let homes: smallvec::SmallVec<[u64; MAX_HOMES]> = advice.homes.clone();
        decision.prefer(|id| homes.contains(&candidates[id.0].affinity));
    }
    if let Some(c) = advice.warm.and_then(of) {
        decision.promote(c.id);
    }
    follow_first(decision, candidates, ctx.keys.len());
}

/// After the pick was moved (replication, an idle warm-up): the decision's prefix is its new
/// first pod's, of the request's `blocks`.
fn follow_first(decision: &mut Decision, candidates: &[Candidate], blocks: usize) {
    let (held, source) = candidates[decision.ranked[0].0].prefix();
    decision.prefix_blocks = held.min(blocks);
    decision.prefix_source = source;
}

/// Whether any candidate can be scored as `policy` scores: a prefix-cache preset needs a pod
/// whose index is trusted (the approximate one always has its history); the others need
/// only a live candidate.
fn scorable(policy: Policy, candidates: &[Candidate]) -> bool {
    let live = |c: &&Candidate| !c.excluded;
    match policy {
        Policy::Precise => candidates.iter().filter(live).any(|c| c.prefix_trusted),
        _ => candidates.iter().any(|c| !c.excluded),
    }
}

/// Why a pick was made, for the decisions counter.
fn decision_reason(policy: Policy, prefix_blocks: usize) -> DecisionReason {
    match policy {
        Policy::RoundRobin => DecisionReason::RoundRobin,
        Policy::Session => DecisionReason::Session,
        Policy::LeastLoaded => DecisionReason::Load,
        Policy::Precise | Policy::Approximate if prefix_blocks > 0 => DecisionReason::Prefix,
        Policy::Precise | Policy::Approximate => DecisionReason::Load,
    }
}

#[cfg(test)]
mod tests;

/// Logs a ranking at trace level (docs/routing.md, "How a decision is made"): the prompt's
/// blocks, its first block's key (`head`), the stall share it paid, then every candidate best
/// first, its prefix blocks (`h`: from the history), requests in flight, queued prefill
/// blocks, KV room and wait, prefill seconds per block and cost.
fn trace_ranking(
    decision: &Decision,
    candidates: &[Candidate],
    endpoints: &[std::sync::Arc<Endpoint>],
    ctx: &RequestCtx,
    yielded: Duration,
) {
    let rows: Vec<String> = decision
        .ranked
        .iter()
        .zip(&decision.costs)
        .map(|(id, cost)| {
            let c = &candidates[id.0];
            let kv = c.kv.map_or_else(String::new, |k| {
                format!(
                    "kv={}/{}+{} w={:.3} r={}",
                    k.pinned,
                    k.capacity,
                    k.new_blocks,
                    k.wait(),
                    k.resident
                )
            });
            format!(
                "{}:m={}{} f={} q={} {kv} spb={:.4} c={cost:.3}",
                endpoints[id.0].authority,
                c.prefix().0,
                if c.prefix_trusted { "" } else { "h" },
                c.in_flight,
                c.queued_prefill_blocks,
                c.timing.secs_per_block
            )
        })
        .collect();
    tracing::trace!(
        blocks = ctx.keys.len(),
        head = ctx.keys.first().map(|k| format!("{:016x}", k.0)),
        stall_share = ctx.stall_share.get(),
        yielded_ms = u64::try_from(yielded.as_millis()).unwrap_or(u64::MAX),
        ranked = ?rows,
        "ranking"
    );
}
