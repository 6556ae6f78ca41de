//! Seeded workload generators for `warmpath bench run`. A workload is a list of sessions;
//! a session is a sequence of turns sent one after the other (think time between them), and
//! sessions arrive by an arrival process ([`super::arrivals`]).
//!
//! | workload | sessions | turns |
//! |---|---|---|
//! | `shared-prefix` | G groups x U users x R questions, one request each | system prompt of the group (S tokens) + a question (Q tokens) |
//! | `multi-turn` | N chat sessions | T turns; each appends a user message (Q tokens) to the conversation so far, including the model's previous answers |
//! | `agentic` | N long-context agents | a long task (S tokens), then T steps each appending a tool result (K tokens) to everything before |
//! | `no-sharing` | G x U x R requests | a random system prompt each: the control, nothing to reuse |
//! | `trace` | one per JSONL line | the line's prompt (or a prompt of its length, prefix-shared within its session) at its timestamp; or a Mooncake trace's line, its blocks as text (see `super::mooncake`) |
//!
//! Every text comes from the simulator's seeded text generator, so the same seed gives the
//! same requests byte for byte; prompt lengths use the built-in tokenizer's average of 3.85
//! characters per token.

use std::{path::PathBuf, time::Duration};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use warmpath_tokenizer::text::TextGen;

use super::mooncake::{self, Shrink};

pub use super::text::CHARS_PER_TOKEN;
use super::text::chars;

/// Which generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    SharedPrefix,
    MultiTurn,
    Agentic,
    NoSharing,
    Trace,
}

/// Workload parameters (flags, or the `workload:` section of a YAML file).
#[derive(Debug, Clone, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct WorkloadArgs {
    #[arg(long, value_enum, default_value = "shared-prefix")]
    pub workload: WorkloadKind,
    /// Prefix groups (shared-prefix, no-sharing).
    #[arg(long, default_value_t = 8)]
    pub groups: usize,
    /// Users per group (shared-prefix, no-sharing).
    #[arg(long, default_value_t = 8)]
    pub users: usize,
    /// Questions per user (shared-prefix, no-sharing).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Shared system prompt / agent task tokens.
    #[arg(long, default_value_t = 1024)]
    pub system_tokens: usize,
    /// Question / user message tokens.
    #[arg(long, default_value_t = 64)]
    pub question_tokens: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 32)]
    pub output_tokens: usize,
    /// Sessions (multi-turn, agentic).
    #[arg(long, default_value_t = 16)]
    pub sessions: usize,
    /// Turns per session (multi-turn, agentic).
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Mean think time between a session's turns, seconds (exponential).
    #[arg(long, default_value_t = 0.5)]
    pub think_seconds: f64,
    /// Tokens each agent step appends (agentic).
    #[arg(long, default_value_t = 1024)]
    pub step_tokens: usize,
    /// JSONL trace (workload `trace`).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Prompt tokens per block of a Mooncake trace's `hash_ids` (Mooncake's: 512).
    #[arg(long, default_value_t = 512)]
    pub trace_block_size: usize,
    /// Tokens each block of a Mooncake trace becomes (its answers shrink alike); the trace's
    /// block size replays it at full length.
    #[arg(long, default_value_t = 64)]
    pub trace_block_tokens: usize,
}

impl Default for WorkloadArgs {
    fn default() -> Self {
        Self {
            workload: WorkloadKind::SharedPrefix,
            groups: 8,
            users: 8,
            rounds: 2,
            system_tokens: 1024,
            question_tokens: 64,
            output_tokens: 32,
            sessions: 16,
            turns: 4,
            think_seconds: 0.5,
            step_tokens: 1024,
            trace: None,
            trace_block_size: 512,
            trace_block_tokens: 64,
        }
    }
}

/// One request of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// Text of this turn.
    pub text: String,
    /// Append to the conversation so far (and the model's answers); else the prompt is `text`.
    pub append: bool,
    pub max_tokens: usize,
    /// Wait before this turn (after the previous one finished).
    pub think: Duration,
}

