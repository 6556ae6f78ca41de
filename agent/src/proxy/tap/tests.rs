//! The taps at every frame split, and the usage scan against the full parser.

use super::{
    usage::{USAGE_KEY, Wire, last_usage_key, scan_usage},
    *,
};

const USAGE: &str = r#"data: {"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}"#;

fn stream() -> String {
    format!(
        "data: {{\"id\":\"c\",\"choices\":[{{\"text\":\"a\"}}],\"usage\":null}}\n\n\
         data: {{\"id\":\"c\",\"choices\":[{{\"text\":\"b\"}}],\"usage\":null}}\n\n{USAGE}\n\ndata: [DONE]\n\n"
    )
}

fn run(tap: &mut SseTap, input: &str, split: usize) -> String {
    let b = input.as_bytes();
    let mut out = Vec::new();
    for chunk in b.chunks(split.max(1)) {
        out.extend_from_slice(&tap.frame(Bytes::copy_from_slice(chunk)));
    }
    out.extend_from_slice(&tap.finish());
    String::from_utf8(out).unwrap()
}

#[test]
fn injected_usage_is_read_then_removed_at_any_frame_split() {
    let expect = "data: {\"id\":\"c\",\"choices\":[{\"text\":\"a\"}]}\n\n\
                  data: {\"id\":\"c\",\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n";
    for split in [1, 2, 7, 33, 64, 1000] {
        let mut tap = SseTap::new(true);
        assert_eq!(run(&mut tap, &stream(), split), expect, "split {split}");
        assert_eq!(
            tap.usage,
            Some(TokenUsage {
                prompt: 7,
                cached: 4,
                completion: 3,
                cached_reported: true,
            })
        );
    }
}

#[test]
fn crlf_streams_are_stripped_event_by_event_keeping_their_line_ends() {
    // The same stream as a server ending events with CRLF would send it.
    let crlf = stream().replace("\n\n", "\r\n\r\n");
    let expect = "data: {\"id\":\"c\",\"choices\":[{\"text\":\"a\"}]}\r\n\r\n\
                  data: {\"id\":\"c\",\"choices\":[{\"text\":\"b\"}]}\r\n\r\ndata: [DONE]\r\n\r\n";
    for split in [1, 2, 3, 7, 64, 1000] {
        let mut tap = SseTap::new(true);
        assert_eq!(run(&mut tap, &crlf, split), expect, "split {split}");
        assert_eq!(tap.usage.map(|u| (u.prompt, u.completion)), Some((7, 3)));
    }
}

#[test]
fn requested_usage_passes_through_unchanged() {
    for split in [1, 5, 1000] {
        let mut tap = SseTap::new(false);
        assert_eq!(run(&mut tap, &stream(), split), stream());
        assert_eq!(tap.usage.map(|u| u.completion), Some(3));
    }
}

#[test]
fn error_events_and_unterminated_tails_are_kept() {
    let mut tap = SseTap::new(true);
    let s = "data: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\npartial";
    assert_eq!(run(&mut tap, s, 4), s);
    assert!(tap.error_event);
    assert_eq!(tap.usage, None);
}

#[test]
fn a_failed_upstream_ends_the_stream_with_an_error_event() {
    let mut tap = SseTap::new(false);
    let _ = tap.frame(Bytes::from_static(
        b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"cho",
    ));
    let end = String::from_utf8(tap.fail("pod went away").to_vec()).unwrap();
    // The partial event was held back, never sent: the error event starts clean.
    assert!(end.starts_with("data: {\"error\":{"), "{end}");
    assert!(end.ends_with("\n\ndata: [DONE]\n\n"), "{end}");
    assert!(tap.error_event);
    // After an oversized event went through unparsed, the client holds an open event.
    let mut open = SseTap::new(true);
    let _ = open.frame(Bytes::from(vec![b'x'; DEFAULT_MAX_EVENT + 1]));
    assert!(open.fail("x").starts_with(b"\n\ndata: {\"error\""));
}

#[test]
fn oversized_event_is_passed_through_not_buffered() {
    let mut tap = SseTap::new(true);
    let big = vec![b'x'; DEFAULT_MAX_EVENT + 10];
    let mut out = tap.frame(Bytes::from(big.clone())).to_vec();
    out.extend_from_slice(&tap.frame(Bytes::from_static(b"\n\n")));
    assert_eq!(out.len(), big.len() + 2);
    assert!(tap.split.pending() == 0);
}

