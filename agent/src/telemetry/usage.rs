//! Token counts of one request: as the engine reported them (read by the proxy's taps), and
//! the route receipt's prefix as the router saw it at decision ([`Receipt`]).

/// Token counts of one request, as the engine reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
    /// The engine reported `prompt_tokens_details.cached_tokens` (vLLM only does with
    /// `--enable-prompt-tokens-details`): without it `cached` is 0 by default, not measured.
    pub cached_reported: bool,
}

/// A request's route receipt as far as the router knows it at decision, in tokens (blocks x
/// the pool's block size, so they compare with the engine's `cached_tokens`, the receipt's
/// third figure, known when the body ends).
///
/// Invariant: `captured <= available` for the first attempt's pick; a retry's pod may hold
/// less than the best one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Receipt {
    /// The longest prefix any live pod with a trusted index holds.
    pub available: u64,
    /// What the pod that answered held at its decision (0 when its index is untrusted).
    pub captured: u64,
}
