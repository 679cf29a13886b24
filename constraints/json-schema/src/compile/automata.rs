//! Patterns and formats as anchored DFAs (regex-automata), with a table of which states can
//! still reach a match, cached across compilations within a size budget; ECMA-262's `\d` and
//! `\w` mapped to Rust's syntax.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dspark_guest::{ConstraintError, ErrorCode};
use regex_automata::dfa::dense;

use super::{Compiler, err};
use crate::graph::{LiveTable, PairLive};

impl<'a> Compiler<'a> {
    /// Whether some text matches the compiled pattern `index`: its start state is live.
    pub(super) fn pattern_matches_some_text(&self, index: u32) -> bool {
        use regex_automata::dfa::Automaton;
        let (dfa, live) = (&self.dfas[index as usize], &self.live[index as usize]);
        let anchored = regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes);
        // No start state would have failed the build; count it as "may match" all the same.
        dfa.start_state(&anchored)
            .map_or(true, |start| live.dist.get(start.as_usize() >> live.stride2).is_some_and(|&d| d != u32::MAX))
    }

    /// The pairs of states of automata `a` and `b` from which some text leads both to a match
    /// (see [`Graph::pairs`](crate::graph::Graph::pairs)); `None` when more than 100,000
    /// pairs are reachable, where the string is served with each automaton's own liveness.
    pub(super) fn pair_live(&self, a: u32, b: u32) -> Option<PairLive> {
        use regex_automata::dfa::Automaton;
        let (da, db) = (&self.dfas[a as usize], &self.dfas[b as usize]);
        let start = |d: &dense::DFA<Vec<u32>>| {
            let cfg = regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes);
            d.start_state(&cfg).ok()
        };
        let first = (start(da)?, start(db)?);
        let mut index = HashMap::from([(first, 0usize)]);
        let mut order = vec![first];
        let mut preds: Vec<Vec<usize>> = vec![Vec::new()];
        let mut i = 0;
        while i < order.len() {
            let (sa, sb) = order[i];
            for byte in (0..=255u8).filter(|&b| writable(b)) {
                let (na, nb) = (da.next_state(sa, byte), db.next_state(sb, byte));
                if !self.live_in(a, na.as_u32()) || !self.live_in(b, nb.as_u32()) {
                    continue;
                }
                let j = match index.get(&(na, nb)) {
                    Some(&j) => j,
                    None => {
                        if order.len() >= 100_000 {
                            return None;
                        }
                        order.push((na, nb));
                        preds.push(Vec::new());
                        index.insert((na, nb), order.len() - 1);
                        order.len() - 1
                    }
                };
                preds[j].push(i);
            }
            i += 1;
        }
        let accepts = |d: &dense::DFA<Vec<u32>>, s| d.is_match_state(d.next_eoi_state(s));
        let mut live = vec![false; order.len()];
        let mut pending: Vec<usize> =
            (0..order.len()).filter(|&k| accepts(da, order[k].0) && accepts(db, order[k].1)).collect();
        pending.iter().for_each(|&k| live[k] = true);
        while let Some(k) = pending.pop() {
            for &p in &preds[k] {
                if !live[p] {
                    live[p] = true;
                    pending.push(p);
                }
            }
        }
        let pairs = (0..order.len()).filter(|&k| live[k]).map(|k| (order[k].0.as_u32(), order[k].1.as_u32()));
        Some(PairLive { live: pairs.collect() })
    }

    /// Whether state `st` of automaton `p` can still reach a match.
    fn live_in(&self, p: u32, st: u32) -> bool {
        let live = &self.live[p as usize];
        live.dist.get(st as usize >> live.stride2).is_some_and(|&d| d != u32::MAX)
    }

    /// The fewest characters a text matching pattern `index` has (`None`: it matches none).
    pub(super) fn pattern_min_chars(&self, index: u32) -> Option<u32> {
        use regex_automata::dfa::Automaton;
        let (dfa, live) = (&self.dfas[index as usize], &self.live[index as usize]);
        let anchored = regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes);
        let start = dfa.start_state(&anchored).ok()?;
        live.char_dist.get(start.as_usize() >> live.stride2).copied().filter(|&d| d != u32::MAX)
    }

    /// Whether pattern automaton `d` matches `text` whole (search patterns match anywhere).
    pub(super) fn dfa_matches(&self, d: u32, text: &[u8]) -> bool {
        use regex_automata::dfa::Automaton;
        let dfa = &self.dfas[d as usize];
        let cfg = regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes);
        let Ok(mut st) = dfa.start_state(&cfg) else { return false };
        for &b in text {
            st = dfa.next_state(st, b);
            if dfa.is_dead_state(st) {
                return false;
            }
        }
        dfa.is_match_state(dfa.next_eoi_state(st))
    }

    /// The index of `pattern`'s automaton in this compile's graph: built once per compile,
    /// and taken from [`BUILT`] where an earlier compile built it.
    pub(super) fn dfa(&mut self, pattern: &str, search: bool, at: &str) -> Result<u32, ConstraintError> {
        if let Some(&i) = self.dfa_cache.get(&(pattern.to_string(), search)) {
            return Ok(i);
        }
        let (dfa, live) = match built_automaton(pattern, search) {
            Some(built) => built,
            None => {
                let (dfa, live) = build_automaton(pattern, search, at)?;
                let built = (Arc::new(dfa), Arc::new(live));
                remember_automaton(pattern, search, &built);
                built
            }
        };
        self.live.push(live);
        self.dfas.push(dfa);
        let i = (self.dfas.len() - 1) as u32;
        self.dfa_cache.insert((pattern.to_string(), search), i);
        Ok(i)
    }
}

