//! `mooncake:FILE`: a cell replayed from a request trace in the Mooncake format, the one
//! Mooncake's production traces (kvcache-ai/Mooncake, `FAST25-release/traces`) were published
//! in and that Dynamo's and llm-d's routing benchmarks replay: one JSON object a line,
//!
//! ```json
//! {"timestamp": 3000, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3]}
//! ```
//!
//! `timestamp` in milliseconds from the trace's start, `hash_ids` one id per block of
//! `--trace-block-size` prompt tokens (512 in Mooncake's), the last block partial. Two lines
//! with the same id at the same place share that block and every block before it: the trace
//! says who shares what with whom, and nothing of its text.
//!
//! The replay keeps the trace's sharing and its arrivals and shrinks its requests, so that a
//! small simulated fleet serves them: each block becomes `--trace-block-tokens` tokens of
//! seeded text (the same id, the same text), a prompt the blocks of its ids in order (the
//! last one in proportion to its share of a block), the answer `output_length` scaled alike
//! (at least one token). A cell is a window of `--requests` consecutive lines (the trace cut
//! into windows; the run on seed `s` takes window `s` mod their count, so `--repeats` takes
//! consecutive ones), its arrivals the window's timestamps, stretched or squeezed so that
//! their mean rate is the cell's.
//!
//! A request's floor ([`super::floor`]) is what follows its longest leading run of blocks
//! whose ids another line of the window names too, after that run as context: a looser bound
//! than a RAG cell's, which also charges the first request of each shared prefix with
//! computing it. Ids are counted across the window, not by position: for a trace whose ids
//! chain by position, as Mooncake's do, the run is a prefix another prompt begins with; for
//! one whose do not, the run can only be longer than that, and the floor only lower.

use std::{
    collections::HashMap,
    fmt,
    io::Read,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{Generated, Part, Sizes, Workload};
pub use crate::run::mooncake::{Line, Shrink, Texts};
use crate::{compare::Chain, workload::Planned};

/// The largest trace file read (Mooncake's largest published trace is 3 MB).
const MAX_FILE_BYTES: u64 = 512 << 20;

/// A trace file, read and checked once.
#[derive(Debug, PartialEq)]
pub struct Trace {
    pub path: PathBuf,
    /// In arrival order.
    pub lines: Vec<Line>,
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mooncake:{}", self.path.display())
    }
}

