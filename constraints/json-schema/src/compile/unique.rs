//! `uniqueItems`, decided once the whole graph is built: which item schemas the recogniser can
//! keep unique (enums of literals, extensible strings, integers, open objects) and which only
//! with a warning.

use dspark_guest::Warning;

use super::{Compiler, EXACT};
use crate::graph::{NEVER, Node, NodeId, NumberNode};

impl<'a> Compiler<'a> {
    /// `uniqueItems`: enforced where every item comes from one small literal set (an `enum`
    /// of strings, booleans, null), by remembering in the state which values were written,
    /// and where every item is an open string (see [`Self::open_string_of`]: whatever has
    /// been written can be extended, so refusing the closing quote of a repeat never leaves
    /// the writer stuck), by remembering a hash of each item's decoded text; likewise over
    /// strings with only a `maxLength`, literals beside such strings
    /// ([`Self::tracked_items_of`]), integers ([`Self::unique_integer_of`]), and objects
    /// that can always take another property ([`Self::open_objects_of`]); elsewhere a warning
    /// (other values could repeat in ways that are only visible once they end, with no way
    /// to avoid it by then). Runs once all nodes are built.
    pub(super) fn resolve_unique_arrays(&mut self) {
        for (id, ptr) in std::mem::take(&mut self.unique_arrays) {
            let Node::Array(a) = &self.nodes[id as usize] else { continue };
            let (items, exact, min_items) = (a.items, a.prefix.is_empty(), a.min_items);
            match self.literal_set_of(items).filter(|&set| exact && self.literals[set as usize].len() <= 64) {
                Some(set) => {
                    let values = self.literals[set as usize].len() as u32;
                    let Node::Array(a) = &mut self.nodes[id as usize] else { continue };
                    a.unique = Some(set);
                    a.max_items = a.max_items.min(values);
                    if a.min_items > a.max_items {
                        self.nodes[id as usize] = Node::Never;
                    }
                }
                None => match (self.open_string_of(items), self.unique_integer_of(items, min_items)) {
                    (Some(string), _) if exact => {
                        let Node::Array(a) = &mut self.nodes[id as usize] else { continue };
                        a.items = string;
                        a.unique_text = true;
                    }
                    (_, Some(mut number)) if exact => {
                        // A copy that keeps its value in the state, so other uses of the node
                        // keep their small states.
                        number.keep_value = true;
                        let number = self.push(Node::Number(number));
                        let Node::Array(a) = &mut self.nodes[id as usize] else { continue };
                        a.items = number;
                        a.unique_ints = true;
                    }
                    _ if exact && self.tracked_items_of(items) => {
                        let Node::Array(a) = &mut self.nodes[id as usize] else { continue };
                        a.unique_text = true;
                    }
                    _ if exact && self.open_objects_of(items) => {
                        let Node::Array(a) = &mut self.nodes[id as usize] else { continue };
                        a.unique_values = true;
                    }
                    _ => self.warn_permissive(Warning {
                        location: format!("#{ptr}/uniqueItems"),
                        message: "`uniqueItems` is not enforced: an array may repeat items (it is enforced for \
                              items from an `enum` of at most 64 strings, booleans or null, for \
                              strings with no `pattern` or `format` that can run out of ways to go on and no \
                              `maxLength` beside a pattern (with those literals beside them), for integers with no `multipleOf`, \
                              and for objects that admit additional properties and have no `maxProperties`)"
                            .into(),
                    }),
                },
            }
        }
    }

    /// The string node that node `id` is (following one-branch unions), if any prefix of it
    /// can be extended into infinitely many strings: no `maxLength`, and no pattern or
    /// format, or one whose every live state has infinitely many completions.
    pub(super) fn open_string_of(&self, mut id: NodeId) -> Option<NodeId> {
        for _ in 0..16 {
            match &self.nodes[id as usize] {
                Node::String(s)
                    if s.max_len == u32::MAX
                        && (s.patterns.is_empty()
                            || (s.patterns.len() == 1 && self.live[s.patterns[0] as usize].infinite)) =>
                {
                    return Some(id);
                }
                Node::Union(alts) if alts.len() == 1 => id = alts[0],
                _ => return None,
            }
        }
        None
    }

