//! One byte through one configuration: [`SchemaRecognizer::step`] takes the top frame and
//! hands it to the step of its value kind (objects, arrays, strings, numbers in their own
//! files; literals and the start of a value here).

use super::SchemaRecognizer;
use super::frame::{ARR_OPEN, Frame, NO_ITEM, NUM_START, OBJ_OPEN};
use super::layout::is_json_ws;
use super::state::Config;
use super::unique::{TEXT_START, captured_item_key, is_tracked_item, mark_used, record_item, written_literals};
use crate::graph::{ANY, Node, NodeId};

impl SchemaRecognizer {
    /// Feeds `b` to one configuration; pushes the resulting configurations onto `out`.
    pub(crate) fn step(&self, mut stack: Config, b: u8, out: &mut Vec<Config>, depth: u32) {
        if depth > 64 {
            return; // a union nested this deep in one byte: refuse rather than loop
        }
        let Some(top) = stack.pop() else { return };
        let layout = &self.layout;
        // Free whitespace: a gap between tokens takes whitespace bytes through the whitespace
        // automaton, and ends (if the automaton accepts) at the first byte it does not take.
        if layout.ws.is_some() {
            if let Frame::Ws { s } = top {
                if is_json_ws(b) {
                    // More whitespace than the pattern allows in one gap is refused, not
                    // split into a second gap.
                    if let Some(n) = layout.ws_step(s, b) {
                        stack.push(Frame::Ws { s: n });
                        out.push(stack);
                    }
                } else if layout.ws_accepts(s) {
                    self.step(stack, b, out, depth + 1);
                }
                return;
            }
            if is_json_ws(b) && matches!(top, Frame::Obj { .. } | Frame::Arr { .. } | Frame::Value(_) | Frame::End) {
                if let Some(n) = layout.ws_start().and_then(|s0| layout.ws_step(s0, b)) {
                    stack.push(top);
                    stack.push(Frame::Ws { s: n });
                    out.push(stack);
                }
                return;
            }
        }
        match top {
            Frame::Ws { .. } => {}
            Frame::Pad { text, pos } => {
                let pad = &layout.pads[text as usize];
                if pad.get(pos as usize) == Some(&b) {
                    if pos as usize + 1 < pad.len() {
                        stack.push(Frame::Pad { text, pos: pos + 1 });
                    }
                    out.push(stack);
                }
            }
            Frame::End => {}
            Frame::Value(node) => self.start_value(stack, node, b, out, depth),
            top @ Frame::Obj { .. } => self.step_object(stack, top, b, out),
            top @ Frame::Key { .. } => self.step_key(stack, top, b, out),
            top @ Frame::FreeKey { .. } => self.step_free_key(stack, top, b, out),
            top @ Frame::Arr { .. } => self.step_array(stack, top, b, out, depth),
            top @ Frame::Str { .. } => self.step_string(stack, top, b, out),
            top @ Frame::Num { .. } => self.step_number(stack, top, b, out, depth),
            top @ Frame::Lit { .. } => self.step_literal(stack, top, b, out, depth),
        }
    }

    /// Feeds `b` to a literal of an `enum`/`const` set (`top`, a [`Frame::Lit`]).
    pub(crate) fn step_literal(&self, mut stack: Config, top: Frame, b: u8, out: &mut Vec<Config>, depth: u32) {
        let Frame::Lit { set, trie, unique } = top else { return };
        let g = &self.graph;
        let lits = &g.literals[set as usize];
        // An item beside tracked strings (`ArrayNode::unique_text`): the literals
        // whose keys the array has written count as used.
        let tracked = unique.is_none() && is_tracked_item(g, &stack);
        let unique = if tracked { Some(written_literals(&stack, lits)) } else { unique };
        // Under an exact `uniqueItems`: only towards literals not written yet, and the
        // one completed is recorded in the array.
        let fresh = |node: u32| unique.is_none_or(|used| lits.below[node as usize] & !used != 0);
        let complete = |node: u32| {
            lits.terminal[node as usize] && unique.is_none_or(|used| used >> lits.value[node as usize].min(63) & 1 == 0)
        };
        let record = |stack: &mut Config, value: u32| {
            if tracked {
                record_item(stack, lits.keys[value as usize]);
            } else {
                mark_used(stack, unique, value);
            }
        };
        if let Some(t) = lits.child(trie, b) {
            if !fresh(t) {
                return;
            }
            if lits.terminal[t as usize] && lits.edges.is_leaf(t) {
                if complete(t) {
                    record(&mut stack, lits.value[t as usize]);
                    out.push(stack);
                }
            } else {
                // A tracked item's literal frame reads the array's list afresh.
                let unique = if tracked { None } else { unique };
                stack.push(Frame::Lit { set, trie: t, unique });
                out.push(stack);
            }
        } else if complete(trie) {
            record(&mut stack, lits.value[trie as usize]);
            self.step(stack, b, out, depth + 1);
        }
    }

