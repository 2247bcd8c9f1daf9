//! Tool progress into the session's live delta stream: each call's output is redacted as a
//! stream (a secret split across two chunks is still caught) before any subscriber sees it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use keel_core::SessionId;
use keel_tools::tool::{ProgressSink, ToolProgress};

use crate::redact::{Redactor, StreamRedactor};
use crate::shared::Active;
use crate::subscribe::{Delta, DeltaKind};

/// Tool progress into the session's delta buffer, redacted per call as a stream (a secret
/// split across two output chunks is still caught).
pub(crate) struct HubProgress {
    pub(crate) sender: crate::subscribe::DeltaSender,
    pub(crate) session: SessionId,
    pub(crate) active: Arc<Active>,
    pub(crate) redactor: Arc<Redactor>,
    pub(crate) streams: Mutex<HashMap<String, StreamRedactor>>,
}

impl HubProgress {
    fn send(&self, call_id: &str, progress: ToolProgress) {
        self.sender.send(Delta {
            session_id: self.session,
            after_seq: self.active.version.load(Ordering::SeqCst),
            kind: DeltaKind::ToolProgress {
                call_id: call_id.to_owned(),
                progress,
            },
        });
    }

    /// Sends what the call's output stream still holds back (the call has finished).
    pub(crate) fn finish(&self, call_id: &str) {
        let rest = self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(call_id)
            .map(|mut s| s.finish());
        if let Some(text) = rest.filter(|t| !t.is_empty()) {
            self.send(call_id, ToolProgress::Output { text });
        }
    }
}

impl ProgressSink for HubProgress {
    fn report(&self, call_id: &str, progress: ToolProgress) {
        let progress = match progress {
            ToolProgress::Output { text } => {
                let text = self
                    .streams
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(call_id.to_owned())
                    .or_insert_with(|| StreamRedactor::new(self.redactor.clone()))
                    .push(&text);
                if text.is_empty() {
                    return;
                }
                ToolProgress::Output { text }
            }
            ToolProgress::Status { text } => ToolProgress::Status {
                text: self.redactor.redact_str(&text),
            },
        };
        self.send(call_id, progress);
    }
}
