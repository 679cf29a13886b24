//! From a parsed [`Grammar`] to the plain context-free form the recogniser runs: numbered
//! alternatives over nonterminals and terminals, every terminal one DFA over bytes.
//!
//! - EBNF operators become helper nonterminals (`e*` is `S: e S | ε`, right-recursive, which
//!   the recogniser runs as a loop); `e{m,n}` is unrolled (at most [`MAX_UNROLL`] copies).
//! - GBNF has no tokens: every maximal run of *regular* items in a sequence (literals,
//!   classes, and rules that reach no recursion) becomes one DFA, so strings, numbers and
//!   white space cost a DFA step per byte instead of a parse. Lark terminals (upper-case
//!   definitions, literals, regexes) are tokens: each is its own DFA.
//! - Direct left recursion (`sum: sum "+" term | term`) is rewritten into right recursion;
//!   any other left recursion is an error naming the rules on the cycle.
//! - Alternatives that can never finish (they need a rule whose every alternative needs
//!   itself again, like `a ::= "x" a`, or a terminal that matches no text) are dropped: the
//!   recogniser would otherwise walk into them and end the output at a dead end, or force
//!   `x` after `x` forever. A grammar left with nothing is an error naming those rules.

use std::collections::HashMap;

use dspark_guest::dfa::{Automaton, DfaError};
use regex_automata::dfa::dense;

use crate::ast::{Expr, Grammar, Pos};

/// Most copies one `{m,n}` / `~ m..n` unrolls into.
pub const MAX_UNROLL: u32 = 512;
/// Most alternatives in the compiled grammar.
pub const MAX_ALTS: usize = 200_000;

/// A grammar symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sym {
    /// A nonterminal.
    N(u32),
    /// A terminal: an index into [`Compiled::dfas`].
    T(u32),
}

/// A nonterminal: its name (for errors) and its alternatives.
#[derive(Clone, Debug)]
pub struct NonTerm {
    /// The rule's name, or a helper's description.
    pub name: String,
    /// Indices into [`Compiled::alts`].
    pub alts: Vec<u32>,
}

/// One terminal.
pub struct Terminal {
    /// The DFA (anchored at the start; a match is checked at the end of input).
    pub dfa: dense::DFA<Vec<u32>>,
    /// Its start state.
    pub start: u32,
    /// Whether it matches the empty string.
    pub nullable: bool,
    /// Whether it matches any text at all.
    pub productive: bool,
    /// The states from which a match is still reachable: a terminal's walk never leaves them.
    pub live: dspark_guest::dfa::LiveStates,
}

/// The compiled grammar.
pub struct Compiled {
    /// Every alternative: a sequence of symbols.
    pub alts: Vec<Vec<Sym>>,
    /// The nonterminals.
    pub nonterms: Vec<NonTerm>,
    /// The terminals.
    pub dfas: Vec<Terminal>,
    /// The alternative `[start]` the recogniser begins in.
    pub start_alt: u32,
    /// The terminal allowed between any two tokens (Lark `%ignore`), if any.
    pub ignore: Option<u32>,
    /// Tokens match greedily (Lark) rather than as plain text (GBNF).
    pub greedy: bool,
    /// `nullable_suffix[alt][pos]`: whether the symbols from `pos` on can match nothing.
    pub nullable_suffix: Vec<Vec<bool>>,
}

/// Why a grammar does not compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileError {
    /// Where, when known.
    pub pos: Option<Pos>,
    /// What.
    pub message: String,
    /// Whether a size limit was hit (rather than the grammar being wrong).
    pub too_large: bool,
}

impl CompileError {
    fn at(pos: Pos, message: impl Into<String>) -> Self {
        Self { pos: Some(pos), message: message.into(), too_large: false }
    }
    fn nowhere(message: impl Into<String>) -> Self {
        Self { pos: None, message: message.into(), too_large: false }
    }
    fn large(pos: Option<Pos>, message: impl Into<String>) -> Self {
        Self { pos, message: message.into(), too_large: true }
    }
}

