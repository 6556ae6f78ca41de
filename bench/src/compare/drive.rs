//! Sending a plan of chains through a row's endpoints and turning what came back into a
//! [`Row`]: latency quantiles, throughput, the engines' prefix hits, the route receipts and
//! the cost model's prediction error.

use std::{sync::Arc, time::Duration};

use super::{Chain, Error, Phase, Row, Setup, Target};
use crate::run::report::{Quantiles, Sample};

/// Sends the plan (chain `c` from user `u` to `urls[u mod len]`) and measures it against
/// `engines`' prefix caches. Every request is bounded by `--max-seconds` from the start; a
/// chain whose turn fails or runs out of time sends none of its later turns (they count as
/// errors).
pub(super) async fn drive(
    args: &Setup,
    target: &Target,
    plan: Arc<Vec<Chain>>,
    engines: &[warmpath_sim::fleet::RunningEngine],
    urls: &[String],
    phase: &Arc<Phase>,
) -> Result<Row, Error> {
    let client = http_client()?;
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs_f64(args.max_seconds);
    let scale = args.time_scale;
    let tasks: Vec<_> = plan
        .iter()
        .cloned()
        .map(|chain| {
            let agent = node_of_chain(&chain, urls.len());
            let (client, url, phase) = (client.clone(), urls[agent].clone(), phase.clone());
            tokio::spawn(async move {
                let times = Times {
                    start,
                    deadline,
                    scale,
                };
                let done = run_chain(&client, &url, &chain, times, || phase.inc()).await;
                (agent, done)
            })
        })
        .collect();
    let mut per_agent = vec![Vec::new(); urls.len()];
    for t in tasks {
        let (agent, done) = t
            .await
            .map_err(|e| Error::Setup(format!("a client task failed: {e}")))?;
        per_agent[agent].extend(done);
    }
    let wall = start.elapsed().as_secs_f64();
    Ok(finish(args, target, &plan, per_agent, wall, engines))
}

/// The load generator's HTTP client (connections kept and reused, as a Service's clients do).
pub(super) fn http_client() -> Result<reqwest::Client, Error> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| Error::Setup(e.to_string()))
}

/// The agent ("node") a chain's user sends through, of `nodes`: users are pinned to nodes.
pub(super) fn node_of_chain(chain: &Chain, nodes: usize) -> usize {
    chain.turns.first().map_or(0, |t| t.user) % nodes.max(1)
}

/// When a run started, when it must end, and its wall seconds per modelled second.
#[derive(Debug, Clone, Copy)]
pub(super) struct Times {
    pub start: tokio::time::Instant,
    pub deadline: tokio::time::Instant,
    pub scale: f64,
}

/// Sends one chain's turns to `url`, each no earlier than its time and after the previous
/// answer, calling `tick` once per request sent; the answered requests' samples. Stops at
/// the first failure or at the deadline.
pub(super) async fn run_chain(
    client: &reqwest::Client,
    url: &str,
    chain: &Chain,
    times: Times,
    tick: impl Fn(),
) -> Vec<Sample> {
    let mut done = Vec::with_capacity(chain.turns.len());
    let mut context = String::new();
    for turn in &chain.turns {
        let at = times.start + turn.at.mul_f64(times.scale);
        if at >= times.deadline {
            break;
        }
        tokio::time::sleep_until(at).await;
        let sent = times.start.elapsed().as_secs_f64();
        let prompt = if chain.grow {
            context.push_str(&turn.prompt);
            context.clone()
        } else {
            turn.prompt.clone()
        };
        let answer = tokio::time::timeout_at(
            times.deadline,
            one_request(client, url, &prompt, turn.max_tokens),
        )
        .await;
        tick();
        let Ok(Some((mut sample, text))) = answer else {
            break;
        };
        sample.start = sent;
        sample.session = Some(turn.user);
        if !sample.ok {
            break;
        }
        if chain.grow {
            context.push_str(&text);
        }
        done.push(sample);
    }
    done
}

/// The row from what each agent's users got back (`per_agent[n]`: the answered requests
/// through agent `n`) over `wall` seconds, and the engines' prefix caches.
pub(super) fn finish(
    args: &Setup,
    target: &Target,
    plan: &[Chain],
    per_agent: Vec<Vec<Sample>>,
    wall: f64,
    engines: &[warmpath_sim::fleet::RunningEngine],
) -> Row {
    let sent: usize = plan.iter().map(|c| c.turns.len()).sum();
    let requests_per_agent = per_agent.iter().map(Vec::len).collect();
    let samples: Vec<Sample> = per_agent.into_iter().flatten().collect();
    let (hits, queries, preemptions) = engines.iter().fold((0, 0, 0), |(h, q, p), e| {
        let st = e.served.engine.stats();
        (
            h + st.prefix_hits,
            q + st.prefix_queries,
            p + st.preemptions,
        )
    });
    let mut row = summarize(&samples, wall, args.time_scale);
    row.policy = target.name();
    row.errors = sent.saturating_sub(samples.len());
    row.prefix_hit_ratio = if queries == 0 {
        0.0
    } else {
        hits as f64 / queries as f64
    };
    row.requests_per_agent = requests_per_agent;
    row.raw.prefix_hits = hits;
    row.raw.prefix_queries = queries;
    row.preemptions = preemptions;
    row
}

