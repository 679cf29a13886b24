//! Lark's grammar syntax, as vLLM and llguidance users send it: `rule: expansions`,
//! `TERMINAL: expansions`, `"literal"` (and `"literal"i`), `/regex/flags`, `"a".."z"`,
//! `[optional]`, groups, `?` `*` `+`, `~ n` and `~ n..m`, `-> alias` (ignored), `?rule` and
//! `!rule` (shape-only marks, ignored), priorities `.n` (ignored: every parse is allowed),
//! `%import common.NAME` (and `-> ALIAS`, and `common (A, B)`), `%ignore`, `//` comments. The
//! start rule is `start`. `%declare`, `%override`, `%extend` and templates are errors.

use crate::ast::{Cursor, Def, Expr, Grammar, Pos, SyntaxError, quoted};

/// Lark's `common.lark` terminals, as regexes.
const COMMON: &[(&str, &str)] = &[
    ("DIGIT", "[0-9]"),
    ("HEXDIGIT", "[0-9a-fA-F]"),
    ("INT", "[0-9]+"),
    ("SIGNED_INT", "[+-]?[0-9]+"),
    ("DECIMAL", r"[0-9]+\.[0-9]*|\.[0-9]+"),
    ("FLOAT", r"[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"),
    ("SIGNED_FLOAT", r"[+-]?(?:[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"),
    ("NUMBER", r"[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+"),
    ("SIGNED_NUMBER", r"[+-]?(?:[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+)"),
    ("ESCAPED_STRING", r#""(?:[^"\\\n]|\\.)*""#),
    ("LCASE_LETTER", "[a-z]"),
    ("UCASE_LETTER", "[A-Z]"),
    ("LETTER", "[a-zA-Z]"),
    ("WORD", "[a-zA-Z]+"),
    ("CNAME", "[_a-zA-Z][_a-zA-Z0-9]*"),
    ("WS_INLINE", "[ \t]+"),
    ("WS", "[ \t\x0C\r\n]+"),
    ("CR", "\r"),
    ("LF", "\n"),
    ("NEWLINE", "(?:\r?\n)+"),
    ("SH_COMMENT", "#[^\n]*"),
    ("CPP_COMMENT", "//[^\n]*"),
    ("C_COMMENT", r"/\*(?s:.)*?\*/"),
    ("SQL_COMMENT", "--[^\n]*"),
];

/// Parses Lark source.
pub fn parse(source: &str) -> Result<Grammar, SyntaxError> {
    let mut c = Cursor::new(source);
    let mut g = Grammar { start: "start".into(), lexed: true, ..Grammar::default() };
    loop {
        skip_blank(&mut c);
        if c.done() {
            return Ok(g);
        }
        let pos = c.pos();
        if c.eat("%") {
            directive(&mut c, pos, &mut g)?;
            continue;
        }
        c.eat("?");
        c.eat("!");
        let name = c.take_while(is_name_char);
        if name.is_empty() {
            return Err(SyntaxError::new(
                pos,
                format!("expected a rule or terminal name, found `{}`", c.peek().unwrap_or(' ')),
            ));
        }
        if c.peek() == Some('{') {
            return Err(SyntaxError::new(c.pos(), "rule templates are not supported"));
        }
        if c.eat(".") {
            c.take_while(|ch| ch.is_ascii_digit() || ch == '-');
        }
        skip_inline(&mut c);
        if !c.eat(":") {
            return Err(SyntaxError::new(c.pos(), format!("expected `:` after `{name}`")));
        }
        let expr = expansions(&mut c, false)?;
        let terminal = is_terminal(name);
        g.defs.push(Def { name: name.to_string(), expr, terminal, pos });
    }
}

fn is_name_char(ch: char) -> bool {
    ch.is_ascii_alphanumeric() || ch == '_'
}

/// Upper-case names (optionally `_`-prefixed) are terminals.
fn is_terminal(name: &str) -> bool {
    name.trim_start_matches('_').chars().next().is_some_and(|ch| ch.is_ascii_uppercase())
}

/// Skips spaces, tabs and comments on this line.
fn skip_inline(c: &mut Cursor<'_>) {
    loop {
        c.take_while(|ch| ch == ' ' || ch == '\t' || ch == '\r');
        if c.rest().starts_with("//") {
            c.take_while(|ch| ch != '\n');
        } else {
            return;
        }
    }
}

/// Skips whitespace, newlines and comments.
fn skip_blank(c: &mut Cursor<'_>) {
    loop {
        skip_inline(c);
        if c.peek() == Some('\n') {
            c.bump();
        } else {
            return;
        }
    }
}

/// After a newline outside brackets: whether the definition goes on (the next non-blank
/// line starts with `|`).
fn continues(c: &Cursor<'_>) -> bool {
    for line in c.rest().lines() {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        return t.starts_with('|');
    }
    false
}

fn directive(c: &mut Cursor<'_>, pos: Pos, g: &mut Grammar) -> Result<(), SyntaxError> {
    let word = c.take_while(|ch| ch.is_ascii_alphabetic());
    skip_inline(c);
    match word {
        "ignore" => {
            let e = expansions(c, false)?;
            g.ignore.push(e);
            Ok(())
        }
        "import" => {
            let path = c.take_while(|ch| is_name_char(ch) || ch == '.');
            skip_inline(c);
            let (module, names): (&str, Vec<(String, String)>) = if c.eat("(") {
                let mut names = Vec::new();
                loop {
                    skip_blank(c);
                    let n = c.take_while(is_name_char);
                    if n.is_empty() {
                        break;
                    }
                    names.push((n.to_string(), n.to_string()));
                    skip_blank(c);
                    if !c.eat(",") {
                        break;
                    }
                }
                skip_blank(c);
                if !c.eat(")") {
                    return Err(SyntaxError::new(c.pos(), "expected `)` to close the import list"));
                }
                (path, names)
            } else {
                let (module, name) = path.rsplit_once('.').unwrap_or(("", path));
                skip_inline(c);
                let alias = if c.eat("->") {
                    skip_inline(c);
                    c.take_while(is_name_char).to_string()
                } else {
                    name.to_string()
                };
                (module, vec![(name.to_string(), alias)])
            };
            if module != "common" {
                return Err(SyntaxError::new(pos, format!("only `%import common` is supported, not `{module}`")));
            }
            for (name, alias) in names {
                let Some((_, pattern)) = COMMON.iter().find(|(n, _)| *n == name) else {
                    return Err(SyntaxError::new(pos, format!("`common.{name}` is not a known common terminal")));
                };
                g.defs.push(Def {
                    name: alias,
                    expr: Expr::Regex { pattern: pattern.to_string(), pos },
                    terminal: true,
                    pos,
                });
            }
            Ok(())
        }
        other => Err(SyntaxError::new(pos, format!("`%{other}` is not supported (use %import common and %ignore)"))),
    }
}

fn expansions(c: &mut Cursor<'_>, nested: bool) -> Result<Expr, SyntaxError> {
    let mut alts = vec![alias_free(c, nested)?];
    while c.eat("|") {
        alts.push(alias_free(c, nested)?);
    }
    Ok(if alts.len() == 1 { alts.pop().unwrap_or_else(Expr::empty) } else { Expr::Alt(alts) })
}

/// One alternative, with a trailing `-> alias` dropped (it only names the tree node).
fn alias_free(c: &mut Cursor<'_>, nested: bool) -> Result<Expr, SyntaxError> {
    let e = sequence(c, nested)?;
    if c.eat("->") {
        skip_inline(c);
        c.take_while(is_name_char);
        skip_space(c, nested);
    }
    Ok(e)
}

/// Skips what separates items: spaces, and newlines when nested or continued with `|`.
fn skip_space(c: &mut Cursor<'_>, nested: bool) {
    loop {
        skip_inline(c);
        if c.peek() == Some('\n')
            && (nested || {
                let mut look = Cursor::new(c.rest());
                look.bump();
                continues(&look)
            })
        {
            c.bump();
        } else {
            return;
        }
    }
}

fn sequence(c: &mut Cursor<'_>, nested: bool) -> Result<Expr, SyntaxError> {
    let mut items = Vec::new();
    loop {
        skip_space(c, nested);
        let pos = c.pos();
        let item = match c.peek() {
            None | Some('|') | Some('\n') => break,
            Some(')') | Some(']') if nested => break,
            Some(ch @ (')' | ']')) => return Err(SyntaxError::new(pos, format!("unmatched `{ch}`"))),
            Some('-') if c.rest().starts_with("->") => break,
            Some('"') => {
                c.bump();
                let text = quoted(c, '"')?;
                let ci = c.peek() == Some('i') && !c.peek2().is_some_and(is_name_char) && c.eat("i");
                skip_inline(c);
                if c.rest().starts_with("..") {
                    c.eat("..");
                    skip_inline(c);
                    let hpos = c.pos();
                    if !c.eat("\"") {
                        return Err(SyntaxError::new(hpos, "expected a string after `..`"));
                    }
                    let hi = quoted(c, '"')?;
                    let (mut lo_chars, mut hi_chars) = (text.chars(), hi.chars());
                    match (lo_chars.next(), lo_chars.next(), hi_chars.next(), hi_chars.next()) {
                        (Some(a), None, Some(b), None) if a <= b => {
                            Expr::Regex { pattern: format!("[\\x{{{:X}}}-\\x{{{:X}}}]", a as u32, b as u32), pos }
                        }
                        _ => {
                            return Err(SyntaxError::new(
                                pos,
                                "a range `\"a\"..\"z\"` takes two single characters in order",
                            ));
                        }
                    }
                } else {
                    Expr::Lit { text, ci }
                }
            }
            Some('/') if !c.rest().starts_with("//") => {
                c.bump();
                Expr::Regex { pattern: regex(c, pos)?, pos }
            }
            Some('(') => {
                c.bump();
                let inner = expansions(c, true)?;
                skip_space(c, true);
                if !c.eat(")") {
                    return Err(SyntaxError::new(pos, "unclosed `(`"));
                }
                inner
            }
            Some('[') => {
                c.bump();
                let inner = expansions(c, true)?;
                skip_space(c, true);
                if !c.eat("]") {
                    return Err(SyntaxError::new(pos, "unclosed `[`"));
                }
                Expr::Repeat { inner: Box::new(inner), min: 0, max: Some(1), pos }
            }
            Some(ch) if is_name_char(ch) => {
                // A name followed by `:` (or `.n:`) on a new line starts the next definition;
                // inside one definition it is a reference.
                let n = c.take_while(is_name_char);
                Expr::Ref { name: n.to_string(), pos }
            }
            Some(ch) => return Err(SyntaxError::new(pos, format!("unexpected `{ch}`"))),
        };
        items.push(postfix(c, item)?);
    }
    Ok(if items.len() == 1 { items.pop().unwrap_or_else(Expr::empty) } else { Expr::Seq(items) })
}

fn postfix(c: &mut Cursor<'_>, mut item: Expr) -> Result<Expr, SyntaxError> {
    loop {
        skip_inline(c);
        let pos = c.pos();
        let (min, max) = match c.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('~') => {
                c.bump();
                skip_inline(c);
                let number = |c: &mut Cursor<'_>| c.take_while(|ch| ch.is_ascii_digit()).parse::<u32>().ok();
                let min = number(c).ok_or_else(|| SyntaxError::new(pos, "expected a number after `~`"))?;
                let max = if c.eat("..") {
                    number(c).ok_or_else(|| SyntaxError::new(pos, "expected a number after `..`"))?
                } else {
                    min
                };
                if max < min {
                    return Err(SyntaxError::new(pos, format!("`~ {min}..{max}`: the maximum is below the minimum")));
                }
                item = Expr::Repeat { inner: Box::new(item), min, max: Some(max), pos };
                continue;
            }
            _ => return Ok(item),
        };
        c.bump();
        item = Expr::Repeat { inner: Box::new(item), min, max, pos };
    }
}