/// A regex that matches exactly `text` (every non-alphanumeric character escaped).
fn escape(text: &str, ci: bool) -> String {
    let mut out = String::new();
    for ch in text.chars() {
        if ch.is_ascii_alphanumeric() {
            out.push(ch);
        } else {
            out.push_str(&format!("\\x{{{:X}}}", ch as u32));
        }
    }
    if ci { format!("(?i:{out})") } else { format!("(?:{out})") }
}

struct Lower<'g> {
    g: &'g Grammar,
    by_name: HashMap<&'g str, usize>,
    rule_nonterm: HashMap<usize, u32>,
    alts: Vec<Vec<Sym>>,
    nonterms: Vec<NonTerm>,
    patterns: Vec<(String, Pos)>,
    pattern_ids: HashMap<String, u32>,
    /// Per definition: its regex when it is regular (`Some(None)`: not regular).
    regular: HashMap<usize, Option<String>>,
    visiting: Vec<usize>,
}

impl<'g> Lower<'g> {
    fn def(&self, name: &str, pos: Pos) -> Result<usize, CompileError> {
        self.by_name.get(name).copied().ok_or_else(|| CompileError::at(pos, format!("`{name}` is not defined")))
    }

    fn terminal(&mut self, pattern: String, pos: Pos) -> u32 {
        if let Some(&id) = self.pattern_ids.get(&pattern) {
            return id;
        }
        let id = self.patterns.len() as u32;
        self.pattern_ids.insert(pattern.clone(), id);
        self.patterns.push((pattern, pos));
        id
    }

    /// The regex of `expr` when it is regular (no reference into recursion), else `None`.
    /// Lark rules are never regular here: only terminals are tokens.
    fn regex_of(&mut self, expr: &Expr) -> Result<Option<String>, CompileError> {
        Ok(match expr {
            Expr::Lit { text, ci } => Some(escape(text, *ci)),
            Expr::Regex { pattern, .. } => Some(format!("(?:{pattern})")),
            Expr::Seq(items) => {
                let mut out = String::new();
                for item in items {
                    match self.regex_of(item)? {
                        Some(r) => out.push_str(&r),
                        None => return Ok(None),
                    }
                }
                Some(format!("(?:{out})"))
            }
            Expr::Alt(alts) => {
                let mut parts = Vec::new();
                for a in alts {
                    match self.regex_of(a)? {
                        Some(r) => parts.push(r),
                        None => return Ok(None),
                    }
                }
                Some(format!("(?:{})", parts.join("|")))
            }
            Expr::Repeat { inner, min, max, pos } => {
                if *min > MAX_UNROLL || max.is_some_and(|m| m > MAX_UNROLL) {
                    return Err(CompileError::large(Some(*pos), format!("repetition bounds above {MAX_UNROLL}")));
                }
                self.regex_of(inner)?.map(|r| match max {
                    Some(m) => format!("(?:{r}){{{min},{m}}}"),
                    None => format!("(?:{r}){{{min},}}"),
                })
            }
            Expr::Ref { name, pos } => {
                let d = self.def(name, *pos)?;
                if self.g.lexed && !self.g.defs[d].terminal {
                    return Ok(None);
                }
                self.def_regex(d)?
            }
        })
    }

    fn def_regex(&mut self, d: usize) -> Result<Option<String>, CompileError> {
        if let Some(r) = self.regular.get(&d) {
            return Ok(r.clone());
        }
        if self.visiting.contains(&d) {
            let def = &self.g.defs[d];
            if def.terminal {
                return Err(CompileError::at(def.pos, format!("terminal `{}` refers to itself", def.name)));
            }
            return Ok(None);
        }
        self.visiting.push(d);
        let expr = self.g.defs[d].expr.clone();
        let r = self.regex_of(&expr);
        self.visiting.pop();
        let r = r?;
        // A rule on a recursion is irregular for every caller, but a rule whose regex was
        // cut short by a caller's recursion is only irregular from there: cache only
        // answers reached outside any recursion.
        if self.visiting.is_empty() || r.is_some() {
            self.regular.insert(d, r.clone());
        }
        Ok(r)
    }

