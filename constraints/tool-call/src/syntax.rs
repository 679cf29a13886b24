//! The tool-call syntaxes of the model families, and a parser for text written in them.
//!
//! One table per family says which literal texts surround the calls. The plugin constrains
//! output to exactly these texts; the server parses finished and partial output with
//! [`Syntax::parse`] from the same table, so the two can never disagree.
//!
//! | format | one call | between calls | around the calls |
//! |---|---|---|---|
//! | `hermes` (Qwen2.5, Hermes) | `<tool_call>\n{"name": "N", "arguments": A}\n</tool_call>` | `\n` | |
//! | `llama3` (Llama-3.1 JSON) | `{"name": "N", "parameters": A}` | `; ` | |
//! | `mistral` | `{"name": "N", "arguments": A}` | `, ` | `[TOOL_CALLS][` … `]` |
//! | `generic` (templates with no tool syntax) | `{"name": "N", "arguments": A}` | `, ` | `{"tool_calls": [` … `]}` |
//!
//! `A` is the arguments object, compact, as the json-schema plugin writes it. With
//! `tool_choice: "auto"` the model writes free text until it writes the format's trigger
//! (`<tool_call>`, `{"name": "`, `[TOOL_CALLS]`, `{"tool_calls": `); from there on the calls
//! are constrained, and nothing may follow them.

/// A model family's tool-call syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `<tool_call>` blocks (Qwen2.5, Hermes, many fine-tunes).
    Hermes,
    /// Llama-3.1's JSON tool calls.
    Llama3,
    /// Mistral's `[TOOL_CALLS]` list.
    Mistral,
    /// dspark's documented format for chat templates that have none.
    Generic,
}

/// The literal texts of one format (see the module docs).
#[derive(Debug)]
pub struct Syntax {
    /// The text that opens the tool calls; free text before it is content (`auto`).
    pub trigger: &'static str,
    /// Before the first call (starts with, or is a prefix of, `trigger` + `call_open`).
    pub section_open: &'static str,
    /// Before each call's name.
    pub call_open: &'static str,
    /// Between the name and the arguments.
    pub name_to_args: &'static str,
    /// After the arguments.
    pub call_close: &'static str,
    /// Between two calls.
    pub call_sep: &'static str,
    /// After the last call.
    pub section_close: &'static str,
}

const HERMES: Syntax = Syntax {
    trigger: "<tool_call>",
    section_open: "",
    call_open: "<tool_call>\n{\"name\": \"",
    name_to_args: "\", \"arguments\": ",
    call_close: "}\n</tool_call>",
    call_sep: "\n",
    section_close: "",
};
const LLAMA3: Syntax = Syntax {
    trigger: "{\"name\": \"",
    section_open: "",
    call_open: "{\"name\": \"",
    name_to_args: "\", \"parameters\": ",
    call_close: "}",
    call_sep: "; ",
    section_close: "",
};
const MISTRAL: Syntax = Syntax {
    trigger: "[TOOL_CALLS]",
    section_open: "[TOOL_CALLS][",
    call_open: "{\"name\": \"",
    name_to_args: "\", \"arguments\": ",
    call_close: "}",
    call_sep: ", ",
    section_close: "]",
};
const GENERIC: Syntax = Syntax {
    trigger: "{\"tool_calls\": ",
    section_open: "{\"tool_calls\": [",
    call_open: "{\"name\": \"",
    name_to_args: "\", \"arguments\": ",
    call_close: "}",
    call_sep: ", ",
    section_close: "]}",
};

impl Format {
    /// Every format.
    pub const ALL: [Format; 4] = [Format::Hermes, Format::Llama3, Format::Mistral, Format::Generic];

    /// The format's name in sources and docs.
    pub fn name(self) -> &'static str {
        match self {
            Format::Hermes => "hermes",
            Format::Llama3 => "llama3",
            Format::Mistral => "mistral",
            Format::Generic => "generic",
        }
    }

    /// The format of a name.
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The literal texts.
    pub fn syntax(self) -> &'static Syntax {
        match self {
            Format::Hermes => &HERMES,
            Format::Llama3 => &LLAMA3,
            Format::Mistral => &MISTRAL,
            Format::Generic => &GENERIC,
        }
    }

    /// The format a chat template teaches its model, from the template's source: the tool
    /// syntax the template itself writes for assistant tool calls, else [`Format::Generic`].
    pub fn from_chat_template(template: &str) -> Format {
        if template.contains("<tool_call>") {
            Format::Hermes
        } else if template.contains("[TOOL_CALLS]") {
            Format::Mistral
        } else if template.contains("<|python_tag|>") || template.contains("\"parameters\": dictionary") {
            Format::Llama3
        } else {
            Format::Generic
        }
    }

    /// Whether a chat template renders the request's `tools` itself; when it does not, the
    /// server describes them (and the generic format) in a system message.
    pub fn template_renders_tools(template: &str) -> bool {
        template.contains("tools")
    }
}

/// One call found in the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function name (only reported once complete).
    pub name: String,
    /// The arguments text written so far (the whole object once `complete`).
    pub arguments: String,
    /// Whether the arguments object is closed.
    pub complete: bool,
}