/// Runs of one row on several seeds as one row: the latency quantiles, receipts and
/// prediction error over every answered request of all of them, output throughput over
/// their summed time, the prefix-hit ratio over their summed counters, errors and each
/// agent's requests summed. The rest (name, cluster, interception) is the first run's.
/// `None` for no runs.
pub(crate) fn pool(rows: Vec<Row>) -> Option<Row> {
    let mut rows = rows.into_iter();
    let first = rows.next()?;
    let mut raw = first.raw.clone();
    let mut preemptions = first.preemptions;
    let mut errors = first.errors;
    let mut per_agent = first.requests_per_agent.clone();
    for r in rows {
        raw.samples.extend(r.raw.samples);
        raw.wall_s += r.raw.wall_s;
        raw.prefix_hits += r.raw.prefix_hits;
        raw.prefix_queries += r.raw.prefix_queries;
        preemptions += r.preemptions;
        errors += r.errors;
        if per_agent.len() < r.requests_per_agent.len() {
            per_agent.resize(r.requests_per_agent.len(), 0);
        }
        for (total, n) in per_agent.iter_mut().zip(&r.requests_per_agent) {
            *total += n;
        }
    }
    let mut row = summarize(&raw.samples, raw.wall_s, raw.scale);
    row.prefix_hit_ratio = if raw.prefix_queries == 0 {
        0.0
    } else {
        raw.prefix_hits as f64 / raw.prefix_queries as f64
    };
    row.raw.prefix_hits = raw.prefix_hits;
    row.raw.prefix_queries = raw.prefix_queries;
    row.preemptions = preemptions;
    Some(Row {
        policy: first.policy,
        errors,
        requests_per_agent: per_agent,
        cluster: first.cluster,
        intercept: first.intercept,
        ..row
    })
}

/// The client-side figures of a row from its answered requests (`wall` seconds of run at
/// `scale` wall seconds per modelled second); the caller fills in the rest.
pub(super) fn summarize(samples: &[Sample], wall: f64, scale: f64) -> Row {
    let mut ttft: Vec<f64> = samples.iter().map(|s| s.ttft / scale).collect();
    ttft.sort_by(f64::total_cmp);
    let ttft_q = Quantiles::of(ttft.iter().copied());
    let output: u64 = samples.iter().map(|s| s.output_tokens).sum();
    let receipt = |f: fn(&Sample) -> Option<u64>| -> Option<u64> {
        samples.iter().filter_map(f).reduce(|a, b| a + b)
    };
    let mut errors: Vec<f64> = samples
        .iter()
        .filter_map(|s| Some((s.predicted_ttft_ms? / 1e3 - s.ttft).abs() / scale * 1e3))
        .collect();
    errors.sort_by(f64::total_cmp);
    Row {
        policy: String::new(),
        requests: samples.len(),
        errors: 0,
        ttft_p50: ttft_q.p50,
        ttft_p90: ttft_q.p90,
        ttft_p99: ttft_q.p99,
        e2e_p50: Quantiles::of(samples.iter().map(|s| s.e2e / scale)).p50,
        output_tokens_per_s: output as f64 / (wall / scale),
        prefix_hit_ratio: 0.0,
        prompt_tokens: samples.iter().map(|s| s.prompt_tokens).sum(),
        available_tokens: receipt(|s| s.available_tokens),
        captured_tokens: receipt(|s| s.captured_tokens),
        delivered_tokens: samples.iter().map(|s| s.cached_tokens).sum(),
        preemptions: 0,
        ttft_prediction_error_ms_p50: median(&errors),
        requests_per_agent: Vec::new(),
        cluster: Vec::new(),
        intercept: None,
        ttfts: ttft,
        raw: super::RawRun {
            samples: samples.to_vec(),
            wall_s: wall,
            scale,
            ..Default::default()
        },
    }
}