    fn new_nonterm(&mut self, name: String) -> u32 {
        self.nonterms.push(NonTerm { name, alts: Vec::new() });
        (self.nonterms.len() - 1) as u32
    }

    fn add_alt(&mut self, n: u32, syms: Vec<Sym>) -> Result<(), CompileError> {
        if self.alts.len() >= MAX_ALTS {
            return Err(CompileError::large(None, format!("the grammar expands to more than {MAX_ALTS} alternatives")));
        }
        self.alts.push(syms);
        let id = (self.alts.len() - 1) as u32;
        self.nonterms[n as usize].alts.push(id);
        Ok(())
    }

    fn rule(&mut self, d: usize) -> Result<u32, CompileError> {
        if let Some(&n) = self.rule_nonterm.get(&d) {
            return Ok(n);
        }
        let def = &self.g.defs[d];
        let n = self.new_nonterm(def.name.clone());
        self.rule_nonterm.insert(d, n);
        let expr = def.expr.clone();
        self.alternatives_into(n, &expr)?;
        Ok(n)
    }

    fn alternatives_into(&mut self, n: u32, expr: &Expr) -> Result<(), CompileError> {
        match expr {
            Expr::Alt(alts) => {
                for a in alts {
                    let syms = self.sequence(a)?;
                    self.add_alt(n, syms)?;
                }
            }
            other => {
                let syms = self.sequence(other)?;
                self.add_alt(n, syms)?;
            }
        }
        Ok(())
    }

    /// The symbols of a sequence; in GBNF, runs of regular items merge into one terminal.
    fn sequence(&mut self, expr: &Expr) -> Result<Vec<Sym>, CompileError> {
        let mut items = Vec::new();
        flatten(expr, &mut items);
        let mut syms = Vec::new();
        let mut run = String::new();
        let mut run_pos = None;
        for item in items {
            if !self.g.lexed
                && let Some(r) = self.regex_of(item)?
            {
                run.push_str(&r);
                run_pos.get_or_insert(position(item));
                continue;
            }
            if !run.is_empty() {
                syms.push(Sym::T(self.terminal(std::mem::take(&mut run), run_pos.take().unwrap_or_default())));
            }
            syms.push(self.item(item)?);
        }
        if !run.is_empty() {
            syms.push(Sym::T(self.terminal(run, run_pos.unwrap_or_default())));
        }
        Ok(syms)
    }

    fn item(&mut self, expr: &Expr) -> Result<Sym, CompileError> {
        if let Some(r) = if self.g.lexed { self.token_regex(expr)? } else { self.regex_of(expr)? } {
            return Ok(Sym::T(self.terminal(r, position(expr))));
        }
        Ok(match expr {
            Expr::Ref { name, pos } => Sym::N(self.rule(self.def(name, *pos)?)?),
            Expr::Seq(_) | Expr::Alt(_) => {
                let n = self.new_nonterm(format!("group at {}", position(expr)));
                self.alternatives_into(n, expr)?;
                Sym::N(n)
            }
            Expr::Repeat { inner, min, max, pos } => {
                let unrolled = min.saturating_add(max.unwrap_or(0));
                if *min > MAX_UNROLL || unrolled > MAX_UNROLL {
                    return Err(CompileError::large(Some(*pos), format!("repetition bounds above {MAX_UNROLL}")));
                }
                let e = self.item(inner)?;
                let n = self.new_nonterm(format!("repetition at {pos}"));
                let mut head = vec![e; *min as usize];
                match max {
                    None => {
                        let star = self.new_nonterm(format!("repetition at {pos}"));
                        self.add_alt(star, vec![e, Sym::N(star)])?;
                        self.add_alt(star, Vec::new())?;
                        head.push(Sym::N(star));
                    }
                    Some(m) if *m > *min => {
                        // O_k: e O_{k-1} | ε, nested (max - min) deep.
                        let mut tail: Option<u32> = None;
                        for _ in 0..(m - min) {
                            let o = self.new_nonterm(format!("repetition at {pos}"));
                            let mut body = vec![e];
                            body.extend(tail.map(Sym::N));
                            self.add_alt(o, body)?;
                            self.add_alt(o, Vec::new())?;
                            tail = Some(o);
                        }
                        head.extend(tail.map(Sym::N));
                    }
                    Some(_) => {}
                }
                self.add_alt(n, head)?;
                Sym::N(n)
            }
            Expr::Lit { .. } | Expr::Regex { .. } => unreachable!("literals and regexes are terminals"),
        })
    }

