//! A message's header fields as the data path holds them: for HTTP/1.1, where each field sits
//! in the head bytes read off the wire (no map is built, no value copied or hashed; lookups
//! scan the few fields a request has); for HTTP/2 through hyper, its `HeaderMap`.

use bytes::Bytes;

/// Where one header field sits in the head it was parsed from (byte offsets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    pub name: (u32, u32),
    pub value: (u32, u32),
}

impl Span {
    fn name<'a>(&self, head: &'a [u8]) -> &'a [u8] {
        &head[range(self.name)]
    }
    fn value<'a>(&self, head: &'a [u8]) -> &'a [u8] {
        &head[range(self.value)]
    }
}

fn range((at, len): (u32, u32)) -> std::ops::Range<usize> {
    at as usize..(at + len) as usize
}

/// The spans of a head's fields: a response from an engine (a handful of fields) needs no
/// allocation; a connection's request heads reuse one list.
pub type Spans = smallvec::SmallVec<[Span; 4]>;

/// Header fields, in the order received.
#[derive(Debug, Clone)]
pub enum Headers {
    /// Fields of an HTTP/1.1 head: `spans` index into `head`.
    Raw {
        head: Bytes,
        spans: Spans,
    },
    Map(http::HeaderMap),
}

impl Default for Headers {
    fn default() -> Self {
        Headers::Map(http::HeaderMap::new())
    }
}

impl From<http::HeaderMap> for Headers {
    fn from(map: http::HeaderMap) -> Self {
        Headers::Map(map)
    }
}

impl Headers {
    /// The first value of `name` (any case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Every value of `name` (any case), in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Every field as (name, value) bytes, in order (names as received: any case for
    /// HTTP/1.1, lowercase from a map).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let (raw, map) = match self {
            Headers::Raw { head, spans } => (Some((head, spans)), None),
            Headers::Map(m) => (None, Some(m)),
        };
        let raw = raw
            .into_iter()
            .flat_map(|(head, spans)| spans.iter().map(|s| (s.name(head), s.value(head))));
        let map = map
            .into_iter()
            .flat_map(|m| m.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())));
        raw.chain(map)
    }

    /// Whether the `connection` field lists `token`.
    pub fn connection_lists(&self, token: &str) -> bool {
        self.get_all("connection")
            .any(|v| lists(v, token.as_bytes()))
    }

    /// As an `http` map (for hyper), leaving out fields `keep` refuses and any a map cannot
    /// hold.
    pub fn to_map(&self, mut keep: impl FnMut(&http::HeaderName) -> bool) -> http::HeaderMap {
        if let Headers::Map(m) = self {
            let mut out = http::HeaderMap::with_capacity(m.len());
            for (n, v) in m {
                if keep(n) {
                    out.append(n.clone(), v.clone());
                }
            }
            return out;
        }
        let mut out = http::HeaderMap::new();
        for (n, v) in self.iter() {
            let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(n),
                http::HeaderValue::from_bytes(v),
            ) else {
                continue;
            };
            if keep(&n) {
                out.append(n, v);
            }
        }
        out
    }
}

/// Whether a comma-separated field value (`connection`, `expect`, ...) lists `token` (any
/// case).
pub fn lists(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// The fields a message's `connection` fields name (RFC 9110 7.6.1: they describe the
/// connection, like the fixed [`hop_by_hop`] ones, and are not forwarded).
#[derive(Debug)]
pub struct HopByHop<'a> {
    named: smallvec::SmallVec<[&'a [u8]; 2]>,
}

impl<'a> HopByHop<'a> {
    pub fn of(headers: &'a Headers) -> Self {
        Self {
            named: headers.get_all("connection").collect(),
        }
    }

    /// Whether `connection` names the field `name` (any case).
    pub fn named(&self, name: &[u8]) -> bool {
        self.named.iter().any(|v| lists(v, name))
    }
}

/// Whether every line of `head` (a message head, its empty last line included) ends in CRLF:
/// httparse also takes a bare LF as a line end, which warmpath refuses on both legs (RFC 9112
/// 2.2 allows either), so that a head is never read two ways.
pub fn crlf_lines(head: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', head).all(|at| at > 0 && head[at - 1] == b'\r')
}

/// Headers that describe one connection, not the message (RFC 9110 7.6.1), by name in any case.
pub fn hop_by_hop(name: &[u8]) -> bool {
    const HOP: [&[u8]; 7] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
    ];
    HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_and_map_fields_read_alike() {
        let head = Bytes::from_static(b"X-Session-Id: a\r\ncookie: x=1\r\nCookie: y=2\r\n");
        let spans = smallvec::smallvec![
            Span {
                name: (0, 12),
                value: (14, 1),
            },
            Span {
                name: (17, 6),
                value: (25, 3),
            },
            Span {
                name: (30, 6),
                value: (38, 3),
            },
        ];
        let raw = Headers::Raw { head, spans };
        let mut map = http::HeaderMap::new();
        map.append("x-session-id", "a".parse().unwrap());
        map.append("cookie", "x=1".parse().unwrap());
        map.append("cookie", "y=2".parse().unwrap());
        let map = Headers::Map(map);
        for h in [&raw, &map] {
            assert_eq!(h.get("x-session-id"), Some(&b"a"[..]));
            assert_eq!(
                h.get_all("COOKIE").collect::<Vec<_>>(),
                [&b"x=1"[..], b"y=2"]
            );
            assert_eq!(h.get("nope"), None);
            let m = h.to_map(|n| n != "cookie");
            assert_eq!(m.len(), 1);
        }
        assert!(hop_by_hop(b"Transfer-Encoding") && !hop_by_hop(b"content-type"));
    }
}
