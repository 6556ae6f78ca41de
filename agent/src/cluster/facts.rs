//! The small facts an agent gossips about itself (docs/cluster.md, "What rides gossip"), typed,
//! with their chitchat keys and string encodings.
//!
//! Every value is bounded (`MAX_FACT_BYTES`, far below chitchat's 65,507-byte datagram) by
//! bounding what goes into it: identifiers and model names at `MAX_ID_BYTES`, numbers as
//! decimals. Values start with a version word and are `key=value` words after it, so a newer
//! agent may add words an older one ignores. Parsing is of untrusted input: it never panics
//! and says what is wrong.

use std::{fmt::Write, net::SocketAddr};

use crate::kv_index::Watermark;

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

/// A pod's load, as its owner scraped it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadFact {
    pub in_flight: u32,
    pub queued_blocks: u64,
    pub kv_permille: u32,
}

/// A tenant's usage over the last window, for cluster-wide quotas (#22).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageFact {
    pub window_ms: u64,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
}

/// One gossiped key and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact {
    Agent(AgentFact),
    Pod { pod: String, fact: PodFact },
    Watermark { pod: String, at: Watermark },
    Load { pod: String, load: LoadFact },
    Usage { tenant: String, usage: UsageFact },
}

const AGENT: &str = "agent";
const POD: &str = "pod:";
const WATERMARK: &str = "wm:";
const LOAD: &str = "load:";
const USAGE: &str = "usage:";

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
                    "inflight={} queued={} kv={}",
                    load.in_flight, load.queued_blocks, load.kv_permille
                )
            }
            Self::Usage { tenant, usage } => {
                check_id("tenant id", tenant)?;
                write!(
                    v,
                    "{VERSION} window={} req={} ptok={} otok={}",
                    usage.window_ms, usage.requests, usage.prompt_tokens, usage.output_tokens
                )
            }
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
            let w = Words::plain(value);
            let load = LoadFact {
                in_flight: w.num("inflight").map_err(|e| bad(&e))?,
                queued_blocks: w.num("queued").map_err(|e| bad(&e))?,
                kv_permille: w.num("kv").map_err(|e| bad(&e))?,
            };
            return Ok(Self::Load { pod, load });
        }
        if key.starts_with(USAGE) {
            let tenant = id(USAGE, "tenant id")?;
            let w = Words::versioned(value).ok_or_else(|| bad("not a v1 value"))?;
            let usage = UsageFact {
                window_ms: w.num("window").map_err(|e| bad(&e))?,
                requests: w.num("req").map_err(|e| bad(&e))?,
                prompt_tokens: w.num("ptok").map_err(|e| bad(&e))?,
                output_tokens: w.num("otok").map_err(|e| bad(&e))?,
            };
            return Ok(Self::Usage { tenant, usage });
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

    fn num<T: std::str::FromStr>(&self, name: &str) -> Result<T, String> {
        let v = self.get(name).ok_or_else(|| format!("no {name}="))?;
        v.parse()
            .map_err(|_| format!("{name}={v:?} is not a number"))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn id_strategy() -> impl Strategy<Value = String> {
        "[A-Za-z0-9._:/-]{1,128}"
    }

    fn fact_strategy() -> impl Strategy<Value = Fact> {
        let health = prop_oneof![
            Just(PodHealth::Healthy),
            Just(PodHealth::Waiting),
            Just(PodHealth::Unsure),
            Just(PodHealth::Stalled),
        ];
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>(), any::<Option<u16>>()).prop_map(|(ip, port, proxy)| {
                Fact::Agent(AgentFact {
                    grpc: (ip, port).into(),
                    proxy: proxy.map(|p| ([127, 0, 0, 1], p).into()),
                })
            }),
            (id_strategy(), id_strategy(), id_strategy(), health).prop_map(
                |(pod, model, addr, health)| Fact::Pod {
                    pod,
                    fact: PodFact {
                        model,
                        addr,
                        health
                    },
                }
            ),
            (id_strategy(), any::<u64>(), any::<u64>()).prop_map(|(pod, i, s)| Fact::Watermark {
                pod,
                at: Watermark {
                    incarnation: i,
                    sequence: s
                },
            }),
            (id_strategy(), any::<u32>(), any::<u64>(), any::<u32>()).prop_map(
                |(pod, in_flight, queued_blocks, kv_permille)| Fact::Load {
                    pod,
                    load: LoadFact {
                        in_flight,
                        queued_blocks,
                        kv_permille
                    },
                }
            ),
            (id_strategy(), any::<[u64; 4]>()).prop_map(|(tenant, n)| Fact::Usage {
                tenant,
                usage: UsageFact {
                    window_ms: n[0],
                    requests: n[1],
                    prompt_tokens: n[2],
                    output_tokens: n[3],
                },
            }),
        ]
    }

    proptest! {
        #[test]
        fn every_fact_reads_back_and_stays_below_the_bound(fact in fact_strategy()) {
            let value = fact.value().expect("valid ids");
            prop_assert!(value.len() <= MAX_FACT_BYTES, "{} bytes", value.len());
            prop_assert_eq!(Fact::parse(&fact.key(), &value), Ok(fact));
        }

        #[test]
        fn garbage_is_an_error_never_a_panic(key in "(agent|pod:|wm:|load:|usage:|x)[ -~]{0,40}", value in "[ -~]{0,80}") {
            let _ = Fact::parse(&key, &value);
        }
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        assert_eq!(
            Fact::parse("wm:pod-a", "12"),
            Err(FactError::Malformed {
                key: "wm:pod-a".into(),
                why: "not INCARNATION:SEQUENCE".into()
            })
        );
        assert!(matches!(
            Fact::parse("pod:", "v1 model=m addr=a health=healthy"),
            Err(FactError::Invalid {
                why: "is empty",
                ..
            })
        ));
        assert!(matches!(
            Fact::parse("pod:p", "v2 model=m addr=a health=healthy"),
            Err(FactError::Malformed { .. })
        ));
        assert_eq!(
            Fact::parse("nodes", "x"),
            Err(FactError::UnknownKey("nodes".into()))
        );
        let long = "m".repeat(129);
        let fact = Fact::Pod {
            pod: "p".into(),
            fact: PodFact {
                model: long,
                addr: "127.0.0.1:1".into(),
                health: PodHealth::Healthy,
            },
        };
        assert!(matches!(
            fact.value(),
            Err(FactError::Invalid {
                what: "model name",
                ..
            })
        ));
        // Words a newer agent adds are ignored.
        assert_eq!(
            Fact::parse("load:p", "inflight=1 queued=2 kv=3 hot=yes"),
            Ok(Fact::Load {
                pod: "p".into(),
                load: LoadFact {
                    in_flight: 1,
                    queued_blocks: 2,
                    kv_permille: 3
                }
            })
        );
    }
}
