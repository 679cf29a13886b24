//! Tool calling: from a request's `tools` and `tool_choice` to the `tool-call` plugin's
//! constraint, and from the model's output back to OpenAI `tool_calls`, whole or streamed.
//!
//! The syntax is the one the model's chat template teaches it (see
//! [`dspark_plugin_tool_call::syntax`]): Hermes `<tool_call>` blocks for Qwen2.5 and Hermes
//! templates, Llama-3.1 JSON, Mistral `[TOOL_CALLS]`, and dspark's generic
//! `{"tool_calls": [...]}` for templates with none. A template that does not render `tools`
//! itself gets them, with the generic format, in a system message, and assistant tool calls
//! of the history are written back into its content in that format. The plugin constrains
//! and this module parses with the same table of literals.
//!
//! | `tool_choice` | output |
//! |---|---|
//! | `none` | free text; `tools` only reach the template |
//! | `auto` (the default with `tools`) | free text, or calls once the model opens one (a lazy trigger) |
//! | `required` | one or more calls (one with `parallel_tool_calls: false`) |
//! | `{"type": "function", "function": {"name": N}}` | exactly one call of N |
//!
//! Arguments are written with `", "` and `": "` separators, as templates render them back
//! (`tojson`). A finished answer with calls has `finish_reason: "tool_calls"`; its text before the calls
//! is `content` (`null` when empty). Streams send the name of each call in its first delta
//! (with its id) and the arguments in pieces as they are written. `tools` with a constraining
//! `tool_choice` cannot be combined with another output constraint (`response_format`,
//! `structured_outputs`, `guided_*`): that is a 400 naming `tool_choice`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use dspark_plugin_tool_call::{Format, ParsedCall, valid_name};
use serde_json::{Value, json};

use super::constraint::ConstraintSpec;
use crate::serving::error::ApiError;
use crate::serving::models::Served;

/// What a chat request does with tools.
pub struct ToolPlan {
    /// The syntax the model writes calls in.
    pub format: Format,
    /// Whether the output is parsed for calls (`tool_choice` other than `none`).
    pub parse: bool,
    /// The tool definitions, for the argument check of finished calls.
    pub(super) tools: Vec<Value>,
    pub(super) validators: Vec<OnceLock<Option<jsonschema::Validator>>>,
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls` and returns the plan and the
/// constraint (none for `tool_choice: "none"`). `other` is the request's other output
/// constraint, if any.
pub fn plan(
    served: &Served,
    tools: Option<&[Value]>,
    tool_choice: Option<&Value>,
    parallel: Option<bool>,
    other: Option<&ConstraintSpec>,
) -> Result<Option<(ToolPlan, Option<ConstraintSpec>)>, ApiError> {
    let Some(tools) = tools else {
        if tool_choice.is_some() {
            return Err(ApiError::invalid("tool_choice", "`tool_choice` needs `tools`"));
        }
        return Ok(None);
    };
    for (i, tool) in tools.iter().enumerate() {
        check_tool(i, tool)?;
    }
    let names: Vec<&str> =
        tools.iter().filter_map(|t| t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str)).collect();
    if let Some((i, name)) = names.iter().enumerate().find(|(i, n)| names[..*i].contains(n)) {
        return Err(ApiError::invalid(format!("tools[{i}].function.name"), format!("two tools are named `{name}`")));
    }
    let choice = match tool_choice {
        None => Value::String("auto".into()),
        Some(Value::String(s)) if matches!(s.as_str(), "none" | "auto" | "required") => Value::String(s.clone()),
        Some(named @ Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str).is_none_or(|t| t == "function"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "a named `tool_choice` is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            if !names.contains(&name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` names `{name}`, which is not one of the tools"),
                ));
            }
            named.clone()
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("`tool_choice` must be \"none\", \"auto\", \"required\" or a named function; got {other}"),
            ));
        }
    };
    let format = served.tool_format;
    let constrained = choice != "none";
    let plan = ToolPlan {
        format,
        parse: constrained,
        tools: tools.to_vec(),
        validators: tools.iter().map(|_| OnceLock::new()).collect(),
    };
    if !constrained {
        return Ok(Some((plan, None)));
    }
    if let Some(other) = other {
        return Err(ApiError::invalid(
            "tool_choice",
            format!(
                "`tools` with `tool_choice` {choice} cannot be combined with `{}`; send `tool_choice: \"none\"` or drop one",
                other.field
            ),
        ));
    }
    let source = json!({
        "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel.unwrap_or(true), "format": format.name(),
    });
    let mut spec = ConstraintSpec::tool_call(source.to_string());
    // Arguments in the style chat templates write them back (`tojson`: Python's json.dumps,
    // `", "` and `": "`), so the model continues the style its context shows.
    spec.request.options = json!({"separators": [", ", ": "]}).to_string();
    Ok(Some((plan, Some(spec))))
}