#[test]
fn the_quick_usage_scan_agrees_with_the_parser() {
    for v in [
        r#"{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":null}"#,
        r#"{ "prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 16} } ,"x":1}"#,
        r#"{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":null,"audio_tokens":0}}"#,
        r#"{}"#,
        r#"{"prompt_tokens":5,"prompt_tokens_details":{}}"#,
        r#"{"prompt_tokens":5,"prompt_tokens_details":{"audio_tokens":0}}"#,
        r#"null,"x":1"#,
        r#"{"prompt_tokens":5,"completion_tokens":2.0}"#,
        r#"{"prompt_tokens":5,"extra":{"deep":[1]},"completion_tokens":2}"#,
        r#"{"prompt_tokens":5,"we\u0069rd":1,"completion_tokens":2}"#,
        r#"{"prompt_tokens":-5}"#,
        r#"{"prompt_tokens":5"#,
    ] {
        let full = serde_json::Deserializer::from_slice(v.as_bytes())
            .into_iter::<Option<Wire>>()
            .next()
            .and_then(Result::ok)
            .map(|w| {
                w.map(|w| TokenUsage {
                    prompt: w.prompt_tokens,
                    cached_reported: w
                        .prompt_tokens_details
                        .as_ref()
                        .is_some_and(|d| d.cached_tokens.is_some()),
                    cached: w
                        .prompt_tokens_details
                        .and_then(|d| d.cached_tokens)
                        .unwrap_or(0),
                    completion: w.completion_tokens,
                })
            });
        if let Some(quick) = scan_usage(v.as_bytes()) {
            assert_eq!(Some(quick), full, "{v}");
        }
        let body = format!(r#"{{"choices":[],"usage":{v}"#);
        assert_eq!(last_usage(body.as_bytes()), full.flatten(), "{v}");
    }
    // The common shapes take the quick path.
    assert!(scan_usage(br#"{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}"#).is_some());
}

#[test]
fn json_tail_finds_usage_of_any_body_size() {
    let body = format!(
        r#"{{"choices":[{{"text":"{}"}}],"usage":{{"prompt_tokens":5,"completion_tokens":2}},"x":null}}"#,
        "y".repeat(40_000)
    );
    for split in [3, 4096, 100_000] {
        let mut tap = JsonTap::default();
        for c in body.as_bytes().chunks(split) {
            tap.observe(&Bytes::copy_from_slice(c));
        }
        assert!(tap.held < JSON_TAIL + split);
        assert_eq!(
            tap.usage(),
            Some(TokenUsage {
                prompt: 5,
                cached: 0,
                completion: 2,
                cached_reported: false,
            })
        );
    }
    assert_eq!(JsonTap::default().usage(), None);
}

#[test]
fn the_last_usage_is_found_wherever_it_is() {
    let usage = |p: u64| format!(r#""usage":{{"prompt_tokens":{p},"completion_tokens":1}}"#);
    // Last of two; only one, far from the end behind text full of `g`; at the very start.
    let bodies = [
        (format!("{{{},{},\"x\":1}}", usage(1), usage(2)), 2),
        (
            format!("{{{},\"pad\":\"{}\"}}", usage(3), "g\"usag".repeat(400)),
            3,
        ),
        (format!("{}}}", usage(4)), 4),
    ];
    for (body, prompt) in bodies {
        assert_eq!(
            last_usage(body.as_bytes()).map(|u| u.prompt),
            Some(prompt),
            "{body}"
        );
    }
    assert_eq!(last_usage(b"{\"usage\""), None);
    assert_eq!(last_usage(b"g"), None);
    assert_eq!(last_usage(b""), None);
}

proptest::proptest! {
    /// The backwards search agrees with a plain search for the last occurrence, on text
    /// made of pieces of the key.
    #[test]
    fn the_key_search_finds_the_last_occurrence(
        pieces in proptest::collection::vec(
            proptest::sample::select(vec!["\"usage\":", "\"usa", "ge\":", "g", "\"", ":", "x", "usage"]),
            0..40,
        )
    ) {
        let text = pieces.concat();
        let naive = text
            .as_bytes()
            .windows(USAGE_KEY.len())
            .rposition(|w| w == USAGE_KEY);
        proptest::prop_assert_eq!(last_usage_key(text.as_bytes()), naive);
    }
}