/// A regex matching exactly `text`.
pub(super) fn escape_regex(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_string() } else { format!("\\x{{{:X}}}", c as u32) })
        .collect()
}

/// Automata built by earlier compiles, by (pattern, search): formats (`date-time`, `uri`,
/// `email`) and common patterns recur across schemas, and determinising one costs far more
/// (up to tens of milliseconds for a counted repetition under search semantics) than the
/// lookup. Bounded by the automata's memory; emptied when full.
pub(super) static BUILT: Mutex<Option<BuiltAutomata>> = Mutex::new(None);

/// A pattern's automaton and its live states, shared between the graphs that use it.
pub(super) type Automaton = (Arc<dense::DFA<Vec<u32>>>, Arc<LiveTable>);

/// The contents of [`BUILT`].
#[derive(Default)]
pub(super) struct BuiltAutomata {
    by_pattern: HashMap<(String, bool), Automaton>,
    bytes: usize,
}

/// The most automaton memory [`BUILT`] keeps.
pub(super) const MAX_BUILT_BYTES: usize = 32 << 20;

/// The automaton of `pattern` built by an earlier compile, if kept.
pub(super) fn built_automaton(pattern: &str, search: bool) -> Option<Automaton> {
    let built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    built.as_ref()?.by_pattern.get(&(pattern.to_string(), search)).cloned()
}

/// Keeps a built automaton for later compiles.
pub(super) fn remember_automaton(pattern: &str, search: bool, built: &Automaton) {
    let size = built.0.memory_usage() + built.1.dist.len() * 5;
    if size > MAX_BUILT_BYTES / 4 {
        return;
    }
    let mut guard = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let cache = guard.get_or_insert_with(BuiltAutomata::default);
    if cache.bytes + size > MAX_BUILT_BYTES {
        *cache = BuiltAutomata::default();
    }
    cache.bytes += size;
    cache.by_pattern.insert((pattern.to_string(), search), (built.0.clone(), built.1.clone()));
}

