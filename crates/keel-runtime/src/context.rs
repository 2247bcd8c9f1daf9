//! Context projection: what the model sees for one step, frozen once per step.
//!
//! A [`ContextSnapshot`] holds the instructions (the release's, then the workspace's `AGENTS.md`
//! if present), the transcript after the last compaction boundary (preceded by the compaction
//! summary), the tool schemas visible under the step's policy, and that policy. The step's
//! proposed calls are validated and authorized against this same snapshot.
//!
//! **Token estimate.** The provider's own count first: the last completed step's
//! `usage.input_tokens` is the exact size of the context it was sampled on, so the next step's
//! context is that number plus an estimate of the items added since (the step's assistant item
//! and its tool results) — see [`crate::journal::TokenAnchor`]. Only when there is no such
//! count (the first step, a provider that reports none, or right after a compaction moved the
//! boundary) is the whole context estimated. Estimates are bytes / 4 (rounded up) plus 4 tokens
//! of framing per item — a byte-based estimator instead of a tokenizer (tiktoken-rs would add a
//! large build for a figure that only decides *when* to compact, and it is exact for no
//! provider but OpenAI's). Each transcript item is estimated once when it is added to the
//! [`crate::journal::Projection`] and cached there; a step adds cached numbers, it never
//! re-tokenizes the transcript. (Changes of the instructions or tool list since the counted
//! step — `AGENTS.md` edited, a tool allowed for the session — are not re-counted until the
//! next step reports its usage.)

use std::sync::Arc;

use keel_model::{Message, ModelRequest, ReasoningItem, RequestPurpose, ToolSchema};
use keel_tools::ToolRegistry;
use keel_tools::policy::{Policy, PolicyRequest, Subject, Verdict};
use keel_tools::tool::EffectClass;
use keel_tools::workspace::Workspace;
use serde::{Serialize, Serializer};

use crate::journal::Projection;

pub use crate::tokens::{estimate_message_tokens, estimate_tokens};

/// The heading the compaction summary is shown under.
pub const SUMMARY_PREFIX: &str =
    "Summary of the earlier conversation (older messages were compacted):\n";

/// What the model sees for one step.
#[derive(Debug, Clone, Serialize)]
pub struct ContextSnapshot {
    /// System prompt.
    pub instructions: String,
    /// Transcript after the last compaction boundary (the summary first, as a user message).
    /// The items are the projection's own (`Arc`-shared, not copied); serialized as plain
    /// messages.
    #[serde(serialize_with = "shared_messages")]
    pub messages: Vec<Arc<Message>>,
    /// Tools the model may call: a list shared with every snapshot showing the same tools of
    /// the same registry (and with the request made from it); serialized as the plain list.
    #[serde(serialize_with = "shared_tools")]
    pub tools: Arc<[ToolSchema]>,
    /// Index of the first transcript item shown.
    pub first_item: u64,
    /// Estimated tokens of the whole request.
    pub estimated_tokens: u64,
    /// The policy calls of this step are authorized against.
    #[serde(skip)]
    pub policy: Policy,
}

/// Serializes shared messages as the messages themselves.
fn shared_messages<S: Serializer>(messages: &[Arc<Message>], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(messages.iter().map(|m| &**m))
}

/// Serializes a shared tool list as the list itself.
fn shared_tools<S: Serializer>(tools: &Arc<[ToolSchema]>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(tools.iter())
}

impl ContextSnapshot {
    /// The model request for this snapshot: the transcript items and the tool list are shared
    /// with it (a copy of the pointers, not of the items).
    pub fn request(&self, purpose: RequestPurpose, response_index: u64) -> ModelRequest {
        ModelRequest {
            instructions: (!self.instructions.is_empty()).then(|| self.instructions.clone()),
            messages: self.messages.clone(),
            tools: self.tools.clone(),
            purpose,
            response_index: Some(response_index),
            ..ModelRequest::default()
        }
    }
}

/// Whether `tool` is visible under `policy`: hidden when the policy denies every use of it
/// (a bare `deny <tool>` rule, or a mode that denies its effect class).
fn visible(policy: &Policy, name: &str, effect: EffectClass) -> bool {
    let subject = Subject::Other(String::new());
    policy
        .evaluate(&PolicyRequest {
            tool: name,
            effect,
            subject: &subject,
        })
        .verdict
        != Verdict::Deny
}

