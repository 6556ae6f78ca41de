use std::{io::Write, sync::Arc};

use super::*;

const TRACE: &str = r#"{"timestamp": 0, "input_length": 1500, "output_length": 100, "hash_ids": [0, 1, 2]}
{"timestamp": 1000, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 3]}

{"timestamp": 2000, "input_length": 300, "output_length": 0, "hash_ids": [4], "session_id": "x"}
"#;

fn sizes(requests: usize) -> Sizes {
    Sizes {
        requests,
        trace: Shrink {
            block_size: 512,
            block_tokens: 16,
        },
        ..Sizes::full(0)
    }
}

fn trace(text: &str) -> Trace {
    Trace {
        path: "t.jsonl".into(),
        lines: Trace::parse(text).unwrap(),
    }
}

#[test]
fn lines_parse_with_unknown_fields_ignored_and_bad_ones_named() {
    let t = trace(TRACE);
    assert_eq!(t.lines.len(), 3);
    assert_eq!(
        t.lines[1],
        Line {
            timestamp: 1000.0,
            input_length: 1100,
            output_length: 3,
            hash_ids: vec![0, 1, 3],
        }
    );
    assert_eq!(t.check(512), Ok(()));
    // Block sizes: at least one token, becoming 1..=4096.
    for (block_size, block_tokens, ok) in [
        (512, 64, true),
        (0, 64, false),
        (512, 0, false),
        (512, 4097, false),
    ] {
        let shrink = Shrink {
            block_size,
            block_tokens,
        };
        assert_eq!(shrink.check().is_ok(), ok, "{shrink:?}");
    }
    // Shrinking saturates rather than overflows.
    let wide = Shrink {
        block_size: 1,
        block_tokens: 4096,
    };
    assert_eq!(wide.tokens(usize::MAX), usize::MAX);
    let err = t.check(256).unwrap_err();
    assert!(
        err.contains("request 1") && err.contains("3 ids for 1500"),
        "{err}"
    );
    for (text, says) in [
        ("", "no requests"),
        ("{\"timestamp\": 0}\n", "line 1: missing field"),
        (
            "\n{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}",
            "line 2: timestamp -1",
        ),
        (
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
            "line 1: hash_ids",
        ),
        ("not json", "line 1: expected"),
        (
            "{\"timestamp\": 0, \"input_length\": -5, \"output_length\": 1, \"hash_ids\": [1]}",
            "line 1: invalid value",
        ),
        (
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 18446744073709551615, \"hash_ids\": [1]}",
            "line 1: input_length 1 / output_length 18446744073709551615: at most 16777216 each",
        ),
    ] {
        let err = Trace::parse(text).unwrap_err();
        assert!(err.contains(says), "{text:?}: {err}");
    }
}