    /// Starts a value of `node` with byte `b` on top of `stack`.
    pub(crate) fn start_value(&self, mut stack: Config, node: NodeId, b: u8, out: &mut Vec<Config>, depth: u32) {
        if depth > 64 {
            return; // a cycle of references with no structure between them
        }
        let g = &self.graph;
        match g.node(node) {
            Node::Never | Node::Pending => {}
            Node::Union(alts) => {
                for &alt in alts {
                    self.start_value(stack.clone(), alt, b, out, depth + 1);
                }
            }
            Node::Object(o) => {
                if b == b'{' && !(o.props.iter().any(|p| p.required && p.node == crate::graph::NEVER)) {
                    stack.push(Frame::Obj { node, phase: OBJ_OPEN, next: 0, seen: 0, count: 0, pending: ANY });
                    out.push(stack);
                }
            }
            Node::Array(_) => {
                if b == b'[' {
                    stack.push(Frame::Arr { node, phase: ARR_OPEN, count: 0, used: 0, texts: None, start: NO_ITEM });
                    out.push(stack);
                }
            }
            Node::String(_) => {
                if b == b'"' {
                    stack.push(self.string_start(node, None));
                    out.push(stack);
                }
            }
            Node::Number(_) => {
                stack.push(Frame::Num {
                    node,
                    phase: NUM_START,
                    neg: false,
                    value: 0,
                    frac: 0,
                    exp: 0,
                    exp_neg: false,
                });
                self.step(stack, b, out, depth + 1);
            }
            Node::Literals(set) => {
                stack.push(Frame::Lit { set: *set, trie: 0, unique: None });
                self.step(stack, b, out, depth + 1);
            }
        }
    }

    /// Starts an item of an array under [`crate::graph::ArrayNode::unique_text`] with byte
    /// `b`: a string alternative tracks its text, a literal one checks the array's list.
    pub(crate) fn start_tracked_item(&self, mut stack: Config, node: NodeId, b: u8, out: &mut Vec<Config>, depth: u32) {
        if depth > 64 {
            return;
        }
        match self.graph.node(node) {
            Node::Union(alts) => {
                for &alt in alts {
                    self.start_tracked_item(stack.clone(), alt, b, out, depth + 1);
                }
            }
            Node::String(_) => {
                if b == b'"' {
                    stack.push(self.string_start(node, Some(TEXT_START)));
                    out.push(stack);
                }
            }
            _ => self.start_value(stack, node, b, out, depth + 1),
        }
    }

    /// At `last`, the byte that closes a value whose frame was just popped off `stack`: when
    /// that value is an item compared whole ([`crate::graph::ArrayNode::unique_values`]),
    /// records it in its array and closes its capture, or returns `None` when an earlier
    /// item of the array has the same value (a repeat: the byte is refused).
    pub(crate) fn end_captured_item(&self, mut stack: Config, last: u8) -> Option<Config> {
        let Some(&Frame::Arr { node, start, .. }) = stack.top() else { return Some(stack) };
        if start == NO_ITEM || !matches!(self.graph.node(node), Node::Array(a) if a.unique_values) {
            return Some(stack);
        }
        let key = captured_item_key(&stack, start, last);
        if !record_item(&mut stack, key) {
            return None;
        }
        if let Some(Frame::Arr { node, phase, count, used, texts, .. }) = stack.pop() {
            stack.push(Frame::Arr { node, phase, count, used, texts, start: NO_ITEM });
        }
        // The outermost captured item began the capture: nothing encloses it.
        if start == 0 {
            stack.end_capture();
        }
        Some(stack)
    }

    /// The node of item `index` of an array, if one may come there.
    pub(crate) fn item_node(&self, node: NodeId, index: u32) -> Option<NodeId> {
        let Node::Array(a) = self.graph.node(node) else { return None };
        let n = a.prefix.get(index as usize).copied().unwrap_or(a.items);
        (n != crate::graph::NEVER).then_some(n)
    }
}
