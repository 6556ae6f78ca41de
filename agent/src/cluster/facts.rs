//! The small facts an agent gossips about itself (docs/cluster.md, "What rides gossip"), typed,
//! with their chitchat keys and string encodings.
//!
//! Every value is bounded (`MAX_FACT_BYTES`, far below chitchat's 65,507-byte datagram) by
//! bounding what goes into it: identifiers and model names at `MAX_ID_BYTES`, numbers as
//! decimals. Values start with a version word and are `key=value` words after it, so a newer
//! agent may add words an older one ignores. Parsing is of untrusted input: it never panics
//! and says what is wrong.

use std::{fmt::Write, net::SocketAddr};

use crate::{contention::Contention, kv_index::Watermark};

/// The largest value this module encodes.
pub const MAX_FACT_BYTES: usize = 512;
/// The longest pod id, model name, node id or tenant id.
pub const MAX_ID_BYTES: usize = 128;

const VERSION: &str = "v1";

/// What went wrong with a fact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FactError {
    #[error("{what} {value:?}: {why}")]
    Invalid {
        what: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("key {0:?} is not a warmpath fact")]
    UnknownKey(String),
    #[error("value of {key:?}: {why}")]
    Malformed { key: String, why: String },
}

/// An identifier fit for a key or a value word: 1-128 bytes, no whitespace or control
/// characters, no `=`.
pub fn check_id(what: &'static str, id: &str) -> Result<(), FactError> {
    let why = if id.is_empty() {
        "is empty"
    } else if id.len() > MAX_ID_BYTES {
        "is longer than 128 bytes"
    } else if id
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '=')
    {
        "holds whitespace, a control character or '='"
    } else {
        return Ok(());
    };
    Err(FactError::Invalid {
        what,
        value: id.chars().take(MAX_ID_BYTES).collect(),
        why,
    })
}

/// Event health of a pod, as its owner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodHealth {
    Healthy,
    /// No batch yet (publisher not reachable, or quiet since start).
    Waiting,
    /// Events were lost: the owner does not trust its own entries.
    Unsure,
    /// Requests were routed there but no batch came for a while.
    Stalled,
}

impl PodHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Waiting => "waiting",
            Self::Unsure => "unsure",
            Self::Stalled => "stalled",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "healthy" => Self::Healthy,
            "waiting" => Self::Waiting,
            "unsure" => Self::Unsure,
            "stalled" => Self::Stalled,
            _ => return None,
        })
    }
}

/// Where to reach an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentFact {
    /// Its IndexSync gRPC server.
    pub grpc: SocketAddr,
    /// Its first proxy listener, when it runs one.
    pub proxy: Option<SocketAddr>,
}

/// One pod the agent owns (subscribes to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFact {
    pub model: String,
    /// The pod's HTTP `host:port`, as the pools name it.
    pub addr: String,
    pub health: PodHealth,
}

/// A pod's load, as its owner last scraped it from the engine's `/metrics`
/// (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadFact {
    /// Requests the engine is running.
    pub running: u32,
    /// Requests waiting in the engine's queue.
    pub waiting: u32,
    /// KV cache usage in thousandths (0..=1000).
    pub kv_permille: u32,
}

/// The largest `kv=` a load fact carries (a full cache).
pub const MAX_KV_PERMILLE: u32 = 1_000;

/// A tenant's offered demand at one agent, per second, for cluster-wide quotas (#22): what
/// `policy::usage::Demand` carries, at a precision that reads back exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageFact {
    pub requests: Rate,
    pub prompt_tokens: Rate,
    pub output_tokens: Rate,
}

/// The largest rate a usage fact carries, per second (far above any one agent's traffic;
/// larger demands are clamped to it when published and refused when read).
pub const MAX_RATE_PER_SEC: u64 = 1_000_000_000;
const MILLI: u64 = 1_000;

/// A non-negative rate per second, in thousandths: decimal with at most three decimals, so
/// its encoding (at most 14 bytes) reads back equal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate(u64);

// === impl UsageFact ===

impl UsageFact {
    /// From a demand measured as floats: NaN and negative rates count as 0, rates above
    /// [`MAX_RATE_PER_SEC`] as that.
    pub fn from_demand(d: &crate::usage::Demand) -> Self {
        Self {
            requests: Rate::from_per_sec(d.requests),
            prompt_tokens: Rate::from_per_sec(d.prompt_tokens),
            output_tokens: Rate::from_per_sec(d.output_tokens),
        }
    }

