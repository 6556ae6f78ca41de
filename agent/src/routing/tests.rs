//! The ranking rule's unit tests: the cost model's picks, fallbacks, rotation, presets.

use super::*;

pub(super) fn cand(id: usize, matched: usize, queued: u64, in_flight: u32) -> Candidate {
    Candidate {
        id: EndpointId(id),
        affinity: id as u64,
        matched_blocks: matched,
        prefix_trusted: true,
        in_flight,
        queued_prefill_blocks: queued,
        kv_usage: 0.0,
        history_blocks: 0,
        lora: LoraState::NotApplicable,
        excluded: false,
        timing: BlockTiming::default(),
        kv: None,
        idle_for: std::time::Duration::ZERO,
    }
}

fn ctx(blocks: usize) -> RequestCtx {
    RequestCtx {
        keys: (0..blocks as u64).map(RouterKey).collect(),
        ..RequestCtx::default()
    }
}

#[test]
fn precise_prefers_the_prefix_until_its_queue_costs_more() {
    let rr = AtomicUsize::new(0);
    let d = rank(
        Policy::Precise,
        &ctx(100),
        &[cand(0, 0, 0, 0), cand(1, 90, 0, 3)],
        &rr,
    )
    .unwrap();
    assert_eq!((d.ranked[0], d.prefix_blocks), (EndpointId(1), 90));
    // The holder has 200 blocks of prefill queued: recomputing 100 elsewhere is cheaper.
    let d = rank(
        Policy::Precise,
        &ctx(100),
        &[cand(0, 0, 0, 0), cand(1, 90, 200, 3)],
        &rr,
    )
    .unwrap();
    assert_eq!(d.ranked[0], EndpointId(0));
}

#[test]
fn cold_prefills_avoid_stalling_busy_decoders_warm_ones_keep_affinity() {
    let rr = AtomicUsize::new(0);
    // A: six requests decoding, nothing queued; B: one request, 30 blocks queued.
    let busy = cand(0, 0, 0, 6);
    let queued = cand(1, 0, 30, 1);
    // Cold everywhere: 100 blocks of prefill would stall A's six decoders. In blocks: A 100
    // + 0.25 x 100 x 6 + 4 x 6 = 274; B 100 + 30 + 0.25 x 100 x 1 + 4 = 159.
    let d = rank(
        Policy::Precise,
        &ctx(100),
        &[busy.clone(), queued.clone()],
        &rr,
    )
    .unwrap();
    assert_eq!(d.ranked[0], EndpointId(1));
    // Without the stall term the cheaper queue wins: A 124, B 134.
    let mut no_stall = RoutePolicy::from(Policy::Precise);
    no_stall.weights.stall = 0.0;
    let d = rank(no_stall, &ctx(100), &[busy.clone(), queued.clone()], &rr).unwrap();
    assert_eq!(d.ranked[0], EndpointId(0));
    // Warm on A: five uncached blocks stall little (5 + 7.5 + 24 = 36.5); affinity wins.
    let warm = cand(0, 95, 0, 6);
    let d = rank(Policy::Precise, &ctx(100), &[warm, queued], &rr).unwrap();
    assert_eq!((d.ranked[0], d.prefix_blocks), (EndpointId(0), 95));
}

#[test]
fn the_stall_share_follows_the_pools_warm_share_and_is_whole_before_any() {
    let share = |warm| StallShare::of(warm).get();
    assert_eq!(share(None), 1.0, "nothing seen: the whole charge");
    assert_eq!(share(Some(0.0)), 0.0, "nothing warm: none of it");
    // A tenth warm: 0.1 / 0.25 = 0.4 of the charge.
    assert!(
        (share(Some(0.1)) - 0.4).abs() < 1e-12,
        "{}",
        share(Some(0.1))
    );
    assert_eq!(share(Some(0.25)), 1.0, "a quarter warm: the whole charge");
    assert_eq!(
        share(Some(0.5)),
        1.0,
        "half warm: capped at the whole charge"
    );
    assert_eq!(share(Some(f64::NAN)), 1.0, "no figure: the whole charge");
}