fn check_tool(i: usize, tool: &Value) -> Result<(), ApiError> {
    let field = |f: &str| format!("tools[{i}]{f}");
    let Value::Object(map) = tool else {
        return Err(ApiError::invalid(field(""), format!("`tools[{i}]` must be an object")));
    };
    match map.get("type").and_then(Value::as_str) {
        Some("function") => {}
        _ => {
            return Err(ApiError::invalid(field(".type"), format!("`tools[{i}].type` must be \"function\"")));
        }
    }
    let Some(Value::Object(function)) = map.get("function") else {
        return Err(ApiError::invalid(field(".function"), format!("`tools[{i}].function` must be an object")));
    };
    let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
    if !valid_name(name) {
        return Err(ApiError::invalid(
            field(".function.name"),
            format!(
                "`tools[{i}].function.name` must be 1 to {} letters, digits, `_`, `-`, `.` or `:`; got {:?}",
                dspark_plugin_tool_call::MAX_NAME_BYTES,
                name
            ),
        ));
    }
    if !matches!(function.get("strict"), None | Some(Value::Null) | Some(Value::Bool(_))) {
        return Err(ApiError::invalid(
            field(".function.strict"),
            format!("`tools[{i}].function.strict` must be a boolean"),
        ));
    }
    match function.get("parameters") {
        None | Some(Value::Null | Value::Object(_) | Value::Bool(_)) => Ok(()),
        Some(_) => Err(ApiError::invalid(
            field(".function.parameters"),
            format!("`tools[{i}].function.parameters` must be a JSON Schema object"),
        )),
    }
}

impl ToolPlan {
    /// Whether every call's arguments validate against its tool's parameters; a failure is
    /// counted and logged (it must never happen under the constraint).
    pub fn check(&self, served: &Served, calls: &[ParsedCall]) {
        for call in calls.iter().filter(|c| c.complete) {
            let Some(i) = self.tools.iter().position(|t| t["function"]["name"] == call.name.as_str()) else {
                served.worker.metrics.validation_failures.add(1);
                tracing::error!(model = %served.entry.name, "a tool call names an unknown tool `{}`", call.name);
                continue;
            };
            let validator = self.validators[i].get_or_init(|| {
                let schema = self.tools[i]["function"].get("parameters").cloned().unwrap_or(json!({}));
                jsonschema::validator_for(&schema).ok()
            });
            let valid = serde_json::from_str::<Value>(&call.arguments)
                .is_ok_and(|args| validator.as_ref().is_none_or(|v| v.is_valid(&args)));
            if !valid {
                served.worker.metrics.validation_failures.add(1);
                tracing::error!(model = %served.entry.name, "tool call arguments do not validate: {}", call.arguments);
            }
        }
    }

    /// Splits a finished answer into content and calls.
    pub fn finish(&self, served: &Served, text: &str) -> (Option<String>, Vec<ParsedCall>) {
        let parsed = self.format.syntax().parse(text, true);
        let calls: Vec<ParsedCall> = parsed.calls.into_iter().filter(|c| c.complete).collect();
        self.check(served, &calls);
        if calls.is_empty() {
            return (Some(text.to_string()), calls);
        }
        ((!parsed.content.is_empty()).then_some(parsed.content), calls)
    }
}

/// A fresh tool-call id.
pub fn call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("call_{:016x}{:08x}", nanos, COUNTER.fetch_add(1, Ordering::Relaxed) as u32)
}

