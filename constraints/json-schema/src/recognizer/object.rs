//! Objects: the object frame's phases, declared keys through the key trie (in schema order or
//! any order, with `required`, dependencies and `maxProperties`), and undeclared keys through
//! the `patternProperties` automata.

use regex_automata::dfa::Automaton;
use regex_automata::util::primitives::StateID;

use super::SchemaRecognizer;
use super::frame::{Chars, Frame, OBJ_CLOSE, OBJ_COMMA, OBJ_KEY, OBJ_OPEN, OBJ_VALUE, advance_chars};
use super::layout::container_depth;
use super::state::Config;
use crate::graph::{Node, NodeId, PropertyOrder};

impl SchemaRecognizer {
    /// Feeds `b` to an object frame (`top`, a [`Frame::Obj`]): a key's quote, `:`, `,`, `}` and layout.
    pub(crate) fn step_object(&self, mut stack: Config, top: Frame, b: u8, out: &mut Vec<Config>) {
        let Frame::Obj { node, phase, next, seen, count, pending } = top else { return };
        let g = &self.graph;
        let layout = &self.layout;
        let Node::Object(o) = g.node(node) else { return };
        let indent = layout.indent.is_some();
        match (phase, b) {
            (OBJ_KEY, b':') => {
                stack.push(Frame::Obj { node, phase: OBJ_VALUE, next, seen, count, pending });
                stack.push(Frame::Value(pending));
                if !layout.key_after.is_empty() {
                    stack.push(Frame::Pad { text: 0, pos: 0 });
                }
                out.push(stack);
            }
            (OBJ_VALUE, b',') if count < o.max_props && self.key_possible(node, next, seen, count) => {
                let d = container_depth(&stack) + 1;
                stack.push(Frame::Obj { node, phase: OBJ_COMMA, next, seen, count, pending });
                match layout.after_comma(d) {
                    Some(pad) if !layout.pads[pad as usize].is_empty() => stack.push(Frame::Pad { text: pad, pos: 0 }),
                    Some(_) => {}
                    None => return,
                }
                out.push(stack);
            }
            // Indented: a non-empty object opens its first key and closes on a new line.
            (OBJ_OPEN, b'\n') if indent && count < o.max_props && self.key_possible(node, next, seen, count) => {
                let d = container_depth(&stack) + 1;
                let Some(pad) = layout.line(d) else { return };
                stack.push(Frame::Obj { node, phase: OBJ_COMMA, next, seen, count, pending });
                if layout.pads[pad as usize].len() > 1 {
                    stack.push(Frame::Pad { text: pad, pos: 1 });
                }
                out.push(stack);
            }
            (OBJ_VALUE, b'\n') if indent && self.object_closable(node, next, seen, count) => {
                let d = container_depth(&stack);
                let Some(pad) = layout.line(d) else { return };
                stack.push(Frame::Obj { node, phase: OBJ_CLOSE, next, seen, count, pending });
                if layout.pads[pad as usize].len() > 1 {
                    stack.push(Frame::Pad { text: pad, pos: 1 });
                }
                out.push(stack);
            }
            (OBJ_OPEN, b'}') | (OBJ_VALUE, b'}')
                if (phase == OBJ_OPEN || !indent) && self.object_closable(node, next, seen, count) =>
            {
                if let Some(stack) = self.end_captured_item(stack, b) {
                    out.push(stack);
                }
            }
            (OBJ_CLOSE, b'}') => {
                if let Some(stack) = self.end_captured_item(stack, b) {
                    out.push(stack);
                }
            }
            (OBJ_OPEN, b'"') if indent => {}
            (OBJ_OPEN | OBJ_COMMA, b'"') if count < o.max_props => {
                let (lo, hi) = self.key_window(node, next, seen, count);
                let base = Frame::Obj { node, phase: OBJ_KEY, next, seen, count: count + 1, pending };
                if lo <= hi
                    && let Some(t) = o.keys.child(0, b'"')
                    && self.key_reachable(node, t, lo, hi, seen)
                {
                    let mut s = stack.clone();
                    s.push(base.clone());
                    s.push(Frame::Key { obj: node, trie: t, lo, hi, seen });
                    out.push(s);
                }
                if (o.additional != crate::graph::NEVER || !o.patterns.is_empty())
                    && self.additional_allowed(node, next, seen)
                {
                    let mut dfa = [0u32; 4];
                    for (k, &p) in o.patterns.iter().enumerate().take(4) {
                        dfa[k] = self.dfa_start(p);
                    }
                    stack.push(base);
                    stack.push(Frame::FreeKey { obj: node, trie: o.keys.child(0, b'"'), chars: Chars::default(), dfa });
                    out.push(stack);
                }
            }
            _ => {}
        }
    }

