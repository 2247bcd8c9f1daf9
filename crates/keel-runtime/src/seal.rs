//! Sealed rows: what must reach a tool or a provider exactly, while the journal keeps it
//! redacted or not at all.
//!
//! **Arguments.** A tool runs exactly the arguments the model proposed (the approval hash is of
//! those), while events, the transcript and the store show them redacted. A call can wait — for
//! an approval decided on another worker, across a drain or a crash — so the exact arguments of
//! every unfinished call whose redacted form differs are kept in the store's sealed rows (kind
//! `arguments`, keyed by the call). The row commits with the call's `tool_call.proposed` (which
//! says `sealed: true`) and is deleted in the commit that journals its `tool_call.finished`. A
//! sealed call whose row cannot be opened (another key, a lost row) is never run with its
//! redacted arguments: it gets an error result instead.
//!
//! **Reasoning.** No hidden chain of thought is stored past its turn. Within a turn's tool loop
//! a provider needs its reasoning back unmodified — Anthropic each `thinking` block (text and
//! signature) and `redacted_thinking` block, OpenAI Responses its encrypted `reasoning` items —
//! so a step's reasoning items are sealed exact (kind `reasoning`, keyed by the step) in the
//! commit of its `step.completed`, which journals only their count (`reasoning_sealed`). Steps
//! of the active turn get them back from the row (after a crash or on another worker too); the
//! row is deleted in the commit of the turn's `turn.finished` (a turn waiting in
//! `requires_action` keeps them: its tool loop is still open), and finished turns are sent
//! without reasoning (both providers accept that for earlier turns). With the session setting
//! `keep_reasoning` the items are also journaled, redacted, in `step.completed.reasoning`. The
//! rows are never redacted: a redacted signature or encrypted item would be refused. A row that
//! does not open is left out, with a warning (the provider may then refuse the request).
//!
//! Rows are encrypted with ChaCha20-Poly1305 (RFC 8439) under a deployment key that never enters
//! the store or an event, bound to tenant, session and call or step. The key is 32 random
//! bytes. [`SealKey::load_or_create`] keeps it in a file of mode 0600 (in a 0700 directory when
//! it creates one) and refuses a key file others can read.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use keel_core::{Correlation, EventBody, StateMachine, StepId, ToolCallId};
use keel_model::ReasoningItem;
use keel_store::{SealedKey, SealedKind};
use keel_tools::keyed_hash::HashKey;
use serde_json::Value;

use crate::error::{Result, RuntimeError};
use crate::journal::Journal;

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// Bytes of the nonce that prefixes each sealed row.
const NONCE_BYTES: usize = 12;
/// What the hash key is derived for (changing it changes every keyed hash).
const HASH_KEY_PURPOSE: &str = "keel-journal-hash/v1";

/// A deployment's key for sealed rows, and the key of the hashes its journals keep
/// ([`SealKey::hash_key`]).
#[derive(Clone)]
pub struct SealKey {
    cipher: ChaCha20Poly1305,
    hash_key: HashKey,
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
            hash_key: HashKey::derive(bytes, HASH_KEY_PURPOSE),
        }
    }

    /// The key of the keyed hashes the runtime journals (a tool's `prepare` probe, an effect's
    /// `request_hash`; see [`keel_tools::keyed_hash`]): derived from this key, so every worker
    /// of the deployment computes the same hashes and nobody without the key can test guesses
    /// of the content against them.
    pub fn hash_key(&self) -> &HashKey {
        &self.hash_key
    }

    /// Reads the key at `path`, or creates one there (mode 0600; its directory 0700 when this
    /// creates it).
    ///
    /// Creation is atomic: the key is written to a temporary file (0600) in the same directory,
    /// flushed to disk, and linked into place only if no file is there yet (the directory is
    /// flushed too). A process killed while creating leaves no key file (at most a stray
    /// `.seal.key.*` temporary); processes starting at once end with the one key the first of
    /// them linked — the others read it.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidInput`] naming the file when it cannot be read or written, is not
    /// exactly 32 bytes (saying what to do: an empty file never held a key and can be removed),
    /// or can be read by group or others.
    pub fn load_or_create(path: &Path) -> Result<Self> {
        let bad = |what: String| {
            RuntimeError::InvalidInput(format!("seal key {}: {what}", path.display()))
        };
        // A creator that loses the race reads the winner's key; a file that vanishes between
        // the two (removed by hand) is created again, a few times at most.
        for _ in 0..3 {
            // A regular file only, and no more than a key's worth (the length is checked next).
            match keel_tools::files::read_regular_file(path, 4096) {
                Ok(bytes) => return Self::from_file(path, bytes).map_err(bad),
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
                    match create_key_file(path) {
                        Ok(key) => return Ok(Self::from_bytes(&key)),
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(bad(format!("cannot create it: {e}"))),
                    }
                }
                Err(e) => return Err(bad(e.to_string())),
            }
        }
        Err(bad(
            "it keeps disappearing while keel creates and reads it; check what removes it".into(),
        ))
    }

    /// The key in the file at `path`, whose content is `bytes`; the error says what is wrong
    /// with the file and what to do.
    fn from_file(path: &Path, bytes: Vec<u8>) -> std::result::Result<Self, String> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .map_err(|e| e.to_string())?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(format!(
                    "mode {:04o} lets others read it; run `chmod 600 {}`",
                    mode & 0o7777,
                    path.display()
                ));
            }
        }
        let bytes: [u8; KEY_BYTES] = bytes.try_into().map_err(|b: Vec<u8>| {
            if b.is_empty() {
                format!(
                    "the file is empty (0 bytes, expected {KEY_BYTES}): no key was ever written to it, \
                     so nothing is sealed with it; remove it (`rm {}`) and keel creates a new key",
                    path.display()
                )
            } else {
                format!(
                    "{} bytes, expected {KEY_BYTES}: this is not a keel seal key; put the \
                     deployment's key file back, or remove it to create a new key (sealed \
                     arguments and secret values of existing sessions then no longer open)",
                    b.len()
                )
            }
        })?;
        Ok(Self::from_bytes(&bytes))
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