#[test]
fn where_nothing_is_warm_a_cold_prefill_goes_by_the_queue_not_the_stall() {
    let rr = AtomicUsize::new(0);
    // As above: A six decoding, nothing queued; B one, 30 blocks queued.
    let (busy, queued) = (cand(0, 0, 0, 6), cand(1, 0, 30, 1));
    let at = |warm| RequestCtx {
        stall_share: StallShare::of(Some(warm)),
        ..ctx(100)
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // No stall charge: A 100 + 4 x 6 = 124 blocks; B 100 + 30 + 4 = 134. At the prior's
    // 1.6 ms a block + 20 ms: 218.4 and 234.4 ms.
    let d = rank(
        Policy::Precise,
        &at(0.0),
        &[busy.clone(), queued.clone()],
        &rr,
    )
    .unwrap();
    assert_eq!(d.ranked[0], EndpointId(0));
    assert!(
        close(d.costs[0], 0.2184) && close(d.costs[1], 0.2344),
        "{:?}",
        d.costs
    );
    // An eighth warm pays half the charge: A 100 + 0.125 x 100 x 6 + 24 = 199 blocks
    // (338.4 ms), B 100 + 30 + 0.125 x 100 + 4 = 146.5 (254.4 ms).
    let d = rank(Policy::Precise, &at(0.125), &[busy, queued], &rr).unwrap();
    assert_eq!(d.ranked[0], EndpointId(1));
    assert!(
        close(d.costs[0], 0.2544) && close(d.costs[1], 0.3384),
        "{:?}",
        d.costs
    );
}

#[test]
fn an_untrusted_pod_is_scored_by_its_history_and_wins_over_a_cold_pod() {
    let rr = AtomicUsize::new(0);
    // Pod 1's index is unsure: whatever it says (90 blocks, maybe stale) is not used,
    // but this agent sent it 80 blocks of this prefix recently.
    let mut unsure = cand(1, 90, 0, 0);
    unsure.prefix_trusted = false;
    unsure.history_blocks = 80;
    let d = rank(
        Policy::Precise,
        &ctx(100),
        &[cand(0, 0, 0, 0), unsure.clone()],
        &rr,
    )
    .unwrap();
    assert_eq!(
        (d.ranked[0], d.prefix_blocks, d.prefix_source),
        (EndpointId(1), 80, PrefixSource::History)
    );
    // Cost: 20 uncached blocks at the prior's 1.6 ms per block, + 20 ms base; the cold pod:
    // 100 blocks.
    assert!(
        (d.score - (20.0 * 0.0016 + 0.02)).abs() < 1e-12,
        "{}",
        d.score
    );
    // A trusted pod holding more by its index wins (5 uncached blocks against 20), and says
    // its prefix is the index's.
    let mut warm = cand(0, 95, 0, 0);
    warm.history_blocks = 80;
    let d = rank(Policy::Precise, &ctx(100), &[warm, unsure], &rr).unwrap();
    assert_eq!(
        (d.ranked[0], d.prefix_blocks, d.prefix_source),
        (EndpointId(0), 95, PrefixSource::Index)
    );
}

#[test]
fn untrusted_prefix_without_history_counts_as_no_match_and_excluded_are_skipped() {
    let rr = AtomicUsize::new(0);
    let mut unsure = cand(1, 90, 0, 0);
    unsure.prefix_trusted = false;
    let d = rank(
        Policy::Precise,
        &ctx(100),
        &[cand(0, 10, 0, 0), unsure],
        &rr,
    )
    .unwrap();
    assert_eq!(d.ranked[0], EndpointId(0));
    let mut gone = cand(0, 10, 0, 0);
    gone.excluded = true;
    let d = rank(Policy::Precise, &ctx(100), &[gone, cand(1, 0, 0, 0)], &rr).unwrap();
    assert_eq!(d.ranked.as_slice(), [EndpointId(1)]);
    let mut all = cand(0, 0, 0, 0);
    all.excluded = true;
    assert!(rank(Policy::Precise, &ctx(1), &[all], &rr).is_none());
}

#[test]
fn cold_requests_spread_and_round_robin_rotates() {
    let rr = AtomicUsize::new(0);
    let cands = [cand(0, 0, 0, 0), cand(1, 0, 0, 0), cand(2, 0, 0, 0)];
    let firsts: Vec<_> = (0..3)
        .map(|_| rank(Policy::Precise, &ctx(4), &cands, &rr).unwrap().ranked[0])
        .collect();
    assert_eq!(
        firsts
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len(),
        3,
        "ties rotate"
    );
    let rr = AtomicUsize::new(0);
    let firsts: Vec<_> = (0..3)
        .map(|_| {
            rank(Policy::RoundRobin, &ctx(4), &cands, &rr)
                .unwrap()
                .ranked[0]
                .0
        })
        .collect();
    assert_eq!(firsts, vec![0, 1, 2]);
    let d = rank(
        Policy::LeastLoaded,
        &ctx(4),
        &[cand(0, 0, 0, 5), cand(1, 0, 0, 1)],
        &rr,
    )
    .unwrap();
    assert_eq!(d.ranked[0], EndpointId(1));
}

#[test]
fn session_is_sticky() {
    let rr = AtomicUsize::new(0);
    let cands = [cand(0, 0, 0, 0), cand(1, 0, 0, 0), cand(2, 0, 0, 0)];
    let c = RequestCtx {
        session: Some("user-42".into()),
        ..RequestCtx::default()
    };
    let a = rank(Policy::Session, &c, &cands, &rr).unwrap().ranked[0];
    let b = rank(Policy::Session, &c, &cands, &rr).unwrap().ranked[0];
    assert_eq!(a, b);
    // Rendezvous: removing another pod never moves this session.
    let others: Vec<Candidate> = cands
        .iter()
        .map(|x| Candidate {
            excluded: x.id != a && x.id.0 == (a.0 + 1) % 3,
            ..x.clone()
        })
        .collect();
    assert_eq!(
        rank(Policy::Session, &c, &others, &rr).unwrap().ranked[0],
        a
    );
    // Many sessions spread over all pods.
    let owners: std::collections::HashSet<_> = (0..64)
        .map(|i| {
            let c = RequestCtx {
                session: Some(format!("user-{i}")),
                ..RequestCtx::default()
            };
            rank(Policy::Session, &c, &cands, &rr).unwrap().ranked[0]
        })
        .collect();
    assert_eq!(owners.len(), 3);
}

#[test]
fn kv_usage_and_lora_weights_move_the_pick() {
    let rr = AtomicUsize::new(0);
    let mut full = cand(0, 0, 0, 0);
    full.kv_usage = 0.95;
    let empty = cand(1, 0, 0, 1);
    // Precise ignores KV usage by default: the pod with nothing in flight wins.
    assert_eq!(
        rank(
            Policy::Precise,
            &ctx(10),
            &[full.clone(), empty.clone()],
            &rr
        )
        .unwrap()
        .ranked[0],
        EndpointId(0)
    );
    let mut w = Policy::Precise.weights();
    // A nearly full cache (19 blocks at weight 2) outweighs one request in flight
    // (4 + 0.25 x 10 blocks it would stall).
    w.set("kv-usage", 2.0).unwrap();
    let p = RoutePolicy {
        weights: w,
        ..RoutePolicy::from(Policy::Precise)
    };
    assert_eq!(
        rank(p, &ctx(10), &[full, empty], &rr).unwrap().ranked[0],
        EndpointId(1)
    );
    // A pod with the adapter loaded wins over one that must load it, unless its queue
    // costs more than the load.
    let mut loaded = cand(0, 0, 10, 0);
    loaded.lora = LoraState::Loaded;
    let mut missing = cand(1, 0, 0, 0);
    missing.lora = LoraState::NotLoaded;
    assert_eq!(
        rank(
            Policy::Precise,
            &ctx(10),
            &[loaded.clone(), missing.clone()],
            &rr
        )
        .unwrap()
        .ranked[0],
        EndpointId(0)
    );
    loaded.queued_prefill_blocks = 100;
    assert_eq!(
        rank(Policy::Precise, &ctx(10), &[loaded, missing], &rr)
            .unwrap()
            .ranked[0],
        EndpointId(1)
    );
}

#[test]
fn an_evicted_prefix_goes_to_the_idlest_pod_unless_the_pull_of_home_is_weighted() {
    let rr = AtomicUsize::new(0);
    // Nobody holds the prefix any more; pod 1 served it last.
    let idle = cand(0, 0, 0, 0);
    let with = |history: f64, home_queued: u64| {
        let mut home = cand(1, 0, home_queued, 0);
        home.history_blocks = 100;
        let mut policy = RoutePolicy::from(Policy::Precise);
        policy.weights.set("history", history).unwrap();
        rank(policy, &ctx(100), &[idle.clone(), home], &rr)
            .unwrap()
            .ranked[0]
    };
    // The preset: the old home is as cold as the idle pod, and 10 queued blocks decide.
    assert_eq!(Policy::Precise.weights().history, 0.0);
    assert_eq!(with(0.0, 10), EndpointId(0));
    // `--weight history=2`: leaving home costs the prompt twice (200 blocks).
    let first = |home_queued: u64| with(2.0, home_queued);
    assert_eq!(
        first(10),
        EndpointId(1),
        "10 queued blocks < the 200-block pull of home"
    );
    assert_eq!(
        first(190),
        EndpointId(1),
        "190 queued blocks do not outweigh it"
    );
    assert_eq!(first(230), EndpointId(0), "230 queued blocks outweigh it");
}

#[test]
fn each_pod_is_predicted_on_its_own_calibration_and_ranked_at_the_pools_median_rate() {
    let rr = AtomicUsize::new(0);
    // Both cold for a 100-block prompt. Pod 0 prefills 16k tokens/s (1 ms per 16-token
    // block) with 2 running and 20 blocks queued; pod 1 4k tokens/s (4 ms per block), idle.
    let mut fast = cand(0, 0, 20, 2);
    fast.timing = BlockTiming {
        secs_per_block: 0.001,
        secs_per_running: 0.005,
        base: 0.01,
    };
    let mut slow = cand(1, 0, 0, 0);
    slow.timing = BlockTiming {
        secs_per_block: 0.004,
        secs_per_running: 0.005,
        base: 0.01,
    };
    let d = rank(Policy::Precise, &ctx(100), &[fast, slow], &rr).unwrap();
    // Predictions, each on its pod's own fit: fast (100 + 20) x 1 ms + 2 x 5 ms + 10 ms =
    // 140 ms; slow 100 x 4 ms + 10 ms = 410 ms.
    // Costs at the median 2.5 ms per block + 10 ms: fast 100 + 20 + stall 0.25 x 100 x 2 +
    // spread 8 = 178 blocks = 455 ms; slow 100 blocks = 260 ms.
    assert_eq!(d.ranked.as_slice(), [EndpointId(1), EndpointId(0)]);
    assert!((d.predicted_ttft() - 0.410).abs() < 1e-12);
    assert!((d.predicted[1] - 0.140).abs() < 1e-12);
    assert!((d.score - 0.260).abs() < 1e-12, "{}", d.score);
    // Replication moving the other pod first keeps each row's figures with its pod.
    let mut moved = d.clone();
    moved.promote(EndpointId(0));
    assert_eq!(moved.ranked.as_slice(), [EndpointId(0), EndpointId(1)]);
    assert!((moved.predicted_ttft() - 0.140).abs() < 1e-12);
    assert!((moved.score - 0.455).abs() < 1e-12, "{}", moved.score);
    moved.prefer(|id| id == EndpointId(1));
    assert_eq!(moved, d);
}

#[test]
fn weights_are_validated_by_name() {
    let mut w = Weights::default();
    assert!(w.set("in_flight", 2.0).is_ok());
    assert_eq!(w.in_flight, 2.0);
    assert!(w.set("prefix", -1.0).unwrap_err().contains(">= 0"));
    assert!(w.set("magic", 1.0).unwrap_err().contains("unknown scorer"));
}

#[test]
fn a_held_prefix_counts_as_much_of_it_as_survives_to_prefill() {
    let rr = AtomicUsize::new(0);
    // 100-block prompt. A holds 90 blocks of it with six requests decoding; B holds
    // nothing, one request decoding.
    let mut warm = cand(0, 90, 0, 6);
    warm.history_blocks = 90;
    let cold = cand(1, 0, 0, 1);
    let t = BlockTiming::default();
    let blocks = |seconds: f64| (seconds - t.base) / t.secs_per_block;
    // Everything held survives (the default): in blocks, A costs 10 uncached + 0.25 x 10 x 6
    // stall + 4 x 6 spread = 49; B 100 + 0.25 x 100 x 1 + 4 = 129.
    let d = rank(
        Policy::Precise,
        &ctx(100),
        &[warm.clone(), cold.clone()],
        &rr,
    )
    .unwrap();
    assert_eq!((d.ranked[0], d.prefix_blocks), (EndpointId(0), 90));
    assert!((blocks(d.costs[0]) - 49.0).abs() < 1e-6, "{:?}", d.costs);
    assert!((blocks(d.costs[1]) - 129.0).abs() < 1e-6, "{:?}", d.costs);
    // A tenth survives (the engines delivered 10 % of what pods held at decision): A is
    // expected to prefill 100 - 0.1 x 90 = 91 blocks, which stall its six decoders: 91 +
    // 0.25 x 91 x 6 + 24 = 251.5; B 129. The idle pod wins.
    let mut few = ctx(100);
    few.survival = Survival::new(0.1);
    let d = rank(Policy::Precise, &few, &[warm, cold], &rr).unwrap();
    assert_eq!(d.ranked[0], EndpointId(1));
    assert!((blocks(d.costs[0]) - 129.0).abs() < 1e-6, "{:?}", d.costs);
    assert!((blocks(d.costs[1]) - 251.5).abs() < 1e-6, "{:?}", d.costs);
    // The receipt still says what the chosen pod held: nothing.
    assert_eq!(d.prefix_blocks, 0);
    assert_eq!(Survival::new(f64::NAN), Survival::new(1.0));
    assert_eq!(Survival::new(-1.0).at(0.1), 0.0);
}

#[test]
fn survival_is_read_at_the_predicted_wait_between_band_midpoints() {
    // Bands: under 25 ms, 25-50, 50-100, 100-200, 200-400, 400-800, 800-1600 ms, beyond.
    assert_eq!(Survival::band(0.010), 0);
    assert_eq!(Survival::band(0.025), 1);
    assert_eq!(Survival::band(0.049), 1);
    assert_eq!(Survival::band(0.050), 2);
    assert_eq!(Survival::band(0.300), 4);
    assert_eq!(Survival::band(1.6), 7);
    assert_eq!(Survival::band(100.0), 7);
    assert_eq!(Survival::band(f64::NAN), 0);
    assert_eq!(Survival::band(-1.0), 0);
    let s = Survival::by_wait([1.0, 0.9, 0.8, 0.5, 0.2, 0.1, 0.0, f64::NAN]);
    // Band i's midpoint is 25 ms x 2^i / sqrt 2: 17.7 ms, 35.4 ms, 70.7 ms, ...
    let mid = |i: i32| 0.025 * 2f64.powi(i) / 2f64.sqrt();
    assert!((s.at(mid(1)) - 0.9).abs() < 1e-12);
    assert!((s.at(mid(3)) - 0.5).abs() < 1e-12);
    // 50 ms is halfway (in log2) between 35.4 and 70.7 ms: between 0.9 and 0.8.
    assert!((s.at(0.050) - 0.85).abs() < 1e-12);
    assert!((s.at(0.100) - 0.65).abs() < 1e-12);
    // Flat before the first midpoint and after the last; NaN shares read 1.
    assert_eq!(s.at(0.0), 1.0);
    assert_eq!(s.at(0.001), 1.0);
    assert_eq!(s.at(f64::NAN), 1.0);
    assert_eq!(s.at(1e9), 1.0);
    assert!((s.at(mid(6)) - 0.0).abs() < 1e-12);
    assert_eq!(Survival::new(0.3).at(0.5), 0.3);
}

#[test]
fn a_held_prefix_is_chased_where_it_survives_the_wait_and_not_where_it_does_not() {
    let rr = AtomicUsize::new(0);
    // The pool's receipts: a prefix survives a predicted TTFT up to 141 ms (band 3's
    // midpoint) whole, and only a tenth of it from 283 ms (band 4's) on.
    let mut req = ctx(100);
    req.survival = Survival::by_wait([1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.1]);
    let t = BlockTiming::default();
    let blocks = |seconds: f64| (seconds - t.base) / t.secs_per_block;
    // A holds 90 of the 100 blocks with six requests decoding; B is cold with one.
    let cold = cand(1, 0, 0, 1);
    // A's fit says its decoders slow it little (1 ms each): predicted TTFT 10 x 1.6 ms + 6
    // x 1 ms + 20 ms = 42 ms, where the whole prefix survives. In blocks A costs 10 + 0.25 x
    // 10 x 6 + 4 x 6 = 49, B 100 + 0.25 x 100 + 4 = 129: A.
    let quick = cand(0, 90, 0, 6);
    let d = rank(Policy::Precise, &req, &[quick, cold.clone()], &rr).unwrap();
    assert_eq!(d.ranked[0], EndpointId(0));
    assert!((d.predicted[0] - 0.042).abs() < 1e-12, "{:?}", d.predicted);
    assert!((blocks(d.costs[0]) - 49.0).abs() < 1e-6, "{:?}", d.costs);
    // The same pod whose fit says each decoder costs 50 ms: predicted 16 + 300 + 20 = 336
    // ms, where a tenth survives. It is expected to prefill 100 - 9 = 91 blocks, stalling
    // six: 91 + 0.25 x 91 x 6 + 24 = 251.5 against B's 129: B. (The ranking prices blocks
    // at the pool's median rate, which neither fit changed.)
    let mut slow = cand(0, 90, 0, 6);
    slow.timing.secs_per_running = 0.05;
    let d = rank(Policy::Precise, &req, &[slow, cold], &rr).unwrap();
    assert_eq!(d.ranked[0], EndpointId(1));
    assert!((blocks(d.costs[0]) - 129.0).abs() < 1e-6, "{:?}", d.costs);
    assert!((blocks(d.costs[1]) - 251.5).abs() < 1e-6, "{:?}", d.costs);
}

#[test]
fn kv_room_wait_is_the_missing_share_of_a_lifetime_capped() {
    let room = |pinned, new_blocks| KvRoom {
        capacity: 253,
        pinned,
        new_blocks,
        lifetime: 0.5,
        resident: 0,
        output: 0,
    };
    assert_eq!(room(100, 72).wait(), 0.0, "fits");
    assert_eq!(room(181, 72).wait(), 0.0, "fits exactly");
    // 240 + 20 - 253 = 7 blocks short: 7/240 of the pinned blocks must be freed first.
    assert!((room(240, 20).wait() - 7.0 / 240.0 * 0.5).abs() < 1e-12);
    // Nothing pinned and still too big: capped at MAX_TURNOVERS lifetimes.
    assert!((room(0, 400).wait() - MAX_TURNOVERS * 0.5).abs() < 1e-12);
    let odd = KvRoom {
        lifetime: f64::NAN,
        ..room(240, 20)
    };
    assert_eq!(odd.wait(), 0.0);
}

#[test]
fn a_cold_prompt_goes_where_its_blocks_fit_not_where_a_hot_document_fills_the_cache() {
    let rr = AtomicUsize::new(0);
    let c = ctx(72);
    // Pod 0: two requests in flight, but its KV is held by a hot document's requests
    // (250 of 253 blocks); pod 1: three in flight and room. The cold prompt needs its 72
    // blocks (output included, as the candidates count it).
    let full = KvRoom {
        capacity: 253,
        pinned: 250,
        new_blocks: 72,
        lifetime: 0.5,
        resident: 0,
        output: 0,
    };
    let roomy = KvRoom {
        pinned: 100,
        ..full
    };
    let mut pods = [cand(0, 0, 0, 2), cand(1, 0, 0, 3)];
    // Without KV sizes (in blocks at the prior's 1.6 ms per block): pod 0 costs
    // 72 + 0.25 x 72 x 2 + 4 x 2 = 116, pod 1 72 + 0.25 x 72 x 3 + 4 x 3 = 138.
    let d = rank(Policy::Precise, &c, &pods, &rr).unwrap();
    assert_eq!(d.ranked[0], EndpointId(0));
    // With them: pod 0 lacks 250 + 72 - 253 = 69 blocks, 69/250 of a 0.5 s lifetime =
    // 0.138 s = 86.25 blocks: 202.25 against pod 1's 138.
    pods[0].kv = Some(full);
    pods[1].kv = Some(roomy);
    let d = rank(Policy::Precise, &c, &pods, &rr).unwrap();
    assert_eq!(d.ranked[0], EndpointId(1));
    let scale = BlockTiming::default().secs_per_block;
    let base = BlockTiming::default().base;
    assert!(
        (d.costs[0] - (138.0 * scale + base)).abs() < 1e-9,
        "{:?}",
        d.costs
    );
    assert!(
        (d.costs[1] - (202.25 * scale + base)).abs() < 1e-9,
        "{:?}",
        d.costs
    );
    // The wait is part of the prediction: pod 0's TTFT = 72 blocks of prefill + 2 running
    // + base + 0.138 s.
    let t = BlockTiming::default();
    let want = 72.0 * t.secs_per_block + 2.0 * t.secs_per_running + t.base + 0.138;
    assert!((d.predicted[1] - want).abs() < 1e-9, "{:?}", d.predicted);
    // `--weight kv-room=0` turns the term off in the ranking.
    let mut off = RoutePolicy::from(Policy::Precise);
    off.weights.set("kv-room", 0.0).unwrap();
    assert_eq!(rank(off, &c, &pods, &rr).unwrap().ranked[0], EndpointId(0));
}

#[test]
fn a_kv_wait_adds_its_seconds_to_the_cost_whatever_the_pods_own_fit() {
    let rr = AtomicUsize::new(0);
    let c = ctx(10);
    // Two cold idle pods; pod 0's fit says 10x faster prefill (0.1 ms per block) than pod
    // 1's (1 ms), and only pod 0 waits for KV room: it lacks 50 of 100 pinned blocks, half
    // of a 0.2 s lifetime = 0.1 s.
    let mut pods = [cand(0, 0, 0, 0), cand(1, 0, 0, 0)];
    pods[0].timing = BlockTiming {
        secs_per_block: 0.0001,
        secs_per_running: 0.0,
        base: 0.0,
    };
    pods[1].timing = BlockTiming {
        secs_per_block: 0.001,
        secs_per_running: 0.0,
        base: 0.0,
    };
    pods[0].kv = Some(KvRoom {
        capacity: 100,
        pinned: 100,
        new_blocks: 50,
        lifetime: 0.2,
        resident: 0,
        output: 0,
    });
    let d = rank(Policy::Precise, &c, &pods, &rr).unwrap();
    // In blocks, each pod: 10 uncached; at the median 0.55 ms per block, 5.5 ms. Pod 0 adds
    // its 0.1 s wait: 105.5 ms (at its own rate the wait would have been 1,000 blocks,
    // 555.5 ms).
    assert_eq!(d.ranked.as_slice(), [EndpointId(1), EndpointId(0)]);
    assert!((d.costs[0] - 0.0055).abs() < 1e-12, "{:?}", d.costs);
    assert!((d.costs[1] - 0.1055).abs() < 1e-12, "{:?}", d.costs);
}

#[test]
fn with_peers_near_ties_go_by_turn_and_a_prefix_a_queue_or_a_cold_stall_is_never_traded() {
    // Prompts of 10 blocks; pods at the default timing (1e-4 s a token: 1.6 ms a block).
    // One more request running costs 4 blocks (in-flight) plus 0.25 x the uncached blocks
    // (stall) there.
    let idle = cand(0, 0, 0, 0);
    let one_busier = cand(1, 0, 0, 1);
    let queued = cand(2, 0, 20, 0);
    let pods = [idle.clone(), one_busier, queued];
    let mut with_peers = RoutePolicy::from(Policy::Precise);
    with_peers.peers_route = true;
    // The pick (its position, its prefix) at each of four turns.
    let picks = |policy: RoutePolicy, pods: &[Candidate]| -> Vec<(usize, usize)> {
        (0..4)
            .map(|start| {
                let d = rank(policy, &ctx(10), pods, &AtomicUsize::new(start)).unwrap();
                (d.ranked[0].0, d.prefix_blocks)
            })
            .collect()
    };
    // Alone, an agent always takes the idle pod.
    let alone = RoutePolicy::from(Policy::Precise);
    assert_eq!(picks(alone, &pods), [(0, 0); 4]);
    // Warm: both pods hold 8 of the 10 blocks. The pod a request busier costs 4 + 0.25 x 2
    // = 4.5 blocks more, one request's load for this prompt: the two go by turn.
    let (warm_idle, warm_busier) = (cand(0, 8, 0, 0), cand(1, 8, 0, 1));
    assert_eq!(
        picks(with_peers, &[warm_idle.clone(), warm_busier]),
        [(0, 8), (1, 8), (0, 8), (1, 8)]
    );
    // Two requests busier is 2 x 4.5 = 9 blocks dearer: beyond one request's load.
    assert_eq!(
        picks(with_peers, &[warm_idle, cand(1, 8, 0, 2)]),
        [(0, 8); 4]
    );
    // Cold: the pod a request busier costs 4 + 0.25 x 10 = 6.5 blocks more, but a cold
    // prompt's window is the 4 blocks of in-flight alone (its stall is not traded), and the
    // pod with 20 blocks of prefill queued is no tie either: always the idle pod.
    assert_eq!(picks(with_peers, &pods), [(0, 0); 4]);
    // Where nothing is warm (stall share 0: the no-sharing control) no stall is charged: the
    // pod a request busier is 4 blocks dearer, within the window of 4, and goes by turn.
    let unshared = RequestCtx {
        stall_share: StallShare::of(Some(0.0)),
        ..ctx(10)
    };
    let unshared_picks: Vec<usize> = (0..4)
        .map(|start| {
            let d = rank(with_peers, &unshared, &pods, &AtomicUsize::new(start)).unwrap();
            d.ranked[0].0
        })
        .collect();
    assert_eq!(unshared_picks, [0, 1, 0, 1]);
    // Exact ties (two idle pods) go by turn, cold or warm, each pod in its turn.
    assert_eq!(
        picks(with_peers, &[idle.clone(), cand(1, 0, 0, 0)]),
        [(0, 0), (1, 0), (0, 0), (1, 0)]
    );
    // A pod with 2 blocks of prefill queued (2 dearer) and none running is within one
    // request's load of the idle pod, but has more queued: never a tie.
    assert_eq!(
        picks(with_peers, &[idle.clone(), cand(1, 0, 2, 0)]),
        [(0, 0); 4]
    );
    // A pod that holds the prompt's first 4 blocks costs 6, and the idle pod's 10 is within
    // the cold pick's 4 blocks of it, but holds less: never taken instead.
    let holder = cand(1, 4, 0, 0);
    assert_eq!(picks(with_peers, &[idle, holder]), [(1, 4); 4]);
}

#[test]
fn evicted_counts_only_reused_blocks_a_request_pushes_out() {
    let room = |resident, pinned| KvRoom {
        capacity: 1069,
        pinned,
        new_blocks: 0,
        lifetime: 1.0,
        resident,
        output: 4,
    };
    // Six 160-block documents kept, nothing in flight: a cold 160-block prompt and its 4
    // output blocks find 1069 - 960 = 109 free, and push out 164 - 109 = 55 of them.
    assert_eq!(room(960, 0).evicted(0, 160), 55);
    // The same pod holding 157 of the prompt's blocks (its document): it adds 3 + 4.
    assert_eq!(room(960, 0).evicted(157, 160), 0);
    // Full of requests in flight, 155 blocks reused of which 150 are this prompt's: it adds
    // 10 + 4, all pushed out, but only the other 5 reused blocks are charged.
    assert_eq!(room(155, 1069).evicted(150, 160), 5);
    // Full of reused prefixes: all it adds is pushed out of them.
    assert_eq!(room(1069, 300).evicted(0, 160), 164);
    // Full of requests in flight (1000 blocks), 100 reused: it lacks 95, all reused.
    assert_eq!(room(100, 1000).evicted(0, 160), 95);
    // ... but only 50 reused: the rest of what it lacks is one-off blocks, free to lose.
    assert_eq!(room(50, 1000).evicted(0, 160), 50);
    assert_eq!(
        room(0, 1069).evicted(0, 160),
        0,
        "nothing reused, nothing charged"
    );
}

#[test]
fn a_new_prefix_goes_where_the_cache_has_room_not_where_it_evicts_reused_ones() {
    let rr = AtomicUsize::new(0);
    let c = ctx(160);
    let kv = |resident, pinned| {
        Some(KvRoom {
            capacity: 1069,
            pinned,
            new_blocks: 164,
            lifetime: 1.0,
            resident,
            output: 4,
        })
    };
    // A cold 160-block prompt. Pod 0 is idle and keeps six documents (960 blocks); pod 1
    // runs one request (168 blocks in flight) and keeps four (640).
    let mut pods = [cand(0, 0, 0, 0), cand(1, 0, 0, 1)];
    pods[0].kv = kv(960, 0);
    pods[1].kv = kv(640, 168);
    // In blocks: pod 0 160 prefill + 55 evicted = 215; pod 1 160 + 4 in flight + 0.25 x
    // 160 x 1 stalled = 204, and nothing evicted (640 + 164 fit in 1069).
    let d = rank(Policy::Precise, &c, &pods, &rr).unwrap();
    assert_eq!(d.ranked[0], EndpointId(1));
    let t = BlockTiming::default();
    let cost = |blocks: f64| blocks * t.secs_per_block + t.base;
    assert!((d.costs[0] - cost(204.0)).abs() < 1e-9, "{:?}", d.costs);
    assert!((d.costs[1] - cost(215.0)).abs() < 1e-9, "{:?}", d.costs);
    // The charge is the next requests' cost, not this one's TTFT: pod 0's prediction is its
    // prefill alone.
    let idle = d.ranked.iter().position(|&id| id == EndpointId(0)).unwrap();
    assert!(
        (d.predicted[idle] - cost(160.0)).abs() < 1e-9,
        "{:?}",
        d.predicted
    );
    // `--weight evict=0`: the idle pod, as before (160 against 204).
    let mut off = RoutePolicy::from(Policy::Precise);
    off.weights.set("evict", 0.0).unwrap();
    assert_eq!(rank(off, &c, &pods, &rr).unwrap().ranked[0], EndpointId(0));
}