/// Builds the automaton of `pattern` (ECMA-262 syntax; `search`: matching anywhere, as
/// `pattern` does, rather than whole, as `propertyNames` enums do) and its live states.
pub(super) fn build_automaton(
    pattern: &str,
    search: bool,
    at: &str,
) -> Result<(dense::DFA<Vec<u32>>, LiveTable), ConstraintError> {
    let translated = ecma_to_rust(pattern);
    regex_automata::util::syntax::parse(&translated)
        .map_err(|e| err(ErrorCode::Unsupported, at, format!("pattern `{pattern}` is not supported: {e}")))?;
    // A search matches anywhere, so pad with `.*` on each side that is not anchored; an
    // explicit `^...$` pattern needs no padding (and no look-around in the automaton).
    let full = if search {
        let (head, body) = match translated.strip_prefix('^') {
            Some(rest) => ("", rest.to_string()),
            None => ("(?s:.)*", translated.clone()),
        };
        let ends = body.ends_with('$') && !body.ends_with("\\$");
        let (body, tail) = if ends { (body[..body.len() - 1].to_string(), "") } else { (body, "(?s:.)*") };
        // Only strip when the anchors bind the whole pattern (no top-level alternation).
        if top_level_alternation(&body) {
            format!("(?s:.)*(?:{translated})(?s:.)*")
        } else {
            format!("{head}(?:{body}){tail}")
        }
    } else {
        translated
    };
    let dfa = dspark_guest::dfa::anchored(&full)
        .map_err(|e| err(ErrorCode::TooLarge, at, format!("pattern `{pattern}` is too complex to compile: {e}")))?
        .dfa;
    let live = live_states(&dfa)
        .ok_or_else(|| err(ErrorCode::TooLarge, at, format!("pattern `{pattern}` has too many automaton states")))?;
    Ok((dfa, live))
}

/// Whether a string's writer can produce decoded byte `b` under a pattern: every byte but the
/// control characters, which JSON writes escaped, and of those only the ones with a short
/// escape (`\b`, `\t`, `\n`, `\f`, `\r`), since `\u` escapes are not written under a pattern
/// (see the string recogniser). A pattern that needs another control character is no way on.
fn writable(b: u8) -> bool {
    b >= 0x20 || matches!(b, 0x08 | 0x09 | 0x0A | 0x0C | 0x0D)
}

/// The states of `dfa` from which a match at the end of input is reachable (None when the
/// automaton has more than 100,000 states).
pub(super) fn live_states(dfa: &dense::DFA<Vec<u32>>) -> Option<LiveTable> {
    use regex_automata::dfa::Automaton;
    let cfg = regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes);
    let start = dfa.start_state(&cfg).ok()?;
    let mut seen: HashMap<u32, usize> = HashMap::new();
    let mut order = vec![start];
    seen.insert(start.as_u32(), 0);
    let mut reverse: Vec<Vec<usize>> = vec![Vec::new()];
    // The same edges, each once per byte kind: (predecessor, whether the byte starts a
    // character), for the distance in characters.
    let mut reverse_chars: Vec<Vec<(usize, bool)>> = vec![Vec::new()];
    let mut i = 0;
    while i < order.len() {
        let s = order[i];
        for b in (0..=255u8).filter(|&b| writable(b)) {
            let n = dfa.next_state(s, b);
            if dfa.is_dead_state(n) || dfa.is_quit_state(n) {
                continue;
            }
            let j = match seen.get(&n.as_u32()) {
                Some(&j) => j,
                None => {
                    if order.len() >= 100_000 {
                        return None;
                    }
                    order.push(n);
                    reverse.push(Vec::new());
                    reverse_chars.push(Vec::new());
                    seen.insert(n.as_u32(), order.len() - 1);
                    order.len() - 1
                }
            };
            if !reverse[j].contains(&i) {
                reverse[j].push(i);
            }
            let starts_char = !(0x80..=0xBF).contains(&b);
            if !reverse_chars[j].contains(&(i, starts_char)) {
                reverse_chars[j].push((i, starts_char));
            }
        }
        i += 1;
    }
    // Breadth-first backwards from the states where input may end: distances in bytes.
    let stride2 = dfa.stride2();
    let max_index = order.iter().map(|s| s.as_usize() >> stride2).max().unwrap_or(0);
    let mut dist = vec![u32::MAX; max_index + 1];
    let mut queue: std::collections::VecDeque<(usize, u32)> =
        (0..order.len()).filter(|&k| dfa.is_match_state(dfa.next_eoi_state(order[k]))).map(|k| (k, 0)).collect();
    while let Some((k, d)) = queue.pop_front() {
        let slot = &mut dist[order[k].as_usize() >> stride2];
        if *slot != u32::MAX {
            continue;
        }
        *slot = d;
        queue.extend(reverse[k].iter().map(|&j| (j, d + 1)));
    }
    // Characters: a 0-1 breadth-first search backwards, a byte that starts a character
    // costing 1 and a continuation byte 0.
    let mut char_dist = vec![u32::MAX; max_index + 1];
    let mut best = vec![u32::MAX; order.len()];
    let mut deque: std::collections::VecDeque<(usize, u32)> =
        (0..order.len()).filter(|&k| dfa.is_match_state(dfa.next_eoi_state(order[k]))).map(|k| (k, 0)).collect();
    for &(k, _) in &deque {
        best[k] = 0;
    }
    while let Some((k, d)) = deque.pop_front() {
        if d > best[k] {
            continue;
        }
        char_dist[order[k].as_usize() >> stride2] = d;
        for &(j, starts_char) in &reverse_chars[k] {
            let nd = d + u32::from(starts_char);
            if nd < best[j] {
                best[j] = nd;
                if starts_char { deque.push_back((j, nd)) } else { deque.push_front((j, nd)) }
            }
        }
    }
    let safe = safe_states(dfa, &order, &seen, &dist, stride2, max_index);
    let infinite = every_live_state_infinite(dfa, &order, &seen, &dist, stride2);
    Some(LiveTable { stride2, dist, char_dist, safe, infinite })
}