    pub fn demand(&self) -> crate::usage::Demand {
        crate::usage::Demand {
            requests: self.requests.per_sec(),
            prompt_tokens: self.prompt_tokens.per_sec(),
            output_tokens: self.output_tokens.per_sec(),
        }
    }

    /// Whether every rate is 0 (at the encoding's precision).
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

// === impl Rate ===

impl Rate {
    pub const MAX: Self = Self(MAX_RATE_PER_SEC * MILLI);

    /// Rounded to the nearest thousandth; NaN and negative rates are 0, anything above
    /// [`MAX_RATE_PER_SEC`] (infinity included) is that.
    pub fn from_per_sec(per_sec: f64) -> Self {
        if per_sec.is_nan() || per_sec <= 0.0 {
            return Self(0);
        }
        let milli = (per_sec * MILLI as f64).round();
        if milli >= Self::MAX.0 as f64 {
            Self::MAX
        } else {
            // In 0..MAX (below 2^53): exact.
            Self(milli as u64)
        }
    }

    pub fn from_milli(milli: u64) -> Self {
        Self(milli.min(Self::MAX.0))
    }

    pub fn per_sec(self) -> f64 {
        self.0 as f64 / MILLI as f64
    }

    pub fn milli(self) -> u64 {
        self.0
    }

    /// Reads `DIGITS[.DIGITS]` (at most three decimals, at most [`MAX_RATE_PER_SEC`]).
    fn parse(s: &str) -> Result<Self, &'static str> {
        if s.starts_with('-') {
            return Err("is negative");
        }
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
        if int.is_empty() || !digits(int) || !digits(frac) || (s.contains('.') && frac.is_empty()) {
            return Err("is not a decimal number (digits, at most one '.')");
        }
        if frac.len() > 3 {
            return Err("has more than 3 decimals");
        }
        let too_big = "is above 1000000000 per second";
        let whole = int
            .bytes()
            .try_fold(0u64, |n, b| {
                n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
            })
            .ok_or(too_big)?;
        let thousandths = frac
            .bytes()
            .chain(std::iter::repeat(b'0'))
            .take(3)
            .fold(0, |n, b| n * 10 + u64::from(b - b'0'));
        let milli = whole
            .checked_mul(MILLI)
            .and_then(|m| m.checked_add(thousandths))
            .filter(|&m| m <= Self::MAX.0)
            .ok_or(too_big)?;
        Ok(Self(milli))
    }
}

impl std::fmt::Display for Rate {
    /// `12`, `12.5`, `0.001`: the shortest decimal that reads back equal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (whole, frac) = (self.0 / MILLI, self.0 % MILLI);
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let frac = format!("{frac:03}");
        write!(f, "{whole}.{}", frac.trim_end_matches('0'))
    }
}

/// A tenant name fit for a `usage:` key: `crate::tenant::check_name`'s rule.
pub fn check_tenant(name: &str) -> Result<(), FactError> {
    crate::tenant::check_name(name).map_err(|_| FactError::Invalid {
        what: "tenant name",
        value: name.chars().take(MAX_ID_BYTES).collect(),
        why: "expected 1 to 64 characters of A-Z a-z 0-9 . _ : / -",
    })
}

/// A `fair:` key's subject: a tenant (`fair:TENANT`, the agent-wide gate) or a tenant in a
/// pool (`fair:TENANT@POOL`, that pool's gate; tenant names hold no `@`, nor may the pool's).
pub fn check_contender(subject: &str) -> Result<(), FactError> {
    let Some((tenant, pool)) = subject.split_once('@') else {
        return check_tenant(subject);
    };
    check_tenant(tenant)?;
    check_id("pool name", pool)?;
    if pool.contains('@') {
        return Err(FactError::Invalid {
            what: "pool name",
            value: pool.chars().take(MAX_ID_BYTES).collect(),
            why: "holds '@'",
        });
    }
    Ok(())
}

/// One gossiped key and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact {
    Agent(AgentFact),
    Pod {
        pod: String,
        fact: PodFact,
    },
    Watermark {
        pod: String,
        at: Watermark,
    },
    Load {
        pod: String,
        load: LoadFact,
    },
    Usage {
        tenant: String,
        usage: UsageFact,
    },
    /// A tenant's contention for a cluster-wide concurrency at this agent (`fair:`): the
    /// agent-wide one (`tenant` is the tenant) or a pool's (`TENANT@POOL`).
    Contention {
        tenant: String,
        contention: Contention,
    },
    /// The contention exchange's round counter at this agent (`fair`): advances every round
    /// while the exchange runs, so peers can tell its `fair:` facts are current.
    ContentionRound(u64),
}