/// A `/regex/flags` after its opening slash, in Rust regex syntax.
fn regex(c: &mut Cursor<'_>, start: Pos) -> Result<String, SyntaxError> {
    let mut body = String::new();
    loop {
        match c.bump() {
            None | Some('\n') => return Err(SyntaxError::new(start, "unterminated regex")),
            Some('/') => break,
            Some('\\') => match c.bump() {
                Some('/') => body.push('/'),
                Some(e) => {
                    body.push('\\');
                    body.push(e);
                }
                None => return Err(SyntaxError::new(start, "unterminated regex")),
            },
            Some(ch) => body.push(ch),
        }
    }
    let flags = c.take_while(|ch| "imsxlu".contains(ch));
    let inline: String = flags.chars().filter(|f| "imsx".contains(*f)).collect();
    Ok(if inline.is_empty() { body } else { format!("(?{inline}:{body})") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_directives_and_continuations() {
        let g = parse(
            "start: expr\n?expr: term\n    | expr \"+\" term -> add\nterm: NUMBER | \"(\" expr \")\"\n%import common.NUMBER\n%import common.WS\n%ignore WS // spaces\n",
        )
        .unwrap();
        let names: Vec<&str> = g.defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["start", "expr", "term", "NUMBER", "WS"]);
        assert!(matches!(&g.defs[1].expr, Expr::Alt(a) if a.len() == 2));
        assert_eq!(g.ignore.len(), 1);
        assert!(g.defs[3].terminal && !g.defs[2].terminal);
    }

    #[test]
    fn errors_have_line_and_column() {
        let e = parse("start: \"a\"\nb \"x\"").unwrap_err();
        assert_eq!((e.pos.line, e.pos.col, e.message.as_str()), (2, 3, "expected `:` after `b`"));
        let e = parse("start: /abc").unwrap_err();
        assert_eq!((e.pos.line, e.pos.col), (1, 8));
        let e = parse("%declare X").unwrap_err();
        assert!(e.message.contains("not supported"), "{e:?}");
    }
}
