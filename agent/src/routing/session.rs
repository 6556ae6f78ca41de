//! Where a request's session key comes from (the input of the session scorer,
//! [`super::RequestCtx::session`]): a header, else a cookie.

use crate::http::Headers;

/// Header a client may send for session affinity.
pub const DEFAULT_SESSION_HEADER: &str = "x-session-id";

/// Where a request's session key comes from: a header, else a cookie.
#[derive(Debug, Clone)]
pub struct SessionSource {
    pub header: http::HeaderName,
    pub cookie: Option<String>,
}

impl Default for SessionSource {
    fn default() -> Self {
        Self {
            header: http::HeaderName::from_static(DEFAULT_SESSION_HEADER),
            cookie: None,
        }
    }
}

impl SessionSource {
    /// The session key of a request, if it carries one.
    pub fn key(&self, headers: &Headers) -> Option<String> {
        if let Some(v) = headers
            .get(self.header.as_str())
            .and_then(|v| std::str::from_utf8(v).ok())
        {
            return Some(v.to_string());
        }
        let name = self.cookie.as_deref()?;
        headers
            .get_all("cookie")
            .filter_map(|v| std::str::from_utf8(v).ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.trim_matches('"').to_string())
    }
}
