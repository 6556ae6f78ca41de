//! The matrix's workload generators, seeded: the same seed gives the same requests byte for
//! byte. Each makes a plan of [`Chain`]s with Poisson arrivals at a given rate:
//!
//! | workload | chains | each request |
//! |---|---|---|
//! | `rag:SKEW:TOKENS` | one per request | one of `docs` documents of TOKENS tokens, drawn with Zipf popularity (document d's share proportional to 1/(d+1)^SKEW), then a question of its own |
//! | `chat` | interleaved sessions (a count that is not a multiple of the engine count) | a user message appended to the conversation so far: the session's system prompt, every earlier message and answer |
//! | `chat:SHARED` | as `chat` | as `chat`, every session opening with one system prompt of SHARED tokens common to all of them (a deployment's own), before its own |
//! | `agentic` | interleaved agent loops | a tool result appended to everything before it, after a long task |
//! | `no-sharing` | one per request | a prefix of its own and a question: nothing to reuse (the control) |
//! | `mix` | each part's own | `rag:1.0:2500`, `chat`, `agentic` and `no-sharing` at once, a quarter of the requests each ([`mix`]) |
//! | `mooncake:FILE` | one per request | a window of a request trace in the Mooncake format, its sharing and arrivals kept, its requests shrunk ([`trace`]) |
//!
//! Arrivals: the n-th request of the plan arrives at the n-th point of a Poisson process of
//! the rate; in `chat` and `agentic` the arrivals go to the sessions in a seeded interleaving,
//! each session's turns in order (a turn also waits for the previous answer, see [`Chain`]).
//! Token counts are estimated at the built-in tokenizer's 3.85 characters per token.

use std::{fmt, path::Path, str::FromStr, sync::Arc, time::Duration};

use rand::{Rng, SeedableRng, seq::SliceRandom};
use rand_chacha::ChaCha8Rng;
use warmpath_tokenizer::text::TextGen;

use super::floor::{self, Fresh, NewWork};
use crate::{compare::Chain, run::plan::CHARS_PER_TOKEN, workload::Planned};

fn chars(tokens: usize) -> usize {
    (tokens as f64 * CHARS_PER_TOKEN) as usize
}

/// One workload of the matrix.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// Retrieval-augmented questions over Zipf-popular documents.
    Rag {
        skew: f64,
        doc_tokens: usize,
    },
    /// Multi-turn chat; `shared_tokens` (0: none) of system prompt common to every session
    /// open each one.
    Chat {
        shared_tokens: usize,
    },
    Agentic,
    NoSharing,
    /// RAG, chat, agent loops and the control on one fleet at once ([`mix`]).
    Mix,
    /// A window of a request trace in the Mooncake format ([`trace`]).
    Trace(Arc<trace::Trace>),
}

impl Workload {
    /// Multi-turn chat with no system prompt common to the sessions (`chat`).
    pub const CHAT: Workload = Workload::Chat { shared_tokens: 0 };
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "chat" => return Ok(Self::CHAT),
            "agentic" => return Ok(Self::Agentic),
            "no-sharing" => return Ok(Self::NoSharing),
            "mix" => return Ok(Self::Mix),
            _ => {}
        }
        if let Some(path) = s.strip_prefix("mooncake:") {
            return trace::Trace::load(Path::new(path)).map(|t| Self::Trace(Arc::new(t)));
        }
        let bad = || {
            format!(
                "`{s}`: expected rag:SKEW:TOKENS (e.g. rag:1.0:2500), chat, chat:SHARED (e.g. \
                 chat:2000), agentic, no-sharing, mix or mooncake:FILE"
            )
        };
        if let Some(shared) = s.strip_prefix("chat:") {
            let shared_tokens: usize = shared.parse().map_err(|_| bad())?;
            if !(16..=16_384).contains(&shared_tokens) {
                return Err(format!(
                    "`{s}`: the shared system prompt must be 16..=16384 tokens"
                ));
            }
            return Ok(Self::Chat { shared_tokens });
        }
        let mut parts = s.split(':');
        let (Some("rag"), Some(skew), Some(tokens), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let skew: f64 = skew.parse().map_err(|_| bad())?;
        let doc_tokens: usize = tokens.parse().map_err(|_| bad())?;
        if !(skew.is_finite() && (0.0..=4.0).contains(&skew) && (16..=16_384).contains(&doc_tokens))
        {
            return Err(format!(
                "`{s}`: the skew must be in 0..=4 and the tokens in 16..=16384"
            ));
        }
        Ok(Self::Rag { skew, doc_tokens })
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rag { skew, doc_tokens } => write!(f, "rag:{skew}:{doc_tokens}"),
            Self::Chat { shared_tokens: 0 } => f.write_str("chat"),
            Self::Chat { shared_tokens } => write!(f, "chat:{shared_tokens}"),
            Self::Agentic => f.write_str("agentic"),
            Self::NoSharing => f.write_str("no-sharing"),
            Self::Mix => f.write_str("mix"),
            Self::Trace(t) => t.fmt(f),
        }
    }
}

