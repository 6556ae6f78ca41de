//! What the servers hand to request handling and get back: a request head and an answer,
//! whose header fields stay as they were read ([`Headers`]) unless an answer of the agent's
//! own carries a map.

use crate::headers::{Headers, hop_by_hop};

use super::Body;

/// A request's head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: http::Method,
    pub uri: http::Uri,
    pub version: http::Version,
    pub headers: Headers,
}

impl RequestHead {
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    /// The request target to forward: path and query.
    pub fn target(&self) -> &str {
        self.uri.path_and_query().map_or("/", |p| p.as_str())
    }
}

impl From<http::request::Parts> for RequestHead {
    fn from(p: http::request::Parts) -> Self {
        Self {
            method: p.method,
            uri: p.uri,
            version: p.version,
            headers: Headers::Map(p.headers),
        }
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
    /// As an `http` response, for hyper's server (h2c clients): hop-by-hop fields and the
    /// engine's `content-length` left out (hyper frames the body from its size).
    pub fn into_http(self) -> http::Response<Body> {
        let mut headers = self
            .headers
            .to_map(|n| n != http::header::CONTENT_LENGTH && !hop_by_hop(n.as_str().as_bytes()));
        for (n, v) in self.extra {
            headers.insert(n, v);
        }
        let mut resp = http::Response::new(self.body);
        *resp.status_mut() = self.status;
        *resp.headers_mut() = headers;
        resp
    }
}
