//! A tenant quota's refusal as the proxy answers it: 429, the OpenAI/vLLM error body every
//! proxy error has (`type` `RateLimitError`, `code` 429; the message names the tenant, the
//! limit and when to retry), and `Retry-After`.

use http::StatusCode;

use crate::{policy::quota::QuotaRefusal, proxy::ProxyError};

impl QuotaRefusal {
    /// The answer to the refused request.
    pub fn into_error(self) -> ProxyError {
        ProxyError::from(self)
    }
}

impl From<QuotaRefusal> for ProxyError {
    fn from(r: QuotaRefusal) -> Self {
        ProxyError {
            retry_after: Some(r.retry_after_secs()),
            ..ProxyError::new(StatusCode::TOO_MANY_REQUESTS, r.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, Instant},
    };

    use crate::policy::quota::{Dimension, QuotaLimits, Quotas};

    #[test]
    fn a_quota_refusal_is_a_429_with_an_openai_body_and_retry_after() {
        let q = Quotas::new();
        let t: Arc<str> = Arc::from("team-a");
        let limits = QuotaLimits {
            requests_per_s: Some(0.4),
            burst: Duration::from_secs(5),
            ..QuotaLimits::default()
        };
        let now = Instant::now();
        let _p = q.admit(&t, &limits, 0, now).unwrap();
        let _p = q.admit(&t, &limits, 0, now).unwrap();
        let refused = q.admit(&t, &limits, 0, now).unwrap_err();
        assert_eq!(refused.dimension, Dimension::Requests);
        // 2 of 2 spent, 1 request at 0.4/s: 2.5 s, so 3.
        let resp = refused.into_error().into_response();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "3");
        let body = futures::executor::block_on(http_body_util::BodyExt::collect(resp.into_body()))
            .unwrap()
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["type"], "RateLimitError");
        assert_eq!(v["error"]["code"], 429);
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("`team-a`") && message.contains("0.4 requests/s"),
            "{message}"
        );
    }
}
