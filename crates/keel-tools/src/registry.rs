//! The [`ToolRegistry`]: the one path every tool call takes — strict validation against the tool's
//! schema, authorization against the step's frozen policy, execution, and the result budget.
//!
//! Every call ends in exactly one [`ToolResult`] (or, for `ask`, an approval request the runtime
//! persists; the eventual decision again ends in one result). Nothing a model sends can panic or
//! fail the turn: an unknown tool, malformed or invalid arguments become a `rejected` result the
//! model can read and fix.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use futures_util::FutureExt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::builtin::builtin_tools;
use crate::error::ToolsError;
use crate::policy::{Decision, PathAccess, Policy, PolicyRequest, Subject, Verdict};
use crate::tool::{
    EffectClass, Tool, ToolContext, ToolOutput, ToolResult, ToolResultStatus, ToolSpec,
};
use crate::workspace::Workspace;

/// A tool call as the model proposed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRequest {
    /// The call id from the model (or assigned deterministically by the runtime).
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments: a JSON object, or a string holding one (as some providers send them).
    pub arguments: Value,
}

/// A call whose tool exists and whose arguments passed the schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidatedCall {
    /// Call id.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// The arguments object, exactly as validated (hash these for approvals).
    pub arguments: Value,
    /// The tool's effect class.
    pub effect: EffectClass,
    /// Whether it may run in parallel with other parallel-safe calls.
    pub parallel_safe: bool,
}

/// What [`ToolRegistry::dispatch`] did with a call.
#[derive(Debug, Clone)]
pub enum Dispatch {
    /// The call ended (ran, or was rejected or denied); here is its one result.
    Finished(ToolResult),
    /// Policy says ask: persist an approval for `call` (bound to its arguments hash) and run it with
    /// [`ToolRegistry::execute`] once allowed.
    NeedsApproval {
        /// The validated call.
        call: ValidatedCall,
        /// Why approval is needed.
        decision: Decision,
        /// The subject policy evaluated (used to derive `allow_for_session` rules).
        subject: Subject,
    },
}

struct Entry {
    tool: Arc<dyn Tool>,
    spec: ToolSpec,
    /// The schema's validator: compiled when the tool is registered, except for tools whose
    /// schema is a constant of this build (the built-in tools, `register_constant`'s; tests
    /// compile each), compiled the first time a call of the tool is validated — compiling all
    /// of them was an eighth of a one-step `keel run`'s instructions, and a run uses few of
    /// them. The error is the compiler's message.
    validator: OnceLock<Result<jsonschema::Validator, String>>,
}

impl Entry {
    fn validator(&self) -> &Result<jsonschema::Validator, String> {
        self.validator.get_or_init(|| {
            jsonschema::validator_for(&self.spec.input_schema).map_err(|e| e.to_string())
        })
    }
}

