use super::*;
use crate::compare::Row;

fn row(name: &str, p50: f64, p90: f64, p99: f64, tps: f64) -> CellRow {
    CellRow {
        name: name.into(),
        status: "ok".into(),
        result: Some(Row {
            policy: name.into(),
            requests: 10,
            errors: 0,
            ttft_p50: p50,
            ttft_p90: p90,
            ttft_p99: p99,
            e2e_p50: 1.0,
            output_tokens_per_s: tps,
            prefix_hit_ratio: 0.5,
            prompt_tokens: 1000,
            available_tokens: None,
            captured_tokens: None,
            delivered_tokens: 0,
            preemptions: 0,
            ttft_prediction_error_ms_p50: None,
            requests_per_agent: vec![10],
            cluster: Vec::new(),
            intercept: None,
            ttfts: Vec::new(),
            raw: Default::default(),
        }),
        runs: Vec::new(),
        answers: Vec::new(),
        tail: None,
        split: Default::default(),
    }
}

/// `row` with each run's p90 and throughput (p50 and p99 as pooled).
fn with_runs(mut r: CellRow, runs: &[(f64, f64)]) -> CellRow {
    let pooled = r.result.as_ref().map(RunFigures::from).expect("a result");
    r.runs = runs
        .iter()
        .map(|&(p90, tps)| RunFigures {
            ttft_p90: p90,
            output_tokens_per_s: tps,
            ..pooled
        })
        .collect();
    r
}

fn cell(shares: bool, rows: Vec<CellRow>) -> Cell {
    with_floor(shares, rows, 0.0)
}

/// A cell whose floor is `floor` seconds at every quantile.
fn with_floor(shares: bool, rows: Vec<CellRow>, floor: f64) -> Cell {
    Cell {
        workload: "w".into(),
        shares,
        load: 1.0,
        rate: 10.0,
        requests: 10,
        working_set_tokens: 100,
        blocks_per_engine: 8,
        floor: crate::matrix::floor::Floor {
            ttft_p50: floor,
            ttft_p90: floor,
            ttft_p99: floor,
        },
        rows,
    }
}

fn find<'a>(v: &'a [Verdict], row: &str, target: &str) -> &'a Verdict {
    v.iter()
        .find(|x| x.row == row && x.target == target)
        .unwrap_or_else(|| panic!("{row} / {target} in {v:?}"))
}

#[test]
fn precise_is_judged_against_the_best_peer_per_figure() {
    let c = cell(
        true,
        vec![
            row("RoundRobin", 0.5, 1.0, 2.0, 900.0),
            row("Precise", 0.10, 0.30, 0.60, 1000.0),
            row("vllm-router cache_aware", 0.09, 0.50, 0.50, 1010.0),
            row("sglang-router cache_aware", 0.20, 0.40, 0.90, 1000.0),
            CellRow {
                name: "vllm-router kv_aware".into(),
                status: "not installed".into(),
                result: None,
                runs: Vec::new(),
                answers: Vec::new(),
                tail: None,
                split: Default::default(),
            },
        ],
    );
    let v = judge(&c, true);
    // Best p90 is sglang's 0.40: 0.30 / 0.40 = 0.75 > 0.7.
    let p90 = find(&v, "Precise", "p90 <= 0.7x best peer");
    assert!(!p90.pass, "{p90:?}");
    assert!(
        p90.detail
            .starts_with("0.75x: 300 ms vs 400 ms (sglang-router"),
        "{p90:?}"
    );
    // p50: 0.10 / 0.09 = 1.11 > 1.05; p99: 0.60 / 0.50 = 1.2; p90 0.75 is fine.
    assert!(!find(&v, "Precise", "p50 <= 1.05x best peer").pass);
    assert!(find(&v, "Precise", "p90 <= 1.05x best peer").pass);
    assert!(!find(&v, "Precise", "p99 <= 1.05x best peer").pass);
    // 1000 / 1010 = 0.990 >= 0.98.
    assert!(find(&v, "Precise", "throughput >= 0.98x best peer").pass);
    // Not at a top load: no 0.7x target; no central row: nothing judged for it.
    let v = judge(&c, false);
    assert!(v.iter().all(|x| !x.target.starts_with("p90 <= 0.7x")));
    assert!(v.iter().all(|x| x.row == "Precise"));
    assert_eq!(v.len(), 4);
}