/// Writes a new random key to a temporary file (0600) beside `path`, flushes it, and links it
/// to `path` unless something is there already (`AlreadyExists`: another process won the race).
fn create_key_file(path: &Path) -> std::io::Result<[u8; KEY_BYTES]> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let key: [u8; KEY_BYTES] = ChaCha20Poly1305::generate_key(&mut OsRng).into();
    let mut builder = tempfile::Builder::new();
    builder.prefix(".seal.key.");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o600));
    }
    let mut tmp = builder.tempfile_in(dir)?;
    tmp.write_all(&key)?;
    tmp.as_file().sync_all()?;
    tmp.persist_noclobber(path).map_err(|e| e.error)?;
    // The new directory entry, durable too (best effort: not every filesystem syncs a
    // directory).
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(key)
}

impl Journal {
    /// Reads the session's sealed rows and opens them with `key`, which also seals what this
    /// journal stages from now on. A row that does not open (another deployment key, an altered
    /// row) is left out: its call never runs (see [`Journal::exact_arguments`]), its step's
    /// reasoning is not sent back.
    ///
    /// # Errors
    /// Store errors.
    pub(crate) async fn unseal(&mut self, key: SealKey) -> Result<()> {
        let open_calls = self
            .state
            .tool_calls
            .values()
            .any(|c| c.sealed && !c.status.is_terminal());
        if open_calls {
            for (call, sealed) in self
                .store
                .sealed_rows(self.tenant, self.session, SealedKind::Arguments)
                .await?
            {
                let id = ToolCallId::from(call.as_str());
                let plain = key.open(self.arguments_context(&id).as_bytes(), &sealed);
                match plain.and_then(|p| serde_json::from_slice::<Value>(&p).ok()) {
                    Some(args) => {
                        self.exact.insert(id, args);
                    }
                    None => tracing::warn!(
                        session = %self.session, call = %id,
                        "sealed arguments do not open with this deployment's key; the call will not run"
                    ),
                }
            }
        }
        let sealed_steps: Vec<StepId> = self
            .proj
            .turn_reasoning
            .iter()
            .filter(|r| r.sealed > 0)
            .map(|r| r.step)
            .collect();
        if !sealed_steps.is_empty() {
            let mut rows: HashMap<String, Vec<u8>> = self
                .store
                .sealed_rows(self.tenant, self.session, SealedKind::Reasoning)
                .await?
                .into_iter()
                .collect();
            for step in sealed_steps {
                let plain = rows
                    .remove(&step.to_string())
                    .and_then(|row| key.open(self.reasoning_context(step).as_bytes(), &row));
                match plain.and_then(|p| serde_json::from_slice::<Vec<ReasoningItem>>(&p).ok()) {
                    Some(items) => {
                        self.reasoning.insert(step, items);
                    }
                    None => tracing::warn!(
                        session = %self.session, step = %step,
                        "sealed reasoning is missing or does not open with this deployment's key; the step's reasoning will not be sent back"
                    ),
                }
            }
        }
        self.seal_key = Some(key);
        Ok(())
    }