/// The set of tools a session can use. Cloning is cheap (the compiled entries are shared).
#[derive(Default, Clone)]
pub struct ToolRegistry {
    entries: BTreeMap<String, Arc<Entry>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `subject` with every path (also those a shell command names) normalized against
/// `workspace`: each path appears as written (lexically normalized) and, when different, as it
/// resolves through symlinks, so a rule on either form applies. The target of a shell
/// redirection that cannot be resolved inside the workspace (a symlink to outside, a dangling
/// one) is also listed as outside; a shell subject comes back marked resolved.
pub fn resolve_subject(subject: Subject, workspace: &Workspace) -> Subject {
    let normalize = |raw: Vec<PathAccess>| {
        let mut out: Vec<PathAccess> = Vec::new();
        let mut add = |entry: PathAccess| {
            if !out.contains(&entry) {
                out.push(entry);
            }
        };
        for access in raw {
            for path in workspace.policy_paths(&access.path) {
                add(PathAccess {
                    inside: !path.starts_with('/'),
                    path,
                    ..access.clone()
                });
            }
            if access.redirect && workspace.resolve(&access.path).is_err() {
                add(PathAccess {
                    inside: false,
                    ..access
                });
            }
        }
        out
    };
    match subject {
        Subject::Paths(raw) => Subject::Paths(normalize(raw)),
        Subject::Command { command, paths, .. } => Subject::Command {
            command,
            paths: normalize(paths),
            resolved: true,
        },
        other @ Subject::Other(_) => other,
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry with every built-in tool.
    ///
    /// Errors: none in practice (built-in schemas are valid); see [`ToolRegistry::register`].
    pub fn with_builtins() -> Result<Self, ToolsError> {
        let mut registry = Self::new();
        for tool in builtin_tools() {
            registry.add(tool, false)?;
        }
        Ok(registry)
    }

    /// Adds `tool`, compiling its schema.
    ///
    /// Errors: [`ToolsError::DuplicateTool`] if the name is taken; [`ToolsError::InvalidSchema`] if
    /// the schema does not compile, is not an object schema, or lacks `additionalProperties: false`.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), ToolsError> {
        self.add(tool, true)
    }

    /// [`ToolRegistry::register`] for a tool whose input schema is a constant of this build (a
    /// runtime's own tool): its validator is compiled at the first validation of a call, not
    /// now. A test of the tool must compile its schema; one that does not compile makes every
    /// call of the tool a `rejected` result saying so.
    ///
    /// Errors: as [`ToolRegistry::register`], but for a schema that does not compile.
    pub fn register_constant(&mut self, tool: Arc<dyn Tool>) -> Result<(), ToolsError> {
        self.add(tool, false)
    }

    /// [`ToolRegistry::register`]; with `compile` false the schema's validator is compiled at
    /// the first validation instead (constant schemas only: see `Entry::validator`).
    fn add(&mut self, tool: Arc<dyn Tool>, compile: bool) -> Result<(), ToolsError> {
        let name = tool.name().to_owned();
        if self.entries.contains_key(&name) {
            return Err(ToolsError::DuplicateTool { name });
        }
        let schema = tool.input_schema();
        let invalid = |reason: String| ToolsError::InvalidSchema {
            tool: name.clone(),
            reason,
        };
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(invalid("the schema must have \"type\": \"object\"".into()));
        }
        if schema.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Err(invalid(
                "the schema must set \"additionalProperties\": false".into(),
            ));
        }
        let validator = OnceLock::new();
        if compile {
            let compiled =
                jsonschema::validator_for(&schema).map_err(|e| invalid(e.to_string()))?;
            let _ = validator.set(Ok(compiled));
        }
        let spec = ToolSpec {
            name: name.clone(),
            description: tool.description().to_owned(),
            input_schema: schema,
            effect: tool.effect(),
            parallel_safe: tool.parallel_safe(),
        };
        self.entries.insert(
            name,
            Arc::new(Entry {
                tool,
                spec,
                validator,
            }),
        );
        Ok(())
    }

    /// This registry plus `tools` (from a [`ToolSource`]), and one notice per tool left out:
    /// a schema the registry refuses ([`ToolRegistry::register`]'s rules) or a name already
    /// taken. What is here is never replaced.
    pub fn extended(&self, tools: Vec<Arc<dyn Tool>>) -> (Self, Vec<String>) {
        let mut out = self.clone();
        let mut notices = Vec::new();
        for tool in tools {
            match out.register(tool) {
                Ok(()) => {}
                Err(ToolsError::InvalidSchema { tool, reason }) => notices.push(format!(
                    "tool `{tool}` is left out: its input schema does not compile ({reason})"
                )),
                Err(ToolsError::DuplicateTool { name }) => notices.push(format!(
                    "tool `{name}` is left out: another tool has that name"
                )),
                Err(e) => notices.push(format!("a tool is left out: {e}")),
            }
        }
        (out, notices)
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.entries.get(name).map(|e| &e.tool)
    }

    /// Specs of every tool, sorted by name (what the model is shown).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.iter_specs().cloned().collect()
    }

    /// Specs of every tool, sorted by name, borrowed (what [`ToolRegistry::specs`] copies).
    pub fn iter_specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.entries.values().map(|e| &e.spec)
    }

    /// Checks that the tool exists and the arguments satisfy its schema exactly.
    ///
    /// Errors: a `rejected` [`ToolResult`] naming the unknown tool (and the known ones) or every
    /// offending field (unknown, wrong type, missing) with the expected shape.
    pub fn validate(&self, call: &ToolCallRequest) -> Result<ValidatedCall, Box<ToolResult>> {
        let reject = |msg: String| {
            Box::new(ToolResult::from_output(
                &call.call_id,
                &call.name,
                ToolOutput::rejected(msg),
            ))
        };
        let Some(entry) = self.entries.get(&call.name) else {
            let known: Vec<&str> = self.entries.keys().map(String::as_str).collect();
            return Err(reject(format!(
                "Unknown tool `{}`. Available tools: {}.",
                call.name,
                known.join(", ")
            )));
        };
        let arguments = match &call.arguments {
            Value::String(text) => match serde_json::from_str::<Value>(text) {
                Ok(v) => v,
                Err(e) => {
                    return Err(reject(format!(
                        "Invalid arguments for `{}`: not valid JSON ({e}). Expected {}.",
                        call.name,
                        shape(&entry.spec.input_schema)
                    )));
                }
            },
            Value::Null => Value::Object(serde_json::Map::new()),
            other => other.clone(),
        };
        let validator = match entry.validator() {
            Ok(v) => v,
            Err(e) => {
                return Err(reject(format!(
                    "The `{}` tool cannot check its arguments: its input schema does not compile ({e}).",
                    call.name
                )));
            }
        };
        let problems: Vec<String> = validator
            .iter_errors(&arguments)
            .map(|e| {
                let at = e
                    .instance_path()
                    .as_str()
                    .trim_start_matches('/')
                    .replace('/', ".");
                if at.is_empty() {
                    format!("- {e}")
                } else {
                    format!("- field `{at}`: {e}")
                }
            })
            .collect();
        if !problems.is_empty() {
            return Err(reject(format!(
                "Invalid arguments for `{}`:\n{}\nExpected {}.",
                call.name,
                problems.join("\n"),
                shape(&entry.spec.input_schema)
            )));
        }
        Ok(ValidatedCall {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments,
            effect: entry.spec.effect,
            parallel_safe: entry.spec.parallel_safe,
        })
    }

    /// The policy subject of `call`, resolved against `workspace` ([`resolve_subject`]).
    pub fn subject(&self, call: &ValidatedCall, workspace: &Workspace) -> Subject {
        let Some(entry) = self.entries.get(&call.name) else {
            return Subject::Other(call.arguments.to_string());
        };
        resolve_subject(entry.tool.subject(&call.arguments), workspace)
    }

    /// Decides `call` against `policy`.
    pub fn authorize(
        &self,
        call: &ValidatedCall,
        workspace: &Workspace,
        policy: &Policy,
    ) -> (Decision, Subject) {
        let subject = self.subject(call, workspace);
        let decision = policy.evaluate(&PolicyRequest {
            tool: &call.name,
            effect: call.effect,
            subject: &subject,
        });
        (decision, subject)
    }

    /// Validates, authorizes against the step snapshot's policy and, if allowed, executes.
    pub async fn dispatch(&self, call: &ToolCallRequest, ctx: &ToolContext) -> Dispatch {
        let validated = match self.validate(call) {
            Ok(v) => v,
            Err(result) => return Dispatch::Finished(*result),
        };
        let (decision, subject) = self.authorize(&validated, &ctx.workspace, &ctx.snapshot.policy);
        match decision.verdict {
            Verdict::Allow => Dispatch::Finished(self.execute(&validated, ctx).await),
            Verdict::Deny => Dispatch::Finished(ToolResult::from_output(
                &validated.call_id,
                &validated.name,
                ToolOutput::rejected(format!(
                    "Permission denied for `{}`: {}. The call was not run; do not retry it unchanged — choose another way or ask the user.",
                    validated.name, decision.reason
                )),
            )),
            Verdict::Ask => Dispatch::NeedsApproval {
                call: validated,
                decision,
                subject,
            },
        }
    }

    /// Runs an already validated and authorized call and applies the result budget.
    pub async fn execute(&self, call: &ValidatedCall, ctx: &ToolContext) -> ToolResult {
        let Some(entry) = self.entries.get(&call.name) else {
            return ToolResult::from_output(
                &call.call_id,
                &call.name,
                ToolOutput::rejected(format!("Unknown tool `{}`.", call.name)),
            );
        };
        if ctx.cancel.is_cancelled() {
            return ToolResult::from_output(
                &call.call_id,
                &call.name,
                ToolOutput::cancelled(format!("`{}` was cancelled before it started", call.name)),
            );
        }
        // A bug in a tool is the tool's failure, not the runtime's: a panic becomes an error
        // result (and, for a side effect, an unknown outcome) instead of a lost task.
        let run = std::panic::AssertUnwindSafe(entry.tool.call(call.arguments.clone(), ctx));
        let mut result = match run.catch_unwind().await {
            Ok(output) => ToolResult::from_output(&call.call_id, &call.name, output),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                tracing::error!(tool = %call.name, "the tool panicked: {what}");
                let mut r = ToolResult::from_output(
                    &call.call_id,
                    &call.name,
                    ToolOutput::error(format!(
                        "Error: `{}` failed with an internal error and may not have finished; check its effect before retrying.",
                        call.name
                    )),
                );
                r.panicked = true;
                return r;
            }
        };
        apply_budget(&mut result, ctx).await;
        result
    }
}