/// Sizes of the generated requests (the full matrix's, or `--quick`'s for tests).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Sizes {
    /// Requests per cell (chat and agentic: rounded up to whole sessions).
    pub requests: usize,
    /// Documents a RAG cell draws from.
    pub docs: usize,
    pub question_tokens: usize,
    pub output_tokens: usize,
    pub chat_system_tokens: usize,
    pub chat_turns: usize,
    pub chat_message_tokens: usize,
    pub agent_task_tokens: usize,
    pub agent_steps: usize,
    pub tool_tokens: usize,
    pub agent_output_tokens: usize,
    pub no_sharing_tokens: usize,
    /// How a trace's blocks become text (`mooncake:FILE`).
    pub trace: trace::Shrink,
}

impl Sizes {
    /// The matrix's sizes, `requests` per cell.
    pub fn full(requests: usize) -> Self {
        Self {
            requests,
            docs: 24,
            question_tokens: 64,
            output_tokens: 64,
            chat_system_tokens: 512,
            chat_turns: 6,
            chat_message_tokens: 96,
            agent_task_tokens: 2048,
            agent_steps: 6,
            tool_tokens: 512,
            agent_output_tokens: 48,
            no_sharing_tokens: 1024,
            trace: trace::Shrink {
                block_size: 512,
                block_tokens: 64,
            },
        }
    }

    /// Tiny requests for tests: a few tokens each, `requests` per cell.
    pub fn quick(requests: usize) -> Self {
        Self {
            requests,
            docs: 3,
            question_tokens: 8,
            output_tokens: 4,
            chat_system_tokens: 32,
            chat_turns: 3,
            chat_message_tokens: 8,
            agent_task_tokens: 64,
            agent_steps: 3,
            tool_tokens: 16,
            agent_output_tokens: 4,
            no_sharing_tokens: 64,
            trace: trace::Shrink {
                block_size: 512,
                block_tokens: 4,
            },
        }
    }
}

/// A cell's plan and what sizing the fleet and the rate needs of it.
#[derive(Debug, Clone)]
pub struct Generated {
    pub chains: Vec<Chain>,
    /// Distinct prompt and answer tokens of the whole plan: what a cache would hold to serve
    /// every reuse.
    pub working_set_tokens: usize,
    /// Mean prompt tokens per request (a growing turn counts everything before it).
    pub mean_prompt_tokens: f64,
    /// The longest request: prompt and output tokens.
    pub longest_tokens: usize,
    /// Output tokens a request asks for (`max_tokens`; a `mix`: the mean, rounded).
    pub output_tokens: usize,
    /// The workloads whose chains make up `chains`, in order (one but for a `mix`).
    pub parts: Vec<Part>,
}

/// One workload's share of a plan: its chains are the next `chains` of the plan's, its
/// users (sessions) are numbered from `first_user` up to the next part's.
#[derive(Debug, Clone)]
pub struct Part {
    pub workload: Workload,
    pub chains: usize,
    pub first_user: usize,
    /// A RAG part's document of each request, in plan order (empty for other workloads).
    pub documents: Vec<usize>,
    /// Whether the sessions open with a system prompt common to all of them (`chat:SHARED`).
    pub shared_opening: bool,
    /// A trace part's bytes of each request's prompt up to the end of its leading blocks that
    /// another request names too ([`trace`]), in plan order (empty for other workloads).
    pub shared_chars: Vec<usize>,
}

impl Generated {
    /// Requests in the plan.
    pub fn requests(&self) -> usize {
        self.chains.iter().map(|c| c.turns.len()).sum()
    }

