//! Response bodies through the usage taps (`proxy::tap`): arbitrary bytes in fuzzed frame
//! sizes through the SSE tap (with and without stripping the usage the proxy asked for) and
//! the JSON tap; and usage objects of fuzzed shape (field order, spacing, nulls, unknown
//! fields), whose counts are known, inside a JSON body and an SSE stream.
//!
//! Properties: whatever the frame sizes, a tap gives the same bytes and readings; without
//! stripping, the SSE tap passes the stream through unchanged; stripping never adds bytes;
//! a usage object is read as the counts it was written with.

#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use warmpath_agent::{
    proxy::tap::{JsonTap, SseTap},
    telemetry::TokenUsage,
};

#[derive(Debug, Arbitrary)]
enum Input {
    Raw {
        strip: bool,
        pieces: Vec<u8>,
        body: Vec<u8>,
    },
    Usage {
        usage: UsageShape,
        pieces: Vec<u8>,
        crlf: bool,
    },
}

/// A usage object as an engine might write it.
#[derive(Debug, Arbitrary)]
struct UsageShape {
    prompt: Option<u64>,
    completion: Option<u64>,
    total: Option<u64>,
    /// `prompt_tokens_details`: absent, null, `{}`/`{"cached_tokens": null}`, or a count.
    details: Option<Option<Option<u64>>>,
    /// Which field goes first (rotation of the field list).
    rotate: u8,
    /// Spaces after `:` and `,`.
    spaced: bool,
}

impl UsageShape {
    fn json(&self) -> String {
        let sep = if self.spaced { ": " } else { ":" };
        let mut fields: Vec<String> = Vec::new();
        let mut num = |name: &str, v: Option<u64>| {
            if let Some(v) = v {
                fields.push(format!("\"{name}\"{sep}{v}"));
            }
        };
        num("prompt_tokens", self.prompt);
        num("completion_tokens", self.completion);
        num("total_tokens", self.total);
        match self.details {
            None => {}
            Some(None) => fields.push(format!("\"prompt_tokens_details\"{sep}null")),
            Some(Some(None)) => fields.push(format!(
                "\"prompt_tokens_details\"{sep}{{\"cached_tokens\"{sep}null}}"
            )),
            Some(Some(Some(c))) => fields.push(format!(
                "\"prompt_tokens_details\"{sep}{{\"cached_tokens\"{sep}{c}}}"
            )),
        }
        if !fields.is_empty() {
            let r = usize::from(self.rotate) % fields.len();
            fields.rotate_left(r);
        }
        let comma = if self.spaced { ", " } else { "," };
        format!("{{{}}}", fields.join(comma))
    }

    fn expected(&self) -> TokenUsage {
        TokenUsage {
            prompt: self.prompt.unwrap_or(0),
            cached: self.details.flatten().flatten().unwrap_or(0),
            completion: self.completion.unwrap_or(0),
            cached_reported: self.details.flatten().flatten().is_some(),
        }
    }
}

fn frames(body: &[u8], pieces: &[u8]) -> Vec<Bytes> {
    let mut sizes = pieces.iter().map(|&p| usize::from(p.max(1))).cycle();
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(usize::MAX).min(rest.len());
        out.push(Bytes::copy_from_slice(&rest[..n]));
        rest = &rest[n..];
    }
    out
}

/// (bytes out, usage, error event) of the SSE tap over `frames`.
fn sse(strip: bool, frames: &[Bytes]) -> (Vec<u8>, Option<TokenUsage>, bool) {
    let mut tap = SseTap::new(strip);
    let mut out = Vec::new();
    for f in frames {
        out.extend_from_slice(&tap.frame(f.clone()));
    }
    out.extend_from_slice(&tap.finish());
    (out, tap.usage, tap.error_event)
}

fn json(frames: &[Bytes]) -> Option<TokenUsage> {
    let mut tap = JsonTap::default();
    for f in frames {
        tap.observe(f);
    }
    tap.usage()
}

fuzz_target!(|input: Input| match input {
    Input::Raw {
        strip,
        pieces,
        body,
    } => {
        let whole = sse(strip, &frames(&body, &[]));
        for split in [frames(&body, &pieces), frames(&body, &[1])] {
            assert_eq!(
                sse(strip, &split),
                whole,
                "the SSE tap depends on frame sizes"
            );
            assert_eq!(
                json(&split),
                json(&frames(&body, &[])),
                "the JSON tap depends on frame sizes"
            );
        }
        if strip {
            assert!(whole.0.len() <= body.len(), "stripping added bytes");
        } else {
            assert_eq!(whole.0, body, "a stream not stripped passes unchanged");
        }
    }
    Input::Usage {
        usage,
        pieces,
        crlf,
    } => {
        let object = usage.json();
        let expected = Some(usage.expected());
        let body = format!(
            "{{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"hi\"}}],\"usage\":{object}}}"
        );
        assert_eq!(
            json(&frames(body.as_bytes(), &pieces)),
            expected,
            "JSON body {body}"
        );
        let end = if crlf { "\r\n\r\n" } else { "\n\n" };
        let stream = format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"text\":\"a\"}}],\"usage\":null}}{end}\
             data: {{\"id\":\"c\",\"choices\":[],\"usage\":{object}}}{end}data: [DONE]{end}"
        );
        for strip in [false, true] {
            let (out, read, error) = sse(strip, &frames(stream.as_bytes(), &pieces));
            assert_eq!(read, expected, "SSE stream {stream}");
            assert!(!error);
            if strip {
                let left = String::from_utf8(out).expect("the stream was UTF-8");
                assert!(
                    !left.contains("usage"),
                    "usage left in a stripped stream: {left}"
                );
            }
        }
    }
});