/// Cuts `result.content` to `ctx.limits.result_budget_chars` characters (head and tail kept), storing
/// the full text as an artifact and pointing to it.
pub async fn apply_budget(result: &mut ToolResult, ctx: &ToolContext) {
    let budget = ctx.limits.result_budget_chars;
    let total = result.content.chars().count();
    if total <= budget {
        return;
    }
    let pointer = match ctx
        .artifacts
        .put(
            &result.call_id,
            "result",
            result.content.clone().into_bytes(),
        )
        .await
    {
        Ok(r) => {
            let text = format!(
                "the full result is stored: read it with read_file {{\"path\": \"{}\"}} (offset/limit to page)",
                r.uri()
            );
            if result.artifact.is_none() {
                result.artifact = Some(r);
            }
            text
        }
        Err(e) => format!("the full result could not be stored: {e}"),
    };
    let marker_budget = 400.min(budget / 2);
    let keep = budget.saturating_sub(marker_budget);
    let head_len = keep * 2 / 3;
    let tail_len = keep - head_len;
    let head: String = result.content.chars().take(head_len).collect();
    let tail: String = result.content.chars().skip(total - tail_len).collect();
    let cut = total - head_len - tail_len;
    let mut marker = format!(
        "\n… [{cut} characters cut: the result was {total} characters, over the {budget}-character budget; {pointer}] …\n"
    );
    if marker.chars().count() > marker_budget {
        marker = marker.chars().take(marker_budget).collect();
    }
    result.content = format!("{head}{marker}{tail}");
    result.truncated = true;
    if let Value::Object(map) = &mut result.details {
        map.insert("result_chars".into(), Value::from(total));
    }
}

/// A one-line description of a schema's fields: `{path: string (required), offset: integer}`.
fn shape(schema: &Value) -> String {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let fields: Vec<String> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| {
            props
                .iter()
                .map(|(name, prop)| {
                    let ty = prop.get("type").and_then(Value::as_str).unwrap_or("any");
                    if required.contains(&name.as_str()) {
                        format!("{name}: {ty} (required)")
                    } else {
                        format!("{name}: {ty}")
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "an object with exactly these fields {{{}}}",
        fields.join(", ")
    )
}

/// Whether a status means the tool did not run.
pub fn did_not_run(status: ToolResultStatus) -> bool {
    status == ToolResultStatus::Rejected
}