    /// Whether every value node `id` admits (through unions) is a string that can always be
    /// written on or a small literal set: what [`ArrayNode::unique_text`] needs. A string
    /// qualifies with no `maxLength` and no pattern or one with infinitely many completions
    /// ([`Self::open_string_of`]), or with a `maxLength` of at least 1 and no pattern (a
    /// repeat is then refused at the character that fills it, and another character is
    /// always left).
    pub(super) fn tracked_items_of(&self, id: NodeId) -> bool {
        self.every_branch(id, |node, id| match node {
            Node::String(s) if s.patterns.is_empty() && s.max_len >= 1 && s.min_len <= s.max_len => true,
            Node::String(_) => self.open_string_of(id).is_some(),
            Node::Literals(set) => self.literals[*set as usize].len() <= 64,
            _ => false,
        })
    }

    /// Whether `accept` holds for every node other than a union that `id` leads to through
    /// unions (at most 256 nodes; cycles of unions count once).
    pub(super) fn every_branch(&self, id: NodeId, accept: impl Fn(&Node, NodeId) -> bool) -> bool {
        let (mut todo, mut seen) = (vec![id], std::collections::HashSet::new());
        while let Some(id) = todo.pop() {
            if !seen.insert(id) {
                continue;
            }
            if seen.len() > 256 {
                return false;
            }
            match &self.nodes[id as usize] {
                Node::Union(alts) if !alts.is_empty() => todo.extend(alts.iter().copied()),
                node if accept(node, id) => {}
                _ => return false,
            }
        }
        true
    }

    /// Whether every value node `id` admits is an object that can always take one more
    /// property, whatever has been written: additional properties allowed (of any name, or of
    /// any name no pattern claims, with a value every pattern combination admits), no
    /// `maxProperties`. Through unions (`anyOf`, `oneOf`, references), all of whose branches
    /// must be such objects. What [`ArrayNode::unique_values`] needs so a repeat refused at
    /// its `}` never leaves the writer stuck.
    pub(super) fn open_objects_of(&self, id: NodeId) -> bool {
        let admits = |n: NodeId| n != NEVER && !matches!(self.nodes[n as usize], Node::Never);
        self.every_branch(id, |node, _| {
            matches!(node, Node::Object(o)
                if admits(o.additional) && o.max_props == u32::MAX && o.pattern_nodes.iter().all(|&n| admits(n)))
        })
    }

    /// The integer node `id` is (through one-branch unions), if [`ArrayNode::unique_ints`]
    /// can hold its items exact: no `multipleOf`, bounds (if any) within 2^53 so each value
    /// is exact in the state, and at least `min_items` values between them. The recogniser
    /// then refuses a digit past which only written values are left, and a `,` once none is.
    pub(super) fn unique_integer_of(&self, mut id: NodeId, min_items: u32) -> Option<NumberNode> {
        for _ in 0..16 {
            match &self.nodes[id as usize] {
                Node::Number(n)
                    if n.integer
                        && n.multiple_of.is_none()
                        && n.exact.is_none()
                        && [n.min, n.max].iter().flatten().all(|(m, _)| m.abs() <= EXACT) =>
                {
                    let (lo, hi) = crate::graph::integer_bounds(n);
                    if let (Some(lo), Some(hi)) = (lo, hi)
                        && hi - lo + 1.0 < f64::from(min_items)
                    {
                        return None;
                    }
                    return Some(n.clone());
                }
                Node::Union(alts) if alts.len() == 1 => id = alts[0],
                _ => return None,
            }
        }
        None
    }

    /// The literal set node `id` is (through one-branch unions, as references compile to),
    /// if it is one already built.
    pub(super) fn literal_set_of(&self, mut id: NodeId) -> Option<u32> {
        for _ in 0..16 {
            match &self.nodes[id as usize] {
                Node::Literals(set) => return Some(*set),
                Node::Union(alts) if alts.len() == 1 => id = alts[0],
                _ => return None,
            }
        }
        None
    }
}
