//! Arrays: items, separators and bounds, with exact `uniqueItems` where the items allow it.

use super::SchemaRecognizer;
use super::frame::{ARR_CLOSE, ARR_COMMA, ARR_OPEN, ARR_VALUE, Frame, NO_ITEM};
use super::layout::container_depth;
use super::number::int_values_left;
use super::state::Config;
use crate::graph::Node;

impl SchemaRecognizer {
    /// Feeds `b` to an array frame (`top`, a [`Frame::Arr`]): items, `,`, `]` and layout, with
    /// exact `uniqueItems` where the items allow it.
    pub(crate) fn step_array(&self, mut stack: Config, top: Frame, b: u8, out: &mut Vec<Config>, depth: u32) {
        let Frame::Arr { node, phase, count, used, texts, start } = top else { return };
        let g = &self.graph;
        let layout = &self.layout;
        let Node::Array(a) = g.node(node) else { return };
        // Under an exact `uniqueItems`, another item needs an unwritten literal, or an
        // unwritten integer within the bounds (asked only at a `,`).
        let more = || {
            a.unique.is_none_or(|set| g.literals[set as usize].below[0] & !used != 0)
                && (!a.unique_ints || int_values_left(g, a.items, texts.as_ref().map_or(0, |t| t.len())))
        };
        let indent = layout.indent.is_some();
        match (phase, b) {
            (ARR_OPEN, b']') if count >= a.min_items => out.push(stack),
            (ARR_VALUE, b']') if !indent && count >= a.min_items => out.push(stack),
            (ARR_CLOSE, b']') => out.push(stack),
            (ARR_VALUE, b',') if more() && count < a.max_items && self.item_node(node, count).is_some() => {
                let d = container_depth(&stack) + 1;
                stack.push(Frame::Arr { node, phase: ARR_COMMA, count, used, texts, start });
                match layout.after_comma(d) {
                    Some(pad) if !layout.pads[pad as usize].is_empty() => stack.push(Frame::Pad { text: pad, pos: 0 }),
                    Some(_) => {}
                    None => return,
                }
                out.push(stack);
            }
            (ARR_OPEN, b'\n') if indent && count < a.max_items && self.item_node(node, count).is_some() => {
                let d = container_depth(&stack) + 1;
                let Some(pad) = layout.line(d) else { return };
                stack.push(Frame::Arr { node, phase: ARR_COMMA, count, used, texts, start });
                if layout.pads[pad as usize].len() > 1 {
                    stack.push(Frame::Pad { text: pad, pos: 1 });
                }
                out.push(stack);
            }
            (ARR_VALUE, b'\n') if indent && count >= a.min_items => {
                let d = container_depth(&stack);
                let Some(pad) = layout.line(d) else { return };
                stack.push(Frame::Arr { node, phase: ARR_CLOSE, count, used, texts, start });
                if layout.pads[pad as usize].len() > 1 {
                    stack.push(Frame::Pad { text: pad, pos: 1 });
                }
                out.push(stack);
            }
            (ARR_OPEN, _) if indent => {}
            (ARR_OPEN | ARR_COMMA, _) if count < a.max_items => {
                let Some(item) = self.item_node(node, count) else { return };
                // An item compared whole: its bytes are captured from here (the
                // capture of an enclosing item, if one is open, goes on).
                let start = if a.unique_values {
                    let at = stack.capture_len().unwrap_or(0);
                    stack.begin_capture();
                    at
                } else {
                    NO_ITEM
                };
                stack.push(Frame::Arr { node, phase: ARR_VALUE, count: count + 1, used, texts, start });
                match a.unique {
                    Some(set) => {
                        stack.push(Frame::Lit { set, trie: 0, unique: Some(used) });
                        self.step(stack, b, out, depth + 1);
                    }
                    // A string whose text is tracked from its first byte, or a literal.
                    None if a.unique_text => self.start_tracked_item(stack, item, b, out, depth + 1),
                    None => self.start_value(stack, item, b, out, depth + 1),
                }
            }
            _ => {}
        }
    }
}
