//! Secrets and digests: new random secrets (publish keys, admin tokens),
//! their SHA-256 digests (what is stored), hex, and the one comparison of
//! digests, in constant time, so a secret cannot be found byte by byte.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A SHA-256 digest from its 64 hex digits.
pub fn digest_from_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A fresh random secret (publish keys, generated admin tokens).
pub fn new_secret(prefix: &str) -> String {
    format!("{prefix}{}", hex(&rand::random::<[u8; 24]>()))
}

/// The SHA-256 of a secret: what the registry keeps of it.
pub fn key_digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Whether `presented` is the secret whose digest is `want`, compared in
/// constant time.
pub fn matches(want: &[u8; 32], presented: &str) -> bool {
    want.ct_eq(&key_digest(presented)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_and_compare() {
        let d = key_digest("pk_x");
        assert_eq!(digest_from_hex(&hex(&d)), Some(d));
        assert_eq!(digest_from_hex("zz"), None);
        assert_eq!(digest_from_hex(&"é".repeat(32)), None);
        assert!(matches(&d, "pk_x"));
        assert!(!matches(&d, "pk_y"));
        assert!(new_secret("pk_").starts_with("pk_") && new_secret("pk_").len() == 51);
    }
}
