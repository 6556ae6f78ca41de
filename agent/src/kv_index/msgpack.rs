//! A small, allocation-free msgpack reader over a byte slice, for untrusted input.
//!
//! Every length is checked against the bytes that remain before anything is allocated, and
//! nesting is bounded, so garbage yields an error, never a panic or a huge allocation.

/// Why a payload could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("expected {expected} at byte {at}, found marker 0x{marker:02x}")]
    Unexpected {
        expected: &'static str,
        at: usize,
        marker: u8,
    },
    #[error("nesting deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("{0}")]
    Invalid(&'static str),
}

/// Deepest nesting `skip` follows.
const MAX_DEPTH: usize = 32;

/// (bytes used, right shift of the 4 bytes after the marker) per marker byte, for markers of
/// unsigned integers that fit u32; (0, _) for every other marker.
const UINT_WIDTH: [(u8, u8); 256] = {
    let mut t = [(0u8, 0u8); 256];
    let mut m = 0;
    while m < 0x80 {
        t[m] = (1, 0);
        m += 1;
    }
    t[0xcc] = (2, 24);
    t[0xcd] = (3, 16);
    t[0xce] = (5, 0);
    t
};

/// A cursor over a msgpack buffer.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn peek(&self) -> Result<u8, Error> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or(Error::Truncated(self.pos))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or(Error::Truncated(self.pos))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, Error> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn unexpected(&self, expected: &'static str) -> Error {
        Error::Unexpected {
            expected,
            at: self.pos,
            marker: self.buf.get(self.pos).copied().unwrap_or(0),
        }
    }

    /// True (and consumed) if the next value is nil.
    pub fn nil(&mut self) -> Result<bool, Error> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the next value is a map.
    pub fn at_map(&self) -> bool {
        matches!(self.buf.get(self.pos), Some(0x80..=0x8f | 0xde | 0xdf))
    }

    /// An integer as raw 64 bits: unsigned as is, negative as two's complement.
    #[inline]
    pub fn int(&mut self) -> Result<u64, Error> {
        // Fast paths for what token ids and hashes use: fixint, uint16, uint32, uint64.
        let rest = &self.buf[self.pos..];
        match rest {
            [m @ 0x00..=0x7f, ..] => {
                self.pos += 1;
                return Ok(u64::from(*m));
            }
            [0xcd, a, b, ..] => {
                self.pos += 3;
                return Ok(u64::from(u16::from_be_bytes([*a, *b])));
            }
            [0xce, a, b, c, d, ..] => {
                self.pos += 5;
                return Ok(u64::from(u32::from_be_bytes([*a, *b, *c, *d])));
            }
            [0xcf, tail @ ..] if tail.len() >= 8 => {
                self.pos += 9;
                return Ok(u64::from_be_bytes(
                    tail[..8].try_into().expect("length checked"),
                ));
            }
            _ => {}
        }
        let m = self.peek()?;
        let v = match m {
            0x00..=0x7f => {
                self.pos += 1;
                u64::from(m)
            }
            0xe0..=0xff => {
                self.pos += 1;
                i64::from(m as i8) as u64
            }
            0xcc..=0xcf => {
                self.pos += 1;
                self.be(1 << (m - 0xcc))?
            }
            0xd0..=0xd3 => {
                self.pos += 1;
                let n = 1usize << (m - 0xd0);
                let raw = self.be(n)?;
                let shift = 64 - 8 * n as u32;
                (((raw << shift) as i64) >> shift) as u64
            }
            _ => return Err(self.unexpected("an integer")),
        };
        Ok(v)
    }

    /// An array of unsigned integers that fit u32 (token ids), appended to `out`.
    ///
    /// Token ids of one array mix widths (fixint, uint8/16/32) at random, so the width is
    /// selected without a branch while at least five bytes remain: load the four bytes after
    /// the marker and shift by the marker's width. Anything else (the tail, other integer
    /// types, errors) takes the general path.
    pub fn u32_array(&mut self, out: &mut Vec<u32>) -> Result<(), Error> {
        let n = self.array_len()?;
        out.reserve(n);
        for _ in 0..n {
            if let Some(&[m, a, b, c, d]) = self.buf.get(self.pos..self.pos + 5) {
                let (used, shift) = UINT_WIDTH[usize::from(m)];
                if used != 0 {
                    let after = u32::from_be_bytes([a, b, c, d]);
                    let wide = after.checked_shr(u32::from(shift)).unwrap_or(0);
                    out.push(if m < 0x80 { u32::from(m) } else { wide });
                    self.pos += usize::from(used);
                    continue;
                }
            }
            let v = self.int()?;
            out.push(u32::try_from(v).map_err(|_| Error::Invalid("integer exceeds u32"))?);
        }
        Ok(())
    }

    /// A float (or an integer, widened).
    pub fn float(&mut self) -> Result<f64, Error> {
        match self.peek()? {
            0xca => {
                self.pos += 1;
                Ok(f64::from(f32::from_bits(self.be(4)? as u32)))
            }
            0xcb => {
                self.pos += 1;
                Ok(f64::from_bits(self.be(8)?))
            }
            _ => Ok(self.int()? as i64 as f64),
        }
    }

    fn len_checked(&self, n: u64, min_bytes_each: usize) -> Result<usize, Error> {
        let n = usize::try_from(n).map_err(|_| Error::Invalid("length overflows usize"))?;
        if n.saturating_mul(min_bytes_each) > self.remaining() {
            return Err(Error::Truncated(self.pos));
        }
        Ok(n)
    }

    pub fn array_len(&mut self) -> Result<usize, Error> {
        let n = self.container_len(0x90, 0xdc, "an array")?;
        self.len_checked(n, 1)
    }

    pub fn map_len(&mut self) -> Result<usize, Error> {
        let n = self.container_len(0x80, 0xde, "a map")?;
        // Each entry is a key and a value.
        self.len_checked(n, 2)
    }

    /// Consumes an array or map header and returns its length: a fix marker (`fix`, the
    /// length in its low four bits), or `wide` (16-bit length) or `wide + 1` (32-bit) followed
    /// by the length; `expected` names the value in the error.
    #[inline]
    fn container_len(&mut self, fix: u8, wide: u8, expected: &'static str) -> Result<u64, Error> {
        let m = self.peek()?;
        let width = match m {
            _ if m & 0xf0 == fix => {
                self.pos += 1;
                return Ok(u64::from(m & 0x0f));
            }
            _ if m == wide => 2,
            _ if m == wide + 1 => 4,
            _ => return Err(self.unexpected(expected)),
        };
        self.pos += 1;
        self.be(width)
    }

    /// A str, or a bin holding UTF-8.
    pub fn str(&mut self) -> Result<&'a str, Error> {
        let n = self.str_or_bin_len("a string")?;
        std::str::from_utf8(self.take(n)?).map_err(|_| Error::Invalid("string is not UTF-8"))
    }

    /// A bin (or str) as raw bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8], Error> {
        let n = self.str_or_bin_len("bytes")?;
        self.take(n)
    }

    /// Consumes a str or bin header (either is taken where the other is expected) and
    /// returns the length that follows it; `expected` names the value in the error.
    #[inline]
    fn str_or_bin_len(&mut self, expected: &'static str) -> Result<usize, Error> {
        let m = self.peek()?;
        let n = match m {
            0xa0..=0xbf => {
                self.pos += 1;
                u64::from(m & 0x1f)
            }
            0xd9 | 0xc4 => {
                self.pos += 1;
                self.be(1)?
            }
            0xda | 0xc5 => {
                self.pos += 1;
                self.be(2)?
            }
            0xdb | 0xc6 => {
                self.pos += 1;
                self.be(4)?
            }
            _ => return Err(self.unexpected(expected)),
        };
        self.len_checked(n, 1)
    }

    /// Whether the next value is a str.
    pub fn at_str(&self) -> bool {
        matches!(self.buf.get(self.pos), Some(0xa0..=0xbf | 0xd9..=0xdb))
    }

    /// Whether the next value is a bin.
    pub fn at_bin(&self) -> bool {
        matches!(self.buf.get(self.pos), Some(0xc4..=0xc6))
    }

    /// Skips one value of any type; returns the bytes it spanned.
    pub fn skip(&mut self) -> Result<&'a [u8], Error> {
        let start = self.pos;
        self.skip_depth(0)?;
        Ok(&self.buf[start..self.pos])
    }

    fn skip_depth(&mut self, depth: usize) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(Error::TooDeep);
        }
        let m = self.peek()?;
        match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => self.pos += 1,
            0xcc..=0xd3 => {
                self.int()?;
            }
            0xca | 0xcb => {
                self.float()?;
            }
            0xa0..=0xbf | 0xd9..=0xdb | 0xc4..=0xc6 => {
                self.bytes()?;
            }
            0x90..=0x9f | 0xdc | 0xdd => {
                for _ in 0..self.array_len()? {
                    self.skip_depth(depth + 1)?;
                }
            }
            0x80..=0x8f | 0xde | 0xdf => {
                for _ in 0..self.map_len()? * 2 {
                    self.skip_depth(depth + 1)?;
                }
            }
            0xd4..=0xd8 => {
                // fixext 1/2/4/8/16: type byte + data.
                self.pos += 1;
                self.take(2usize << (m - 0xd4) >> 1)?;
                self.take(1)?;
            }
            0xc7..=0xc9 => {
                self.pos += 1;
                let n = self.be(1 << (m - 0xc7))? as usize;
                self.take(1)?;
                self.take(n)?;
            }
            _ => return Err(self.unexpected("a value")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 256,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x6d73_6770),
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]
        /// Any u32s, as rmp encodes them (smallest width each), decode back — including the
        /// last few, which take the general path.
        #[test]
        fn u32_arrays_of_mixed_widths_round_trip(
            ids in proptest::collection::vec(
                proptest::prop_oneof![0u32..0x80, 0x80u32..0x100, 0x100u32..0x1_0000, proptest::prelude::any::<u32>()],
                0..40,
            ),
            trailing in proptest::prelude::any::<bool>(),
        ) {
            let mut buf = Vec::new();
            rmp::encode::write_array_len(&mut buf, ids.len() as u32).unwrap();
            for id in &ids {
                rmp::encode::write_uint(&mut buf, u64::from(*id)).unwrap();
            }
            if trailing {
                buf.extend_from_slice(&[0xc0, 0xc0, 0xc0, 0xc0, 0xc0]);
            }
            let mut out = Vec::new();
            let mut r = Reader::new(&buf);
            r.u32_array(&mut out).unwrap();
            proptest::prop_assert_eq!(out, ids);
        }
    }

    #[test]
    fn u32_arrays_reject_what_is_not_a_u32() {
        // A negative int, a u64 beyond u32, a string, a truncated uint32.
        for bad in [
            &[0x91, 0xff][..],
            &[0x91, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0],
            &[0x91, 0xa1, b'x'],
            &[0x92, 0x01, 0xce, 0, 0],
        ] {
            assert!(
                Reader::new(bad).u32_array(&mut Vec::new()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn integers_of_every_width_and_sign() {
        let cases: &[(&[u8], u64)] = &[
            (&[0x05], 5),
            (&[0xff], u64::MAX),
            (&[0xcc, 0xff], 255),
            (&[0xcf, 0xda, 0x8a, 0, 0, 0, 0, 0, 1], 0xda8a_0000_0000_0001),
            (
                &[0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe],
                (-2i64) as u64,
            ),
            (&[0xd0, 0x80], (-128i64) as u64),
        ];
        for (bytes, want) in cases {
            assert_eq!(Reader::new(bytes).int().unwrap(), *want, "{bytes:?}");
        }
    }

    #[test]
    fn lengths_beyond_the_buffer_are_errors_not_allocations() {
        assert!(matches!(
            Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]).array_len(),
            Err(Error::Truncated(_))
        ));
        assert!(
            Reader::new(&[0xdb, 0xff, 0xff, 0xff, 0xff, b'a'])
                .str()
                .is_err()
        );
        assert!(Reader::new(&[]).int().is_err());
        let mut deep = vec![0x91u8; 100];
        deep.push(0xc0);
        assert_eq!(Reader::new(&deep).skip(), Err(Error::TooDeep));
    }
}
