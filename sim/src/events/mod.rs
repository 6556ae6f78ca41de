//! Publishing KV cache events the way vLLM does: ZeroMQ PUB with `[topic, seq, payload]`
//! frames, a ROUTER replay endpoint, and vLLM's `--kv-events-config` JSON.

mod encode;
#[cfg(test)]
mod golden;
mod publisher;

use serde::Deserialize;

pub use encode::{Encoder, HashEncoding, WireFormat, hash_to_u64};
pub use publisher::{Publisher, PublisherError, ReplayLayout, Started};

/// vLLM's `--kv-events-config` (KVEventsConfig), with vLLM's defaults.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct KvEventsConfig {
    pub enable_kv_cache_events: bool,
    pub publisher: Option<String>,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub buffer_steps: usize,
    pub hwm: usize,
    pub max_queue_size: usize,
    pub topic: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

impl KvEventsConfig {
    /// Parses the JSON form, naming the offending field on error.
    pub fn from_json(json: &str) -> Result<Self, String> {
        let cfg: Self =
            serde_json::from_str(json).map_err(|e| format!("--kv-events-config: {e}"))?;
        match cfg.publisher.as_deref() {
            None | Some("zmq") | Some("null") => Ok(cfg),
            Some(other) => Err(format!(
                "--kv-events-config: publisher `{other}` is not supported (use \"zmq\")"
            )),
        }
    }

    /// Whether events are published at all (enabled and not the "null" publisher).
    pub fn active(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref() != Some("null")
    }
}

/// vLLM's rule: bind when the endpoint has `*` or `::` or is ipc/inproc; else connect.
pub fn should_bind(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_errors() {
        let cfg =
            KvEventsConfig::from_json(r#"{"enable_kv_cache_events": true, "publisher": "zmq"}"#)
                .unwrap();
        assert_eq!(cfg.endpoint, "tcp://*:5557");
        assert_eq!(cfg.buffer_steps, 10_000);
        assert!(cfg.active());
        let err = KvEventsConfig::from_json(r#"{"enable_kv_cache_events": true, "endpont": "x"}"#)
            .unwrap_err();
        assert!(err.contains("endpont"), "{err}");
        assert!(KvEventsConfig::from_json(r#"{"publisher": "kafka"}"#).is_err());
    }

    #[test]
    fn bind_or_connect_follows_vllm() {
        assert!(should_bind("tcp://*:5557"));
        assert!(should_bind("tcp://[::]:5557"));
        assert!(should_bind("ipc:///tmp/kv"));
        assert!(!should_bind("tcp://127.0.0.1:5557"));
    }
}