    /// What the requests must compute however they are routed: the cell's floor
    /// ([`floor`]), each part's in turn. Tokenizes every prompt, so only the plans that run
    /// ask for it.
    pub fn new_work(&self) -> NewWork {
        let mut work = NewWork::default();
        let mut first = 0;
        for part in &self.parts {
            let end = (first + part.chains).min(self.chains.len());
            let mut own = part.new_work(&self.chains[first..end]);
            let offset = work.each.len();
            for prefix in &mut own.shared {
                prefix.members.iter_mut().for_each(|m| *m += offset);
            }
            work.each.append(&mut own.each);
            work.shared.append(&mut own.shared);
            first = end;
        }
        work
    }
}

impl Part {
    /// The workload of the part of `parts` (a plan's) whose chain `user` (a turn's) is,
    /// where the plan has several (a `mix`); `None` for a plan of one.
    pub fn of_user(parts: &[Part], user: usize) -> Option<Workload> {
        if parts.len() < 2 {
            return None;
        }
        parts
            .iter()
            .rev()
            .find(|p| p.first_user <= user)
            .map(|p| p.workload.clone())
    }

    /// The whole plan of `workload` as one part.
    fn whole(workload: Workload, chains: &[Chain]) -> Vec<Part> {
        vec![Part {
            workload,
            chains: chains.len(),
            first_user: 0,
            documents: Vec::new(),
            shared_opening: false,
            shared_chars: Vec::new(),
        }]
    }

    /// A trace part's new work: what follows each prompt's shared run, after it.
    fn trace_work<'a>(&self, turns: impl Iterator<Item = &'a Planned>) -> NewWork {
        let each = self
            .shared_chars
            .iter()
            .zip(turns)
            .map(|(&shared, t)| {
                let context = match shared {
                    0 => 0,
                    n => floor::tokens(t.prompt.get(..n).unwrap_or_default(), true),
                };
                Fresh {
                    tokens: floor::tokens(&t.prompt, true).saturating_sub(context),
                    context,
                }
            })
            .collect();
        NewWork {
            each,
            shared: Vec::new(),
        }
    }

    /// What this part's requests (`chains`) must compute.
    fn new_work(&self, chains: &[Chain]) -> NewWork {
        let turns = || chains.iter().flat_map(|c| &c.turns);
        if !self.documents.is_empty() {
            let asked: Vec<(usize, &str)> = self
                .documents
                .iter()
                .zip(turns())
                .map(|(d, t)| (*d, t.prompt.as_str()))
                .collect();
            return floor::rag(&asked, super::BLOCK_SIZE);
        }
        if !self.shared_chars.is_empty() {
            return self.trace_work(turns());
        }
        // A prompt of its own is new whole (with BOS), as is a session's opening; each later
        // turn's text is appended to what may be cached.
        let each: Vec<Fresh> = chains
            .iter()
            .flat_map(|c| c.turns.iter().enumerate().map(move |(k, t)| (c.grow, k, t)))
            .map(|(grow, k, t)| Fresh {
                tokens: floor::tokens(&t.prompt, !grow || k == 0),
                context: 0,
            })
            .collect();
        let mut work = NewWork {
            each,
            shared: Vec::new(),
        };
        if self.shared_opening {
            // The openings share their common system prompt as a RAG cell's requests share
            // their document: each brings what follows it, and the first brings it too.
            let mut at = Vec::new();
            let mut openings = Vec::new();
            let mut i = 0;
            for c in chains {
                if let Some(t) = c.turns.first() {
                    at.push(i);
                    openings.push((0, t.prompt.as_str()));
                }
                i += c.turns.len();
            }
            let opened = floor::rag(&openings, super::BLOCK_SIZE);
            for (j, f) in opened.each.into_iter().enumerate() {
                work.each[at[j]] = f;
            }
            work.shared = opened
                .shared
                .into_iter()
                .map(|mut p| {
                    p.members = p.members.iter().map(|&j| at[j]).collect();
                    p
                })
                .collect();
        }
        work
    }
}

/// Poisson arrival times of `n` requests at `rate` per modelled second.
fn arrivals(n: usize, rate: f64, rng: &mut ChaCha8Rng) -> Vec<Duration> {
    let mut at = 0.0;
    (0..n)
        .map(|_| {
            at += -(1.0 - rng.random::<f64>()).ln() / rate;
            Duration::from_secs_f64(at)
        })
        .collect()
}

