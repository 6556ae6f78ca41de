//! Engine pages the scrape loop reads (`proxy::scrape`): a `/metrics` page to `parse_load`,
//! `parse_kv_blocks` and `parse_lora`, a `/v1/models` answer to `parse_adapters`; arbitrary
//! text, and pages of fuzzed shape (series order, label sets, comments, look-alike series
//! names, CRLF line ends, which `str::lines` takes as vLLM's `\n`) whose values are known.
//!
//! Properties: no panic on any text; a load reading is finite and non-negative, a KV size is
//! above zero; a page written with known gauges, KV size and LoRA series reads as what it was
//! written with, whatever the order, labels and look-alike lines around them.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use warmpath_agent::proxy::{parse_adapters, parse_kv_blocks, parse_load, parse_lora};

#[derive(Debug, Arbitrary)]
enum Input {
    Raw(String),
    Page(Page),
}

/// A metrics page as vLLM (or a proxy in front of it) might write it.
#[derive(Debug, Arbitrary)]
struct Page {
    waiting: u16,
    running: u16,
    /// KV usage in thousandths; `None`: no usage series at all.
    kv_milli: Option<u16>,
    /// The older name `vllm:gpu_cache_usage_perc` instead of `vllm:kv_cache_usage_perc`.
    old_kv_name: bool,
    /// `num_gpu_blocks` of `vllm:cache_config_info`; `None`: no such series.
    blocks: Option<u32>,
    /// Labels put before the gauges' values (`engine="0",model_name="m"` and such).
    labels: Vec<Label>,
    /// LoRA series: (timestamp, running adapters, waiting adapters); the newest counts.
    lora: Vec<(u32, Vec<Adapter>, Vec<Adapter>)>,
    /// Lines that look like the gauges but are other series, and comments.
    noise: Vec<Noise>,
    /// Rotation of the line order.
    rotate: u8,
    crlf: bool,
}

#[derive(Debug, Arbitrary)]
enum Label {
    Engine(u8),
    Model(Adapter),
    /// A label whose value holds characters the parsers split on.
    Tricky,
}

/// Adapter names from a small alphabet (no `,` or `"`, as in vLLM's own labels).
#[derive(Debug, Arbitrary)]
struct Adapter(u8, u8);

impl Adapter {
    fn name(&self) -> String {
        const ALPHABET: &[u8] = b"abcdefghij-_.0123456789";
        let n = 1 + usize::from(self.1 % 6);
        (0..n)
            .map(|i| char::from(ALPHABET[(usize::from(self.0) + i * 7) % ALPHABET.len()]))
            .collect()
    }
}

#[derive(Debug, Arbitrary)]
enum Noise {
    Comment,
    /// `vllm:num_requests_waiting_by_reason{...}`: a longer name with the gauge's as prefix.
    ByReason(u16),
    /// A `num_cpu_blocks` label on another series.
    CpuBlocks(u16),
    Blank,
    Other(u16),
}

impl Page {
    fn labels(&self) -> String {
        self.labels
            .iter()
            .map(|l| match l {
                Label::Engine(e) => format!("engine=\"{e}\""),
                Label::Model(a) => format!("model_name=\"{}\"", a.name()),
                Label::Tricky => "note=\"a} 7 {b,num_gpu_blocks=9\"".to_string(),
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    fn gauge(&self, name: &str, value: &str) -> String {
        if self.labels.is_empty() {
            format!("{name} {value}")
        } else {
            format!("{name}{{{}}} {value}", self.labels())
        }
    }

    fn text(&self) -> String {
        let mut lines = vec![
            self.gauge("vllm:num_requests_waiting", &format!("{}.0", self.waiting)),
            self.gauge("vllm:num_requests_running", &format!("{}.0", self.running)),
        ];
        if let Some(kv) = self.kv_milli {
            let name = if self.old_kv_name {
                "vllm:gpu_cache_usage_perc"
            } else {
                "vllm:kv_cache_usage_perc"
            };
            lines.push(self.gauge(name, &(f64::from(kv) / 1000.0).to_string()));
        }
        if let Some(b) = self.blocks {
            lines.push(format!(
                "vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",num_cpu_blocks=\"0\",num_gpu_blocks=\"{b}\"}} 1.0"
            ));
        }
        // Distinct timestamps: the newest series is then one line.
        let mut stamps = std::collections::BTreeSet::new();
        for (t, running, waiting) in &self.lora {
            if !stamps.insert(*t) {
                continue;
            }
            lines.push(format!(
                "vllm:lora_requests_info{{max_lora=\"2\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {t}.0",
                names(running).join(","),
                names(waiting).join(","),
            ));
        }
        for n in &self.noise {
            lines.push(match n {
                Noise::Comment => "# HELP vllm:num_requests_waiting Requests waiting.".into(),
                Noise::ByReason(v) => {
                    format!("vllm:num_requests_waiting_by_reason{{reason=\"x\"}} {v}")
                }
                Noise::CpuBlocks(v) => format!("vllm:other_info{{num_gpu_blocks=\"{v}\"}} 1"),
                Noise::Blank => String::new(),
                Noise::Other(v) => format!("process_resident_memory_bytes {v}"),
            });
        }
        if !lines.is_empty() {
            let r = usize::from(self.rotate) % lines.len();
            lines.rotate_left(r);
        }
        let end = if self.crlf { "\r\n" } else { "\n" };
        lines.join(end) + end
    }

    fn expected_lora(&self) -> Option<(Vec<String>, Vec<String>)> {
        let mut seen = std::collections::BTreeSet::new();
        self.lora
            .iter()
            .filter(|(t, _, _)| seen.insert(*t))
            .max_by_key(|(t, _, _)| *t)
            .map(|(_, running, waiting)| (names(running), names(waiting)))
    }
}

fn names(adapters: &[Adapter]) -> Vec<String> {
    adapters.iter().map(Adapter::name).collect()
}

fuzz_target!(|input: Input| match input {
    Input::Raw(text) => {
        if let Some((_, _, kv)) = parse_load(&text) {
            assert!(kv.is_finite() && kv >= 0.0, "KV usage {kv} from {text:?}");
        }
        if let Some(b) = parse_kv_blocks(&text) {
            assert!(b > 0, "a KV size of 0 from {text:?}");
        }
        let _ = parse_lora(&text);
        let _ = parse_adapters(&text, "base");
    }
    Input::Page(page) => {
        let text = page.text();
        let kv = page.kv_milli.map_or(0.0, |k| f64::from(k) / 1000.0);
        assert_eq!(
            parse_load(&text),
            Some((u32::from(page.waiting), u32::from(page.running), kv)),
            "load of {text}"
        );
        assert_eq!(
            parse_kv_blocks(&text),
            page.blocks.map(u64::from).filter(|b| *b > 0),
            "KV size of {text}"
        );
        assert_eq!(parse_lora(&text), page.expected_lora(), "LoRA of {text}");
    }
});
