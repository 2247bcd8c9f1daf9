//! Keyed content hashes: what a tool journals about content it must not reveal.
//!
//! A file tool's `prepare` probe records the hash of a file before a write and of the content
//! it will write, so `reconcile` can tell after a crash whether the write happened. A plain
//! SHA-256 of that content, kept in the journal, lets anyone who reads the journal test guesses
//! of it — a file holding a short password falls to a dictionary. These hashes are
//! HMAC-SHA256 (RFC 2104) under a key derived from the deployment's secret (the runtime's seal
//! key), spelled `hmac-sha256:<64 lowercase hex digits>`: comparable by every worker of the
//! deployment, useless for guessing without its key. Plain `sha256:<hex>` probes of older
//! journals are still compared as they are.

use std::fmt::Write as _;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of a keyed hash.
pub const KEYED_PREFIX: &str = "hmac-sha256:";

/// The prefix of a plain hash (`keel_core::canonical::bytes_hash`), as older journals hold.
pub const PLAIN_PREFIX: &str = "sha256:";

/// The key of the keyed hashes a deployment journals.
#[derive(Clone)]
pub struct HashKey([u8; 32]);

impl std::fmt::Debug for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HashKey(..)")
    }
}

impl HashKey {
    /// The key derived from `secret` (the deployment's seal key) for `purpose`: HMAC-SHA256 of
    /// `purpose` under `secret`, so the hash key reveals nothing of the secret and differs per
    /// purpose.
    pub fn derive(secret: &[u8], purpose: &str) -> Self {
        let mut mac = new_mac(secret);
        mac.update(purpose.as_bytes());
        Self(mac.finalize().into_bytes().into())
    }

    /// `hmac-sha256:<hex>` of `bytes`.
    pub fn hash(&self, bytes: &[u8]) -> String {
        let mut h = self.hasher();
        h.update(bytes);
        h.finish()
    }

    /// A hasher for content that arrives in pieces.
    pub fn hasher(&self) -> KeyedHasher {
        KeyedHasher(new_mac(&self.0))
    }
}

/// An HMAC-SHA256 of content given in pieces ([`HashKey::hasher`]).
pub struct KeyedHasher(Hmac<Sha256>);

impl KeyedHasher {
    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// `hmac-sha256:<hex>` of everything added.
    pub fn finish(self) -> String {
        let mut out = String::from(KEYED_PREFIX);
        for b in self.0.finalize().into_bytes() {
            let _ = write!(out, "{b:02x}");
        }
        out
    }
}

fn new_mac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length: `new_from_slice` cannot fail.
    <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231 test case 2 (key "Jefe"), through `derive`'s primitive.
    #[test]
    fn the_hash_is_hmac_sha256() {
        let k = HashKey(*b"Jefe\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0");
        // A 32-byte key zero-padded is the same HMAC key as the 4-byte one (RFC 2104 pads).
        assert_eq!(
            k.hash(b"what do ya want for nothing?"),
            "hmac-sha256:5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let a = HashKey::derive(b"deployment", "probe");
        assert_ne!(
            a.hash(b"x"),
            HashKey::derive(b"deployment", "other").hash(b"x")
        );
        assert_ne!(
            a.hash(b"x"),
            HashKey::derive(b"another", "probe").hash(b"x")
        );
        let mut h = a.hasher();
        h.update(b"hel");
        h.update(b"lo");
        assert_eq!(h.finish(), a.hash(b"hello"));
    }
}