/// A chain count for `wanted` that is not a multiple of `replicas` (so round-robin cannot
/// give each session its own engine by accident), at least 1.
fn not_a_multiple(wanted: usize, replicas: usize) -> usize {
    let n = wanted.max(1);
    if replicas > 1 && n.is_multiple_of(replicas) {
        n + 1
    } else {
        n
    }
}

impl Workload {
    /// The plan at `rate` requests per modelled second in front of `replicas` engines.
    pub fn generate(&self, sizes: &Sizes, rate: f64, replicas: usize, seed: u64) -> Generated {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        match self {
            &Self::Rag { skew, doc_tokens } => rag(sizes, skew, doc_tokens, rate, &mut rng, seed),
            Self::NoSharing => no_sharing(sizes, rate, &mut rng),
            Self::Mix => mix::plan(sizes, rate, replicas, seed),
            Self::Trace(t) => t.plan(self, sizes, rate, seed),
            &Self::Chat { shared_tokens } => {
                let shape = Growing {
                    workload: self.clone(),
                    shared_tokens,
                    turns: sizes.chat_turns,
                    first_tokens: sizes.chat_system_tokens,
                    step_tokens: sizes.chat_message_tokens,
                    output_tokens: sizes.output_tokens,
                    first: "System",
                    step: "\nUser",
                };
                shape.plan(sizes.requests, rate, replicas, &mut rng)
            }
            Self::Agentic => {
                let shape = Growing {
                    workload: self.clone(),
                    shared_tokens: 0,
                    turns: sizes.agent_steps,
                    first_tokens: sizes.agent_task_tokens,
                    step_tokens: sizes.tool_tokens,
                    output_tokens: sizes.agent_output_tokens,
                    first: "Task",
                    step: "\nTool output",
                };
                shape.plan(sizes.requests, rate, replicas, &mut rng)
            }
        }
    }

    /// Whether requests share prefixes (every workload but the control).
    pub fn shares(&self) -> bool {
        !matches!(self, Self::NoSharing)
    }
}

/// Document popularity: `docs` weights proportional to 1/(d+1)^skew, as a CDF.
fn zipf_cdf(docs: usize, skew: f64) -> Vec<f64> {
    let w: Vec<f64> = (0..docs).map(|d| (d as f64 + 1.0).powf(-skew)).collect();
    let total: f64 = w.iter().sum();
    w.iter()
        .scan(0.0, |acc, x| {
            *acc += x / total;
            Some(*acc)
        })
        .collect()
}

fn rag(
    sizes: &Sizes,
    skew: f64,
    doc_tokens: usize,
    rate: f64,
    rng: &mut ChaCha8Rng,
    seed: u64,
) -> Generated {
    let docs: Vec<String> = (0..sizes.docs)
        .map(|d| TextGen::new(seed ^ ((d as u64 + 1) * 7919)).text(chars(doc_tokens)))
        .collect();
    let cdf = zipf_cdf(sizes.docs, skew);
    let times = arrivals(sizes.requests, rate, rng);
    let mut text = TextGen::new(seed ^ 0xabcdef);
    let mut used = vec![false; sizes.docs];
    let mut picks = Vec::with_capacity(times.len());
    let turns: Vec<Planned> = times
        .into_iter()
        .enumerate()
        .map(|(i, at)| {
            let x: f64 = rng.random();
            let d = cdf.iter().position(|c| x < *c).unwrap_or(sizes.docs - 1);
            used[d] = true;
            picks.push(d);
            let question = text.text(chars(sizes.question_tokens));
            Planned {
                at,
                user: i,
                prompt: format!("{}\nQuestion {i}: {question}", docs[d]),
                max_tokens: sizes.output_tokens,
            }
        })
        .collect();
    let distinct = used.iter().filter(|u| **u).count();
    let request_tokens = doc_tokens + sizes.question_tokens;
    let chains = Chain::singles(turns);
    Generated {
        parts: vec![Part {
            workload: Workload::Rag { skew, doc_tokens },
            chains: chains.len(),
            first_user: 0,
            documents: picks,
            shared_opening: false,
            shared_chars: Vec::new(),
        }],
        working_set_tokens: distinct * doc_tokens
            + sizes.requests * (sizes.question_tokens + sizes.output_tokens),
        mean_prompt_tokens: request_tokens as f64,
        longest_tokens: request_tokens + sizes.output_tokens,
        output_tokens: sizes.output_tokens,
        chains,
    }
}

