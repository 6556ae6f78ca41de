//! Token counts of one request, as the engine reported them (read by the proxy's taps).

/// Token counts of one request, as the engine reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
}
