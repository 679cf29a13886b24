//! Chat templates: the model's Jinja template rendered the way Hugging Face's
//! `apply_chat_template` renders it.
//!
//! Hugging Face uses a sandboxed Jinja2 environment with `trim_blocks` and `lstrip_blocks`,
//! a `raise_exception` function, `strftime_now`, and a `tojson` filter that is Python's
//! `json.dumps(..., ensure_ascii=False)`: `", "` and `": "` separators, no HTML escaping.
//! minijinja with its Python-compatibility methods (`.strip()`, `.items()`, ...) gives the
//! same output; `tojson` is replaced by a Python-style one here because minijinja's escapes
//! `<`, `>` and `&`, which would change the prompt.
//!
//! OpenAI clients send tool-call `arguments` as a JSON string, while templates expect an
//! object (`tool_call.arguments | tojson`); [`ChatTemplate::render`] parses them first, as
//! vLLM does.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde};
use minijinja::{Environment, Error, ErrorKind, Value as JinjaValue};
use serde_json::Value;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the strings templates may refer to.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> anyhow::Result<Self> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build()?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<JinjaValue, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_function("strftime_now", |format: String| -> Result<String, Error> { Ok(strftime_now(&format)) });
        env.add_filter("tojson", python_tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string()).context("the chat template does not compile")?;
        Ok(Self { env, bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// Renders `messages` (OpenAI chat messages) with optional `tools` (OpenAI tool objects).
    /// With `add_generation_prompt`, the text ends where the assistant's answer starts.
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> anyhow::Result<String> {
        let messages: Vec<Value> = messages.iter().map(normalise_message).collect();
        let template = self.env.get_template(TEMPLATE_NAME)?;
        let context = minijinja::context! {
            messages => JinjaValue::from(Serde(&messages)),
            tools => tools.filter(|t| !t.is_empty()).map(|t| JinjaValue::from(Serde(t))),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        template.render(context).map_err(|e| anyhow!("the chat template failed: {e:#}"))
    }
}

/// Parses string `arguments` of assistant tool calls into objects.
fn normalise_message(message: &Value) -> Value {
    let mut message = message.clone();
    if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            if let Some(function) = call.get_mut("function")
                && let Some(Value::String(text)) = function.get("arguments")
                && let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(text)
            {
                function["arguments"] = parsed;
            }
        }
    }
    message
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn python_tojson(value: JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json =
        serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_python_json(&json, indent, 0, &mut out);
    Ok(JinjaValue::from_safe_string(out))
}

fn write_python_json(value: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let item_separator = if indent.is_some() { "," } else { ", " };
    match value {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_separator);
                }
                newline(out, depth + 1);
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_separator);
                }
                newline(out, depth + 1);
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(": ");
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `strftime` of the current UTC time for the directives templates use
/// (`%Y %m %d %b %B %H %M %S %%`).
fn strftime_now(format: &str) -> String {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    let secs_of_day = seconds.rem_euclid(86_400);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('b') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new("", "", "").unwrap();
        let env = &t.env;
        let out = env
            .render_str(
                "{{ x | tojson }}",
                minijinja::context! { x => Serde(json!({"a": [1, "<b>"], "c": {}, "B": 2})) },
            )
            .unwrap();
        assert_eq!(out, r#"{"a": [1, "<b>"], "c": {}, "B": 2}"#);
        let out = env
            .render_str("{{ x | tojson(indent=2) }}", minijinja::context! { x => Serde(json!({"a": [1]})) })
            .unwrap();
        assert_eq!(out, "{\n  \"a\": [\n    1\n  ]\n}");
    }

    #[test]
    fn dates_from_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn tool_call_arguments_become_objects() {
        let source = "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(source, "", "").unwrap();
        let messages =
            [json!({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{\"x\":1}"}}]})];
        assert_eq!(t.render(&messages, None, false).unwrap(), r#"{"x": 1}"#);
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&[], None, true).unwrap_err();
        assert!(format!("{err:#}").contains("no system role"), "{err:#}");
    }
}