#[test]
fn a_file_loads_in_time_order_and_names_itself() {
    let path = std::env::temp_dir().join(format!("warmpath-trace-{}.jsonl", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    // Out of order: the loader sorts by timestamp, stably.
    for line in TRACE.lines().rev() {
        writeln!(f, "{line}").unwrap();
    }
    drop(f);
    let spec = format!("mooncake:{}", path.display());
    let w: Workload = spec.parse().unwrap();
    assert_eq!(w.to_string(), spec);
    let Workload::Trace(t) = &w else {
        panic!("{w:?}")
    };
    let stamps: Vec<f64> = t.lines.iter().map(|l| l.timestamp).collect();
    assert_eq!(stamps, [0.0, 1000.0, 2000.0]);
    assert!(w.shares());
    std::fs::remove_file(&path).unwrap();
    let missing = "mooncake:/nonexistent/trace.jsonl".parse::<Workload>();
    assert!(
        missing
            .unwrap_err()
            .starts_with("/nonexistent/trace.jsonl: "),
        "the path named"
    );
}

#[test]
fn a_replay_keeps_who_shares_what_and_shrinks_the_requests() {
    let w = Workload::Trace(Arc::new(trace(TRACE)));
    let g = w.generate(&sizes(3), 2.0, 4, 9);
    assert_eq!(g.requests(), 3);
    let turns: Vec<&Planned> = g.chains.iter().flat_map(|c| &c.turns).collect();
    let p: Vec<&str> = turns.iter().map(|t| t.prompt.as_str()).collect();
    let shared = &g.parts[0].shared_chars;
    // Requests 0 and 1 share blocks 0 and 1, byte for byte, and part there.
    assert!(shared[0] > 0);
    assert_eq!(shared[0], shared[1]);
    assert_eq!(p[0][..shared[0]], p[1][..shared[1]]);
    assert_eq!(&p[0][shared[0]..shared[0] + 1], " ");
    assert_ne!(p[0][shared[0]..].get(..20), p[1][shared[1]..].get(..20));
    // Request 2 shares nothing: no common start with either.
    assert_eq!(shared[2], 0);
    assert_ne!(p[2].get(..20), p[0].get(..20));
    // Blocks of 512 tokens become 16: 1500 tokens (two whole blocks and 476) become
    // 16 + 16 + ceil(476 x 16 / 512) = 47, at 3.85 characters a token; answers shrink alike,
    // at least one token: ceil(100 x 16 / 512) = 4, ceil(3 x 16 / 512) = 1, and 1.
    assert!(
        (p[0].len() as f64 / 47.0 - 3.85).abs() < 1.2,
        "{}",
        p[0].len()
    );
    let asked: Vec<usize> = turns.iter().map(|t| t.max_tokens).collect();
    assert_eq!(asked, [4, 1, 1]);
    // 1100 tokens: 16 + 16 + ceil(76 x 16 / 512) = 35; 300: ceil(300 x 16 / 512) = 10.
    assert_eq!(g.mean_prompt_tokens, (47.0 + 35.0 + 10.0) / 3.0);
    assert_eq!(g.longest_tokens, 47 + 4);
    assert_eq!(g.output_tokens, 2);
    // Five distinct blocks held once each, and every answer.
    assert_eq!(g.working_set_tokens, 5 * 16 + 6);
    // Timestamps 0, 1, 2 s: three requests over 3 s (the span and one mean gap), 1 a second;
    // at 2 a second, twice as fast.
    let at: Vec<f64> = turns.iter().map(|t| t.at.as_secs_f64()).collect();
    assert_eq!(at, [0.0, 0.5, 1.0]);
    assert!(turns.iter().enumerate().all(|(i, t)| t.user == i));
    // The same seed, the same prompts; another, other text.
    let prompts = |g: &Generated| -> Vec<String> {
        g.chains.iter().map(|c| c.turns[0].prompt.clone()).collect()
    };
    assert_eq!(prompts(&g), prompts(&w.generate(&sizes(3), 2.0, 4, 9)));
    assert_ne!(prompts(&g), prompts(&w.generate(&sizes(3), 2.0, 4, 10)));
}

#[test]
fn runs_take_consecutive_windows_of_the_trace() {
    let text: String = (0..10)
        .map(|i| {
            format!(
                "{{\"timestamp\": {}, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [{i}]}}\n",
                i * 100
            )
        })
        .collect();
    let t = trace(&text);
    let first = |seed| t.window(3, seed)[0].hash_ids[0];
    // Three windows of three lines (the tenth line is in none): seed s takes window s mod 3.
    assert_eq!(
        [first(0), first(1), first(2), first(3), first(7)],
        [0, 3, 6, 0, 3]
    );
    // A window longer than the trace is the whole trace.
    assert_eq!(t.window(50, 4).len(), 10);
    // Lines at one instant arrive at once.
    let same = trace(&text.replace("\"timestamp\": 100", "\"timestamp\": 0"));
    let at = arrivals(same.window(2, 0), 5.0);
    assert_eq!(at, [Duration::ZERO; 2]);
}

#[test]
fn the_floor_counts_what_follows_the_shared_prefix() {
    let w = Workload::Trace(Arc::new(trace(TRACE)));
    let g = w.generate(&sizes(3), 2.0, 4, 9);
    let work = g.new_work();
    assert!(work.shared.is_empty());
    let whole = |i: usize| {
        let t = &g.chains[i].turns[0];
        super::super::floor::tokens(&t.prompt, true)
    };
    // Requests 0 and 1: their two shared blocks (about 32 tokens) as context, the rest new.
    for i in [0, 1] {
        let f = work.each[i];
        assert!((28..=38).contains(&f.context), "{f:?}");
        assert_eq!(f.tokens + f.context, whole(i));
    }
    // Request 2 shares nothing: new whole.
    assert_eq!(work.each[2].context, 0);
    assert_eq!(work.each[2].tokens, whole(2));
}
