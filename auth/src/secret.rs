//! Opaque secrets: 256 random bits, shown once, kept as a SHA-256 hash and compared
//! in constant time. A stolen journal or database holds no usable token.

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A new secret: `PREFIX_` then 43 URL-safe characters (256 bits). The prefix says
/// what it is for when one turns up in a log or a paste (`allot` for user tokens,
/// `allot-enroll` for enrollment tokens).
pub fn new_secret(prefix: &str) -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!(
        "{prefix}_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// The stored form of a secret: its SHA-256, in hex.
pub fn hash_secret(secret: &str) -> String {
    let digest = Sha256::digest(secret.trim().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether two stored hashes are equal, in time that does not depend on where they
/// differ.
pub fn same_hash(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_new_each_time_and_carry_their_prefix() {
        let a = new_secret("allot").expect("random");
        let b = new_secret("allot").expect("random");
        assert_ne!(a, b);
        assert!(
            a.starts_with("allot_") && a.len() == "allot_".len() + 43,
            "{a}"
        );
        assert!(a[6..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }

    #[test]
    fn a_secret_matches_only_its_own_hash() {
        let a = new_secret("allot").expect("random");
        let b = new_secret("allot").expect("random");
        assert!(same_hash(&hash_secret(&a), &hash_secret(&a)));
        // Whitespace from a copy and paste does not matter.
        assert!(same_hash(&hash_secret(&a), &hash_secret(&format!("{a}\n"))));
        assert!(!same_hash(&hash_secret(&a), &hash_secret(&b)));
        assert!(!same_hash(&hash_secret(&a), ""));
        assert_eq!(hash_secret("abc").len(), 64);
    }
}
