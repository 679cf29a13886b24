//! llama.cpp's GBNF: `name ::= alternatives`, literals `"..."`, character classes `[...]`
//! and `[^...]`, `.`, groups, `*` `+` `?` `{m}` `{m,}` `{m,n}`, `#` comments. The start rule
//! is `root`. A rule runs until the next `name ::=`, so rules may span lines freely.

use crate::ast::{Cursor, Def, Expr, Grammar, Pos, SyntaxError, escape, quoted};

/// Parses GBNF source.
pub fn parse(source: &str) -> Result<Grammar, SyntaxError> {
    let mut c = Cursor::new(source);
    let mut g = Grammar { start: "root".into(), lexed: false, ..Grammar::default() };
    skip_space(&mut c);
    while !c.done() {
        let pos = c.pos();
        let name = name(&mut c).ok_or_else(|| SyntaxError::new(pos, "expected a rule name"))?;
        skip_space(&mut c);
        if !c.eat("::=") {
            return Err(SyntaxError::new(c.pos(), format!("expected `::=` after rule name `{name}`")));
        }
        let expr = alternatives(&mut c, false)?;
        g.defs.push(Def { name: name.to_string(), expr, terminal: false, pos });
        skip_space(&mut c);
    }
    Ok(g)
}

fn is_name_char(ch: char) -> bool {
    ch.is_ascii_alphanumeric() || ch == '-' || ch == '_'
}

fn name<'a>(c: &mut Cursor<'a>) -> Option<&'a str> {
    let n = c.take_while(is_name_char);
    (!n.is_empty()).then_some(n)
}

fn skip_space(c: &mut Cursor<'_>) {
    loop {
        c.take_while(char::is_whitespace);
        if c.peek() == Some('#') {
            c.take_while(|ch| ch != '\n');
        } else {
            return;
        }
    }
}

/// Whether the text at the cursor starts a new rule (`name ::=`).
fn at_rule_start(c: &Cursor<'_>) -> bool {
    let rest = c.rest();
    let n = rest.find(|ch: char| !is_name_char(ch)).unwrap_or(rest.len());
    n > 0 && rest[n..].trim_start().starts_with("::=")
}

fn alternatives(c: &mut Cursor<'_>, nested: bool) -> Result<Expr, SyntaxError> {
    let mut alts = vec![sequence(c, nested)?];
    while c.eat("|") {
        alts.push(sequence(c, nested)?);
    }
    Ok(if alts.len() == 1 { alts.pop().unwrap_or_else(Expr::empty) } else { Expr::Alt(alts) })
}

fn sequence(c: &mut Cursor<'_>, nested: bool) -> Result<Expr, SyntaxError> {
    let mut items = Vec::new();
    loop {
        skip_space(c);
        let pos = c.pos();
        let item = match c.peek() {
            None | Some('|') => break,
            Some(')') if nested => break,
            Some(')') => return Err(SyntaxError::new(pos, "unmatched `)`")),
            Some('"') => {
                c.bump();
                Expr::Lit { text: quoted(c, '"')?, ci: false }
            }
            Some('[') => {
                c.bump();
                Expr::Regex { pattern: class(c, pos)?, pos }
            }
            Some('.') => {
                c.bump();
                Expr::Regex { pattern: "(?s:.)".into(), pos }
            }
            Some('(') => {
                c.bump();
                let inner = alternatives(c, true)?;
                skip_space(c);
                if !c.eat(")") {
                    return Err(SyntaxError::new(pos, "unclosed `(`"));
                }
                inner
            }
            Some(ch) if is_name_char(ch) => {
                if at_rule_start(c) {
                    break;
                }
                let n = name(c).unwrap_or_default();
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
        let pos = c.pos();
        let (min, max) = match c.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                c.bump();
                let number = |c: &mut Cursor<'_>| c.take_while(|ch| ch.is_ascii_digit()).parse::<u32>().ok();
                c.take_while(|ch| ch == ' ');
                let min = number(c).ok_or_else(|| SyntaxError::new(pos, "expected a number in `{m,n}`"))?;
                c.take_while(|ch| ch == ' ');
                let max = if c.eat(",") {
                    c.take_while(|ch| ch == ' ');
                    number(c)
                } else {
                    Some(min)
                };
                c.take_while(|ch| ch == ' ');
                if c.peek() != Some('}') {
                    return Err(SyntaxError::new(pos, "expected `}` to close `{m,n}`"));
                }
                if max.is_some_and(|m| m < min) {
                    return Err(SyntaxError::new(
                        pos,
                        format!("`{{{min},{}}}`: the maximum is below the minimum", max.unwrap_or(0)),
                    ));
                }
                (min, max)
            }
            _ => return Ok(item),
        };
        c.bump();
        item = Expr::Repeat { inner: Box::new(item), min, max, pos };
    }
}

/// A character class after its `[`, as a regex class with every character escaped.
fn class(c: &mut Cursor<'_>, start: Pos) -> Result<String, SyntaxError> {
    let mut out = String::from("[");
    if c.peek() == Some('^') {
        c.bump();
        out.push('^');
    }
    let mut empty = true;
    loop {
        let pos = c.pos();
        let ch = match c.bump() {
            None | Some('\n') => return Err(SyntaxError::new(start, "unterminated character class")),
            Some(']') if !empty => break,
            Some(']') => return Err(SyntaxError::new(pos, "empty character class")),
            Some('\\') => escape(c, pos)?,
            Some(ch) => ch,
        };
        empty = false;
        out.push_str(&format!("\\x{{{:X}}}", ch as u32));
        if c.peek() == Some('-') && c.peek2().is_some_and(|n| n != ']') {
            c.bump();
            let pos = c.pos();
            let hi = match c.bump() {
                Some('\\') => escape(c, pos)?,
                Some(h) => h,
                None => return Err(SyntaxError::new(start, "unterminated character class")),
            };
            if hi < ch {
                return Err(SyntaxError::new(pos, format!("range {ch:?}-{hi:?} is backwards")));
            }
            out.push_str(&format!("-\\x{{{:X}}}", hi as u32));
        }
    }
    out.push(']');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_span_lines_until_the_next_rule() {
        let g = parse("root ::= a\n  | \"x\" [a-z]+ # comment\na ::= (\"b\" | \"c\"){2,3} .\n").unwrap();
        assert_eq!(g.defs.len(), 2);
        assert_eq!(g.defs[1].name, "a");
        assert!(matches!(&g.defs[0].expr, Expr::Alt(a) if a.len() == 2));
    }

    #[test]
    fn errors_have_line_and_column() {
        let e = parse("root ::= \"a\"\nx := \"b\"").unwrap_err();
        assert_eq!((e.pos.line, e.pos.col), (2, 3));
        let e = parse("root ::= (\"a\"").unwrap_err();
        assert_eq!(e.message, "unclosed `(`");
        let e = parse("root ::= [z-a]").unwrap_err();
        assert!(e.message.contains("backwards"), "{e:?}");
    }
}
