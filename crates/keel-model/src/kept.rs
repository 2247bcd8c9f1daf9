//! What an [`HttpModel`](crate::HttpModel) keeps between requests so that a step encodes
//! only what is new (issue 16): the tool lists it encoded and the transcripts it encoded, each
//! keyed by the `Arc`s the runtime shares between steps and sessions. A request that matches
//! nothing kept is encoded whole, as it would be without them.

use std::sync::{Arc, Mutex, PoisonError};

use crate::Wire;

/// The encodings one model keeps.
#[derive(Default)]
pub(crate) struct Kept {
    /// The tool lists encoded last (at most [`TOOL_LISTS_KEPT`], the newest last) and their
    /// `tools` JSON on the model's wire. Every step of every session shown the same tools
    /// shares one list (`ModelRequest::tools` is an `Arc`), so its schemas are escaped once, not
    /// at every request (issue 16); a parent and its sub-agents (other lists on the same model)
    /// each keep theirs. The `Arc`s held here keep a list's address from being reused while it
    /// is a key.
    tools: Mutex<Vec<EncodedTools>>,
    /// The transcripts encoded last (at most [`TRANSCRIPTS_KEPT`], the newest last): a step's
    /// transcript is the last step's with messages added (the same `Arc`s), so only the added
    /// ones are escaped and encoded; the rest is copied (issue 16: escaping the whole
    /// transcript at every step was ~16 % of a 199-step run's instructions).
    transcripts: Mutex<Vec<EncodedTranscript>>,
}

/// How many encoded transcripts an [`HttpModel`](crate::HttpModel) keeps (about one per
/// session it serves at once; a session past them is encoded whole at each step, as without
/// the cache).
const TRANSCRIPTS_KEPT: usize = 32;

/// A transcript and its items on one wire ([`crate::body::WriteItems`] of each message,
/// comma-separated, without the brackets).
struct EncodedTranscript {
    messages: Vec<Arc<crate::Message>>,
    items: Vec<u8>,
}

/// How many encoded tool lists an [`HttpModel`](crate::HttpModel) keeps.
const TOOL_LISTS_KEPT: usize = 8;

/// A tool list and its JSON on one wire.
type EncodedTools = (Arc<[crate::ToolSchema]>, Arc<serde_json::value::RawValue>);

