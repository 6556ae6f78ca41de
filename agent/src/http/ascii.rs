//! Byte-string reading shared by the wire parsers (HTTP heads, engine JSON bodies).

/// `digits`, all ASCII digits, as a number; `None` when empty or longer than 19 digits (the
/// most that always fit in a `u64`).
pub fn decimal(digits: &[u8]) -> Option<u64> {
    ((1..=19).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit)).then(|| {
        digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_up_to_nineteen_digits() {
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(
            decimal(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(decimal(b""), None);
        assert_eq!(decimal(b"12a"), None);
        assert_eq!(decimal(b"10000000000000000000"), None);
    }
}