#[test]
fn without_peers_the_stand_in_is_labelled_and_the_control_is_judged_against_least_loaded() {
    let c = cell(
        false,
        vec![
            row("RoundRobin", 0.5, 1.0, 2.0, 900.0),
            row("LeastLoaded", 0.4, 0.8, 1.5, 950.0),
            row("Precise", 0.41, 0.83, 1.5, 940.0),
            row(CENTRAL_ROW, 0.45, 0.90, 1.6, 800.0),
        ],
    );
    let v = judge(&c, true);
    let stand_in = "best non-warmpath row (stand-in: no peer ran)";
    // No sharing: no 0.7x target even at the top load.
    assert!(v.iter().all(|x| !x.target.starts_with("p90 <= 0.7x")));
    assert!(find(&v, "Precise", &format!("p50 <= 1.05x {stand_in}")).pass);
    // 0.83 / 0.8 = 1.0375 <= 1.05; 940 / 950 = 0.989.
    assert!(find(&v, "Precise", "p90 <= 1.05x least-loaded (control)").pass);
    assert!(find(&v, "Precise", "throughput >= 0.95x least-loaded (control)").pass);
    // The central row: 0.90 / 0.8 = 1.125; 800 / 950 = 0.84.
    assert!(!find(&v, CENTRAL_ROW, "p90 <= 1.05x least-loaded (control)").pass);
    assert!(
        !find(
            &v,
            CENTRAL_ROW,
            "throughput >= 0.95x least-loaded (control)"
        )
        .pass
    );
}

#[test]
fn a_row_with_failed_requests_misses_every_target() {
    let mut precise = row("Precise", 0.01, 0.01, 0.01, 5000.0);
    if let Some(r) = &mut precise.result {
        r.errors = 2;
    }
    // Its answers are the peer's, so every TTFT interval is 1.00-1.00x and holds the 1.05x
    // limit; but failed requests miss on any draw, so none is within the noise.
    let precise = with_answers(precise, &[&[&[1.0], &[1.0]]]);
    let peer = with_answers(
        row("vllm-router kv_aware", 1.0, 1.0, 1.0, 100.0),
        &[&[&[1.0], &[1.0]]],
    );
    let c = cell(true, vec![peer, precise]);
    let v = judge(&c, true);
    assert_eq!(v.len(), 5);
    assert!(
        v.iter()
            .all(|x| !x.pass && !x.within_noise && x.detail.ends_with("; 2 failed requests")),
        "{v:?}"
    );
    let p50 = find(&v, "Precise", "p50 <= 1.05x best peer");
    assert_eq!(p50.interval, Some((1.0, 1.0)));
    assert!(
        p50.detail
            .contains("95 % interval 1.00-1.00x, the answers' ratio only"),
        "{}",
        p50.detail
    );
}

#[test]
fn with_several_runs_each_is_judged_against_that_runs_best_too() {
    // Pooled: p90 0.30 against sglang's 0.40 (0.75x). Run by run the best peer changes:
    // run 0 vllm 0.50, sglang 0.60 -> 0.20 / 0.50 = 0.40x; run 1 vllm 0.25, sglang 0.35 ->
    // 0.30 / 0.25 = 1.20x; run 2 sglang 0.45 (vllm 0.90) -> 0.36 / 0.45 = 0.80x.
    let c = cell(
        true,
        vec![
            with_runs(
                row("Precise", 0.10, 0.30, 0.60, 1000.0),
                &[(0.20, 1000.0), (0.30, 900.0), (0.36, 1100.0)],
            ),
            with_runs(
                row("vllm-router cache_aware", 0.09, 0.50, 0.50, 1010.0),
                &[(0.50, 1000.0), (0.25, 1000.0), (0.90, 1000.0)],
            ),
            with_runs(
                row("sglang-router cache_aware", 0.20, 0.40, 0.90, 1000.0),
                &[(0.60, 900.0), (0.35, 950.0), (0.45, 1200.0)],
            ),
        ],
    );
    let v = judge(&c, true);
    let p90 = find(&v, "Precise", "p90 <= 0.7x best peer");
    assert!(!p90.pass);
    let want = [0.40, 1.20, 0.80];
    assert_eq!(p90.by_run.len(), 3);
    for (got, want) in p90.by_run.iter().zip(want) {
        assert!(
            got.is_some_and(|got| (got - want).abs() < 1e-9),
            "{:?}",
            p90.by_run
        );
    }
    assert!(
        p90.detail
            .ends_with("; by run 0.40x, 1.20x, 0.80x (1 of 3 pass)"),
        "{p90:?}"
    );
    // Throughput, the highest wins: run 0 1000 / 1000, run 1 900 / 1000, run 2 1100 / 1200.
    let t = find(&v, "Precise", "throughput >= 0.98x best peer");
    assert!(
        t.detail
            .ends_with("; by run 1.00x, 0.90x, 0.92x (1 of 3 pass)"),
        "{t:?}"
    );
    // One run only: no by-run figures.
    let single = judge(
        &cell(
            true,
            vec![
                row("Precise", 0.10, 0.30, 0.60, 1000.0),
                row("sglang-router cache_aware", 0.20, 0.40, 0.90, 1000.0),
            ],
        ),
        true,
    );
    assert!(
        single
            .iter()
            .all(|x| x.by_run.is_empty() && !x.detail.contains("by run"))
    );
}

