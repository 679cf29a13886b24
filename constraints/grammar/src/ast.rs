//! The grammar both syntaxes parse into: named definitions of expressions over literals,
//! regular expressions and references, with the source position of everything that can be
//! wrong.

use std::fmt;

/// A position in the grammar source, 1-based.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pos {
    /// Line.
    pub line: u32,
    /// Column, in characters.
    pub col: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A grammar expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// One after another.
    Seq(Vec<Expr>),
    /// One of.
    Alt(Vec<Expr>),
    /// Literal text (`ci`: ASCII case-insensitive).
    Lit {
        /// The text.
        text: String,
        /// Case-insensitive.
        ci: bool,
    },
    /// A regular expression in Rust `regex` syntax (Lark `/.../`, GBNF character classes).
    Regex {
        /// The pattern.
        pattern: String,
        /// Where it was written.
        pos: Pos,
    },
    /// A reference to a definition.
    Ref {
        /// The name.
        name: String,
        /// Where it was written.
        pos: Pos,
    },
    /// `e{min,max}` (`max` `None`: unbounded); `?`, `*` and `+` are special cases.
    Repeat {
        /// What repeats.
        inner: Box<Expr>,
        /// At least.
        min: u32,
        /// At most.
        max: Option<u32>,
        /// Where the operator was written.
        pos: Pos,
    },
}

impl Expr {
    /// The empty sequence.
    pub fn empty() -> Expr {
        Expr::Seq(Vec::new())
    }
}

/// One definition: `name: expr` (Lark) or `name ::= expr` (GBNF).
#[derive(Clone, Debug)]
pub struct Def {
    /// The name.
    pub name: String,
    /// The expression.
    pub expr: Expr,
    /// A Lark terminal (an upper-case name): matched as one token, greedily.
    pub terminal: bool,
    /// Where it starts.
    pub pos: Pos,
}

/// A parsed grammar.
#[derive(Clone, Debug, Default)]
pub struct Grammar {
    /// The definitions, in source order.
    pub defs: Vec<Def>,
    /// Lark `%ignore` expressions: allowed between any two terminals.
    pub ignore: Vec<Expr>,
    /// The start rule's name.
    pub start: String,
    /// Whether terminals are matched as tokens (Lark: greedy, longest match byte by byte)
    /// rather than as plain context-free text (GBNF).
    pub lexed: bool,
}

/// A syntax error with its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    /// Where.
    pub pos: Pos,
    /// What.
    pub message: String,
}

impl SyntaxError {
    /// An error at `pos`.
    pub fn new(pos: Pos, message: impl Into<String>) -> Self {
        Self { pos, message: message.into() }
    }
}

/// A cursor over grammar source with line and column tracking, shared by both parsers.
pub struct Cursor<'a> {
    text: &'a str,
    at: usize,
    line: u32,
    col: u32,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `text`.
    pub fn new(text: &'a str) -> Self {
        Self { text, at: 0, line: 1, col: 1 }
    }

    /// The current position.
    pub fn pos(&self) -> Pos {
        Pos { line: self.line, col: self.col }
    }

    /// The rest of the text.
    pub fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    /// The next character.
    pub fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    /// The character after the next.
    pub fn peek2(&self) -> Option<char> {
        self.rest().chars().nth(1)
    }

    /// Takes the next character.
    pub fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    /// Takes `s` if the text continues with it.
    pub fn eat(&mut self, s: &str) -> bool {
        if self.rest().starts_with(s) {
            for _ in s.chars() {
                self.bump();
            }
            true
        } else {
            false
        }
    }

    /// Takes characters while `f` holds.
    pub fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        let start = self.at;
        while self.peek().is_some_and(&f) {
            self.bump();
        }
        &self.text[start..self.at]
    }

    /// Whether the text is used up.
    pub fn done(&self) -> bool {
        self.at >= self.text.len()
    }
}

/// Reads a quoted string's body after the opening `quote` (escapes: `\n \r \t \\ \" \'
/// \xHH \uHHHH \UHHHHHHHH`, and `\` before anything else is that character).
pub fn quoted(c: &mut Cursor<'_>, quote: char) -> Result<String, SyntaxError> {
    let start = c.pos();
    let mut out = String::new();
    loop {
        let pos = c.pos();
        match c.bump() {
            None | Some('\n') => return Err(SyntaxError::new(start, "unterminated string")),
            Some(ch) if ch == quote => return Ok(out),
            Some('\\') => out.push(escape(c, pos)?),
            Some(ch) => out.push(ch),
        }
    }
}

/// Reads an escape after its backslash: `\n \r \t \0 \xHH \uHHHH \UHHHHHHHH`, and any other
/// character stands for itself (`\\`, `\"`, `\]`).
pub fn escape(c: &mut Cursor<'_>, pos: Pos) -> Result<char, SyntaxError> {
    let e = c.bump().ok_or_else(|| SyntaxError::new(pos, "unterminated escape"))?;
    let hex = |c: &mut Cursor<'_>, n: usize| -> Result<char, SyntaxError> {
        let digits: String = (0..n).filter_map(|_| c.bump()).collect();
        u32::from_str_radix(&digits, 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| SyntaxError::new(pos, format!("bad escape \\{e}{digits}")))
    };
    Ok(match e {
        'n' => '\n',
        'r' => '\r',
        't' => '\t',
        '0' => '\0',
        'x' => hex(c, 2)?,
        'u' => hex(c, 4)?,
        'U' => hex(c, 8)?,
        other => other,
    })
}
