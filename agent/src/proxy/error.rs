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
}

impl ProxyError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
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
        full(self.status, "application/json", self.body())
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
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
        StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT => "BadGatewayError",
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
}
