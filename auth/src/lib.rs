//! Who is asking. The pieces allotd and the agent share to prove identities:
//! the cluster CA that signs node certificates ([`pki`]), and opaque secrets
//! (user tokens, enrollment tokens) that are shown once and stored only as hashes
//! ([`secret`]).
//!
//! Pure apart from the operating system's random numbers: no files, no clock (the
//! caller passes the time), no network.

pub mod pki;
pub mod secret;

pub use pki::{Ca, CertInfo, Issued, PkiError};
pub use secret::{hash_secret, new_secret, same_hash};
