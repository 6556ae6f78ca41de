//! A tenant's quotas in the engine's units (rates per second) and the dimensions they
//! limit, read from a `Tenant`'s `spec.quotas`.

use std::{fmt, time::Duration};

use crate::policy::{resources, validate::parse_rate};

/// `burstSeconds` when the quota does not say.
pub const DEFAULT_BURST: Duration = Duration::from_secs(1);

/// One quota's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    Requests,
    PromptTokens,
    OutputTokens,
    ConcurrentStreams,
}

impl Dimension {
    pub const ALL: [Dimension; 4] = [
        Dimension::Requests,
        Dimension::PromptTokens,
        Dimension::OutputTokens,
        Dimension::ConcurrentStreams,
    ];
    /// The three rate dimensions, in bucket order.
    pub(super) const RATES: [Dimension; 3] = [
        Dimension::Requests,
        Dimension::PromptTokens,
        Dimension::OutputTokens,
    ];

    /// The `dimension` attribute of the quota metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::PromptTokens => "prompt_tokens",
            Dimension::OutputTokens => "output_tokens",
            Dimension::ConcurrentStreams => "concurrent_streams",
        }
    }

    /// The field of `spec.quotas`.
    pub fn field(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::PromptTokens => "promptTokens",
            Dimension::OutputTokens => "outputTokens",
            Dimension::ConcurrentStreams => "concurrentStreams",
        }
    }

    pub(super) fn unit(self) -> &'static str {
        match self {
            Dimension::Requests => "requests/s",
            Dimension::PromptTokens => "prompt tokens/s",
            Dimension::OutputTokens => "output tokens/s",
            Dimension::ConcurrentStreams => "concurrent streams",
        }
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tenant's quotas in the engine's units: rates per second, cluster-wide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaLimits {
    pub requests_per_s: Option<f64>,
    pub prompt_tokens_per_s: Option<f64>,
    pub output_tokens_per_s: Option<f64>,
    pub concurrent_streams: Option<u32>,
    /// Seconds of each rate that may be spent at once.
    pub burst: Duration,
}

impl Default for QuotaLimits {
    /// No limit at all.
    fn default() -> Self {
        Self {
            requests_per_s: None,
            prompt_tokens_per_s: None,
            output_tokens_per_s: None,
            concurrent_streams: None,
            burst: DEFAULT_BURST,
        }
    }
}

/// A quota field that cannot be used: which field of `spec.quotas`, its value, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.quotas.{field}: `{value}`: {reason}")]
pub struct LimitError {
    pub field: &'static str,
    pub value: String,
    pub reason: String,
}

impl QuotaLimits {
    /// The limits of a `Tenant`'s `spec.quotas`.
    pub fn from_spec(spec: &resources::Quotas) -> Result<Self, LimitError> {
        let rate = |dim: Dimension, v: &Option<String>| {
            v.as_deref()
                .map(|s| {
                    parse_rate(s).map_err(|reason| LimitError {
                        field: dim.field(),
                        value: s.to_owned(),
                        reason,
                    })
                })
                .transpose()
        };
        let concurrent_streams = match spec.concurrent_streams {
            Some(0) => {
                return Err(LimitError {
                    field: Dimension::ConcurrentStreams.field(),
                    value: "0".into(),
                    reason: "must be at least 1".into(),
                });
            }
            n => n,
        };
        let burst = match spec.burst_seconds {
            None => DEFAULT_BURST,
            Some(s) if (0.05..=60.0).contains(&s) => Duration::from_secs_f64(s),
            Some(s) => {
                return Err(LimitError {
                    field: "burstSeconds",
                    value: s.to_string(),
                    reason: "must be between 0.05 and 60 seconds".into(),
                });
            }
        };
        Ok(Self {
            requests_per_s: rate(Dimension::Requests, &spec.requests)?,
            prompt_tokens_per_s: rate(Dimension::PromptTokens, &spec.prompt_tokens)?,
            output_tokens_per_s: rate(Dimension::OutputTokens, &spec.output_tokens)?,
            concurrent_streams,
            burst,
        })
    }

    /// Nothing is limited: [`super::Quotas::admit`] keeps no state for the tenant.
    pub fn is_unlimited(&self) -> bool {
        self.rates().iter().all(Option::is_none) && self.concurrent_streams.is_none()
    }

    pub(super) fn rates(&self) -> [Option<f64>; 3] {
        [
            self.requests_per_s,
            self.prompt_tokens_per_s,
            self.output_tokens_per_s,
        ]
    }
}