impl Kept {
    /// `body` (an object) with the array `key` added last: `first` (an item, encoded), then
    /// the request's messages as `write` encodes them ([`crate::body::each_message`]). The
    /// items of the longest kept transcript that the request's begins with (the same `Arc`s,
    /// in order) are reused and only the messages after them encoded; what they settle is
    /// kept for the next request.
    ///
    /// # Errors
    /// serde_json's encoding error.
    pub(crate) fn with_transcript(
        &self,
        body: &impl serde::Serialize,
        key: &str,
        first: Option<Vec<u8>>,
        request: &crate::ModelRequest,
        write: impl Fn(&[Arc<crate::Message>], &mut Vec<u8>) -> serde_json::Result<(usize, Vec<u8>)>,
    ) -> serde_json::Result<Vec<u8>> {
        let messages = &request.messages;
        let kept = self.take_transcript(messages);
        let (mut items, mut encoded) =
            kept.map_or((Vec::new(), Vec::new()), |t| (t.items, t.messages));
        let done = encoded.len();
        let (settled, open) = write(&messages[done..], &mut items)?;
        let mut out = Vec::with_capacity(items.len() + 1024);
        serde_json::to_writer(&mut out, body)?;
        // `{…}` → `{…,"key":[first,items]}`.
        if out.pop() != Some(b'}') {
            return Err(serde::ser::Error::custom("a request body is not an object"));
        }
        if out.len() > 1 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key)?;
        out.extend_from_slice(b":[");
        let parts = [first.as_deref().unwrap_or_default(), &items, &open];
        for (k, part) in parts.iter().filter(|p| !p.is_empty()).enumerate() {
            if k > 0 {
                out.push(b',');
            }
            out.extend_from_slice(part);
        }
        out.extend_from_slice(b"]}");
        // Only the newly settled messages are added: copying the whole list would touch every
        // message's reference count at every step.
        encoded.extend_from_slice(&messages[done..done + settled]);
        self.keep_transcript(EncodedTranscript {
            messages: encoded,
            items,
        });
        Ok(out)
    }

    /// Takes out the longest kept transcript that `messages` begins with.
    fn take_transcript(&self, messages: &[Arc<crate::Message>]) -> Option<EncodedTranscript> {
        let mut kept = self
            .transcripts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let prefix = |t: &EncodedTranscript| {
            t.messages.len() <= messages.len()
                && t.messages
                    .iter()
                    .zip(messages)
                    .all(|(a, b)| Arc::ptr_eq(a, b))
        };
        let at = (0..kept.len())
            .filter(|&i| prefix(&kept[i]))
            .max_by_key(|&i| kept[i].messages.len())?;
        Some(kept.remove(at))
    }

    /// Keeps `transcript` as the newest, dropping the oldest past [`TRANSCRIPTS_KEPT`].
    fn keep_transcript(&self, transcript: EncodedTranscript) {
        let mut kept = self
            .transcripts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if kept.len() >= TRANSCRIPTS_KEPT {
            kept.remove(0);
        }
        kept.push(transcript);
    }

    /// `tools` as this wire's `tools` array, encoded: `None` for an empty list; a kept
    /// encoding when `tools` is a list it was made of (the same `Arc`), else a new one, kept
    /// for the next requests (the oldest kept one dropped past [`TOOL_LISTS_KEPT`]). The
    /// encoding runs without the lock held.
    ///
    /// # Errors
    /// serde_json's encoding error.
    pub(crate) fn tools(
        &self,
        wire: Wire,
        tools: &Arc<[crate::ToolSchema]>,
    ) -> serde_json::Result<Option<Arc<serde_json::value::RawValue>>> {
        if tools.is_empty() {
            return Ok(None);
        }
        let kept = || self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        let find = |kept: &[EncodedTools]| {
            kept.iter()
                .find(|(list, _)| Arc::ptr_eq(list, tools))
                .map(|(_, json)| json.clone())
        };
        if let Some(json) = find(&kept()) {
            return Ok(Some(json));
        }
        let json: Arc<serde_json::value::RawValue> = Arc::from(match wire {
            Wire::OpenaiChat => serde_json::value::to_raw_value(&crate::openai_chat::tools(tools)),
            Wire::OpenaiResponses => {
                serde_json::value::to_raw_value(&crate::openai_responses::tools(tools))
            }
            Wire::Anthropic => serde_json::value::to_raw_value(&crate::anthropic::tools(tools)),
        }?);
        let mut kept = kept();
        // Another request may have encoded the same list meanwhile.
        if find(&kept).is_none() {
            if kept.len() == TOOL_LISTS_KEPT {
                kept.remove(0);
            }
            kept.push((tools.clone(), json.clone()));
        }
        Ok(Some(json))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use crate::{HttpModel, ModelRequest, ProviderConfig, ToolSchema, Wire};

    fn tool_list(names: &[&str]) -> Arc<[ToolSchema]> {
        names
            .iter()
            .map(|n| ToolSchema {
                name: (*n).to_owned(),
                description: format!("the {n} tool"),
                parameters: json!({"type": "object", "properties": {n.to_string(): {"type": "string"}}}),
            })
            .collect()
    }

    /// The names in a body's `tools` (each wire nests them differently); `None` without tools.
    fn tool_names(body: &Value) -> Option<Vec<String>> {
        let tools = body.get("tools")?.as_array().unwrap();
        Some(
            tools
                .iter()
                .map(|t| {
                    let name = t.get("name").or_else(|| t.pointer("/function/name"));
                    name.and_then(Value::as_str).unwrap().to_owned()
                })
                .collect(),
        )
    }

    /// A body built from a kept transcript is the body a model with nothing kept builds, on
    /// every wire: as the transcript grows by a step, when it diverges
    /// from the kept one (another message where the kept one had its own), when it is shorter
    /// (a re-sampled step), with assistant messages that become no item at all at either end,
    /// with a user entry joining Anthropic's open user message, with and without a system
    /// prompt, and empty.
    #[test]
    fn a_kept_transcript_gives_the_body_a_fresh_encoding_gives() {
        use crate::{Message, ToolCall};
        let user = Arc::new(Message::User {
            content: "go \"now\"\n".into(),
        });
        let call = |k: usize| {
            Arc::new(Message::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCall::new(
                    format!("call_{k}"),
                    "shell",
                    json!({"command": format!("echo {k}")}),
                )],
                reasoning: Vec::new(),
            })
        };
        let result = |k: usize| {
            Arc::new(Message::Tool {
                call_id: format!("call_{k}"),
                content: format!("{k}\n[exit code 0]"),
                is_error: k % 2 == 1,
            })
        };
        let silent = Arc::new(Message::Assistant {
            text: String::new(),
            tool_calls: Vec::new(),
            reasoning: Vec::new(),
        });
        let (c1, r1, c2, r2) = (call(1), result(1), call(2), result(2));
        let transcripts: Vec<Vec<Arc<Message>>> = vec![
            vec![],
            vec![user.clone()],
            vec![user.clone(), c1.clone(), r1.clone()],
            vec![user.clone(), c1.clone(), r1.clone(), c2.clone(), r2.clone()],
            vec![user.clone(), c1.clone(), r1.clone(), call(3), result(3)],
            vec![user.clone(), c1.clone()],
            vec![silent.clone(), user.clone(), c1.clone(), silent.clone()],
            vec![
                silent.clone(),
                user.clone(),
                c1.clone(),
                silent.clone(),
                r1.clone(),
            ],
            vec![silent.clone()],
            // Anthropic: a user entry after a tool result joins the open user message.
            vec![user.clone(), c1.clone(), r1.clone()],
            vec![user.clone(), c1.clone(), r1.clone(), user.clone()],
            vec![
                user.clone(),
                c1.clone(),
                r1.clone(),
                user.clone(),
                silent.clone(),
            ],
            vec![
                user.clone(),
                c1.clone(),
                r1.clone(),
                user.clone(),
                c2.clone(),
                r2.clone(),
            ],
        ];
        for wire in [Wire::OpenaiChat, Wire::OpenaiResponses, Wire::Anthropic] {
            let config = ProviderConfig::new("m").with_base_url("http://127.0.0.1:9/v1");
            let kept = HttpModel::new(wire, config.clone()).unwrap();
            for instructions in [None, Some("be brief".to_owned())] {
                for messages in &transcripts {
                    let request = ModelRequest {
                        instructions: instructions.clone(),
                        messages: messages.clone(),
                        ..ModelRequest::default()
                    };
                    let fresh = HttpModel::new(wire, config.clone()).unwrap();
                    let expected = fresh.request_body(&request).unwrap();
                    assert_eq!(
                        kept.request_body(&request).unwrap(),
                        expected,
                        "{wire:?}: {} messages",
                        messages.len()
                    );
                    if wire == Wire::Anthropic {
                        continue;
                    }
                    let key = if wire == Wire::OpenaiChat {
                        "messages"
                    } else {
                        "input"
                    };
                    let items = expected[key].as_array().unwrap().len();
                    let system = usize::from(wire == Wire::OpenaiChat && instructions.is_some());
                    let silent_ones = messages.iter().filter(|m| Arc::ptr_eq(m, &silent)).count();
                    let expect_items = if wire == Wire::OpenaiChat {
                        messages.len() + system
                    } else {
                        messages.len() - silent_ones
                    };
                    assert_eq!(items, expect_items, "{wire:?}: {expected}");
                }
            }
        }
    }

    /// The encoded tool list is reused only for the list it was made of: another list (even
    /// one of the same length), an empty one and the first one again are each sent as they are,
    /// on every wire, and a list equal to the cached one but not the same `Arc` is encoded
    /// anew to the same JSON.
    #[test]
    fn each_request_is_sent_its_own_tool_list() {
        for wire in [Wire::OpenaiChat, Wire::OpenaiResponses, Wire::Anthropic] {
            let model = HttpModel::new(
                wire,
                ProviderConfig::new("m").with_base_url("http://127.0.0.1:9/v1"),
            )
            .unwrap();
            let (a, b) = (tool_list(&["read", "grep"]), tool_list(&["write", "shell"]));
            let mut request = ModelRequest::default();
            let mut names = |tools: &Arc<[ToolSchema]>| {
                request.tools = tools.clone();
                tool_names(&model.request_body(&request).unwrap())
            };
            let expect = |v: &[&str]| Some(v.iter().map(|s| (*s).to_owned()).collect());
            assert_eq!(names(&a), expect(&["read", "grep"]), "{wire:?}");
            assert_eq!(names(&a), expect(&["read", "grep"]), "{wire:?}");
            assert_eq!(names(&b), expect(&["write", "shell"]), "{wire:?}");
            assert_eq!(names(&Arc::from([])), None, "{wire:?}");
            assert_eq!(names(&a), expect(&["read", "grep"]), "{wire:?}");
            // More lists than are kept, then each again: each still sent its own.
            let many: Vec<Arc<[ToolSchema]>> = (0..super::TOOL_LISTS_KEPT + 3)
                .map(|i| tool_list(&[&format!("t{i}")]))
                .collect();
            for _ in 0..2 {
                for (i, list) in many.iter().enumerate() {
                    assert_eq!(names(list), expect(&[&format!("t{i}")]), "{wire:?}");
                }
            }
            assert_eq!(names(&a), expect(&["read", "grep"]), "{wire:?}");
            let first = model.request_body(&request).unwrap();
            request.tools = tool_list(&["read", "grep"]);
            assert_eq!(model.request_body(&request).unwrap(), first, "{wire:?}");
        }
    }
}