#[test]
fn a_run_with_failed_requests_or_no_reference_does_not_pass() {
    // Run 1 of the precise row lost a request; run 2 has no peer figures (the peer row
    // kept two runs only).
    let mut precise = with_runs(
        row("Precise", 0.10, 0.20, 0.60, 1000.0),
        &[(0.20, 1000.0), (0.20, 1000.0), (0.20, 1000.0)],
    );
    precise.runs[1].errors = 1;
    let c = cell(
        true,
        vec![
            precise,
            with_runs(
                row("sglang-router cache_aware", 0.20, 0.40, 0.90, 1000.0),
                &[(0.40, 1000.0), (0.40, 1000.0)],
            ),
        ],
    );
    let v = judge(&c, true);
    let p90 = find(&v, "Precise", "p90 <= 0.7x best peer");
    assert!(p90.pass, "pooled: 0.50x, no failed request pooled: {p90:?}");
    assert_eq!(p90.by_run, vec![Some(0.5), Some(0.5), None]);
    assert!(
        p90.detail
            .ends_with("; by run 0.50x, 0.50x, - (1 of 3 pass)"),
        "{p90:?}"
    );
}

#[test]
fn a_target_below_the_floor_is_a_miss_that_says_it_is_out_of_reach() {
    let rows = vec![
        row("Precise", 0.13, 0.14, 0.15, 1000.0),
        row("sglang-router cache_aware", 0.13, 0.14, 0.16, 1000.0),
    ];
    // Floor 130 ms: 0.7 x 140 ms = 98 ms is below it; 1.05 x 140 ms is not.
    let v = judge(&with_floor(true, rows.clone(), 0.13), true);
    let tight = find(&v, "Precise", "p90 <= 0.7x best peer");
    assert!(!tight.pass && tight.out_of_reach, "{tight:?}");
    assert!(
        tight
            .detail
            .ends_with("; out of any router's reach: the floor is 130 ms (0.93x)"),
        "{tight:?}"
    );
    let loose = find(&v, "Precise", "p90 <= 1.05x best peer");
    assert!(loose.pass && !loose.out_of_reach, "{loose:?}");
    assert!(!loose.detail.contains("reach"), "{loose:?}");
    // Throughput has no floor.
    assert!(!find(&v, "Precise", "throughput >= 0.98x best peer").out_of_reach);
    // Floor 90 ms: 98 ms is within reach, so the miss is the router's.
    let v = judge(&with_floor(true, rows, 0.09), true);
    let tight = find(&v, "Precise", "p90 <= 0.7x best peer");
    assert!(!tight.pass && !tight.out_of_reach, "{tight:?}");
}

/// `r` with each run's answers: per run, each chain's TTFTs.
fn with_answers(mut r: CellRow, runs: &[&[&[f64]]]) -> CellRow {
    r.answers = runs
        .iter()
        .map(|chains| {
            chains
                .iter()
                .enumerate()
                .map(|(i, t)| (i, t.to_vec()))
                .collect()
        })
        .collect();
    r
}

#[test]
fn a_ttft_verdict_carries_its_interval_and_says_whether_the_limit_is_inside() {
    // The peer answers two chains in 1 s each. Precise answers them in 1 s and 3 s: its
    // pooled p50 (rank ceil(0.5 x 2) = 1) is 1 s, a pass at 1.00x, but a resample draws the
    // slow chain twice a quarter of the time, so the p50 ratio's interval is 1.00-3.00x and
    // the 1.05x limit lies inside it. Its p90 and p99 (3 s) are 3.00x: a resample's p90 is
    // 1 s only when it draws the fast chain twice (a quarter), so their interval is
    // 1.00-3.00x too, the limit inside it as well. The central agent answers every request
    // 1.2x the peer's: 1.20x in every resample, a miss beyond the noise at every quantile.
    let c = cell(
        true,
        vec![
            with_answers(row("Precise", 1.0, 3.0, 3.0, 100.0), &[&[&[1.0], &[3.0]]]),
            with_answers(row(CENTRAL_ROW, 1.2, 1.2, 1.2, 100.0), &[&[&[1.2], &[1.2]]]),
            with_answers(
                row("vllm-router kv_aware", 1.0, 1.0, 1.0, 100.0),
                &[&[&[1.0], &[1.0]]],
            ),
        ],
    );
    let v = judge(&c, true);
    let p50 = find(&v, "Precise", "p50 <= 1.05x best peer");
    assert!(p50.pass && p50.within_noise, "{p50:?}");
    assert_eq!(p50.interval, Some((1.0, 3.0)));
    assert!(
        p50.detail
            .contains("95 % interval 1.00-3.00x, the limit inside it"),
        "{}",
        p50.detail
    );
    let p99 = find(&v, "Precise", "p99 <= 1.05x best peer");
    assert!(!p99.pass && p99.within_noise, "{p99:?}");
    for target in [
        "p50 <= 1.05x best peer",
        "p90 <= 1.05x best peer",
        "p99 <= 1.05x best peer",
    ] {
        let central = find(&v, CENTRAL_ROW, target);
        assert!(!central.pass && !central.within_noise, "{central:?}");
        assert_eq!(central.interval, Some((1.2, 1.2)));
        assert!(
            central
                .detail
                .contains("1.20-1.20x, a miss beyond the noise"),
            "{}",
            central.detail
        );
    }
    // 0.7x of the peer's p90: the central agent's 1.2 s is a miss beyond the noise.
    let tight = find(&v, CENTRAL_ROW, "p90 <= 0.7x best peer");
    assert!(!tight.pass && !tight.within_noise, "{tight:?}");
    // Throughput has no per-request figure to resample.
    assert_eq!(
        find(&v, "Precise", "throughput >= 0.98x best peer").interval,
        None
    );
}