    /// In Lark: the regex of a literal, a regex or a terminal reference (one token each).
    fn token_regex(&mut self, expr: &Expr) -> Result<Option<String>, CompileError> {
        match expr {
            Expr::Lit { .. } | Expr::Regex { .. } => self.regex_of(expr),
            Expr::Ref { name, pos } => {
                let d = self.def(name, *pos)?;
                if self.g.defs[d].terminal { self.def_regex(d) } else { Ok(None) }
            }
            _ => Ok(None),
        }
    }
}

fn flatten<'e>(expr: &'e Expr, out: &mut Vec<&'e Expr>) {
    match expr {
        Expr::Seq(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other),
    }
}

fn position(expr: &Expr) -> Pos {
    match expr {
        Expr::Regex { pos, .. } | Expr::Ref { pos, .. } | Expr::Repeat { pos, .. } => *pos,
        Expr::Seq(items) | Expr::Alt(items) => items.first().map(position).unwrap_or_default(),
        Expr::Lit { .. } => Pos::default(),
    }
}

fn build_dfa(pattern: &str, pos: Pos) -> Result<Terminal, CompileError> {
    let built = dspark_guest::dfa::anchored(pattern).map_err(|e| match e {
        DfaError::TooLarge(m) => CompileError::large(Some(pos), format!("a terminal's automaton is too large: {m}")),
        DfaError::Syntax(m) => CompileError::at(pos, format!("invalid regex: {m}")),
    })?;
    let (dfa, start) = (built.dfa, built.start);
    let nullable = dfa.is_match_state(dfa.next_eoi_state(start));
    let live = dspark_guest::dfa::live_states(&dfa, start)
        .ok_or_else(|| CompileError::large(Some(pos), "a terminal's automaton has too many states".to_string()))?;
    let productive = live.is_live(start);
    Ok(Terminal { dfa, start: start.as_u32(), nullable, productive, live })
}