/// Whether every live state in `order` (all states reachable from the start) has infinitely
/// many completions, i.e. reaches a cycle of live states, counting only the bytes a string
/// under a pattern can carry (no control characters but the simple escapes'). Live states
/// that cannot reach such a cycle are peeled off from the ones with no live successor left.
pub(super) fn every_live_state_infinite(
    dfa: &dense::DFA<Vec<u32>>,
    order: &[regex_automata::util::primitives::StateID],
    seen: &HashMap<u32, usize>,
    dist: &[u32],
    stride2: usize,
) -> bool {
    use regex_automata::dfa::Automaton;
    let live = |k: usize| dist[order[k].as_usize() >> stride2] != u32::MAX;
    let mut successors: Vec<Vec<u32>> = vec![Vec::new(); order.len()];
    let mut predecessors: Vec<Vec<u32>> = vec![Vec::new(); order.len()];
    for (k, &st) in order.iter().enumerate().filter(|&(k, _)| live(k)) {
        for b in (0..=255u8).filter(|&b| writable(b)) {
            if let Some(&j) = seen.get(&dfa.next_state(st, b).as_u32())
                && live(j)
                && !successors[k].contains(&(j as u32))
            {
                successors[k].push(j as u32);
                predecessors[j].push(k as u32);
            }
        }
    }
    let mut left: Vec<usize> = successors.iter().map(Vec::len).collect();
    let mut peel: Vec<usize> = (0..order.len()).filter(|&k| live(k) && left[k] == 0).collect();
    let mut finite = vec![false; order.len()];
    while let Some(k) = peel.pop() {
        if std::mem::replace(&mut finite[k], true) {
            continue;
        }
        for &p in &predecessors[k] {
            left[p as usize] -= 1;
            if left[p as usize] == 0 {
                peel.push(p as usize);
            }
        }
    }
    !finite.iter().any(|&f| f)
}

/// Past this many automaton states, no state is called safe (the check below walks every
/// state with every UTF-8 decoder position).
pub(super) const MAX_SAFE_CHECK_STATES: usize = 512;