impl Trace {
    /// Reads and checks `path`: every line an object as above, timestamps finite and
    /// non-negative, at least one id a line; lines out of time order are sorted (stably).
    pub fn load(path: &Path) -> Result<Self, String> {
        let at = path.display();
        let file = std::fs::File::open(path).map_err(|e| format!("{at}: {e}"))?;
        let mut text = String::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| format!("{at}: {e}"))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(format!("{at}: larger than {MAX_FILE_BYTES} bytes"));
        }
        let mut lines = Self::parse(&text).map_err(|e| format!("{at}: {e}"))?;
        lines.sort_by(|a, b| a.timestamp.total_cmp(&b.timestamp));
        Ok(Self {
            path: path.to_path_buf(),
            lines,
        })
    }

    /// The lines of trace text, each checked; the error names the line.
    pub fn parse(text: &str) -> Result<Vec<Line>, String> {
        let mut out = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let line = Line::parse(raw).map_err(|e| format!("line {}: {e}", i + 1))?;
            out.push(line);
        }
        if out.is_empty() {
            return Err("no requests".into());
        }
        Ok(out)
    }

    /// Checks that every line's ids cover its prompt in blocks of `block_size` tokens (the
    /// last one partial), as the trace's own block size must.
    pub fn check(&self, block_size: usize) -> Result<(), String> {
        for (i, l) in self.lines.iter().enumerate() {
            l.covers(block_size).map_err(|e| {
                format!(
                    "{}: request {} (in time order): {e}",
                    self.path.display(),
                    i + 1
                )
            })?;
        }
        Ok(())
    }

    /// The window of `n` lines that the run on `seed` replays.
    fn window(&self, n: usize, seed: u64) -> &[Line] {
        let n = n.clamp(1, self.lines.len());
        let count = (self.lines.len() / n) as u64;
        let start = (seed % count.max(1)) as usize * n;
        &self.lines[start..start + n]
    }

    /// The cell's plan: the window of `sizes.requests` lines for `seed`, at `rate` requests per
    /// modelled second.
    pub fn plan(&self, me: &Workload, sizes: &Sizes, rate: f64, seed: u64) -> Generated {
        let lines = self.window(sizes.requests, seed);
        let shrink = sizes.trace;
        let times = arrivals(lines, rate);
        // How many of the window's lines name each id: a block two of them name is shared.
        let mut named = HashMap::<u64, usize>::new();
        for l in lines {
            for h in &l.hash_ids {
                *named.entry(*h).or_default() += 1;
            }
        }
        let mut texts = Texts::new();
        let mut shared_chars = Vec::with_capacity(lines.len());
        let (mut prompts, mut outputs, mut longest) = (0usize, 0usize, 0usize);
        let turns: Vec<Planned> = lines
            .iter()
            .zip(times)
            .enumerate()
            .map(|(i, (l, at))| {
                let (prompt, shared) = render(l, shrink, seed, &named, &mut texts);
                shared_chars.push(shared);
                let (input, output) = l.shrunk(shrink);
                prompts += input;
                outputs += output;
                longest = longest.max(input + output);
                Planned {
                    at,
                    user: i,
                    prompt,
                    max_tokens: output,
                }
            })
            .collect();
        let n = turns.len().max(1) as f64;
        let distinct_blocks = named.len();
        let chains = Chain::singles(turns);
        Generated {
            parts: vec![Part {
                shared_chars,
                ..Part::whole(me.clone(), &chains).remove(0)
            }],
            working_set_tokens: distinct_blocks * shrink.block_tokens + outputs,
            mean_prompt_tokens: prompts as f64 / n,
            longest_tokens: longest,
            output_tokens: (outputs as f64 / n).round() as usize,
            chains,
        }
    }
}

/// The window's arrivals at `rate` a second on average: its timestamps from its first,
/// scaled. The window's own span counts one mean gap past its last line, so that `n` lines
/// over that span are its rate (a window whose lines share one timestamp arrives at once).
fn arrivals(lines: &[Line], rate: f64) -> Vec<Duration> {
    let first = lines.first().map_or(0.0, |l| l.timestamp);
    let last = lines.last().map_or(0.0, |l| l.timestamp);
    let n = lines.len() as f64;
    let span_s = (last - first) / 1000.0 * n / (n - 1.0).max(1.0);
    let scale = n / span_s / rate.max(f64::MIN_POSITIVE);
    // A window at one instant (or spanning too little to scale) arrives at once.
    let scale = if span_s > 0.0 && scale.is_finite() {
        scale
    } else {
        0.0
    };
    lines
        .iter()
        .map(|l| {
            Duration::try_from_secs_f64((l.timestamp - first) / 1000.0 * scale)
                .unwrap_or(Duration::MAX)
        })
        .collect()
}

/// A line's prompt, and the length in bytes of its longest run of blocks that another line
/// of the window names too. Blocks join at a space (each block's text is whole words), so a
/// shared run is a prefix of every prompt that has it, byte for byte.
fn render(
    l: &Line,
    shrink: Shrink,
    seed: u64,
    named: &HashMap<u64, usize>,
    texts: &mut Texts,
) -> (String, usize) {
    let (prompt, ends) = l.prompt_and_ends(shrink, seed, texts);
    let leading = l
        .hash_ids
        .iter()
        .take_while(|h| named.get(h).copied().unwrap_or(0) >= 2)
        .count();
    let shared = leading.checked_sub(1).map_or(0, |k| ends[k]);
    (prompt, shared)
}

#[cfg(test)]
mod tests;