    /// What a sealed arguments row of `call` is bound to (it does not open for another call).
    fn arguments_context(&self, call: &ToolCallId) -> String {
        format!(
            "keel-sealed-arguments/{}/{}/{call}",
            self.tenant, self.session
        )
    }

    /// What a sealed reasoning row of `step` is bound to.
    fn reasoning_context(&self, step: StepId) -> String {
        format!(
            "keel-sealed-reasoning/{}/{}/{step}",
            self.tenant, self.session
        )
    }

    /// The arguments call `call` runs with: exactly what the model proposed, or a journaled
    /// `pre_tool_use` hook's rewrite of them (`hook.ran`). `None` when the
    /// call is unknown, or its journaled arguments were redacted and the exact ones are not
    /// available (a sealed row that did not open): such a call must not run.
    pub(crate) fn exact_arguments(&self, call: &ToolCallId) -> Option<Value> {
        let c = self.state.tool_calls.get(call)?;
        if c.sealed {
            self.exact.get(call).cloned()
        } else {
            Some(c.arguments.clone())
        }
    }

    /// The exact reasoning of the active turn's assistant items, by transcript index: what the
    /// next request sends back in place of the projection's own (see
    /// [`crate::context::project`]).
    pub(crate) fn exact_reasoning(&self) -> Vec<(usize, Vec<ReasoningItem>)> {
        self.proj
            .turn_reasoning
            .iter()
            .filter_map(|r| Some((r.item, self.reasoning.get(&r.step)?.clone())))
            .collect()
    }

    /// Whether the session journals reasoning (`keep_reasoning` in its effective config).
    fn keeps_reasoning(&self) -> bool {
        self.state.config.get("keep_reasoning") == Some(&Value::Bool(true))
    }

    /// Seals what must not be journaled as it is, before the items are redacted: the exact
    /// arguments of each proposal whose redaction changes them (marking it `sealed`; the call's
    /// result deletes the row), and the reasoning items of each completed step (counting them
    /// in `reasoning_sealed` and, unless the session keeps reasoning, leaving them out of the
    /// event; the turn's end deletes the rows). The rows are staged to commit with the events.
    pub(crate) fn seal_items(&mut self, items: &mut [(Correlation, EventBody)]) {
        for (corr, body) in items.iter_mut() {
            match body {
                EventBody::ToolCallProposed {
                    arguments, sealed, ..
                } => {
                    let Some(call) = corr.tool_call_id.clone() else {
                        continue;
                    };
                    let mut shown = arguments.clone();
                    self.redactor.redact_value(&mut shown);
                    if shown == *arguments {
                        continue;
                    }
                    *sealed = true;
                    if let Some(key) = &self.seal_key {
                        let plain = arguments.to_string();
                        let row =
                            key.seal(self.arguments_context(&call).as_bytes(), plain.as_bytes());
                        self.stage_seal(SealedKey::new(SealedKind::Arguments, call.as_str()), row);
                        self.exact.insert(call, arguments.clone());
                    }
                }
                EventBody::HookRan {
                    arguments: Some(arguments),
                    sealed,
                    ..
                } => {
                    // A hook's rewrite: the call runs these from now on, so they replace the
                    // proposal's exact arguments — sealed when redaction changes them, and a
                    // sealed proposal's row deleted when it does not.
                    let Some(call) = corr.tool_call_id.clone() else {
                        continue;
                    };
                    let mut shown = arguments.clone();
                    self.redactor.redact_value(&mut shown);
                    let key = SealedKey::new(SealedKind::Arguments, call.as_str());
                    if shown == *arguments {
                        if self.exact.remove(&call).is_some()
                            || self.state.tool_calls.get(&call).is_some_and(|c| c.sealed)
                        {
                            self.stage_unseal(key);
                        }
                        continue;
                    }
                    *sealed = true;
                    if let Some(seal_key) = &self.seal_key {
                        let plain = arguments.to_string();
                        let row = seal_key
                            .seal(self.arguments_context(&call).as_bytes(), plain.as_bytes());
                        self.stage_seal(key, row);
                        self.exact.insert(call, arguments.clone());
                    }
                }
                EventBody::ToolCallFinished { .. } => {
                    let Some(call) = corr.tool_call_id.clone() else {
                        continue;
                    };
                    if self.exact.remove(&call).is_some()
                        || self.state.tool_calls.get(&call).is_some_and(|c| c.sealed)
                    {
                        self.stage_unseal(SealedKey::new(SealedKind::Arguments, call.as_str()));
                    }
                }
                EventBody::StepCompleted {
                    reasoning,
                    reasoning_sealed,
                    ..
                } if !reasoning.is_empty() => {
                    let Some(step) = corr.step_id else {
                        continue;
                    };
                    let exact: Vec<ReasoningItem> = reasoning
                        .iter()
                        .filter_map(|v| serde_json::from_value(v.clone()).ok())
                        .collect();
                    if let (Some(key), Ok(plain)) = (&self.seal_key, serde_json::to_vec(&exact))
                        && !exact.is_empty()
                    {
                        let row = key.seal(self.reasoning_context(step).as_bytes(), &plain);
                        self.stage_seal(
                            SealedKey::new(SealedKind::Reasoning, step.to_string()),
                            row,
                        );
                        *reasoning_sealed = u32::try_from(exact.len()).unwrap_or(u32::MAX);
                        self.reasoning.insert(step, exact);
                    }
                    if !self.keeps_reasoning() {
                        reasoning.clear();
                    }
                }
                EventBody::TurnFinished { .. } => {
                    // One active turn: every sealed reasoning row belongs to it. (The rows in
                    // memory go once the projection has let go of the turn's reasoning; see
                    // `Journal::prune_reasoning`.)
                    let mut steps: Vec<StepId> = self.reasoning.keys().copied().collect();
                    steps.extend(
                        self.proj
                            .turn_reasoning
                            .iter()
                            .filter(|r| r.sealed > 0)
                            .map(|r| r.step),
                    );
                    steps.sort();
                    steps.dedup();
                    for step in steps {
                        self.stage_unseal(SealedKey::new(SealedKind::Reasoning, step.to_string()));
                    }
                }
                _ => {}
            }
        }
    }

