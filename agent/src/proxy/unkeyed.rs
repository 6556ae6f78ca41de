//! Requests routed without prefix keys, counted per pool by reason: a request whose tokens
//! the router cannot compute is still forwarded (the engine answers it, or refuses it with its
//! own validation error), but it routes on load alone — a silent loss of cache affinity unless
//! it is counted. `/status` shows the counts (`pools[].unkeyed`), and the first failure of each
//! reason is logged once at warn with its message (later ones only count).

use std::sync::{
    OnceLock,
    atomic::{AtomicU64, Ordering},
};

/// Why a request has no prefix keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnkeyedReason {
    /// The chat template failed (a `raise_exception`, an undefined value, ...).
    Template,
    /// The pool's tokenizer has no chat template.
    NoChatTemplate,
    /// Chat messages, tools or options the template cannot be given (malformed).
    ChatRequest,
    /// The tokenizer failed on the text.
    Tokenizer,
    /// A prompt shape routing does not read (batched prompts, objects, no prompt).
    Prompt,
    /// The engine's `/tokenize` refused, failed or answered something unreadable.
    EngineTokenize,
    /// The engine's `/tokenize` did not answer in time.
    EngineTokenizeTimeout,
    /// No endpoint to ask for `/tokenize`.
    NoEngine,
}

impl UnkeyedReason {
    /// Every reason, in `/status` order.
    pub const ALL: [UnkeyedReason; 8] = [
        UnkeyedReason::Template,
        UnkeyedReason::NoChatTemplate,
        UnkeyedReason::ChatRequest,
        UnkeyedReason::Tokenizer,
        UnkeyedReason::Prompt,
        UnkeyedReason::EngineTokenize,
        UnkeyedReason::EngineTokenizeTimeout,
        UnkeyedReason::NoEngine,
    ];

    /// Its name in `/status`.
    pub fn name(self) -> &'static str {
        match self {
            UnkeyedReason::Template => "template",
            UnkeyedReason::NoChatTemplate => "no_chat_template",
            UnkeyedReason::ChatRequest => "chat_request",
            UnkeyedReason::Tokenizer => "tokenizer",
            UnkeyedReason::Prompt => "prompt",
            UnkeyedReason::EngineTokenize => "engine_tokenize",
            UnkeyedReason::EngineTokenizeTimeout => "engine_tokenize_timeout",
            UnkeyedReason::NoEngine => "no_engine",
        }
    }

    fn index(self) -> usize {
        Self::ALL
            .iter()
            .position(|r| *r == self)
            .expect("ALL lists every reason")
    }
}

/// A request without keys: the reason and the failure's own message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unkeyed {
    pub reason: UnkeyedReason,
    pub detail: String,
}

impl Unkeyed {
    pub fn new(reason: UnkeyedReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

impl From<warmpath_tokenizer::Error> for Unkeyed {
    fn from(e: warmpath_tokenizer::Error) -> Self {
        use warmpath_tokenizer::Error as E;
        let reason = match &e {
            E::Template(_) => UnkeyedReason::Template,
            E::NoChatTemplate => UnkeyedReason::NoChatTemplate,
            E::Request(_) => UnkeyedReason::ChatRequest,
            E::Encode(_) | E::Load { .. } => UnkeyedReason::Tokenizer,
        };
        Unkeyed::new(reason, e.to_string())
    }
}

/// One pool's counts (lock-free; a few atomics per pool).
#[derive(Debug)]
pub struct UnkeyedCounts {
    pool: String,
    counts: [AtomicU64; UnkeyedReason::ALL.len()],
    /// The first message of each reason (set once: the warn line is written then).
    first: [OnceLock<String>; UnkeyedReason::ALL.len()],
}

impl UnkeyedCounts {
    pub fn new(pool: &str) -> Self {
        Self {
            pool: pool.to_string(),
            counts: Default::default(),
            first: Default::default(),
        }
    }

    /// Counts one request; the first of its reason is logged at warn.
    pub fn record(&self, why: &Unkeyed) {
        let i = why.reason.index();
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        if self.first[i].set(why.detail.clone()).is_ok() {
            tracing::warn!(
                pool = %self.pool,
                reason = why.reason.name(),
                error = %why.detail,
                "routing a request without prefix keys (later ones with this reason are only \
                 counted: /status pools[].unkeyed)"
            );
        }
    }

    /// How many requests went without keys, for one reason.
    pub fn count(&self, reason: UnkeyedReason) -> u64 {
        self.counts[reason.index()].load(Ordering::Relaxed)
    }

    /// `{reason: count}` for the reasons seen (`/status` `pools[].unkeyed`).
    pub fn counts(&self) -> serde_json::Value {
        self.by_reason(|r| {
            let n = self.count(r);
            (n > 0).then(|| n.into())
        })
    }

    /// `{reason: the first failure's message}` (`/status` `pools[].unkeyed_first_error`).
    pub fn first_errors(&self) -> serde_json::Value {
        self.by_reason(|r| self.first[r.index()].get().map(|m| m.as_str().into()))
    }

    fn by_reason(
        &self,
        each: impl Fn(UnkeyedReason) -> Option<serde_json::Value>,
    ) -> serde_json::Value {
        let map: serde_json::Map<String, serde_json::Value> = UnkeyedReason::ALL
            .into_iter()
            .filter_map(|r| each(r).map(|v| (r.name().to_string(), v)))
            .collect();
        map.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_reason_and_keeps_the_first_message() {
        let c = UnkeyedCounts::new("p");
        c.record(&Unkeyed::new(UnkeyedReason::Template, "boom 1"));
        c.record(&Unkeyed::new(UnkeyedReason::Template, "boom 2"));
        c.record(&Unkeyed::new(UnkeyedReason::EngineTokenizeTimeout, "slow"));
        assert_eq!(c.count(UnkeyedReason::Template), 2);
        assert_eq!(c.count(UnkeyedReason::Prompt), 0);
        assert_eq!(
            c.counts(),
            serde_json::json!({"template": 2, "engine_tokenize_timeout": 1})
        );
        assert_eq!(
            c.first_errors(),
            serde_json::json!({"template": "boom 1", "engine_tokenize_timeout": "slow"})
        );
    }

    #[test]
    fn tokenizer_errors_map_to_reasons() {
        let e = warmpath_tokenizer::Error::Template("Conversation roles must alternate".into());
        let u = Unkeyed::from(e);
        assert_eq!(u.reason, UnkeyedReason::Template);
        assert!(u.detail.contains("roles must alternate"));
        let u = Unkeyed::from(warmpath_tokenizer::Error::NoChatTemplate);
        assert_eq!(u.reason, UnkeyedReason::NoChatTemplate);
    }
}