/// The middle value of sorted `v` (the mean of the two middle ones for an even count).
fn median(v: &[f64]) -> Option<f64> {
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Streams one completion: the sample (wall-clock TTFT and end to end, usage, receipt and
/// prediction headers) and the generated text.
async fn one_request(
    client: &reqwest::Client,
    url: &str,
    prompt: &str,
    max_tokens: usize,
) -> Option<(Sample, String)> {
    // `model` explicitly: some routers (sglang-router) require it.
    let model = warmpath_sim::cli::DEFAULT_MODEL;
    let req = crate::run::Completion {
        client,
        url,
        model,
        prompt,
        max_tokens,
        header: None,
    };
    req.stream().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ttft: f64, receipt: Option<(u64, u64)>, predicted_ms: Option<f64>) -> Sample {
        Sample {
            tenant: "-".into(),
            step: 0,
            ok: true,
            start: 0.0,
            ttft,
            e2e: ttft + 1.0,
            itl: Vec::new(),
            prompt_tokens: 100,
            cached_tokens: 32,
            output_tokens: 10,
            available_tokens: receipt.map(|r| r.0),
            captured_tokens: receipt.map(|r| r.1),
            predicted_ttft_ms: predicted_ms,
            pod: None,
            held_ms: None,
            session: None,
        }
    }

    #[test]
    fn receipts_and_prediction_error_are_summed_and_medianed() {
        // Wall seconds at scale 0.5: modelled = wall / 0.5.
        let samples = [
            sample(0.10, Some((64, 48)), Some(150.0)),
            sample(0.20, Some((96, 96)), Some(180.0)),
            sample(0.30, None, None),
        ];
        let row = summarize(&samples, 2.0, 0.5);
        assert_eq!(row.requests, 3);
        assert_eq!(row.prompt_tokens, 300);
        assert_eq!(row.delivered_tokens, 96);
        assert_eq!(row.available_tokens, Some(160));
        assert_eq!(row.captured_tokens, Some(144));
        // |150 - 100| / 0.5 = 100 ms and |180 - 200| / 0.5 = 40 ms: median 70 ms.
        let err = row.ttft_prediction_error_ms_p50.unwrap();
        assert!((err - 70.0).abs() < 1e-9, "{err}");
        // 30 output tokens over 2 wall s = 4 modelled s.
        assert!((row.output_tokens_per_s - 7.5).abs() < 1e-9);
        assert!((row.ttft_p50 - 0.4).abs() < 0.001, "{}", row.ttft_p50);
        // A peer sends no headers: no receipt, no error.
        let peer = summarize(&[sample(0.1, None, None)], 1.0, 1.0);
        assert_eq!(peer.available_tokens, None);
        assert_eq!(peer.ttft_prediction_error_ms_p50, None);
    }

    #[test]
    fn runs_pool_into_the_row_one_longer_run_would_give() {
        // Run A: 2 answers in 1 s, 30 of 100 blocks hit, 1 error; run B: 3 answers in 3 s,
        // 10 of 300 hit, 2 errors; A's engines preempted 4 sequences, B's 1. Each answer has
        // 10 output tokens (at scale 1), a 100-token prompt with 32 cached, and ends 1 s after
        // its first token.
        let run = |samples: &[Sample], wall, errors, per_agent: Vec<usize>, hits, queries| {
            let mut r = summarize(samples, wall, 1.0);
            r.policy = "Precise".into();
            r.errors = errors;
            r.requests_per_agent = per_agent;
            (r.raw.prefix_hits, r.raw.prefix_queries) = (hits, queries);
            r.preemptions = if hits == 30 { 4 } else { 1 };
            r
        };
        let a = run(
            &[sample(0.1, None, None), sample(0.2, None, None)],
            1.0,
            1,
            vec![1, 1],
            30,
            100,
        );
        let b = run(
            &[
                sample(0.5, Some((64, 48)), Some(100.0)),
                sample(0.3, None, None),
                sample(0.4, None, None),
            ],
            3.0,
            2,
            vec![2, 1],
            10,
            300,
        );
        let row = pool(vec![a, b]).expect("two runs");
        assert_eq!(row.policy, "Precise");
        assert_eq!((row.requests, row.errors), (5, 3));
        assert_eq!(row.requests_per_agent, vec![3, 2]);
        assert_eq!((row.prompt_tokens, row.delivered_tokens), (500, 160));
        assert_eq!(row.ttfts.len(), 5);
        // TTFTs 0.1..0.5 s: the middle one is 0.3 s, the top 0.5 s; end to end 1.3 s.
        assert!((row.ttft_p50 - 0.3).abs() < 0.001, "{}", row.ttft_p50);
        assert!((row.ttft_p99 - 0.5).abs() < 0.001, "{}", row.ttft_p99);
        assert!((row.e2e_p50 - 1.3).abs() < 0.002, "{}", row.e2e_p50);
        // 50 output tokens over 4 s (the runs' means would say 15); 40 of 400 blocks hit
        // (the means: 0.17).
        assert!((row.output_tokens_per_s - 12.5).abs() < 1e-9);
        assert!((row.prefix_hit_ratio - 0.1).abs() < 1e-9);
        assert_eq!(row.preemptions, 5);
        // B's one receipt and prediction (|100 - 500| ms) survive the pooling.
        assert_eq!(row.available_tokens, Some(64));
        let err = row.ttft_prediction_error_ms_p50.expect("one prediction");
        assert!((err - 400.0).abs() < 1e-9, "{err}");
        assert_eq!(pool(Vec::new()).map(|r| r.requests), None);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, 2.0, 9.0]), Some(2.0));
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), Some(3.0));
    }
}