    /// Forgets exact reasoning the projection no longer places (a finished turn's, or of a
    /// step whose staging was refused).
    pub(crate) fn prune_reasoning(&mut self) {
        let placed = &self.proj.turn_reasoning;
        self.reasoning
            .retain(|s, _| placed.iter().any(|r| r.step == *s));
    }

    /// Stages row `key` to be written with the staged events (replacing a staged delete).
    fn stage_seal(&mut self, key: SealedKey, row: Vec<u8>) {
        self.extras.unseal.retain(|k| *k != key);
        self.extras.seal.retain(|(k, _)| *k != key);
        self.extras.seal.push((key, row));
    }

    /// Stages the deletion of row `key` with the staged events (dropping a staged write).
    fn stage_unseal(&mut self, key: SealedKey) {
        self.extras.seal.retain(|(k, _)| *k != key);
        if !self.extras.unseal.contains(&key) {
            self.extras.unseal.push(key);
        }
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

    /// Processes starting at once on a fresh deployment all end with the one key (before, the
    /// losers of `create_new` failed, or read the winner's file before it was written and
    /// refused it as 0 bytes). Threads stand in for the processes: the file system is the
    /// same. Many rounds, so the race is met.
    #[test]
    fn creators_racing_on_a_fresh_key_file_all_get_the_one_key() {
        for round in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("keys/seal.key");
            let start = std::sync::Arc::new(std::sync::Barrier::new(8));
            let keys: Vec<SealKey> = (0..8)
                .map(|_| {
                    let (path, start) = (path.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        SealKey::load_or_create(&path)
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap()
                        .unwrap_or_else(|e| panic!("round {round}: {e}"))
                })
                .collect();
            let row = keys[0].seal(b"c", b"x");
            for k in &keys {
                assert_eq!(
                    k.open(b"c", &row).as_deref(),
                    Some(&b"x"[..]),
                    "round {round}"
                );
            }
            let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                names,
                vec![std::ffi::OsString::from("seal.key")],
                "no temporary left"
            );
        }
    }

    /// An empty key file (left by an interrupted creation before creation was atomic) is a
    /// clear error that names the file and says what to do; removing it lets keel go on.
    #[cfg(unix)]
    #[test]
    fn an_empty_key_file_is_a_clear_error_naming_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seal.key");
        std::fs::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = SealKey::load_or_create(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("empty") && err.contains("rm "), "{err}");
        std::fs::remove_file(&path).unwrap();
        SealKey::load_or_create(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap().len(), KEY_BYTES);
    }
}