const AGENT: &str = "agent";
const POD: &str = "pod:";
const WATERMARK: &str = "wm:";
const LOAD: &str = "load:";
const USAGE: &str = "usage:";
const CONTENTION: &str = "fair:";
const CONTENTION_ROUND: &str = "fair";

/// The keys an agent publishes for one of its pods (`pod:`, `wm:`, `load:`): what it
/// retracts when the pod stops being its.
pub fn pod_keys(pod: &str) -> [String; 3] {
    [
        format!("{POD}{pod}"),
        format!("{WATERMARK}{pod}"),
        format!("{LOAD}{pod}"),
    ]
}

// === impl Fact ===

impl Fact {
    /// The chitchat key.
    pub fn key(&self) -> String {
        match self {
            Self::Agent(_) => AGENT.to_string(),
            Self::Pod { pod, .. } => format!("{POD}{pod}"),
            Self::Watermark { pod, .. } => format!("{WATERMARK}{pod}"),
            Self::Load { pod, .. } => format!("{LOAD}{pod}"),
            Self::Usage { tenant, .. } => format!("{USAGE}{tenant}"),
            Self::Contention { tenant, .. } => format!("{CONTENTION}{tenant}"),
            Self::ContentionRound(_) => CONTENTION_ROUND.to_string(),
        }
    }

    /// The chitchat value; refuses identifiers that would not parse back or would make the
    /// value longer than [`MAX_FACT_BYTES`].
    pub fn value(&self) -> Result<String, FactError> {
        let mut v = String::new();
        // Writing to a String cannot fail.
        let _ = match self {
            Self::Agent(a) => {
                let proxy = a.proxy.map_or("-".to_string(), |p| p.to_string());
                write!(v, "{VERSION} grpc={} proxy={proxy}", a.grpc)
            }
            Self::Pod { pod, fact } => {
                check_id("pod id", pod)?;
                check_id("model name", &fact.model)?;
                check_id("pod address", &fact.addr)?;
                write!(
                    v,
                    "{VERSION} model={} addr={} health={}",
                    fact.model,
                    fact.addr,
                    fact.health.as_str()
                )
            }
            Self::Watermark { pod, at } => {
                check_id("pod id", pod)?;
                write!(v, "{}:{}", at.incarnation, at.sequence)
            }
            Self::Load { pod, load } => {
                check_id("pod id", pod)?;
                write!(
                    v,
                    "{VERSION} running={} waiting={} kv={}",
                    load.running,
                    load.waiting,
                    load.kv_permille.min(MAX_KV_PERMILLE)
                )
            }
            Self::Usage { tenant, usage } => {
                check_tenant(tenant)?;
                write!(
                    v,
                    "{VERSION} req={} pt={} ot={}",
                    usage.requests, usage.prompt_tokens, usage.output_tokens
                )
            }
            Self::Contention { tenant, contention } => {
                check_contender(tenant)?;
                write!(
                    v,
                    "{VERSION} pri={} w={} dem={}",
                    contention.priority,
                    contention.weight.max(1),
                    contention.demand
                )
            }
            Self::ContentionRound(round) => write!(v, "{VERSION} round={round}"),
        };
        debug_assert!(v.len() <= MAX_FACT_BYTES, "bounded by the id checks");
        Ok(v)
    }