/// Compiles a grammar.
pub fn compile(g: &Grammar) -> Result<Compiled, CompileError> {
    let mut by_name = HashMap::new();
    for (i, d) in g.defs.iter().enumerate() {
        if by_name.insert(d.name.as_str(), i).is_some() {
            return Err(CompileError::at(d.pos, format!("`{}` is defined twice", d.name)));
        }
    }
    let start_def = *by_name
        .get(g.start.as_str())
        .ok_or_else(|| CompileError::nowhere(format!("the grammar has no `{}` rule (where output starts)", g.start)))?;
    let mut lower = Lower {
        g,
        by_name,
        rule_nonterm: HashMap::new(),
        alts: Vec::new(),
        nonterms: Vec::new(),
        patterns: Vec::new(),
        pattern_ids: HashMap::new(),
        regular: HashMap::new(),
        visiting: Vec::new(),
    };
    // The start is always a nonterminal, even when the whole grammar is regular.
    let start_nt = lower.new_nonterm("(start)".into());
    let start_expr = Expr::Ref { name: g.start.clone(), pos: g.defs[start_def].pos };
    let start_sym = if g.defs[start_def].terminal {
        lower.item(&start_expr)?
    } else {
        // GBNF: a regular start rule becomes one terminal.
        match lower.regex_of(&start_expr)? {
            Some(r) if !g.lexed => Sym::T(lower.terminal(r, g.defs[start_def].pos)),
            _ => Sym::N(lower.rule(start_def)?),
        }
    };
    lower.add_alt(start_nt, vec![start_sym])?;
    let start_alt = lower.nonterms[start_nt as usize].alts[0];
    let mut ignore = None;
    if !g.ignore.is_empty() {
        let mut parts = Vec::new();
        for e in &g.ignore {
            let r = lower
                .regex_of(e)?
                .ok_or_else(|| CompileError::at(position(e), "`%ignore` takes terminals, literals or regexes"))?;
            parts.push(r);
        }
        ignore = Some(lower.terminal(format!("(?:{})", parts.join("|")), position(&g.ignore[0])));
    }
    let Lower { mut alts, mut nonterms, patterns, .. } = lower;
    let mut dfas = Vec::with_capacity(patterns.len());
    for (pattern, pos) in &patterns {
        let t = build_dfa(pattern, *pos)?;
        if g.lexed && t.nullable {
            return Err(CompileError::at(*pos, "a terminal matches the empty string; Lark tokens must consume text"));
        }
        dfas.push(t);
    }
    if let Some(i) = ignore
        && dfas[i as usize].nullable
    {
        return Err(CompileError::nowhere("`%ignore` matches the empty string"));
    }
    remove_direct_left_recursion(&mut alts, &mut nonterms)?;
    let nullable = nullable_nonterms(&alts, &nonterms, &dfas);
    check_left_recursion(&alts, &nonterms, &dfas, &nullable)?;
    // After the left-recursion check (whose message is the more specific one); a nullable
    // rule finishes, so dropping does not change `nullable`.
    drop_unproductive_alternatives(&alts, &mut nonterms, &dfas, start_nt)?;
    let sym_nullable = |s: &Sym| match s {
        Sym::N(n) => nullable[*n as usize],
        Sym::T(t) => dfas[*t as usize].nullable,
    };
    let nullable_suffix = alts
        .iter()
        .map(|syms| {
            let mut v = vec![true; syms.len() + 1];
            for i in (0..syms.len()).rev() {
                v[i] = v[i + 1] && sym_nullable(&syms[i]);
            }
            v
        })
        .collect();
    Ok(Compiled { alts, nonterms, dfas, start_alt, ignore, greedy: g.lexed, nullable_suffix })
}

/// `A: A α | β` becomes `A: β A'`, `A': α A' | ε`.
fn remove_direct_left_recursion(alts: &mut Vec<Vec<Sym>>, nonterms: &mut Vec<NonTerm>) -> Result<(), CompileError> {
    for n in 0..nonterms.len() {
        let me = Sym::N(n as u32);
        let (recursive, base): (Vec<u32>, Vec<u32>) =
            nonterms[n].alts.iter().partition(|&&a| alts[a as usize].first() == Some(&me));
        if recursive.is_empty() {
            continue;
        }
        if base.is_empty() {
            return Err(CompileError::nowhere(format!(
                "rule `{}` is left-recursive with no alternative that starts otherwise",
                nonterms[n].name
            )));
        }
        let tail = nonterms.len() as u32;
        nonterms.push(NonTerm { name: format!("{} (tail)", nonterms[n].name), alts: Vec::new() });
        for &a in &recursive {
            let mut syms = alts[a as usize][1..].to_vec();
            if syms.is_empty() {
                return Err(CompileError::nowhere(format!(
                    "rule `{}` has an alternative that is only itself",
                    nonterms[n].name
                )));
            }
            syms.push(Sym::N(tail));
            alts[a as usize] = syms;
        }
        alts.push(Vec::new());
        nonterms[tail as usize].alts = recursive;
        nonterms[tail as usize].alts.push((alts.len() - 1) as u32);
        for &a in &base {
            alts[a as usize].push(Sym::N(tail));
        }
        nonterms[n].alts = base;
    }
    Ok(())
}