/// A sequence of turns from one tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub turns: Vec<Turn>,
    /// Fixed start (trace replay); `None`: the arrival process decides.
    pub at: Option<Duration>,
}

/// One line of a trace file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    /// Seconds from the start of the trace.
    timestamp: f64,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    prompt_tokens: Option<usize>,
    #[serde(default)]
    output_tokens: Option<usize>,
}

/// Errors building a plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("--trace FILE is required for the trace workload")]
    NoTrace,
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line {
        path: String,
        line: usize,
        message: String,
    },
}

impl WorkloadArgs {
    /// The sessions; identical for the same seed.
    pub fn sessions(&self, seed: u64) -> Result<Vec<Session>, PlanError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut words = TextGen::new(seed ^ 0x5eed);
        let think = |rng: &mut ChaCha8Rng| {
            Duration::from_secs_f64(-(1.0 - rng.random::<f64>()).ln() * self.think_seconds.max(0.0))
        };
        Ok(match self.workload {
            WorkloadKind::SharedPrefix | WorkloadKind::NoSharing => {
                let (systems, order) = crate::workload::shared_prefix_order(
                    seed,
                    &vec![self.users; self.groups],
                    self.rounds,
                    chars(self.system_tokens),
                    &mut rng,
                );
                order
                    .into_iter()
                    .map(|(g, u, r)| {
                        let system = if self.workload == WorkloadKind::NoSharing {
                            TextGen::new(rng.random()).text(chars(self.system_tokens))
                        } else {
                            systems[g].clone()
                        };
                        let q = words.text(chars(self.question_tokens));
                        Session {
                            turns: vec![Turn {
                                text: crate::workload::question_prompt(&system, u, r, &q),
                                append: false,
                                max_tokens: self.output_tokens,
                                think: Duration::ZERO,
                            }],
                            at: None,
                        }
                    })
                    .collect()
            }
            WorkloadKind::MultiTurn | WorkloadKind::Agentic => {
                let agentic = self.workload == WorkloadKind::Agentic;
                (0..self.sessions)
                    .map(|s| {
                        let mut own = TextGen::new(seed ^ ((s as u64 + 1) * 104_729));
                        let turns = (0..self.turns.max(1))
                            .map(|t| {
                                let text = match (agentic, t) {
                                    (_, 0) => format!(
                                        "{}\nUser: {}",
                                        own.text(chars(self.system_tokens)),
                                        own.text(chars(self.question_tokens))
                                    ),
                                    (true, _) => format!(
                                        "\nTool result {t}: {}",
                                        own.text(chars(self.step_tokens))
                                    ),
                                    (false, _) => {
                                        format!("\nUser: {}", own.text(chars(self.question_tokens)))
                                    }
                                };
                                Turn {
                                    text,
                                    append: true,
                                    max_tokens: self.output_tokens,
                                    think: if t == 0 {
                                        Duration::ZERO
                                    } else {
                                        think(&mut rng)
                                    },
                                }
                            })
                            .collect();
                        Session { turns, at: None }
                    })
                    .collect()
            }
            WorkloadKind::Trace => {
                let path = self.trace.as_ref().ok_or(PlanError::NoTrace)?;
                let text = std::fs::read_to_string(path).map_err(|source| PlanError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                let shrink = Shrink {
                    block_size: self.trace_block_size,
                    block_tokens: self.trace_block_tokens,
                };
                let at = path.display().to_string();
                shrink.check().map_err(|message| PlanError::Line {
                    path: at.clone(),
                    line: 0,
                    message: format!("--trace-block-size / --trace-block-tokens: {message}"),
                })?;
                trace_sessions(&text, &at, self.output_tokens, shrink, seed)?
            }
        })
    }
}

