//! The admin API's bearer token: read once from a file, kept only as its SHA-256 digest,
//! compared in constant time.

use std::path::Path;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// Shortest token accepted: 16 characters of a random token are 80+ bits even in hex.
pub const MIN_TOKEN_LEN: usize = 16;
/// Largest token file read (a token is a line, not a document).
const MAX_TOKEN_FILE: u64 = 4096;

/// The token `/status` and `/metrics` require (`Authorization: Bearer <token>`).
///
/// Only the digest is kept: the token itself is not in the agent's memory after start-up,
/// and `Debug` prints nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// From the token text (surrounding whitespace removed).
    pub fn new(token: &str) -> Result<Self, String> {
        let token = token.trim();
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "the token must be at least {MIN_TOKEN_LEN} characters (it is {})",
                token.len()
            ));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the token must be printable ASCII without spaces (it is sent as an HTTP header)"
                    .into(),
            );
        }
        Ok(Self {
            digest: Sha256::digest(token.as_bytes()).into(),
        })
    }

    /// Reads the token from `path` (one line; a trailing newline is fine).
    pub fn from_file(path: &Path) -> Result<Self, String> {
        Self::new(&read_token_file(path)?)
    }

    /// Whether `presented` is the token. Both sides are hashed first, so the comparison
    /// takes the same time whatever the presented length and wherever it differs.
    pub fn verify(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        bool::from(digest.ct_eq(&self.digest))
    }
}

/// The token in `path`, trimmed; errors name the file, never its content.
pub fn read_token_file(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    let mut text = String::new();
    file.take(MAX_TOKEN_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{shown}: cannot read: {e}"))?;
    if text.len() as u64 > MAX_TOKEN_FILE {
        return Err(format!(
            "{shown}: larger than {MAX_TOKEN_FILE} bytes; expected one token"
        ));
    }
    Ok(text.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_only_the_token() {
        let t = AdminToken::new("  s3cret-admin-token-0123\n").unwrap();
        assert!(t.verify(b"s3cret-admin-token-0123"));
        assert!(!t.verify(b"s3cret-admin-token-0124"));
        assert!(!t.verify(b"s3cret-admin-token-012"));
        assert!(!t.verify(b""));
        assert_eq!(format!("{t:?}"), "AdminToken(<redacted>)");
    }

    #[test]
    fn weak_or_unsendable_tokens_are_refused() {
        let e = AdminToken::new("short").unwrap_err();
        assert!(e.contains("at least 16"), "{e}");
        let e = AdminToken::new("has a space inside it ok").unwrap_err();
        assert!(e.contains("printable ASCII"), "{e}");
    }

    #[test]
    fn the_config_file_reads_the_token_file() {
        let path =
            std::env::temp_dir().join(format!("warmpath-admin-{}.token", std::process::id()));
        std::fs::write(&path, "file-admin-token-0123456789\n").unwrap();
        let doc = |admin: &str, file: &str| {
            format!(
                "version: 1\nadmin: \"{admin}\"\nadminTokenFile: {file}\npools:\n- name: p\n  model: m\n  endpoints: [{{url: http://127.0.0.1:1}}]\n"
            )
        };
        let c = super::super::file::parse(&doc("0.0.0.0:9090", &path.display().to_string()), "f")
            .unwrap();
        assert!(
            c.admin_token
                .unwrap()
                .verify(b"file-admin-token-0123456789")
        );
        let e = super::super::file::parse(&doc("127.0.0.1:9090", "/nonexistent/t"), "f")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("f: adminTokenFile: /nonexistent/t: cannot read"),
            "{e}"
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn file_errors_name_the_file() {
        let e = AdminToken::from_file(Path::new("/nonexistent/warmpath-token")).unwrap_err();
        assert!(
            e.starts_with("/nonexistent/warmpath-token: cannot read"),
            "{e}"
        );
    }
}