fn no_sharing(sizes: &Sizes, rate: f64, rng: &mut ChaCha8Rng) -> Generated {
    let times = arrivals(sizes.requests, rate, rng);
    let turns: Vec<Planned> = times
        .into_iter()
        .enumerate()
        .map(|(i, at)| {
            let prefix = TextGen::new(rng.random()).text(chars(sizes.no_sharing_tokens));
            let question = TextGen::new(rng.random()).text(chars(sizes.question_tokens));
            Planned {
                at,
                user: i,
                prompt: format!("{prefix}\nQuestion {i}: {question}"),
                max_tokens: sizes.output_tokens,
            }
        })
        .collect();
    let request_tokens = sizes.no_sharing_tokens + sizes.question_tokens;
    let chains = Chain::singles(turns);
    Generated {
        parts: Part::whole(Workload::NoSharing, &chains),
        working_set_tokens: sizes.requests * (request_tokens + sizes.output_tokens),
        mean_prompt_tokens: request_tokens as f64,
        longest_tokens: request_tokens + sizes.output_tokens,
        output_tokens: sizes.output_tokens,
        chains,
    }
}

/// Sessions whose context grows each turn: a first text of its own, then one appended text
/// per turn (the answers are appended between them as they arrive).
struct Growing {
    workload: Workload,
    /// A first text common to every session, before each one's own (0: none).
    shared_tokens: usize,
    turns: usize,
    first_tokens: usize,
    step_tokens: usize,
    output_tokens: usize,
    first: &'static str,
    step: &'static str,
}

impl Growing {
    fn plan(&self, requests: usize, rate: f64, replicas: usize, rng: &mut ChaCha8Rng) -> Generated {
        let turns = self.turns.max(1);
        let sessions = not_a_multiple(requests.div_ceil(turns), replicas);
        // A seeded interleaving: each session's turns in order, sessions mixed.
        let mut order: Vec<usize> = (0..sessions).flat_map(|s| vec![s; turns]).collect();
        order.shuffle(rng);
        let times = arrivals(order.len(), rate, rng);
        let mut text = TextGen::new(rng.random());
        // Drawn only when asked for, so `chat` plans stay as they were.
        let shared = match self.shared_tokens {
            0 => String::new(),
            n => format!("{}\n", text.text(chars(n))),
        };
        let mut chains: Vec<Chain> = (0..sessions)
            .map(|_| Chain {
                turns: Vec::with_capacity(turns),
                grow: true,
            })
            .collect();
        for (s, at) in order.into_iter().zip(times) {
            let chain = &mut chains[s];
            let k = chain.turns.len();
            let prompt = if k == 0 {
                let first = text.text(chars(self.first_tokens));
                let step = text.text(chars(self.step_tokens));
                format!(
                    "{shared}{} {s}: {first}{} {k}: {step}\n",
                    self.first, self.step
                )
            } else {
                format!(
                    "{} {k}: {}\n",
                    self.step,
                    text.text(chars(self.step_tokens))
                )
            };
            chain.turns.push(Planned {
                at,
                user: s,
                prompt,
                max_tokens: self.output_tokens,
            });
        }
        // Turn k's prompt: the shared and the first text, k + 1 appended texts and k answers.
        let prompt_at = |k: usize| {
            self.shared_tokens
                + self.first_tokens
                + (k + 1) * self.step_tokens
                + k * self.output_tokens
        };
        let mean = (0..turns).map(prompt_at).sum::<usize>() as f64 / turns as f64;
        // The shared text is held once, however many sessions open with it.
        let own = prompt_at(turns - 1) - self.shared_tokens + self.output_tokens;
        Generated {
            parts: vec![Part {
                workload: self.workload.clone(),
                chains: chains.len(),
                first_user: 0,
                documents: Vec::new(),
                shared_opening: self.shared_tokens > 0,
                shared_chars: Vec::new(),
            }],
            working_set_tokens: self.shared_tokens + sessions * own,
            mean_prompt_tokens: mean,
            longest_tokens: prompt_at(turns - 1) + self.output_tokens,
            output_tokens: self.output_tokens,
            chains,
        }
    }
}

pub mod mix;
#[cfg(test)]
mod tests;
pub mod trace;