/// Sessions from JSONL trace text: one single-turn session per line at its timestamp. Lines of
/// the same `session` without a `prompt` get prefixes of one session text, so they share
/// cache like a real conversation does. A line with `hash_ids` is a Mooncake trace's
/// (milliseconds, blocks as text by `shrink`).
pub fn trace_sessions(
    text: &str,
    path: &str,
    default_output: usize,
    shrink: Shrink,
    seed: u64,
) -> Result<Vec<Session>, PlanError> {
    let mut out = Vec::new();
    let mut blocks = mooncake::Texts::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let err = |message: String| PlanError::Line {
            path: path.to_string(),
            line: i + 1,
            message,
        };
        if line.contains("\"hash_ids\"") {
            let l = mooncake::Line::read(line, shrink).map_err(err)?;
            out.push(Session {
                turns: vec![Turn {
                    text: l.prompt(shrink, seed, &mut blocks),
                    append: false,
                    max_tokens: l.shrunk(shrink).1,
                    think: Duration::ZERO,
                }],
                at: Some(seconds(l.timestamp / 1000.0).map_err(err)?),
            });
            continue;
        }
        let l: TraceLine = serde_json::from_str(line).map_err(|e| err(e.to_string()))?;
        let at = seconds(l.timestamp).map_err(err)?;
        let prompt = match (l.prompt, l.prompt_tokens) {
            (Some(p), _) => p,
            (None, Some(n)) => {
                let key = l.session.as_deref().unwrap_or("");
                let session_seed = seed ^ xxhash_rust::xxh3::xxh3_64(key.as_bytes());
                let mut t = TextGen::new(session_seed).text(chars(n));
                if l.session.is_none() {
                    t = TextGen::new(session_seed ^ (i as u64 + 1)).text(chars(n));
                }
                t
            }
            (None, None) => return Err(err("needs `prompt` or `prompt_tokens`".into())),
        };
        out.push(Session {
            turns: vec![Turn {
                text: prompt,
                append: false,
                max_tokens: l.output_tokens.unwrap_or(default_output),
                think: Duration::ZERO,
            }],
            at: Some(at),
        });
    }
    Ok(out)
}