/// Output split into content and calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Free text before the calls. When parsing a partial output, a tail that may be the
    /// start of the trigger is held back.
    pub content: String,
    /// The calls, in order; the last may be incomplete in a partial output.
    pub calls: Vec<ParsedCall>,
}

impl Syntax {
    /// `section_open` + `call_open`: the text of the section up to the first name.
    pub fn first_open(&self) -> String {
        format!("{}{}", self.section_open, self.call_open)
    }

    /// Splits `text` (what the model wrote so far, `finished` or not) into content and calls.
    /// Text the syntax does not allow (never produced under the constraint) ends the parse:
    /// what came before is kept.
    pub fn parse(&self, text: &str, finished: bool) -> Parsed {
        let Some(at) = text.find(self.trigger) else {
            let keep = if finished { text.len() } else { text.len() - partial_suffix(text, self.trigger) };
            return Parsed { content: text[..keep].to_string(), calls: Vec::new() };
        };
        let mut parsed = Parsed { content: text[..at].to_string(), calls: Vec::new() };
        let mut rest = &text[at..];
        let first = self.first_open();
        let mut open = first.as_str();
        loop {
            // The literal before the name (possibly cut short by the end of a partial text).
            let Some(after) = strip_literal(rest, open) else { return parsed };
            let Some(end) = after.find('"') else { return parsed };
            let name = after[..end].to_string();
            let Some(args) = strip_literal(&after[end..], self.name_to_args) else {
                return parsed;
            };
            let (len, complete) = json_value_len(args);
            parsed.calls.push(ParsedCall { name, arguments: args[..len].to_string(), complete });
            if !complete {
                return parsed;
            }
            let Some(after_close) = strip_literal(&args[len..], self.call_close) else { return parsed };
            let Some(next) = after_close.strip_prefix(self.call_sep) else { return parsed };
            rest = next;
            open = self.call_open;
        }
    }
}

/// `text` after `literal`, or `None` when `text` does not start with all of it (a partial
/// text that ends inside the literal included).
fn strip_literal<'a>(text: &'a str, literal: &str) -> Option<&'a str> {
    text.strip_prefix(literal)
}

/// The length of the longest proper suffix of `text` that is a prefix of `trigger`.
fn partial_suffix(text: &str, trigger: &str) -> usize {
    let max = (trigger.len() - 1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && trigger.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// The length of the JSON value at the start of `text` and whether it is complete; an
/// incomplete value takes all of `text`. Objects and arrays are delimited by depth (strings
/// and escapes skipped); scalars end at the first byte that cannot continue them.
fn json_value_len(text: &str) -> (usize, bool) {
    let bytes = text.as_bytes();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    if depth == 0 {
                        return (i + 1, true);
                    }
                }
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                if depth == 0 {
                    // The end of a top-level scalar, followed by the call's close.
                    return (i, i > 0);
                }
                depth -= 1;
                if depth == 0 {
                    return (i + 1, true);
                }
            }
            _ if depth == 0 && !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.')) => {
                return (i, i > 0);
            }
            _ => {}
        }
    }
    (bytes.len(), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_output_splits_into_content_and_calls() {
        let s = Format::Hermes.syntax();
        let text = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>";
        let p = s.parse(text, true);
        assert_eq!(p.content, "Let me check.");
        assert_eq!(
            p.calls,
            vec![
                ParsedCall { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into(), complete: true },
                ParsedCall { name: "time".into(), arguments: "{}".into(), complete: true },
            ]
        );
        let m = Format::Mistral.syntax();
        let p = m.parse(
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\":[1,\"]}\"]}}, {\"name\": \"b\", \"arguments\": {}}]",
            true,
        );
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].arguments, "{\"x\":[1,\"]}\"]}");
    }

    #[test]
    fn partial_output_holds_back_a_possible_trigger_and_streams_arguments() {
        let s = Format::Hermes.syntax();
        assert_eq!(s.parse("Sure <tool", false), Parsed { content: "Sure ".into(), calls: vec![] });
        assert_eq!(s.parse("Sure <tool", true).content, "Sure <tool");
        let p = s.parse("<tool_call>\n{\"name\": \"get_wea", false);
        assert!(p.calls.is_empty(), "a name is reported only once complete");
        let p = s.parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Pa", false);
        assert_eq!(
            p.calls,
            vec![ParsedCall { name: "get_weather".into(), arguments: "{\"city\":\"Pa".into(), complete: false }]
        );
    }

    #[test]
    fn formats_follow_the_chat_template() {
        assert_eq!(Format::from_chat_template("{{ '<tool_call>\\n' }}"), Format::Hermes);
        assert_eq!(Format::from_chat_template("[TOOL_CALLS]"), Format::Mistral);
        assert_eq!(Format::from_chat_template("<|python_tag|>"), Format::Llama3);
        assert_eq!(Format::from_chat_template("{{ message.content }}"), Format::Generic);
        for f in Format::ALL {
            let s = f.syntax();
            assert!(s.first_open().starts_with(s.trigger), "{f:?}: the trigger opens the section");
            assert!(s.call_open.ends_with('"') && s.name_to_args.starts_with('"'), "{f:?}: names are JSON strings");
        }
    }
}
