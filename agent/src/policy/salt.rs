//! Cache isolation: the `cache_salt` an isolated tenant's requests are forwarded with.
//! vLLM folds the salt into the hash of a prompt's first block, so every later block differs
//! too: two tenants with different salts never share a cached block, and one cannot learn
//! from its time to first token what another has sent (docs/policy.md, "Cache isolation").
//!
//! The salt is `wp1-` and 32 hex digits of HMAC-SHA256(key, tenant [0x00 client salt]): a
//! client cannot choose another tenant's salt without the key, and agents sharing the key
//! (the cluster key, or `--cache-salt-key-file`) agree on it, so an isolated tenant's
//! prefixes still route to where they are cached. A client's own salt subdivides its
//! tenant's cache instead of escaping it.

use ring::hmac;

/// Where the key came from (said once in the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaltOrigin {
    /// A key shared with other agents.
    Shared,
    /// Made up at start: isolation holds, but agents do not agree on salts.
    Random,
}

/// The salt key.
#[derive(Debug)]
pub struct CacheSalt {
    key: hmac::Key,
    pub origin: SaltOrigin,
}

impl CacheSalt {
    pub fn new(key: &[u8]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            origin: SaltOrigin::Shared,
        }
    }

    /// A key of this process only.
    pub fn random() -> Self {
        let rng = ring::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng).unwrap_or_else(|_| {
            hmac::Key::new(hmac::HMAC_SHA256, &std::process::id().to_le_bytes())
        });
        Self {
            key,
            origin: SaltOrigin::Random,
        }
    }

    /// The salt of an isolated tenant's request (`client`: the salt the request carried).
    pub fn isolated(&self, tenant: &str, client: Option<&str>) -> String {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(tenant.as_bytes());
        if let Some(c) = client {
            ctx.update(&[0]);
            ctx.update(c.as_bytes());
        }
        let tag = ctx.sign();
        format!("wp1-{}", hex::encode(&tag.as_ref()[..16]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salts_separate_tenants_and_agree_across_agents_with_one_key() {
        let a = CacheSalt::new(b"cluster key one");
        let b = CacheSalt::new(b"cluster key one");
        let other = CacheSalt::new(b"cluster key two");
        let s = a.isolated("team-a", None);
        assert!(s.starts_with("wp1-") && s.len() == 36, "{s}");
        assert_eq!(s, b.isolated("team-a", None), "same key, same salt");
        assert_ne!(s, a.isolated("team-b", None));
        assert_ne!(s, other.isolated("team-a", None));
        assert_ne!(s, a.isolated("team-a", Some("x")));
        // The separator keeps ("ab", None) and ("a", "b") apart.
        assert_ne!(a.isolated("ab", None), a.isolated("a", Some("b")));
        let r1 = CacheSalt::random();
        let r2 = CacheSalt::random();
        assert_ne!(r1.isolated("t", None), r2.isolated("t", None));
        assert_eq!(r1.origin, SaltOrigin::Random);
    }
}
