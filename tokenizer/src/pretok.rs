//! GPT-2's pre-tokenization, hand-written for ASCII text: the split that byte-level BPE
//! tokenizers apply before BPE, without a regex engine (in the `tokenizers` crate the regex
//! and the bookkeeping around it are ~75 % of encoding time).
//!
//! The pattern, tried left to right at each position (leftmost-first alternation):
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! For ASCII, `\p{L}` is `[A-Za-z]`, `\p{N}` is `[0-9]` and `\s` is `[\t\n\x0B\x0C\r ]`
//! (Unicode White_Space). `\s+(?!\S)` takes a whitespace run but leaves its last character
//! when a non-space follows (so " word" keeps its space); a lone whitespace character before
//! a non-space falls to the final `\s+`. Callers use this only for ASCII text; anything
//! else goes through the tokenizer itself. A unit test checks it against the `tokenizers`
//! crate's own split on generated and adversarial text.

fn is_space(b: u8) -> bool {
    matches!(b, b'\t'..=b'\r' | b' ')
}

fn is_other(b: u8) -> bool {
    !is_space(b) && !b.is_ascii_alphanumeric()
}

/// Length of the run of bytes from `i` satisfying `class`.
fn run(s: &[u8], i: usize, class: impl Fn(u8) -> bool) -> usize {
    s[i..].iter().take_while(|&&b| class(b)).count()
}

/// Calls `piece` for each pre-token of ASCII `text`, in order; the pieces concatenate to
/// `text`.
pub fn gpt2_pieces(text: &str, mut piece: impl FnMut(&str)) {
    debug_assert!(text.is_ascii());
    let s = text.as_bytes();
    let mut i = 0;
    while i < s.len() {
        let len = piece_len(s, i);
        piece(&text[i..i + len]);
        i += len;
    }
}

/// Length (>= 1) of the pre-token starting at `i`.
fn piece_len(s: &[u8], i: usize) -> usize {
    let b = s[i];
    if b == b'\'' {
        let rest = &s[i + 1..];
        for c in [&b"s"[..], b"t", b"re", b"ve", b"m", b"ll", b"d"] {
            if rest.starts_with(c) {
                return 1 + c.len();
            }
        }
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then one class.
    let (lead, j) = if b == b' ' && i + 1 < s.len() {
        (1, i + 1)
    } else {
        (0, i)
    };
    for class in [
        u8::is_ascii_alphabetic as fn(&u8) -> bool,
        u8::is_ascii_digit,
        |b: &u8| is_other(*b),
    ] {
        let n = run(s, j, |b| class(&b));
        if n > 0 {
            return lead + n;
        }
    }
    // Whitespace: `\s+(?!\S)`, else `\s+` (one character).
    let n = run(s, i, is_space);
    debug_assert!(n > 0, "every ASCII byte is a letter, digit, other or space");
    if i + n == s.len() {
        n
    } else if n >= 2 {
        n - 1
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Tokenizer, text::TextGen};

    /// Ids of `text` encoded one pre-token at a time (equal to encoding it whole exactly
    /// when the split matches the crate's).
    fn piecewise(tok: &Tokenizer, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        gpt2_pieces(text, |p| ids.extend(tok.encode_pretoken(p).unwrap()));
        ids
    }

    #[test]
    fn splits_like_the_gpt2_pattern() {
        let split = |t: &str| {
            let mut v = Vec::new();
            gpt2_pieces(t, |p| v.push(p.to_string()));
            v
        };
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split("it's 42nd!!"), ["it", "'s", " 42", "nd", "!!"]);
        assert_eq!(split("a   b"), ["a", "  ", " b"]);
        assert_eq!(split("a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(split("a \n b  "), ["a", " \n", " b", "  "]);
        assert_eq!(
            split("?'s 'x' ''ll"),
            ["?'", "s", " '", "x", "'", " ''", "ll"]
        );
        assert_eq!(split("x\t\x0b\x0cy"), ["x", "\t\x0b", "\x0c", "y"]);
        assert_eq!(split(" "), [" "]);
        assert_eq!(split("\x00\x1f \x7f"), ["\x00\x1f", " \x7f"]);
    }

    #[test]
    fn piecewise_encoding_equals_the_tokenizer() {
        let tok = Tokenizer::builtin();
        assert!(tok.is_gpt2_byte_level());
        let mut words = TextGen::new(5);
        let mut cases: Vec<String> = (0..30).map(|i| words.text(50 + i * 40)).collect();
        // Every ASCII byte in odd company.
        let all: String = (0u8..128).map(char::from).collect();
        cases.push(all.clone());
        cases.push(all.chars().rev().collect());
        cases.push(
            "  Don't   stop:\n\n\tx = f(a, b) // 3.14e-2 'quoted' I'M we'll they'd \r\n  end   "
                .into(),
        );
        cases.push("fn main() {\n    println!(\"{}\", 1 + 2);\n}\n".into());
        for text in cases {
            assert_eq!(
                piecewise(&tok, &text),
                tok.encode(&text, false).unwrap(),
                "{text:?}"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 300,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x7072_6574),
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]
        /// Dense mixes of the characters the pattern treats differently.
        #[test]
        fn random_ascii_encodes_piecewise_like_the_tokenizer(
            text in "[aZ9 \t\n\x0b\x0c\r'sltdmrve!?.\x00\x1c\x7f]{0,64}"
        ) {
            static TOK: std::sync::LazyLock<Tokenizer> = std::sync::LazyLock::new(Tokenizer::builtin);
            let tok = &*TOK;
            proptest::prop_assert_eq!(piecewise(tok, &text), tok.encode(&text, false).unwrap());
        }
    }
}
