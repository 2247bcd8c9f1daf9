//! Sealed arguments: the exact arguments of a tool call whose journaled form was redacted.
//!
//! A tool runs exactly the arguments the model proposed (the approval hash is of those), while
//! events, the transcript and the store show them redacted. A call can wait — for an approval
//! decided on another worker, across a drain or a crash — so the exact arguments of every
//! unfinished call whose redacted form differs are kept in the store's sealed rows (kind `arguments`),
//! encrypted with ChaCha20-Poly1305 (RFC 8439) under a deployment key that never enters the
//! store or an event. The row commits with the call's `tool_call.proposed` (which says
//! `sealed: true`) and is deleted in the commit that journals its `tool_call.finished`. A sealed
//! call whose row cannot be opened (another key, a lost row) is never run with its redacted
//! arguments: it gets an error result instead.
//!
//! The key is 32 random bytes. [`SealKey::load_or_create`] keeps it in a file of mode 0600 (in
//! a 0700 directory when it creates one) and refuses a key file others can read.

use std::io::Write;
use std::path::Path;

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};

use crate::error::{Result, RuntimeError};

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// Bytes of the nonce that prefixes each sealed row.
const NONCE_BYTES: usize = 12;

/// A deployment's key for sealed arguments.
#[derive(Clone)]
pub struct SealKey {
    cipher: ChaCha20Poly1305,
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    /// A fresh random key, known only to this process: rows it sealed cannot be opened after a
    /// restart (the calls waiting on them get an error result, never redacted arguments).
    pub fn ephemeral() -> Self {
        Self::from_bytes(&ChaCha20Poly1305::generate_key(&mut OsRng).into())
    }

    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8; KEY_BYTES]) -> Self {
        Self {
            cipher: ChaCha20Poly1305::new(Key::from_slice(bytes)),
        }
    }

    /// Reads the key at `path`, or creates one there (mode 0600; its directory 0700 when this
    /// creates it).
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] naming the file when it
    /// cannot be read or written, is not exactly 32 bytes, or can be read by group or others.
    pub fn load_or_create(path: &Path) -> Result<Self> {
        let bad = |what: String| {
            RuntimeError::InvalidInput(format!("seal key {}: {what}", path.display()))
        };
        match std::fs::read(path) {
            Ok(bytes) => {
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    let mode = std::fs::metadata(path)
                        .map_err(|e| bad(e.to_string()))?
                        .permissions()
                        .mode();
                    if mode & 0o077 != 0 {
                        return Err(bad(format!(
                            "mode {:04o} lets others read it; run `chmod 600 {}`",
                            mode & 0o7777,
                            path.display()
                        )));
                    }
                }
                let bytes: [u8; KEY_BYTES] = bytes.try_into().map_err(|b: Vec<u8>| {
                    bad(format!("{} bytes, expected {KEY_BYTES}", b.len()))
                })?;
                Ok(Self::from_bytes(&bytes))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
                    && !dir.exists()
                {
                    let mut b = std::fs::DirBuilder::new();
                    b.recursive(true);
                    #[cfg(unix)]
                    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
                    b.create(dir).map_err(|e| bad(e.to_string()))?;
                }
                let key: [u8; KEY_BYTES] = ChaCha20Poly1305::generate_key(&mut OsRng).into();
                let mut o = std::fs::OpenOptions::new();
                o.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
                let mut f = o.open(path).map_err(|e| bad(e.to_string()))?;
                f.write_all(&key)
                    .and_then(|()| f.sync_all())
                    .map_err(|e| bad(e.to_string()))?;
                Ok(Self::from_bytes(&key))
            }
            Err(e) => Err(bad(e.to_string())),
        }
    }

    /// Encrypts `plain`, bound to `context` (tenant, session and call: a row copied to another
    /// call does not open). Returns nonce ‖ ciphertext ‖ tag.
    pub fn seal(&self, context: &[u8], plain: &[u8]) -> Vec<u8> {
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        let mut out = nonce.to_vec();
        // Encryption with a valid key and nonce cannot fail for inputs under 256 GiB.
        let sealed = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plain,
                    aad: context,
                },
            )
            .unwrap_or_default();
        out.extend(sealed);
        out
    }

    /// Decrypts what [`SealKey::seal`] made for the same `context`; `None` when it was sealed
    /// under another key or context, or was altered.
    pub fn open(&self, context: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE_BYTES {
            return None;
        }
        let (nonce, body) = sealed.split_at(NONCE_BYTES);
        self.cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: body,
                    aad: context,
                },
            )
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_row_opens_only_with_its_key_and_context() {
        let k = SealKey::ephemeral();
        let row = k.seal(b"t/s/call_1", br#"{"token":"s3cr3t"}"#);
        assert!(!row.windows(6).any(|w| w == b"s3cr3t"));
        assert_eq!(
            k.open(b"t/s/call_1", &row).unwrap(),
            br#"{"token":"s3cr3t"}"#
        );
        assert!(k.open(b"t/s/call_2", &row).is_none());
        assert!(SealKey::ephemeral().open(b"t/s/call_1", &row).is_none());
        let mut bent = row.clone();
        *bent.last_mut().unwrap() ^= 1;
        assert!(k.open(b"t/s/call_1", &bent).is_none());
        assert!(k.open(b"t/s/call_1", b"short").is_none());
    }

    #[cfg(unix)]
    #[test]
    fn the_key_file_is_created_0600_in_a_0700_directory_and_refused_when_others_can_read_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/seal.key");
        let k = SealKey::load_or_create(&path).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let row = k.seal(b"c", b"x");
        let again = SealKey::load_or_create(&path).unwrap();
        assert_eq!(again.open(b"c", &row).unwrap(), b"x");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = SealKey::load_or_create(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, b"short").unwrap();
        let err = SealKey::load_or_create(&path).unwrap_err().to_string();
        assert!(err.contains("5 bytes, expected 32"), "{err}");
    }
}