/// The workspace's `AGENTS.md`, read as the file tools read (a repository's file is untrusted
/// input): beneath the workspace root only — a symlink to a file outside it (another
/// tenant's workspace, `/proc/self/environ`, keel's config) or to keel's own files inside it
/// is left out, as is anything but a regular file (a FIFO is never waited on) or a file over
/// 1 MiB, or a hard link (another name of a file elsewhere, such as keel's seal key). `None`
/// when there is none or it is left out (logged at debug).
pub fn read_agents_md(workspace: &Workspace) -> Option<String> {
    let resolved = workspace
        .resolve("AGENTS.md")
        .map_err(|e| tracing::debug!("AGENTS.md left out: {e}"))
        .ok()?;
    if !resolved.exists {
        return None;
    }
    // A hard link is the same file under another name, and the path checks cannot see what
    // else names it (keel's seal key, a config elsewhere on the filesystem): left out.
    let links = workspace
        .open_read(&resolved.beneath, "AGENTS.md")
        .map_err(|e| e.to_string())
        .and_then(|opened| {
            use std::os::unix::fs::MetadataExt;
            opened
                .file
                .metadata()
                .map(|m| m.nlink())
                .map_err(|e| e.to_string())
        })
        .map_err(|e| tracing::debug!("AGENTS.md left out: {e}"))
        .ok()?;
    if links > 1 {
        tracing::debug!("AGENTS.md left out: it is a hard link ({links} names)");
        return None;
    }
    workspace
        .read_regular(
            &resolved.beneath,
            "AGENTS.md",
            keel_tools::files::MAX_CONFIG_BYTES,
        )
        .map_err(|e| tracing::debug!("AGENTS.md left out: {e}"))
        .ok()
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// Builds the snapshot for the next step. `exact_reasoning` gives, by transcript index, the
/// reasoning items an assistant item is sent with in place of its projected ones: the active
/// turn's sealed reasoning, exactly as the provider sent it (see [`crate::seal`]). Inspection
/// passes none, so a projected context never shows hidden reasoning.
pub fn project(
    instructions: &str,
    agents_md: Option<&str>,
    allowed_tools: &[String],
    registry: &Arc<ToolRegistry>,
    policy: Policy,
    proj: &Projection,
    exact_reasoning: &[(usize, Vec<ReasoningItem>)],
) -> ContextSnapshot {
    let mut system = instructions.to_owned();
    if let Some(agents) = agents_md {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str("# AGENTS.md (workspace instructions)\n\n");
        system.push_str(agents.trim_end());
    }
    let (tools, tool_tokens) = crate::tool_schemas::shown_tools(registry, |name, effect| {
        (allowed_tools.is_empty() || allowed_tools.iter().any(|a| a == name))
            && visible(&policy, name, effect)
    });
    let first = usize::try_from(proj.first_kept)
        .unwrap_or(usize::MAX)
        .min(proj.items.len());
    let mut messages = Vec::with_capacity(proj.items.len() - first + 1);
    let mut tokens = estimate_tokens(&system) + tool_tokens;
    if let Some(summary) = &proj.summary {
        let m = Message::User {
            content: format!("{SUMMARY_PREFIX}{summary}"),
        };
        tokens += estimate_message_tokens(&m);
        messages.push(Arc::new(m));
    }
    let shown_from = messages.len();
    messages.extend(proj.items[first..].iter().cloned());
    for (item, exact) in exact_reasoning {
        // Only these items are copied (the snapshot's own version replaces the shared one).
        if let Some(m) = item
            .checked_sub(first)
            .and_then(|i| messages.get_mut(shown_from + i))
            && matches!(&**m, Message::Assistant { .. })
            && let Message::Assistant { reasoning, .. } = Arc::make_mut(m)
        {
            reasoning.clone_from(exact);
        }
    }
    tokens += proj.item_tokens[first..].iter().sum::<u64>();
    if let Some(a) = proj.anchor
        && a.first_kept == proj.first_kept
        && (first..=proj.items.len()).contains(&a.items)
    {
        // The provider counted everything up to `a.items`; estimate only what came after.
        tokens = a.input_tokens + proj.item_tokens[a.items..].iter().sum::<u64>();
    }
    ContextSnapshot {
        instructions: system,
        messages,
        tools,
        first_item: first as u64,
        estimated_tokens: tokens,
        policy,
    }
}

/// Indices after `from` where a kept range may start: a `user` or `assistant` item (never a
/// `tool` item, which must follow its call).
pub fn boundaries(proj: &Projection, from: u64) -> Vec<u64> {
    proj.items
        .iter()
        .enumerate()
        .skip(
            usize::try_from(from)
                .unwrap_or(usize::MAX)
                .saturating_add(1),
        )
        .filter(|(_, m)| !matches!(&***m, Message::Tool { .. }))
        .map(|(i, _)| i as u64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_is_a_quarter_of_the_bytes_rounded_up() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("abcde"), 2);
        assert_eq!(
            estimate_message_tokens(&Message::User {
                content: "abcdefgh".into()
            }),
            6
        );
    }
}