    /// Feeds `b` to a declared key (`top`, a [`Frame::Key`]), through the object's key trie.
    pub(crate) fn step_key(&self, mut stack: Config, top: Frame, b: u8, out: &mut Vec<Config>) {
        let Frame::Key { obj, trie, lo, hi, seen } = top else { return };
        let g = &self.graph;
        let Node::Object(o) = g.node(obj) else { return };
        let Some(t) = o.keys.child(trie, b) else { return };
        if !self.key_reachable(obj, t, lo, hi, seen) {
            return;
        }
        match o.keys.terminal[t as usize] {
            Some(i)
                if (lo..=hi).contains(&i)
                    && b == b'"'
                    && o.keys.edges.is_leaf(t)
                    && self.dependencies_writable(o, i, seen)
                    && o.allows_with_forbidden(i, seen) =>
            {
                // The key is complete: record it in the object frame.
                let Some(Frame::Obj { node, phase, next, seen, count, .. }) = stack.pop() else { return };
                let bit = if i < 64 { 1u64 << i } else { 0 };
                let (next, seen) = match g.order {
                    // Schema order tracks presence only where a dependency needs it.
                    PropertyOrder::Schema => (i + 1, seen | (bit & o.dep_mask)),
                    PropertyOrder::Any => (next, seen | bit),
                };
                stack.push(Frame::Obj { node, phase, next, seen, count, pending: o.props[i as usize].node });
                out.push(stack);
            }
            _ => {
                stack.push(Frame::Key { obj, trie: t, lo, hi, seen });
                out.push(stack);
            }
        }
    }

    /// Feeds `b` to an undeclared key (`top`, a [`Frame::FreeKey`]): its text through the
    /// `patternProperties` automata, its closing quote to the value schema they select.
    pub(crate) fn step_free_key(&self, mut stack: Config, top: Frame, b: u8, out: &mut Vec<Config>) {
        let Frame::FreeKey { obj, trie, chars, mut dfa } = top else { return };
        let g = &self.graph;
        let Node::Object(o) = g.node(obj) else { return };
        if chars.esc == 0 && chars.utf8 == 0 && b == b'"' {
            // A declared name is not an additional property.
            if let Some(t) = trie
                && o.keys.child(t, b'"').is_some_and(|e| o.keys.terminal[e as usize].is_some())
            {
                return;
            }
            let mut subset = 0usize;
            for (k, &p) in o.patterns.iter().enumerate().take(4) {
                let d = &g.dfas[p as usize];
                let st = StateID::new(dfa[k] as usize).unwrap_or(StateID::ZERO);
                if d.is_match_state(d.next_eoi_state(st)) {
                    subset |= 1 << k;
                }
            }
            let value = o.pattern_nodes[subset];
            if value == crate::graph::NEVER {
                return;
            }
            let Some(Frame::Obj { node, phase, next, seen, count, .. }) = stack.pop() else { return };
            stack.push(Frame::Obj { node, phase, next, seen, count, pending: value });
            out.push(stack);
            return;
        }
        if b == b'\\' && chars.esc == 0 && !o.patterns.is_empty() {
            return; // keys matched against patterns are written without escapes
        }
        let Some(chars) = advance_chars(chars, b) else { return };
        let mut live = false;
        for (k, &p) in o.patterns.iter().enumerate().take(4) {
            let d = &g.dfas[p as usize];
            let st = d.next_state(StateID::new(dfa[k] as usize).unwrap_or(StateID::ZERO), b);
            dfa[k] = st.as_u32();
            live |= g.live(p, st.as_u32());
        }
        // With `additionalProperties: false` the key must still be able to match a pattern.
        if o.additional == crate::graph::NEVER && !live {
            return;
        }
        let trie = trie.and_then(|t| o.keys.child(t, b));
        stack.push(Frame::FreeKey { obj, trie, chars, dfa });
        out.push(stack);
    }

