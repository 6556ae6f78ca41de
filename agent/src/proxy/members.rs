//! Top-level members the proxy sets in a request body before forwarding it: the model a
//! traffic split chose, an isolated tenant's `cache_salt`. The body has already been read
//! as a JSON object ([`super::request::Request::read`]).
//!
//! A member the body does not hold is inserted right after the opening brace, copying
//! nothing else (the common case: clients rarely send `cache_salt`). A member it may hold
//! (the key as written, or any `\u` escape that could spell it) is replaced by a full
//! rewrite — never by appending a second occurrence: which occurrence counts differs
//! between JSON readers (vLLM's takes the last, strict ones refuse duplicates).

use bytes::Bytes;

/// `body` with each `(key, value)` string member set.
pub fn set_members(body: &Bytes, members: &[(&str, String)]) -> Bytes {
    if members.is_empty() {
        return body.clone();
    }
    let escapes = memchr::memmem::find(body, b"\\u").is_some();
    let present =
        |k: &str| escapes || memchr::memmem::find(body, format!("\"{k}\"").as_bytes()).is_some();
    if members.iter().any(|(k, _)| present(k)) {
        return rewrite(body, members);
    }
    let Some(open) = body.iter().position(|&b| b == b'{') else {
        return body.clone();
    };
    let empty = body[open + 1..]
        .iter()
        .all(|b| b.is_ascii_whitespace() || *b == b'}');
    let mut out = Vec::with_capacity(body.len() + 64 * members.len());
    out.extend_from_slice(&body[..=open]);
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Strings serialize infallibly.
        out.extend_from_slice(&serde_json::to_vec(k).unwrap_or_default());
        out.push(b':');
        out.extend_from_slice(&serde_json::to_vec(v).unwrap_or_default());
    }
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(&body[open + 1..]);
    out.into()
}

fn rewrite(body: &Bytes, members: &[(&str, String)]) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return body.clone();
    };
    let Some(o) = v.as_object_mut() else {
        return body.clone();
    };
    for (k, val) in members {
        o.insert((*k).to_string(), serde_json::Value::String(val.clone()));
    }
    serde_json::to_vec(&v).map_or_else(|_| body.clone(), Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(body: &str, members: &[(&str, &str)]) -> serde_json::Value {
        let m: Vec<(&str, String)> = members.iter().map(|(k, v)| (*k, v.to_string())).collect();
        let out = set_members(&Bytes::from(body.to_string()), &m);
        serde_json::from_slice(&out).expect("still JSON")
    }

    #[test]
    fn members_are_inserted_or_replaced_never_duplicated() {
        let v = set(r#"{"model":"a","prompt":"x"}"#, &[("cache_salt", "s1")]);
        assert_eq!(
            v,
            serde_json::json!({"cache_salt":"s1","model":"a","prompt":"x"})
        );
        let v = set(
            r#" { "model":"a" } "#,
            &[("model", "b"), ("cache_salt", "s")],
        );
        assert_eq!(v, serde_json::json!({"model":"b","cache_salt":"s"}));
        let v = set(r#"{}"#, &[("cache_salt", "s")]);
        assert_eq!(v, serde_json::json!({"cache_salt":"s"}));
        // A key spelt with an escape is still the same member.
        let raw = r#"{"cache\u005fsalt":"client","prompt":"x"}"#;
        let out = set_members(&Bytes::from(raw), &[("cache_salt", "t".into())]);
        let text = std::str::from_utf8(&out).unwrap();
        assert_eq!(text.matches("cache_salt").count(), 1, "{text}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(text).unwrap()["cache_salt"],
            "t"
        );
        // Values with quotes are escaped.
        let v = set(r#"{"prompt":"x"}"#, &[("model", "a\"b")]);
        assert_eq!(v["model"], "a\"b");
        let body = Bytes::from_static(b"{\"prompt\":1}");
        assert_eq!(set_members(&body, &[]), body);
    }
}