/// The OpenAI `tool_calls` of finished calls.
pub fn tool_calls_json(calls: &[ParsedCall]) -> Vec<Value> {
    calls
        .iter()
        .map(|c| json!({"id": call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect()
}

/// The streaming state of one choice: what of its content and calls was sent.
#[derive(Default)]
pub struct ToolStream {
    pub(super) text: String,
    pub(super) content_sent: usize,
    /// Per call: arguments bytes sent (the name and id go in the call's first delta).
    pub(super) args_sent: Vec<usize>,
}

impl ToolStream {
    /// Adds `delta` to the output and returns the chat deltas it makes (content pieces, new
    /// calls, argument pieces); `finished` when the answer has ended.
    pub fn push(&mut self, plan: &ToolPlan, delta: &str, finished: bool) -> Vec<Value> {
        self.text.push_str(delta);
        let parsed = plan.format.syntax().parse(&self.text, finished);
        let mut out = Vec::new();
        if parsed.content.len() > self.content_sent {
            out.push(json!({"content": parsed.content[self.content_sent..]}));
            self.content_sent = parsed.content.len();
        }
        for (index, call) in parsed.calls.iter().enumerate() {
            if index == self.args_sent.len() {
                self.args_sent.push(0);
                out.push(json!({"tool_calls": [{"index": index, "id": call_id(), "type": "function",
                    "function": {"name": call.name, "arguments": ""}}]}));
            }
            let sent = self.args_sent[index];
            if call.arguments.len() > sent {
                out.push(json!({"tool_calls": [{"index": index, "function": {"arguments": call.arguments[sent..]}}]}));
                self.args_sent[index] = call.arguments.len();
            }
        }
        out
    }

    /// The calls of the whole answer (after the last `push`).
    pub fn calls(&self, plan: &ToolPlan) -> Vec<ParsedCall> {
        plan.format.syntax().parse(&self.text, true).calls.into_iter().filter(|c| c.complete).collect()
    }
}

/// The messages as the template should see them: for a template that does not render tools,
/// a system message describing them in the generic format, and earlier assistant calls
/// written into content in that format.
pub fn prepare_messages(served: &Served, messages: Vec<Value>, tools: Option<&[Value]>) -> Vec<Value> {
    let Some(tools) = tools.filter(|t| !t.is_empty()) else { return messages };
    if served.template_renders_tools {
        return messages;
    }
    let syntax = Format::Generic.syntax();
    let mut out = Vec::with_capacity(messages.len() + 1);
    let listing: Vec<String> = tools.iter().map(|t| t.get("function").unwrap_or(t).to_string()).collect();
    let instructions = format!(
        "You can call these tools (JSON Schema of each function's parameters):\n{}\n\nTo call tools, answer with only {}{}<function name>{}<arguments object>{}{}; separate several calls with \"{}\".",
        listing.join("\n"),
        syntax.section_open,
        syntax.call_open,
        syntax.name_to_args,
        syntax.call_close,
        syntax.section_close,
        syntax.call_sep,
    );
    let mut messages = messages.into_iter().peekable();
    match messages.peek() {
        Some(first) if first["role"] == "system" => {
            let mut first = messages.next().unwrap_or_default();
            let content = first["content"].as_str().unwrap_or_default().to_string();
            first["content"] = Value::String(format!("{content}\n\n{instructions}"));
            out.push(first);
        }
        _ => out.push(json!({"role": "system", "content": instructions})),
    }
    for mut m in messages {
        if let Some(calls) = m.get("tool_calls").and_then(Value::as_array).filter(|c| !c.is_empty()) {
            let written: Vec<String> = calls
                .iter()
                .map(|c| {
                    let f = &c["function"];
                    let args = match &f["arguments"] {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    format!(
                        "{}{}{}{args}{}",
                        syntax.call_open,
                        f["name"].as_str().unwrap_or_default(),
                        syntax.name_to_args,
                        syntax.call_close
                    )
                })
                .collect();
            let content = m["content"].as_str().unwrap_or_default().to_string();
            m["content"] = Value::String(format!(
                "{content}{}{}{}",
                syntax.section_open,
                written.join(syntax.call_sep),
                syntax.section_close
            ));
            if let Value::Object(map) = &mut m {
                map.remove("tool_calls");
            }
        }
        out.push(m);
    }
    out
}