/// By state index: whether every well-formed UTF-8 continuation from the state (at a
/// character boundary) keeps the automaton able to match. A search pattern that has matched
/// is safe, and so is one padded with `.*` before it matches: content then needs no walk
/// through the automaton. Over (state, UTF-8 decoder position) pairs: a pair is unsafe when
/// a byte well-formed there leads to the dead state or one that cannot match, or to an
/// unsafe pair.
pub(super) fn safe_states(
    dfa: &dense::DFA<Vec<u32>>,
    order: &[regex_automata::util::primitives::StateID],
    seen: &HashMap<u32, usize>,
    dist: &[u32],
    stride2: usize,
    max_index: usize,
) -> Vec<bool> {
    use dspark_guest::Utf8Step;
    use regex_automata::dfa::Automaton;
    let mut safe = vec![false; max_index + 1];
    if order.len() > MAX_SAFE_CHECK_STATES {
        return safe;
    }
    // The decoder positions reachable from a boundary.
    let mut steps = vec![Utf8Step::BOUNDARY];
    let mut i = 0;
    while i < steps.len() {
        for b in 0..=255u8 {
            if let Some(n) = steps[i].next(b)
                && !steps.contains(&n)
            {
                steps.push(n);
            }
        }
        i += 1;
    }
    let u = steps.len();
    let live = |st: regex_automata::util::primitives::StateID| dist[st.as_usize() >> stride2] != u32::MAX;
    let mut bad = vec![false; order.len() * u];
    let mut reverse: Vec<Vec<u32>> = vec![Vec::new(); order.len() * u];
    for (k, &st) in order.iter().enumerate() {
        for (ui, step) in steps.iter().enumerate() {
            let node = k * u + ui;
            if !live(st) {
                bad[node] = true;
                continue;
            }
            for b in (0..=255u8).filter(|&b| writable(b)) {
                let Some(next_step) = step.next(b) else { continue };
                let next = dfa.next_state(st, b);
                let target = (!dfa.is_dead_state(next) && !dfa.is_quit_state(next) && live(next))
                    .then(|| seen.get(&next.as_u32()))
                    .flatten();
                match (target, steps.iter().position(|&s| s == next_step)) {
                    (Some(&j), Some(uj)) => reverse[j * u + uj].push(node as u32),
                    _ => {
                        bad[node] = true;
                        break;
                    }
                }
            }
        }
    }
    let mut unsafe_ = vec![false; order.len() * u];
    let mut stack: Vec<u32> = (0..bad.len() as u32).filter(|&x| bad[x as usize]).collect();
    while let Some(x) = stack.pop() {
        if std::mem::replace(&mut unsafe_[x as usize], true) {
            continue;
        }
        stack.extend(reverse[x as usize].iter().copied().filter(|&y| !unsafe_[y as usize]));
    }
    for (k, st) in order.iter().enumerate() {
        // Index 0 of `steps` is the boundary.
        safe[st.as_usize() >> stride2] = !unsafe_[k * u];
    }
    safe
}

/// Whether `p` has a `|` outside any group or class.
pub(super) fn top_level_alternation(p: &str) -> bool {
    let (mut depth, mut class, mut esc) = (0i32, false, false);
    for c in p.chars() {
        if esc {
            esc = false;
            continue;
        }
        match c {
            '\\' => esc = true,
            '[' if !class => class = true,
            ']' if class => class = false,
            '(' if !class => depth += 1,
            ')' if !class => depth -= 1,
            '|' if !class && depth == 0 => return true,
            _ => {}
        }
    }
    false
}

/// ECMA-262 character classes that differ from Rust's: `\d` and `\w` are ASCII in ECMA.
pub(super) fn ecma_to_rust(p: &str) -> String {
    let mut out = String::with_capacity(p.len() + 8);
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('d') => out.push_str("[0-9]"),
                Some('D') => out.push_str("[^0-9]"),
                Some('w') => out.push_str("[0-9A-Za-z_]"),
                Some('W') => out.push_str("[^0-9A-Za-z_]"),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}