    /// The declared properties that may come next: `[lo, hi]` (empty when lo > hi).
    pub(crate) fn key_window(&self, node: NodeId, next: u16, seen: u64, count: u32) -> (u16, u16) {
        let Node::Object(o) = self.graph.node(node) else { return (1, 0) };
        let n = o.props.len() as u16;
        if n == 0 {
            return (1, 0);
        }
        match self.graph.order {
            PropertyOrder::Any => {
                let _ = seen;
                (0, n - 1)
            }
            PropertyOrder::Schema => {
                // Up to and including the first property that must still be written (required,
                // or required by a dependency of a written one).
                let needed = o.dep_needed(seen);
                let mut hi = (next..n)
                    .find(|&i| o.props[i as usize].required || (i < 64 && needed & (1 << i) != 0))
                    .unwrap_or(n.saturating_sub(1));
                // With no undeclared key to make up the number, property `i` leaves only the
                // ones after it: `count + 1 + (n - 1 - i)` must reach `minProperties`.
                if o.additional == crate::graph::NEVER && o.patterns.is_empty() {
                    let last = n as i64 + count as i64 - o.min_props as i64;
                    if last < next as i64 {
                        return (1, 0);
                    }
                    hi = hi.min(last.min(u16::MAX as i64) as u16);
                }
                (next, hi)
            }
        }
    }

    /// Whether the key trie node `t` leads to a property in `[lo, hi]` not yet seen.
    pub(crate) fn key_reachable(&self, node: NodeId, t: u32, lo: u16, hi: u16, seen: u64) -> bool {
        let Node::Object(o) = self.graph.node(node) else { return false };
        o.keys.below[t as usize].iter().any(|&i| {
            i >= lo
                && i <= hi
                && (i >= 64 || seen & (1 << i) == 0)
                && o.props[i as usize].node != crate::graph::NEVER
                && self.dependencies_writable(o, i, seen)
                && o.allows_with_forbidden(i, seen)
        })
    }

    /// Whether writing property `i` now leaves every property it requires writable: already
    /// written, or (schema order) still ahead of it.
    pub(crate) fn dependencies_writable(&self, o: &crate::graph::ObjectNode, i: u16, seen: u64) -> bool {
        o.deps.iter().filter(|(t, _)| *t == i).all(|(_, m)| {
            let missing = m & !seen;
            match self.graph.order {
                PropertyOrder::Any => true,
                PropertyOrder::Schema => (0..=i.min(63)).all(|k| missing & (1 << k) == 0),
            }
        })
    }

    /// Whether any key may come now (so that a `,` is not a dead end).
    pub(crate) fn key_possible(&self, node: NodeId, next: u16, seen: u64, count: u32) -> bool {
        let Node::Object(o) = self.graph.node(node) else { return false };
        let (lo, hi) = self.key_window(node, next, seen, count);
        let declared = lo <= hi && o.keys.child(0, b'"').is_some_and(|t| self.key_reachable(node, t, lo, hi, seen));
        declared
            || ((o.additional != crate::graph::NEVER || !o.patterns.is_empty())
                && self.additional_allowed(node, next, seen))
    }

    /// Whether an undeclared key may come now.
    pub(crate) fn additional_allowed(&self, node: NodeId, next: u16, seen: u64) -> bool {
        let Node::Object(o) = self.graph.node(node) else { return false };
        match self.graph.order {
            PropertyOrder::Any => true,
            // Additional properties come after every required declared one.
            PropertyOrder::Schema => !o.props[next as usize..].iter().any(|p| p.required) && o.dep_needed(seen) == 0,
        }
    }

    /// Whether `}` may come now.
    pub(crate) fn object_closable(&self, node: NodeId, next: u16, seen: u64, count: u32) -> bool {
        let Node::Object(o) = self.graph.node(node) else { return false };
        if count < o.min_props {
            return false;
        }
        if o.dep_needed(seen) != 0 {
            return false;
        }
        match self.graph.order {
            PropertyOrder::Schema => !o.props[(next as usize).min(o.props.len())..].iter().any(|p| p.required),
            PropertyOrder::Any => {
                o.props.iter().enumerate().all(|(i, p)| !p.required || (i < 64 && seen & (1 << i) != 0))
            }
        }
    }
}