    /// Reads a gossiped key and value (a peer's: untrusted).
    pub fn parse(key: &str, value: &str) -> Result<Self, FactError> {
        let bad = |why: &str| FactError::Malformed {
            key: key.chars().take(MAX_ID_BYTES + 8).collect(),
            why: why.to_string(),
        };
        if value.len() > MAX_FACT_BYTES {
            return Err(bad("longer than 512 bytes"));
        }
        let id = |prefix: &str, what| -> Result<String, FactError> {
            let id = &key[prefix.len()..];
            check_id(what, id)?;
            Ok(id.to_string())
        };
        if key == AGENT {
            let w = Words::versioned(value).ok_or_else(|| bad("not a v1 value"))?;
            let grpc = w.addr("grpc").map_err(|e| bad(&e))?;
            let proxy = match w.get("proxy") {
                None | Some("-") => None,
                Some(_) => Some(w.addr("proxy").map_err(|e| bad(&e))?),
            };
            return Ok(Self::Agent(AgentFact { grpc, proxy }));
        }
        if key == CONTENTION_ROUND {
            let w = Words::versioned(value).ok_or_else(|| bad("not a v1 value"))?;
            return Ok(Self::ContentionRound(w.num("round").map_err(|e| bad(&e))?));
        }
        if key.starts_with(POD) {
            let pod = id(POD, "pod id")?;
            let w = Words::versioned(value).ok_or_else(|| bad("not a v1 value"))?;
            let word = |name| w.get(name).ok_or_else(|| bad(&format!("no {name}=")));
            let model = word("model")?.to_string();
            let addr = word("addr")?.to_string();
            check_id("model name", &model)?;
            check_id("pod address", &addr)?;
            let health = PodHealth::parse(word("health")?).ok_or_else(|| bad("unknown health"))?;
            return Ok(Self::Pod {
                pod,
                fact: PodFact {
                    model,
                    addr,
                    health,
                },
            });
        }
        if key.starts_with(WATERMARK) {
            let pod = id(WATERMARK, "pod id")?;
            let (i, s) = value
                .split_once(':')
                .ok_or_else(|| bad("not INCARNATION:SEQUENCE"))?;
            let at = Watermark {
                incarnation: i.parse().map_err(|_| bad("incarnation not a u64"))?,
                sequence: s.parse().map_err(|_| bad("sequence not a u64"))?,
            };
            return Ok(Self::Watermark { pod, at });
        }
        if key.starts_with(LOAD) {
            let pod = id(LOAD, "pod id")?;
            let w = Words::versioned(value).ok_or_else(|| bad("not a v1 value"))?;
            let load = LoadFact {
                running: w.num("running").map_err(|e| bad(&e))?,
                waiting: w.num("waiting").map_err(|e| bad(&e))?,
                kv_permille: w.num("kv").map_err(|e| bad(&e))?,
            };
            if load.kv_permille > MAX_KV_PERMILLE {
                return Err(bad("kv= is above 1000 (permille)"));
            }
            return Ok(Self::Load { pod, load });
        }
        if let Some(tenant) = key.strip_prefix(USAGE) {
            check_tenant(tenant)?;
            let w = Words::versioned(value).ok_or_else(|| bad("not a v1 value"))?;
            let usage = UsageFact {
                requests: w.rate("req").map_err(|e| bad(&e))?,
                prompt_tokens: w.rate("pt").map_err(|e| bad(&e))?,
                output_tokens: w.rate("ot").map_err(|e| bad(&e))?,
            };
            let tenant = tenant.to_string();
            return Ok(Self::Usage { tenant, usage });
        }
        if let Some(tenant) = key.strip_prefix(CONTENTION) {
            check_contender(tenant)?;
            let w = Words::versioned(value).ok_or_else(|| bad("not a v1 value"))?;
            let contention = Contention {
                priority: w.num("pri").map_err(|e| bad(&e))?,
                weight: w.num("w").map_err(|e| bad(&e))?,
                demand: w.num("dem").map_err(|e| bad(&e))?,
            };
            if contention.weight == 0 {
                return Err(bad("w= is 0 (weights are at least 1)"));
            }
            let tenant = tenant.to_string();
            return Ok(Self::Contention { tenant, contention });
        }
        Err(FactError::UnknownKey(
            key.chars().take(MAX_ID_BYTES + 8).collect(),
        ))
    }
}

/// A value's `key=value` words.
struct Words<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Words<'a> {
    fn plain(value: &'a str) -> Self {
        Self(
            value
                .split_ascii_whitespace()
                .filter_map(|w| w.split_once('='))
                .collect(),
        )
    }

    /// The words after a leading `v1`; `None` for another version.
    fn versioned(value: &'a str) -> Option<Self> {
        let rest = value.strip_prefix(VERSION)?;
        (rest.is_empty() || rest.starts_with(' ')).then(|| Self::plain(rest))
    }

    fn get(&self, name: &str) -> Option<&'a str> {
        self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    fn addr(&self, name: &str) -> Result<SocketAddr, String> {
        let v = self.get(name).ok_or_else(|| format!("no {name}="))?;
        v.parse()
            .map_err(|_| format!("{name}={v:?} is not an address"))
    }

    fn rate(&self, name: &str) -> Result<Rate, String> {
        let v = self.get(name).ok_or_else(|| format!("no {name}="))?;
        Rate::parse(v).map_err(|why| format!("{name}={v:?} {why}"))
    }

    fn num<T: std::str::FromStr>(&self, name: &str) -> Result<T, String> {
        let v = self.get(name).ok_or_else(|| format!("no {name}="))?;
        v.parse()
            .map_err(|_| format!("{name}={v:?} is not a number"))
    }
}

#[cfg(test)]
mod tests;