#[test]
fn a_limit_under_the_best_peer_says_whether_the_rows_best_combined_could_meet_it() {
    use crate::matrix::reach::Split;
    // The rows' quantiles (the table's) and their answers (the splits) are set apart: each
    // verdict takes its ratio from the first and the rows' reach from the second.
    let with_split = |mut r: CellRow, warm: &[f64], cold: &[f64]| {
        r.split = Split::new(warm.to_vec(), cold.to_vec());
        r
    };
    let judged = |peer_p90: f64, peer: (&[f64], &[f64]), precise: (&[f64], &[f64])| {
        let peer = with_split(
            row("vllm-router cache_aware", 0.018, peer_p90, 0.140, 1000.0),
            peer.0,
            peer.1,
        );
        let precise = with_split(
            row("Precise", 0.016, 0.030, 0.150, 1000.0),
            precise.0,
            precise.1,
        );
        judge(&cell(true, vec![precise, peer]), true)
    };
    const P07: &str = "p90 <= 0.7x best peer";
    // The peer: 1 cold answer of 10, its warm ones at 18 ms; 0.7 x its p90 (25 ms) = 17.5 ms.
    let peer: (&[f64], &[f64]) = (&[0.018; 9], &[0.140]);
    // Precise's 8 warm answers at 16 ms: 1 cold in 10 (the peer's) and every warm answer
    // within 17.5 ms (Precise's) put 90 % within it: not beyond the rows, though a miss.
    let v = judged(0.025, peer, (&[0.016; 8], &[0.140, 0.150]));
    let p90 = find(&v, "Precise", P07);
    assert!(!p90.pass);
    assert_eq!(p90.beyond_rows, None);
    assert!(!p90.detail.contains("beyond"), "{}", p90.detail);
    // Half of them at 18 ms: 0.9 x 0.5 = 45 % within 17.5 ms, under the 90 % a p90 needs.
    let half: &[f64] = &[0.016, 0.016, 0.016, 0.016, 0.018, 0.018, 0.018, 0.018];
    let v = judged(0.025, peer, (half, &[0.140, 0.150]));
    let p90 = find(&v, "Precise", P07);
    let r = p90.beyond_rows.expect("beyond every row");
    assert!((r.within - 0.45).abs() < 1e-12, "{r:?}");
    assert!((r.fewest_cold - 0.1).abs() < 1e-12, "{r:?}");
    assert_eq!((r.warm_within, r.cold_within), (0.5, 0.0));
    assert!(
        p90.detail
            .contains("put 45.0 % within it, under the 90.0 % a p90 needs"),
        "{}",
        p90.detail
    );
    // Exactly 9 of 10 within (the peer: 3 cold, 2 of them within 17.5 ms, 7 warm within),
    // 0.7 + 0.3 x 2/3 in floating point a hair under 0.9: met, not beyond.
    let v = judged(
        0.025,
        (&[0.016; 7], &[0.010, 0.012, 0.140]),
        (&[0.018; 6], &[0.140; 4]),
    );
    assert_eq!(find(&v, "Precise", P07).beyond_rows, None);
    // A limit at or over the reference's own figure is never judged so: at 1.05 x 10 ms no
    // row has an answer within it, and the miss says nothing of the rows.
    let v = judged(0.010, peer, (half, &[0.140, 0.150]));
    let p90 = find(&v, "Precise", "p90 <= 1.05x best peer");
    assert!(!p90.pass);
    assert_eq!(p90.beyond_rows, None);
    assert!(find(&v, "Precise", P07).beyond_rows.is_some());
}
