//! Passes over the built graph: which nodes can finish a value at all (unproductive
//! alternatives are pruned, a schema that admits nothing is an error), and unions flattened
//! into one level (the recogniser follows unions only so deep within one byte).

use super::Compiler;
use crate::graph::{NEVER, Node, NodeId};

impl<'a> Compiler<'a> {
    /// Which nodes admit some value: a union is productive when one of its branches is.
    pub(super) fn productive(&self, root: NodeId) -> Vec<bool> {
        let n = self.nodes.len();
        let mut good = vec![false; n];
        // Objects with a required property, and arrays with a required item, are as
        // productive as those; a union as its best branch; everything else is.
        let waits = |node: &Node| match node {
            Node::Never | Node::Pending | Node::Union(_) => true,
            Node::Object(o) => o.props.iter().any(|p| p.required),
            Node::Array(a) => a.min_items > 0,
            _ => false,
        };
        for (i, node) in self.nodes.iter().enumerate() {
            good[i] = !waits(node);
        }
        loop {
            let mut changed = false;
            for (i, node) in self.nodes.iter().enumerate() {
                if good[i] {
                    continue;
                }
                let now = match node {
                    Node::Union(alts) => alts.iter().any(|&a| good[a as usize]),
                    Node::Object(o) => o.props.iter().filter(|p| p.required).all(|p| good[p.node as usize]),
                    Node::Array(a) => {
                        let needed = a.min_items as usize;
                        a.prefix.iter().take(needed).all(|&n| good[n as usize])
                            && (needed <= a.prefix.len() || good[a.items as usize])
                    }
                    _ => false,
                };
                if now {
                    good[i] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        debug_assert!((root as usize) < n);
        good
    }

    /// Cuts every way into a node that admits no value (`good` from [`Self::productive`]),
    /// so the recogniser never offers a key, an item or a branch it could not finish: an
    /// optional property whose schema is unsatisfiable (say an object that requires a key
    /// its `additionalProperties: false` forbids) becomes a key that cannot be written, an
    /// unsatisfiable item ends the array before it, an unsatisfiable branch is dropped.
    /// Without this a generation could write `"instance":` and find no value to follow.
    pub(super) fn prune_unproductive(&mut self, good: &[bool]) {
        let never = |id: NodeId| if good[id as usize] { id } else { NEVER };
        for node in &mut self.nodes {
            match node {
                Node::Union(alts) => alts.iter_mut().for_each(|a| *a = never(*a)),
                Node::Object(o) => {
                    o.props.iter_mut().for_each(|p| p.node = never(p.node));
                    o.additional = never(o.additional);
                }
                Node::Array(a) => {
                    if let Some(i) = a.prefix.iter().position(|&p| !good[p as usize]) {
                        a.max_items = a.max_items.min(i as u32);
                    } else if !good[a.items as usize] {
                        a.max_items = a.max_items.min(a.prefix.len() as u32);
                    }
                }
                _ => {}
            }
        }
    }

    /// Replaces every union's alternatives by the nodes that are not unions reachable from it
    /// through unions (each once, `never` left out). Each `$ref` and `anyOf` level is a union,
    /// and the recogniser follows unions within one byte only so deep (it must stop on a
    /// cycle of references with no structure between them), so a chain of a hundred `$ref`s
    /// would otherwise admit nothing while writing. The language is the same. Past a budget of
    /// steps (schemas with very many unions) the remaining unions stay as they are.
    pub(super) fn flatten_unions(&mut self) {
        const BUDGET: usize = 4_000_000;
        let mut budget = BUDGET;
        // `mark[node] == stamp`: already taken for the union being flattened.
        let mut mark = vec![0u32; self.nodes.len()];
        let mut flat: Vec<(usize, Vec<NodeId>)> = Vec::new();
        for id in 0..self.nodes.len() {
            if !matches!(self.nodes[id], Node::Union(_)) {
                continue;
            }
            let stamp = id as u32 + 1;
            mark[id] = stamp;
            let (mut leaves, mut pending) = (Vec::new(), vec![id]);
            while let Some(union) = pending.pop() {
                let Node::Union(alts) = &self.nodes[union] else { continue };
                for &alt in alts {
                    let Some(left) = budget.checked_sub(1) else {
                        return self.set_flattened(flat);
                    };
                    budget = left;
                    if std::mem::replace(&mut mark[alt as usize], stamp) == stamp {
                        continue;
                    }
                    match self.nodes[alt as usize] {
                        Node::Union(_) => pending.push(alt as usize),
                        Node::Never => {}
                        _ => leaves.push(alt),
                    }
                }
            }
            flat.push((id, leaves));
        }
        self.set_flattened(flat);
    }

    pub(super) fn set_flattened(&mut self, flat: Vec<(usize, Vec<NodeId>)>) {
        for (id, leaves) in flat {
            self.nodes[id] = Node::Union(leaves);
        }
    }
}
