//! What the servers hand to request handling and get back: a request head (or the
//! [`Refusal`] of a request that could not be read) and an answer, whose header fields stay
//! as they were read ([`Headers`]) unless an answer of the handler's own carries a map.

use super::{
    Body,
    headers::{Headers, HopByHop, hop_by_hop},
};

/// A request's head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: http::Method,
    /// Path and query, as forwarded (always UTF-8: see [`RequestHead::new`]).
    target: bytes::Bytes,
    pub version: http::Version,
    pub headers: Headers,
}

impl RequestHead {
    /// `target` is the request target as received: origin form (`/path?query`) is kept as
    /// it is, without another parse; any other form (absolute, `*`) is read as a URI and its
    /// path and query kept. `None`: not a request target.
    pub fn new(
        method: http::Method,
        target: bytes::Bytes,
        version: http::Version,
        headers: Headers,
    ) -> Option<Self> {
        let origin_form = target.first() == Some(&b'/') && std::str::from_utf8(&target).is_ok();
        let target = if origin_form {
            target
        } else {
            let uri = http::Uri::from_maybe_shared(target).ok()?;
            bytes::Bytes::copy_from_slice(path_and_query(&uri).as_bytes())
        };
        Some(Self {
            method,
            target,
            version,
            headers,
        })
    }

    /// The request target to forward: path and query.
    pub fn target(&self) -> &str {
        std::str::from_utf8(&self.target).unwrap_or("/")
    }

    pub fn path(&self) -> &str {
        let t = self.target();
        t.split_once('?').map_or(t, |(path, _)| path)
    }
}

/// The origin-form target of `uri`: its path and query, the path `/` when it has none
/// (RFC 9112 3.2.1: `http://host?q` is forwarded as `/?q`).
fn path_and_query(uri: &http::Uri) -> std::borrow::Cow<'_, str> {
    match uri.path_and_query().map(|p| p.as_str()) {
        None | Some("") => "/".into(),
        Some(query) if query.starts_with('?') => format!("/{query}").into(),
        Some(target) => target.into(),
    }
}

impl From<http::request::Parts> for RequestHead {
    fn from(p: http::request::Parts) -> Self {
        Self {
            method: p.method,
            target: bytes::Bytes::copy_from_slice(path_and_query(&p.uri).as_bytes()),
            version: p.version,
            headers: Headers::Map(p.headers),
        }
    }
}

/// A whole response of the handler's own: `body` with its `content-type`.
pub fn full(
    status: http::StatusCode,
    content_type: &'static str,
    body: impl Into<bytes::Bytes>,
) -> http::Response<Body> {
    use http_body_util::BodyExt as _;
    let mut resp = http::Response::new(
        http_body_util::Full::new(body.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    resp
}

/// A request that could not be read (malformed, too large, too slow): the status it is
/// answered with and why. The handler turns it into its own error body
/// ([`super::server::Handler::refusal_body`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct Refusal {
    pub status: http::StatusCode,
    pub message: String,
}

impl Refusal {
    pub fn new(status: http::StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(http::StatusCode::BAD_REQUEST, message)
    }
}

/// A response to send back. `headers` are the engine's (hop-by-hop fields and framing are
/// left out when written: each leg frames its own messages); `extra` are the agent's own.
pub struct Answer {
    pub status: http::StatusCode,
    pub headers: Headers,
    pub extra: Vec<(http::HeaderName, http::HeaderValue)>,
    pub body: Body,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("extra", &self.extra)
            .finish_non_exhaustive()
    }
}

impl From<http::Response<Body>> for Answer {
    fn from(r: http::Response<Body>) -> Self {
        let (parts, body) = r.into_parts();
        Self {
            status: parts.status,
            headers: Headers::Map(parts.headers),
            extra: Vec::new(),
            body,
        }
    }
}

impl Answer {
    /// As an `http` response, for hyper's server (h2c clients): hop-by-hop fields (those the
    /// engine's `connection` names too) and the engine's `content-length` left out (hyper
    /// frames the body from its size).
    pub fn into_http(self) -> http::Response<Body> {
        let hop = HopByHop::of(&self.headers);
        let mut headers = self.headers.to_map(|n| {
            let n = n.as_str().as_bytes();
            n != b"content-length" && !hop_by_hop(n) && !hop.named(n)
        });
        for (n, v) in self.extra {
            headers.insert(n, v);
        }
        let mut resp = http::Response::new(self.body);
        *resp.status_mut() = self.status;
        *resp.headers_mut() = headers;
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(target: &'static [u8]) -> Option<RequestHead> {
        RequestHead::new(
            http::Method::GET,
            bytes::Bytes::from_static(target),
            http::Version::HTTP_11,
            Headers::default(),
        )
    }

    #[test]
    fn answers_for_h2_clients_leave_hop_by_hop_fields_behind() {
        let mut map = http::HeaderMap::new();
        for (n, v) in [
            ("connection", "x-a"),
            ("x-a", "1"),
            ("keep-alive", "timeout=5"),
            ("content-length", "2"),
            ("x-b", "2"),
        ] {
            map.append(n, v.parse().unwrap());
        }
        let answer = Answer {
            status: http::StatusCode::OK,
            headers: Headers::Map(map),
            extra: vec![(
                http::HeaderName::from_static("x-c"),
                http::HeaderValue::from_static("3"),
            )],
            body: full(http::StatusCode::OK, "text/plain", "ok").into_body(),
        };
        let resp = answer.into_http();
        let names: Vec<_> = resp.headers().keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-b", "x-c"]);
    }

    #[test]
    fn request_targets_in_every_form_forward_their_path_and_query() {
        let h = head(b"/v1/models?x=1").unwrap();
        assert_eq!((h.path(), h.target()), ("/v1/models", "/v1/models?x=1"));
        let h = head(b"http://pod:8000/v1/completions?y").unwrap();
        assert_eq!(
            (h.path(), h.target()),
            ("/v1/completions", "/v1/completions?y")
        );
        let h = head(b"http://pod:8000").unwrap();
        assert_eq!(h.target(), "/");
        // Found by fuzzing (docs/reliability.md): no path before the query.
        let h = head(b"http://pod?x=1").unwrap();
        assert_eq!((h.path(), h.target()), ("/", "/?x=1"));
        assert!(head(b"not a target").is_none());
    }
}