/// A trace's timestamp in seconds as a duration: finite, non-negative, representable.
fn seconds(s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s).map_err(|_| format!("timestamp {s} s: must be >= 0 and finite"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(kind: WorkloadKind) -> WorkloadArgs {
        WorkloadArgs {
            workload: kind,
            groups: 3,
            users: 2,
            rounds: 2,
            system_tokens: 100,
            question_tokens: 10,
            sessions: 4,
            turns: 3,
            step_tokens: 50,
            think_seconds: 1.0,
            ..WorkloadArgs::default()
        }
    }

    #[test]
    fn every_generator_is_seeded() {
        for kind in [
            WorkloadKind::SharedPrefix,
            WorkloadKind::MultiTurn,
            WorkloadKind::Agentic,
            WorkloadKind::NoSharing,
        ] {
            let a = args(kind).sessions(1).unwrap();
            assert_eq!(a, args(kind).sessions(1).unwrap(), "{kind:?}");
            assert_ne!(a, args(kind).sessions(2).unwrap(), "{kind:?}");
        }
    }

    #[test]
    fn shapes() {
        let first_line = |s: &Session| s.turns[0].text.split('\n').next().unwrap().to_string();
        let shared = args(WorkloadKind::SharedPrefix).sessions(1).unwrap();
        assert_eq!(shared.len(), 12);
        let systems: std::collections::HashSet<_> = shared.iter().map(first_line).collect();
        assert_eq!(systems.len(), 3, "one system prompt per group");
        let control = args(WorkloadKind::NoSharing).sessions(1).unwrap();
        let systems: std::collections::HashSet<_> = control.iter().map(first_line).collect();
        assert_eq!(systems.len(), 12, "nothing shared");
        // ~3.85 chars per token: 100 system + 10 question tokens ~ 424 characters + framing.
        let len = shared[0].turns[0].text.len();
        assert!((440..530).contains(&len), "{len}");
        let chat = args(WorkloadKind::MultiTurn).sessions(1).unwrap();
        assert_eq!(chat.len(), 4);
        assert!(
            chat.iter()
                .all(|s| s.turns.len() == 3 && s.turns.iter().all(|t| t.append))
        );
        assert_eq!(chat[0].turns[0].think, Duration::ZERO);
        let agent = args(WorkloadKind::Agentic).sessions(1).unwrap();
        assert!(agent[0].turns[1].text.starts_with("\nTool result 1: "));
        assert!(agent[0].turns[1].text.len() > 150);
    }

    #[test]
    fn think_times_are_exponential_with_the_given_mean() {
        let mut a = args(WorkloadKind::MultiTurn);
        a.sessions = 400;
        a.turns = 6;
        a.think_seconds = 2.0;
        let thinks: Vec<f64> = a
            .sessions(9)
            .unwrap()
            .iter()
            .flat_map(|s| s.turns[1..].iter().map(|t| t.think.as_secs_f64()))
            .collect();
        let mean = thinks.iter().sum::<f64>() / thinks.len() as f64;
        assert!((1.85..2.15).contains(&mean), "{mean}");
        // Exponential: the median is mean x ln 2.
        let mut sorted = thinks.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        assert!((1.25..1.5).contains(&median), "{median}");
    }

    const SHRINK: Shrink = Shrink {
        block_size: 512,
        block_tokens: 64,
    };

    #[test]
    fn mooncake_lines_replay_their_shared_blocks_shrunk() {
        let text = "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 512, \"hash_ids\": [7, 8]}\n\
                    {\"timestamp\": 2500, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [7, 9]}\n";
        let s = trace_sessions(text, "m.jsonl", 16, SHRINK, 1).unwrap();
        assert_eq!(s[1].at, Some(Duration::from_millis(2500)));
        // 512 answer tokens of 512-token blocks shrunk to 64: 64; one token stays one.
        assert_eq!(s[0].turns[0].max_tokens, 64);
        assert_eq!(s[1].turns[0].max_tokens, 1);
        // Block 7 opens both prompts (64 tokens: about 246 characters), then they part.
        let (a, b) = (&s[0].turns[0].text, &s[1].turns[0].text);
        let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert!((200..=260).contains(&common), "{common}");
        // Three ids for 1024 tokens of 512-token blocks: refused, the line named.
        let bad = "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}";
        let e = trace_sessions(bad, "m.jsonl", 16, SHRINK, 1).unwrap_err();
        assert!(
            e.to_string().starts_with("m.jsonl:1: 3 ids for 1024"),
            "{e}"
        );
    }

    #[test]
    fn traces_replay_with_shared_session_prefixes_and_clear_errors() {
        let text = "{\"timestamp\": 0.5, \"session\": \"a\", \"prompt_tokens\": 50}\n\n\
                    {\"timestamp\": 1.0, \"session\": \"a\", \"prompt_tokens\": 80, \"output_tokens\": 7}\n\
                    {\"timestamp\": 1.5, \"prompt\": \"hello\"}\n";
        let s = trace_sessions(text, "t.jsonl", 16, SHRINK, 1).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[1].at, Some(Duration::from_millis(1000)));
        assert_eq!(s[1].turns[0].max_tokens, 7);
        assert!(s[1].turns[0].text.starts_with(&s[0].turns[0].text[..100]));
        assert_eq!(s[2].turns[0].text, "hello");
        let e = trace_sessions("{\"timestamp\": 1}\n", "t.jsonl", 16, SHRINK, 1).unwrap_err();
        assert!(e.to_string().starts_with("t.jsonl:1:"), "{e}");
        let e = trace_sessions(
            "{}\n{\"timestamp\": -1, \"prompt\": \"x\"}",
            "t.jsonl",
            16,
            SHRINK,
            1,
        )
        .unwrap_err();
        assert!(e.to_string().contains("t.jsonl:1"), "{e}");
    }
}
