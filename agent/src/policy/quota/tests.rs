use std::time::{Duration, Instant};

use super::*;
use crate::policy::resources;

fn name(s: &str) -> Arc<str> {
    Arc::from(s)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn prompt_limit(per_s: f64) -> QuotaLimits {
    QuotaLimits {
        prompt_tokens_per_s: Some(per_s),
        ..QuotaLimits::default()
    }
}

#[test]
fn a_token_limit_holds_over_30_simulated_seconds_and_spares_other_tenants() {
    let q = Quotas::new();
    let (a, b) = (name("team-a"), name("team-b"));
    let (la, lb) = (prompt_limit(1000.0), prompt_limit(100_000.0));
    let t0 = Instant::now();
    let (mut admitted_a, mut steady_a, mut admitted_b) = (0u64, 0u64, 0u64);
    // Each tenant offers a 100-token request every 20 ms: 5,000 tokens/s.
    for i in 0..1500u64 {
        let now = t0 + ms(20 * i);
        if q.admit(&a, &la, 100, now).is_ok() {
            admitted_a += 100;
            if i >= 250 {
                steady_a += 100;
            }
        }
        if q.admit(&b, &lb, 100, now).is_ok() {
            admitted_b += 100;
        }
    }
    // 30 s at 1,000/s plus the full bucket it started with (1 s of burst).
    let expected = 1000.0 * 30.0 + 1000.0;
    let err = (admitted_a as f64 - expected).abs() / expected;
    assert!(err <= 0.01, "admitted {admitted_a}, expected {expected}");
    // From 5 s on the bucket is empty: the rate alone, 25 s x 1,000/s.
    let err = (steady_a as f64 - 25_000.0).abs() / 25_000.0;
    assert!(err <= 0.01, "steady {steady_a}");
    assert_eq!(admitted_b, 1500 * 100, "the other tenant lost nothing");
    assert_eq!(
        q.local_limit("team-a", Dimension::PromptTokens),
        Some(1000.0)
    );
}

#[test]
fn output_debt_blocks_the_tenant_then_recovers() {
    let q = Quotas::new();
    let t = name("t");
    let limits = QuotaLimits {
        output_tokens_per_s: Some(100.0),
        ..QuotaLimits::default()
    };
    let t0 = Instant::now();
    let mut p = q.admit(&t, &limits, 10, t0).expect("a full bucket");
    // 100 in the bucket, 350 generated: 250 of debt, 2.5 s of refill.
    p.settle(10, 350, t0);
    drop(p);
    let refused = q.admit(&t, &limits, 10, t0 + ms(100)).unwrap_err();
    assert_eq!(refused.dimension, Dimension::OutputTokens);
    assert_eq!(refused.retry_after, ms(2400));
    assert_eq!(refused.retry_after_secs(), 3);
    assert!(
        refused.message.contains("output tokens") && refused.message.contains("`t`"),
        "{}",
        refused.message
    );
    assert!(q.admit(&t, &limits, 10, t0 + ms(2499)).is_err());
    assert!(q.admit(&t, &limits, 10, t0 + ms(2500)).is_ok());
}

#[test]
fn retry_after_is_the_longest_wait_among_refusing_limits_in_whole_seconds() {
    let q = Quotas::new();
    let t = name("t");
    let limits = QuotaLimits {
        requests_per_s: Some(2.0),
        prompt_tokens_per_s: Some(100.0),
        ..QuotaLimits::default()
    };
    let t0 = Instant::now();
    let _p1 = q.admit(&t, &limits, 70, t0).unwrap();
    let _p2 = q.admit(&t, &limits, 0, t0).unwrap();
    // Requests: 0 of 2, 0.5 s to earn 1. Prompt: 30 of 100, 0.6 s to earn 90.
    let r = q.admit(&t, &limits, 90, t0).unwrap_err();
    assert_eq!(r.dimension, Dimension::PromptTokens);
    assert_eq!(r.retry_after, ms(600));
    assert_eq!(r.retry_after_secs(), 1, "rounded up to a whole second");
    // Requests alone.
    let r = q.admit(&t, &limits, 0, t0).unwrap_err();
    assert_eq!(r.dimension, Dimension::Requests);
    assert_eq!(r.retry_after, ms(500));
    // A refusal paid nothing: 0.6 s later both can pay.
    assert!(q.admit(&t, &limits, 90, t0 + ms(600)).is_ok());
}

#[test]
fn a_prompt_larger_than_the_burst_waits_for_a_full_bucket_then_runs_into_debt() {
    let q = Quotas::new();
    let t = name("t");
    let limits = prompt_limit(100.0);
    let t0 = Instant::now();
    assert!(q.admit(&t, &limits, 500, t0).is_ok(), "full bucket");
    let r = q.admit(&t, &limits, 500, t0).unwrap_err();
    // -400 back to a full 100: 5 s.
    assert_eq!(r.retry_after, Duration::from_secs(5));
}

#[test]
fn settling_corrects_the_prompt_estimate_both_ways() {
    let q = Quotas::new();
    let t = name("t");
    let limits = prompt_limit(100.0);
    let t0 = Instant::now();
    let mut p = q.admit(&t, &limits, 60, t0).unwrap();
    assert_eq!(p.estimated_prompt(), 60);
    // The engine counted 90: 30 more charged, 10 left.
    p.settle(90, 0, t0);
    assert_eq!(
        q.admit(&t, &limits, 11, t0).unwrap_err().retry_after,
        ms(10)
    );
    // Settling again with the same totals charges nothing more.
    p.settle(90, 0, t0);
    let mut small = q.admit(&t, &limits, 10, t0).unwrap();
    // It was 4 tokens: 6 refunded.
    small.settle(4, 0, t0);
    assert!(q.admit(&t, &limits, 6, t0).is_ok());
    assert!(q.admit(&t, &limits, 1, t0).is_err());
}

#[test]
fn the_stream_cap_holds_until_a_permit_drops() {
    let q = Quotas::new();
    let t = name("t");
    let limits = QuotaLimits {
        concurrent_streams: Some(2),
        ..QuotaLimits::default()
    };
    let t0 = Instant::now();
    let p1 = q.admit(&t, &limits, 0, t0).unwrap();
    let _p2 = q.admit(&t, &limits, 0, t0).unwrap();
    let r = q.admit(&t, &limits, 0, t0).unwrap_err();
    assert_eq!(r.dimension, Dimension::ConcurrentStreams);
    assert_eq!(r.retry_after_secs(), 1);
    drop(p1);
    assert!(q.admit(&t, &limits, 0, t0).is_ok());
}

#[test]
fn tenants_without_quotas_keep_no_state() {
    let q = Quotas::new();
    for i in 0..100 {
        let p = q.admit(
            &name(&format!("t{i}")),
            &QuotaLimits::default(),
            1,
            Instant::now(),
        );
        assert!(p.is_ok());
    }
    assert_eq!(q.tenants(), 0);
    assert!(q.local_demand_at(Instant::now()).is_empty());
}

#[test]
fn state_is_bounded_and_idle_tenants_go_first() {
    let q = Quotas::new();
    let limits = QuotaLimits {
        requests_per_s: Some(1.0),
        ..QuotaLimits::default()
    };
    let t0 = Instant::now();
    // The earliest tenant holds a stream: it is not the one forgotten.
    let held = q.admit(&name("held"), &limits, 0, t0).unwrap();
    for i in 1..MAX_TENANTS {
        q.admit(&name(&format!("t{i}")), &limits, 0, t0 + ms(1))
            .unwrap();
    }
    assert_eq!(q.tenants(), MAX_TENANTS);
    q.admit(&name("new"), &limits, 0, t0 + ms(2)).unwrap();
    assert_eq!(q.tenants(), MAX_TENANTS, "one forgotten for one added");
    assert!(q.local_limit("held", Dimension::Requests).is_some());
    assert!(q.local_limit("new", Dimension::Requests).is_some());
    // Later every tenant but `held` is idle (buckets full, nothing open): all go at once.
    let later = t0 + IDLE_AFTER + Duration::from_secs(1);
    q.admit(&name("newer"), &limits, 0, later).unwrap();
    assert_eq!(q.tenants(), 2, "held and newer");
    drop(held);
}

#[test]
fn the_local_rate_is_this_agents_water_filled_share() {
    let q = Quotas::new();
    let t = name("t");
    let limits = prompt_limit(1000.0);
    let t0 = Instant::now();
    let remote = |a: f64, b: f64| {
        let d = |p| Demand {
            prompt_tokens: p,
            ..Demand::default()
        };
        HashMap::from([(t.clone(), vec![d(a), d(b)])])
    };
    // Alone: the whole limit.
    q.admit(&t, &limits, 100, t0).unwrap();
    assert_eq!(q.local_limit("t", Dimension::PromptTokens), Some(1000.0));
    // Own demand: 100 tokens / tau (2 s) = 50/s. Others 600 and 600: 50 is met, the others
    // split 950.
    q.set_remote_demand(remote(600.0, 600.0));
    let _ = q.admit(&t, &limits, 0, t0);
    let share = q.local_limit("t", Dimension::PromptTokens).unwrap();
    assert!((share - 50.0).abs() < 1e-6, "{share}");
    // Others idle: this agent gets its demand and two thirds of the rest after the floors
    // (5 % of 1000 / 3 each).
    q.set_remote_demand(remote(0.0, 0.0));
    let _ = q.admit(&t, &limits, 0, t0);
    let floor = 0.05 * 1000.0 / 3.0;
    let expected = 50.0 + (1000.0 - 50.0 - 2.0 * floor) / 3.0;
    let share = q.local_limit("t", Dimension::PromptTokens).unwrap();
    assert!((share - expected).abs() < 1e-6, "{share} vs {expected}");
}

#[test]
fn local_demand_reports_offered_load_refused_or_not() {
    let q = Quotas::new();
    let t = name("t");
    let limits = QuotaLimits {
        requests_per_s: Some(1.0),
        ..QuotaLimits::default()
    };
    let t0 = Instant::now();
    // 40 requests per second for 10 s (five time constants): 1 admitted per second.
    for i in 0..400u64 {
        let _ = q.admit(&t, &limits, 10, t0 + ms(25 * i));
    }
    let now = t0 + ms(25 * 399);
    let d = q.local_demand_at(now);
    assert_eq!(d.len(), 1);
    assert_eq!(&*d[0].0, "t");
    let requests = d[0].1.requests;
    assert!((requests - 40.0).abs() < 2.0, "{requests}");
    assert!((d[0].1.prompt_tokens - 400.0).abs() < 20.0);
}

#[test]
fn refused_requests_count_their_expected_output_as_demand() {
    let q = Quotas::new();
    let t = name("t");
    let limits = QuotaLimits {
        output_tokens_per_s: Some(10.0),
        ..QuotaLimits::default()
    };
    let t0 = Instant::now();
    let mut p = q.admit(&t, &limits, 0, t0).unwrap();
    p.settle(0, 800, t0);
    drop(p);
    let before = q.local_demand_at(t0)[0].1.output_tokens;
    // 800 / tau.
    assert!((before - 400.0).abs() < 1e-9, "{before}");
    assert!(q.admit(&t, &limits, 0, t0).is_err(), "in debt");
    // The refused request would have produced about one request's output: 1/8 of 800 so
    // far (the average starts at 0 and weighs each request 1/8).
    let after = q.local_demand_at(t0)[0].1.output_tokens;
    assert!((after - before - 100.0 / 2.0).abs() < 1e-9, "{after}");
}

/// Four agents share a tenant's traffic unevenly (10/20/30/40 %) and exchange demand every
/// 500 ms: together they admit the cluster-wide limit.
#[test]
fn four_agents_converge_on_the_cluster_wide_limit() {
    let agents: Vec<Arc<Quotas>> = (0..4).map(|_| Quotas::new()).collect();
    let t = name("t");
    let limits = prompt_limit(2000.0);
    let t0 = Instant::now();
    let mut steady = 0u64;
    // Every 10 ms agent k receives k+1 requests of 100 tokens: 10,000 tokens/s offered
    // in all, five times the limit.
    for tick in 0..3500u64 {
        let now = t0 + ms(10 * tick);
        if tick % 50 == 0 {
            exchange(&agents, now);
        }
        for (k, a) in agents.iter().enumerate() {
            for _ in 0..=k {
                if a.admit(&t, &limits, 100, now).is_ok() && tick >= 500 {
                    steady += 100;
                }
            }
        }
    }
    // From 5 s to 35 s: 30 s at 2,000/s.
    let expected = 2000.0 * 30.0;
    let err = (steady as f64 - expected).abs() / expected;
    assert!(err <= 0.05, "admitted {steady}, expected {expected}");
    let shares: f64 = agents
        .iter()
        .map(|a| a.local_limit("t", Dimension::PromptTokens).unwrap())
        .sum();
    assert!((shares - 2000.0).abs() < 1.0, "{shares}");
}

/// A fourth agent's traffic starts 10 s in (a demand step the others learn of one exchange
/// later): the cluster still admits the limit within 2 % over the 30 s that follow.
#[test]
fn a_newly_busy_agent_is_absorbed_within_one_exchange() {
    let agents: Vec<Arc<Quotas>> = (0..4).map(|_| Quotas::new()).collect();
    let t = name("t");
    let limits = prompt_limit(2000.0);
    let t0 = Instant::now();
    let mut window = 0u64;
    // Every 10 ms each of agents 0-2 receives one 100-token request; agent 3 two, from 10 s.
    for tick in 0..4000u64 {
        let now = t0 + ms(10 * tick);
        if tick % 50 == 0 {
            exchange(&agents, now);
        }
        for (k, a) in agents.iter().enumerate() {
            let n = match k {
                3 if tick < 1000 => 0,
                3 => 2,
                _ => 1,
            };
            for _ in 0..n {
                if a.admit(&t, &limits, 100, now).is_ok() && tick >= 1000 {
                    window += 100;
                }
            }
        }
    }
    let expected = 2000.0 * 30.0;
    let err = (window as f64 - expected).abs() / expected;
    assert!(err <= 0.02, "admitted {window}, expected {expected}");
}

/// Each agent hears every other agent's demand (what the gossip delivers).
fn exchange(agents: &[Arc<Quotas>], now: Instant) {
    let demands: Vec<_> = agents.iter().map(|a| a.local_demand_at(now)).collect();
    for (i, a) in agents.iter().enumerate() {
        let mut remote: HashMap<Arc<str>, Vec<Demand>> = HashMap::new();
        for (j, d) in demands.iter().enumerate() {
            if i != j {
                for (tenant, demand) in d {
                    remote.entry(tenant.clone()).or_default().push(*demand);
                }
            }
        }
        a.set_remote_demand(remote);
    }
}

#[test]
fn remote_demand_is_sanitised_and_bounded() {
    let q = Quotas::new();
    let t = name("t");
    let bad = Demand {
        requests: f64::NAN,
        prompt_tokens: -5.0,
        output_tokens: f64::INFINITY,
    };
    q.set_remote_demand(HashMap::from([(
        t.clone(),
        vec![bad; MAX_REMOTE_AGENTS + 10],
    )]));
    let stored = q.remote_of("t");
    assert_eq!(stored.len(), MAX_REMOTE_AGENTS);
    assert_eq!(stored[0], Demand::default());
}

#[test]
fn quota_specs_parse_into_rates_per_second() {
    let spec = resources::Quotas {
        requests: Some("120/min".into()),
        prompt_tokens: Some("36000/h".into()),
        output_tokens: Some("2.5/s".into()),
        concurrent_streams: Some(8),
        burst_seconds: Some(0.5),
    };
    let l = QuotaLimits::from_spec(&spec).unwrap();
    assert_eq!(l.requests_per_s, Some(2.0));
    assert_eq!(l.prompt_tokens_per_s, Some(10.0));
    assert_eq!(l.output_tokens_per_s, Some(2.5));
    assert_eq!(l.concurrent_streams, Some(8));
    assert_eq!(l.burst, ms(500));
    assert!(
        QuotaLimits::from_spec(&resources::Quotas::default())
            .unwrap()
            .is_unlimited()
    );
}

type Mutation = fn(&mut resources::Quotas);

#[test]
fn bad_quota_specs_name_the_field_value_and_reason() {
    let with = |f: Mutation| {
        let mut q = resources::Quotas::default();
        f(&mut q);
        QuotaLimits::from_spec(&q).unwrap_err().to_string()
    };
    // Rates are read by validation's parser: the path and value here, its reason after.
    let cases: [(Mutation, &str, &str); 5] = [
        (
            |q| q.prompt_tokens = Some("100".into()),
            "spec.quotas.promptTokens: `100`: ",
            "unit",
        ),
        (
            |q| q.requests = Some("5/day".into()),
            "spec.quotas.requests: `5/day`: ",
            "unknown unit `day`",
        ),
        (
            |q| q.output_tokens = Some("-5/s".into()),
            "spec.quotas.outputTokens: `-5/s`: ",
            "negative",
        ),
        (
            |q| q.requests = Some("0/s".into()),
            "spec.quotas.requests: `0/s`: ",
            "zero",
        ),
        (
            |q| q.requests = Some("x/s".into()),
            "spec.quotas.requests: `x/s`: ",
            "not a decimal number",
        ),
    ];
    for (mutate, prefix, why) in cases {
        let message = with(mutate);
        assert!(
            message.starts_with(prefix) && message.contains(why),
            "{message}"
        );
    }
    assert_eq!(
        with(|q| q.concurrent_streams = Some(0)),
        "spec.quotas.concurrentStreams: `0`: must be at least 1"
    );
    assert_eq!(
        with(|q| q.burst_seconds = Some(f64::NAN)),
        "spec.quotas.burstSeconds: `NaN`: must be between 0.05 and 60 seconds"
    );
}