/// Drops from every nonterminal the alternatives that can never finish: those holding a
/// terminal that matches no text or a nonterminal with no alternative that can finish (the
/// least fixed point from the terminals up). Errors when the start is such a nonterminal.
fn drop_unproductive_alternatives(
    alts: &[Vec<Sym>],
    nonterms: &mut [NonTerm],
    dfas: &[Terminal],
    start: u32,
) -> Result<(), CompileError> {
    let mut productive = vec![false; nonterms.len()];
    let finishes = |syms: &[Sym], productive: &[bool]| {
        syms.iter().all(|s| match s {
            Sym::N(m) => productive[*m as usize],
            Sym::T(t) => dfas[*t as usize].productive,
        })
    };
    loop {
        let mut changed = false;
        for (n, nt) in nonterms.iter().enumerate() {
            if !productive[n] && nt.alts.iter().any(|&a| finishes(&alts[a as usize], &productive)) {
                productive[n] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    if !productive[start as usize] {
        let stuck: Vec<String> = nonterms
            .iter()
            .enumerate()
            .filter(|&(n, nt)| !productive[n] && n != start as usize && !nt.name.starts_with('('))
            .take(4)
            .map(|(_, nt)| format!("`{}`", nt.name))
            .collect();
        let why = if stuck.is_empty() {
            "every alternative needs a terminal that matches no text".to_string()
        } else {
            format!(
                "{} can never finish (each alternative needs itself again, or a terminal that matches no text)",
                stuck.join(", ")
            )
        };
        return Err(CompileError::nowhere(format!("the grammar matches no text: {why}")));
    }
    for nt in nonterms.iter_mut() {
        nt.alts.retain(|&a| finishes(&alts[a as usize], &productive));
    }
    Ok(())
}

fn nullable_nonterms(alts: &[Vec<Sym>], nonterms: &[NonTerm], dfas: &[Terminal]) -> Vec<bool> {
    let mut nullable = vec![false; nonterms.len()];
    loop {
        let mut changed = false;
        for (n, nt) in nonterms.iter().enumerate() {
            if nullable[n] {
                continue;
            }
            let any = nt.alts.iter().any(|&a| {
                alts[a as usize].iter().all(|s| match s {
                    Sym::N(m) => nullable[*m as usize],
                    Sym::T(t) => dfas[*t as usize].nullable,
                })
            });
            if any {
                nullable[n] = true;
                changed = true;
            }
        }
        if !changed {
            return nullable;
        }
    }
}

/// Errors on left recursion that survived the rewrite (indirect, or hidden behind a
/// nullable prefix): the recogniser would predict forever.
fn check_left_recursion(
    alts: &[Vec<Sym>],
    nonterms: &[NonTerm],
    dfas: &[Terminal],
    nullable: &[bool],
) -> Result<(), CompileError> {
    // Left corners: A -> B when B can come first in A.
    let corners: Vec<Vec<u32>> = nonterms
        .iter()
        .map(|nt| {
            let mut out = Vec::new();
            for &a in &nt.alts {
                for s in &alts[a as usize] {
                    match s {
                        Sym::N(m) => {
                            out.push(*m);
                            if !nullable[*m as usize] {
                                break;
                            }
                        }
                        Sym::T(t) => {
                            if !dfas[*t as usize].nullable {
                                break;
                            }
                        }
                    }
                }
            }
            out
        })
        .collect();
    // Depth-first search for a cycle (0 unvisited, 1 on the path, 2 done).
    let mut mark = vec![0u8; nonterms.len()];
    let mut path = Vec::new();
    for root in 0..nonterms.len() {
        if mark[root] != 0 {
            continue;
        }
        let mut stack = vec![(root as u32, 0usize)];
        mark[root] = 1;
        path.push(root as u32);
        while let Some(&mut (n, ref mut i)) = stack.last_mut() {
            if let Some(&m) = corners[n as usize].get(*i) {
                *i += 1;
                match mark[m as usize] {
                    0 => {
                        mark[m as usize] = 1;
                        path.push(m);
                        stack.push((m, 0));
                    }
                    1 => {
                        let from = path.iter().position(|&p| p == m).unwrap_or(0);
                        let names: Vec<&str> =
                            path[from..].iter().map(|&p| nonterms[p as usize].name.as_str()).collect();
                        return Err(CompileError::nowhere(format!(
                            "left recursion through {} -> {} is not supported; rewrite it as repetition (e.g. `a: b (\"+\" b)*`)",
                            names.join(" -> "),
                            nonterms[m as usize].name
                        )));
                    }
                    _ => {}
                }
            } else {
                mark[n as usize] = 2;
                path.pop();
                stack.pop();
            }
        }
    }
    Ok(())
}
