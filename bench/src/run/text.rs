//! Generated text's size: how many characters a token takes.

/// Average characters per token of the built-in tokenizer on generated text.
pub const CHARS_PER_TOKEN: f64 = 3.85;

/// Characters of generated text for about `tokens` tokens.
pub fn chars(tokens: usize) -> usize {
    (tokens as f64 * CHARS_PER_TOKEN) as usize
}
