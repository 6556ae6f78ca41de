//! Every error the proxy answers with, as an OpenAI/vLLM error body, defined once.

use bytes::Bytes;
use http::StatusCode;

use crate::http::{Body, Refusal, message::full};

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ProxyError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
    /// Seconds for a `Retry-After` field (429 and 503: when trying again may succeed).
    pub retry_after: Option<u32>,
}

impl ProxyError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            // The proxy's own 503s (no endpoint could take the request) pass with the
            // engines' recovery: a second is a fair first wait.
            retry_after: (status == StatusCode::SERVICE_UNAVAILABLE).then_some(1),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn model_not_found(model: &str) -> Self {
        Self {
            param: Some("model"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("The model `{model}` does not exist."),
            )
        }
    }

    /// `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Bytes {
        body(self.status, &self.message, self.param)
    }

    pub fn into_response(self) -> http::Response<Body> {
        let mut resp = full(self.status, "application/json", self.body());
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(s));
        }
        resp
    }
}

impl From<Refusal> for ProxyError {
    fn from(r: Refusal) -> Self {
        Self::new(r.status, r.message)
    }
}

/// The OpenAI/vLLM error type of a status.
fn kind(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST
        | StatusCode::PAYLOAD_TOO_LARGE
        | StatusCode::REQUEST_TIMEOUT
        | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "BadRequestError",
        StatusCode::NOT_FOUND => "NotFoundError",
        StatusCode::TOO_MANY_REQUESTS => "RateLimitError",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
        StatusCode::BAD_GATEWAY => "BadGatewayError",
        StatusCode::GATEWAY_TIMEOUT => "GatewayTimeoutError",
        _ => "InternalServerError",
    }
}

/// An error body: `{"error": {"message", "type", "param", "code"}}` (also the body of the
/// HTTP/1.1 server's refusals).
pub fn body(status: StatusCode, message: &str, param: Option<&'static str>) -> Bytes {
    let v = serde_json::json!({"error": {"message": message, "type": kind(status),
        "param": param, "code": status.as_u16()}});
    Bytes::from(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_openai_shaped() {
        let v: serde_json::Value =
            serde_json::from_slice(&ProxyError::model_not_found("x").body()).unwrap();
        assert_eq!(v["error"]["type"], "NotFoundError");
        assert_eq!(v["error"]["code"], 404);
        assert_eq!(v["error"]["param"], "model");
    }

    #[test]
    fn busy_answers_say_when_to_retry() {
        let e = ProxyError {
            retry_after: Some(3),
            ..ProxyError::new(StatusCode::TOO_MANY_REQUESTS, "full")
        };
        let resp = e.clone().into_response();
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "3");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["type"], "RateLimitError");
        assert_eq!(v["error"]["code"], 429);
        let none = ProxyError::new(StatusCode::SERVICE_UNAVAILABLE, "No endpoint is available.");
        assert_eq!(
            none.into_response().headers()[http::header::RETRY_AFTER],
            "1"
        );
        let bad = ProxyError::bad_request("x").into_response();
        assert!(bad.headers().get(http::header::RETRY_AFTER).is_none());
    }
}
