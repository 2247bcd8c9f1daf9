//! Exit codes: one per terminal reason (docs/ARCHITECTURE.md), so scripts can branch on why a
//! run ended without parsing its output.

use keel_core::TerminalReason;

/// Exit status for command-line usage errors (clap's convention).
pub const USAGE: u8 = 2;

/// A command line keel cannot act on, found after parsing: an empty prompt, `--base-url` for a
/// route without an OpenAI-compatible model. Like clap's errors it exits with [`USAGE`] and is
/// reported on standard error before any stream starts (no `result` line, nothing created).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The exit status of a run that ended with `reason`.
///
/// | reason | code |
/// |---|---|
/// | `completed` | 0 |
/// | `failed` (also: keel could not start the run) | 1 |
/// | (usage error) | 2 |
/// | `requires_action` | 3 |
/// | `aborted` | 4 |
/// | `budget_exhausted` | 5 |
/// | `loop_detected` | 6 |
/// | `prompt_too_long` | 7 |
pub fn code(reason: TerminalReason) -> u8 {
    match reason {
        TerminalReason::Completed => 0,
        TerminalReason::Failed => 1,
        TerminalReason::RequiresAction => 3,
        TerminalReason::Aborted => 4,
        TerminalReason::BudgetExhausted => 5,
        TerminalReason::LoopDetected => 6,
        TerminalReason::PromptTooLong => 7,
    }
}

/// The exit-code table as shown at the end of `keel --help`.
pub const HELP: &str = "\
Exit codes of run and resume (one per terminal reason):
  0  completed          the model ended the turn
  1  failed             an error the runtime could not recover from (or keel could not start)
  2  usage error        the command line was not understood or does not apply (no prompt, --base-url
                        without an OpenAI model, …): reported before any output, no JSONL result line
  3  requires_action    waiting on a human: `keel approve|deny APPROVAL` or `keel resolve KEY`, then `keel resume SESSION`
  4  aborted            cancelled (Ctrl-C or `keel cancel SESSION`); `keel resume SESSION` continues
  5  budget_exhausted   a limit ran out (steps, tokens, cost, tool_calls, wall_time)
  6  loop_detected      the model repeated the same failing call
  7  prompt_too_long    the context stayed over the model's window after compaction
Other commands exit 0 on success and 1 on error.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_a_distinct_documented_code() {
        let mut seen = std::collections::BTreeSet::new();
        for reason in TerminalReason::ALL {
            let c = code(reason);
            assert!(seen.insert(c), "{reason:?} reuses {c}");
            assert_ne!(c, USAGE);
            assert!(
                HELP.contains(&format!("  {c}  {}", reason.as_str())),
                "{reason:?} is documented"
            );
        }
        assert_eq!(code(TerminalReason::Completed), 0);
    }
}
