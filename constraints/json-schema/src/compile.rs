//! JSON Schema to [`Graph`]: normalisation (inline `$ref`, merge `allOf`, push sibling keywords
//! into `anyOf`/`oneOf` branches) and node building.
//!
//! Decisions, where JSON Schema leaves room:
//! - `$ref` resolves within the document: `#` JSON pointers, `#name` anchors (`$anchor`, and
//!   draft-6/7 `$id: "#name"`), and `$defs`/`definitions` by pointer. A remote reference is an
//!   error: the sandbox has no network. Recursive references become graph cycles.
//! - `allOf` branches are merged into one schema (properties merged per key, `required`
//!   united, bounds tightened, `type` intersected); what cannot be merged is an error naming
//!   the keyword.
//! - `oneOf` is exact where its branches have disjoint types, or where they can be negated
//!   (the forms `if` takes, no `$ref` in the branches): the union of each branch with every
//!   other failing. Where the only obstacle is property schemas that cannot be negated (a
//!   `$ref`, `items`, a pattern), it is enforced strictly, with a warning: those ways to fail
//!   are dropped, so a few valid outputs are refused and no invalid one is accepted (tried
//!   only where every branch requires a property another does not). Elsewhere it is
//!   enforced as `anyOf`, and a warning says so.
//! - `format`: `date`, `time`, `date-time`, `duration`, `uuid`, `ipv4`, `ipv6`, `uri`,
//!   `uri-reference` and `json-pointer` are exact patterns (checked against the `jsonschema`
//!   crate in `tests/tests/json_schema_formats.rs`); `hostname` is strict (no IDNA labels);
//!   `email` and the IRI forms are approximated; unknown formats allow any string. Each
//!   approximation is a warning.
//! - `dependentRequired` and array-valued `dependencies` track the presence of the properties
//!   involved (at most 64 per object; not together with `maxProperties`); in schema order a
//!   trigger is offered only while what it requires can still follow it.
//! - `propertyNames` is one pattern every key must match (its `pattern`, its `enum`/`const`,
//!   or its length bounds), not combined with `patternProperties`.
//! - Keywords that cannot be enforced by a left-to-right automaton yet (`not`,
//!   `if`/`then`/`else`, dependent schemas other than `{required}` and `{not: {required}}`, `contains`,
//!   `unevaluated*`, dynamic refs) are errors naming pointer and keyword: never silently
//!   ignored. `uniqueItems` is enforced where the items come from an `enum` of at most 64
//!   strings, booleans or null (the state remembers which were written) and where they are
//!   strings that can always be extended (no `maxLength`; no pattern or format, or one whose
//!   every live automaton state has infinitely many completions): the state remembers a
//!   64-bit hash of each item's decoded text, and a closing quote that would repeat one is
//!   refused, which never leaves the writer stuck. It is enforced too over strings with only a
//!   `maxLength` (a repeat refused at the character that fills it) with literals beside them
//!   (`[string, null]`: a written literal refused at its first byte), over integers with no
//!   `multipleOf` (a digit refused past which every value within the bounds is written, a
//!   `,` once none is left), and over objects that can always take one more property
//!   (additional properties allowed, no `maxProperties`; through unions of such objects):
//!   each item's bytes are captured while it is written and its value hashed by JSON
//!   equality (`values`) at its `}`, where a repeat is refused and a `,` can be written
//!   instead. Elsewhere it is a warning. Unknown keywords are ignored, as JSON Schema says, with a warning.
//! - Regex `pattern`s use the Rust syntax with ECMA-262's ASCII meaning of `\d` and `\w`.
//!   Strings under a pattern or format are written without `\u` escapes and without `\/`
//!   (the same values as their plain forms, which a compact serialiser writes): a digit of a
//!   `\u` escape would decide too late whether the pattern survives, and a `/` the pattern
//!   requires is then forced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dspark_guest::{ConstraintError, ErrorCode, Warning};
use regex_automata::MatchKind;
use regex_automata::dfa::{StartKind, dense};
use serde_json::{Map, Value};

use crate::formats;
use crate::graph::{
    ANY, ArrayNode, Graph, KeyTrie, LiteralTrie, LiveTable, NEVER, Node, NodeId, NumberNode, ObjectNode, Prop,
    PropertyOrder, StringNode,
};

/// Size limits that keep a hostile schema from exhausting the sandbox.
pub const MAX_NODES: usize = 200_000;
/// Deepest nesting of schemas followed while compiling.
pub const MAX_DEPTH: usize = 200;
/// 2^53: below it in magnitude every integer is an f64, so bounds and multiples there compare
/// exactly as f64 values.
pub(crate) const EXACT: f64 = 9_007_199_254_740_992.0;
/// Largest DFA per pattern.
pub const MAX_DFA_BYTES: usize = 8 << 20;

/// Keywords that carry no validation (annotations and containers of other schemas).
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
    "$anchor",
    "$dynamicAnchor",
    "$recursiveAnchor",
    "$vocabulary",
    "discriminator",
    "example",
    "markdownDescription",
];

/// Keywords handled by this compiler.
const HANDLED: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "allOf",
    "anyOf",
    "oneOf",
    "$ref",
    "minProperties",
    "maxProperties",
    "uniqueItems",
    "patternProperties",
    "dependentRequired",
    "dependencies",
    "propertyNames",
    "not",
    "dependentSchemas",
    "if",
    "then",
    "else",
];

/// The most `if` conditions one `allOf` may combine (their cases multiply).
const MAX_CONDITIONALS: usize = 4;
/// The most branches the conditions of one `allOf` may combine into.
const MAX_CONDITION_BRANCHES: usize = 64;

/// Keywords refused with an error.
const UNSUPPORTED: &[&str] = &[
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
];

fn err(code: ErrorCode, pointer: &str, message: impl Into<String>) -> ConstraintError {
    ConstraintError::new(code, message).at(if pointer.is_empty() { "#".to_string() } else { format!("#{pointer}") })
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// A node to build from the worklist.
enum Job {
    /// The schema at a JSON pointer of the document.
    Pointer(String),
    /// A `$ref` merged with sibling keywords (memoised, so a recursive one is a cycle).
    Merged(Map<String, Value>, String),
}

/// The compiler's state over one document.
pub struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    literals: Vec<LiteralTrie>,
    dfas: Vec<Arc<dense::DFA<Vec<u32>>>>,
    live: Vec<Arc<LiveTable>>,
    /// Arrays with `uniqueItems: true` and their pointers, decided at the end.
    unique_arrays: Vec<(NodeId, String)>,
    dfa_cache: HashMap<(String, bool), u32>,
    refs: HashMap<String, NodeId>,
    anchors: HashMap<String, String>,
    /// Drafts 4-7: `$ref` siblings are ignored.
    legacy_ref: bool,
    /// Drafts 4 and 6 have no `if`/`then`/`else`: there they are unknown keywords, ignored
    /// with a warning (as every validator of those drafts ignores them).
    no_conditionals: bool,
    /// `$ref` targets waiting to be compiled: (node, pointer). Compiling them from a
    /// worklist, not recursively, keeps long reference chains off the stack.
    queue: Vec<(NodeId, Job)>,
    /// Warnings, with the pointer they apply to.
    pub warnings: Vec<Warning>,
    /// Which of `warnings` are approximations that can let through a value the schema
    /// rejects (strict mode refuses those); the others only refuse values it admits, or
    /// report a keyword that JSON Schema says to ignore.
    permissive: Vec<usize>,
    depth: usize,
}

impl<'a> Compiler<'a> {
    /// A compiler over `root`.
    pub fn new(root: &'a Value) -> Self {
        Self::with_draft(root, None)
    }

    /// A compiler over `root` for a given draft (`"4"`, `"6"`, `"7"`, `"2019-09"`,
    /// `"2020-12"`); `None` reads `$schema`, defaulting to 2020-12.
    pub fn with_draft(root: &'a Value, draft: Option<&str>) -> Self {
        let mut c = Self {
            root,
            nodes: vec![Node::Never, Node::Pending],
            literals: Vec::new(),
            dfas: Vec::new(),
            live: Vec::new(),
            unique_arrays: Vec::new(),
            dfa_cache: HashMap::new(),
            refs: HashMap::new(),
            anchors: HashMap::new(),
            legacy_ref: match draft {
                Some(d) => matches!(d, "4" | "6" | "7"),
                None => root
                    .get("$schema")
                    .and_then(Value::as_str)
                    .is_some_and(|s| s.contains("draft-04") || s.contains("draft-06") || s.contains("draft-07")),
            },
            no_conditionals: match draft {
                Some(d) => matches!(d, "4" | "6"),
                None => root
                    .get("$schema")
                    .and_then(Value::as_str)
                    .is_some_and(|s| s.contains("draft-04") || s.contains("draft-06")),
            },
            warnings: Vec::new(),
            permissive: Vec::new(),
            queue: Vec::new(),
            depth: 0,
        };
        c.collect_anchors(root, String::new(), 0);
        c.build_any();
        c
    }

    /// Compiles the document into a graph.
    /// With `strict`, the first approximation that could let an invalid value through is an
    /// `unsupported` error instead of a warning.
    pub fn compile(mut self, order: PropertyOrder, strict: bool) -> Result<(Graph, Vec<Warning>), ConstraintError> {
        let root = self.schema(self.root, "")?;
        while let Some((id, job)) = self.queue.pop() {
            let built = match job {
                Job::Pointer(tptr) => {
                    let target = self.root.pointer(&tptr).unwrap_or(&Value::Bool(false));
                    self.schema(target, &tptr)?
                }
                Job::Merged(map, ptr) => {
                    let flat = self.flatten(&map, &ptr, 0)?;
                    self.build(&flat, &ptr)?
                }
            };
            self.nodes[id as usize] = Node::Union(vec![built]);
        }
        self.resolve_unique_arrays();
        let good = self.productive(root);
        if !good[root as usize] {
            return Err(err(
                ErrorCode::InvalidSource,
                "",
                "the schema admits no value (a circular `$ref` with no base case, or contradictory keywords)",
            ));
        }
        self.prune_unproductive(&good);
        self.flatten_unions();
        if strict && let Some(&first) = self.permissive.first() {
            let w = &self.warnings[first];
            return Err(ConstraintError::new(
                ErrorCode::Unsupported,
                format!("strict mode: {}; without strict mode this is served as a warning", w.message),
            )
            .at(w.location.clone()));
        }
        Ok((
            Graph { nodes: self.nodes, literals: self.literals, dfas: self.dfas, live: self.live, root, order },
            self.warnings,
        ))
    }

    /// Records a warning for an approximation that can let through a value the schema rejects.
    fn warn_permissive(&mut self, warning: Warning) {
        self.permissive.push(self.warnings.len());
        self.warnings.push(warning);
    }

    /// A graph that admits any JSON value (`root = ANY`) or any object.
    pub fn any(object_only: bool, order: PropertyOrder) -> Graph {
        let v = Value::Bool(true);
        let c = Compiler::new(&v);
        let root = if object_only {
            match &c.nodes[ANY as usize] {
                Node::Union(alts) => alts[0],
                _ => ANY,
            }
        } else {
            ANY
        };
        Graph { nodes: c.nodes, literals: c.literals, dfas: c.dfas, live: c.live, root, order }
    }

    fn build_any(&mut self) {
        let object = self.push(Node::Object(ObjectNode {
            props: Vec::new(),
            additional: ANY,
            patterns: Vec::new(),
            pattern_nodes: vec![ANY],
            keys: KeyTrie::build(&[]),
            min_props: 0,
            max_props: u32::MAX,
            deps: Vec::new(),
            forbidden: Vec::new(),
            required_mask: 0,
            dep_mask: 0,
        }));
        let array = self.push(Node::Array(ArrayNode {
            prefix: Vec::new(),
            items: ANY,
            min_items: 0,
            max_items: u32::MAX,
            unique: None,
            unique_text: false,
            unique_ints: false,
            unique_values: false,
        }));
        let string = self.push(Node::String(StringNode { min_len: 0, max_len: u32::MAX, patterns: Vec::new() }));
        let number = self.push(Node::Number(NumberNode {
            integer: false,
            min: None,
            max: None,
            multiple_of: None,
            exact: None,
            keep_value: false,
        }));
        let lits = self.literal_node(&[b"true".to_vec(), b"false".to_vec(), b"null".to_vec()]);
        self.nodes[ANY as usize] = Node::Union(vec![object, array, string, number, lits]);
    }

    fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        (self.nodes.len() - 1) as NodeId
    }

    fn literal_node(&mut self, values: &[Vec<u8>]) -> NodeId {
        self.literals.push(LiteralTrie::build(values.iter().map(Vec::as_slice)));
        let set = (self.literals.len() - 1) as u32;
        self.push(Node::Literals(set))
    }

    fn collect_anchors(&mut self, v: &Value, ptr: String, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        match v {
            Value::Object(m) => {
                if let Some(Value::String(a)) = m.get("$anchor") {
                    self.anchors.insert(a.clone(), ptr.clone());
                }
                for key in ["$id", "id"] {
                    if let Some(Value::String(id)) = m.get(key)
                        && let Some(a) = id.strip_prefix('#')
                        && !a.is_empty()
                        && !a.starts_with('/')
                    {
                        self.anchors.insert(a.to_string(), ptr.clone());
                    }
                }
                for (k, child) in m {
                    if k == "enum" || k == "const" || k == "examples" || k == "default" {
                        continue;
                    }
                    self.collect_anchors(child, format!("{ptr}/{}", escape_pointer(k)), depth + 1);
                }
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    self.collect_anchors(child, format!("{ptr}/{i}"), depth + 1);
                }
            }
            _ => {}
        }
    }

    /// Resolves a `$ref` to (target, pointer).
    fn resolve(&self, reference: &str, at: &str) -> Result<(&'a Value, String), ConstraintError> {
        let fragment = if let Some(f) = reference.strip_prefix('#') {
            f.to_string()
        } else {
            // Refs relative to the root's own `$id` resolve locally.
            let base = self.root.get("$id").and_then(Value::as_str).unwrap_or("");
            match reference.split_once('#') {
                Some((doc, f)) if !doc.is_empty() && (base.ends_with(doc) || base == doc) => f.to_string(),
                _ => {
                    return Err(err(
                        ErrorCode::Unsupported,
                        at,
                        format!(
                            "`$ref` to `{reference}` is remote; only references within the schema are supported (the sandbox has no network)"
                        ),
                    ));
                }
            }
        };
        let pointer = if fragment.is_empty() || fragment.starts_with('/') {
            fragment
        } else {
            self.anchors
                .get(&fragment)
                .cloned()
                .ok_or_else(|| err(ErrorCode::InvalidSource, at, format!("`$ref` to unknown anchor `#{fragment}`")))?
        };
        let decoded = percent_decode(&pointer);
        self.root
            .pointer(&decoded)
            .map(|v| (v, decoded.clone()))
            .ok_or_else(|| err(ErrorCode::InvalidSource, at, format!("`$ref` target `#{pointer}` does not exist")))
    }

    /// Compiles the schema at `ptr`.
    fn schema(&mut self, v: &'a Value, ptr: &str) -> Result<NodeId, ConstraintError> {
        if self.nodes.len() > MAX_NODES {
            return Err(err(ErrorCode::TooLarge, ptr, format!("the schema compiles to more than {MAX_NODES} nodes")));
        }
        if self.depth > MAX_DEPTH {
            return Err(err(ErrorCode::TooLarge, ptr, format!("the schema nests deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        let r = self.schema_inner(v, ptr);
        self.depth -= 1;
        r
    }

    fn schema_inner(&mut self, v: &'a Value, ptr: &str) -> Result<NodeId, ConstraintError> {
        let map = match v {
            Value::Bool(true) => return Ok(ANY),
            Value::Bool(false) => return Ok(NEVER),
            Value::Object(m) => m,
            _ => return Err(err(ErrorCode::InvalidSource, ptr, "a schema must be an object or a boolean")),
        };
        self.check_keywords(map, ptr)?;
        // A `$ref` alone is a graph edge (cycles allowed); with siblings it is merged.
        if let Some(r) = map.get("$ref") {
            let r = r.as_str().ok_or_else(|| err(ErrorCode::InvalidSource, ptr, "`$ref` must be a string"))?;
            // Drafts 4-7 ignore the siblings of `$ref`; 2019-09 and later apply them too.
            let has_siblings = map.keys().any(|k| HANDLED.contains(&k.as_str()) && k != "$ref");
            if !has_siblings || self.legacy_ref {
                return self.reference(r, ptr);
            }
            return self.merged_reference(map, ptr);
        }
        if !map.contains_key("allOf") {
            return self.build(map, ptr);
        }
        let merged = self.flatten(map, ptr, 0)?;
        self.build(&merged, ptr)
    }

    /// The node of a `$ref` target: one node per target, compiled later from the queue, so
    /// cycles are graph cycles.
    fn reference(&mut self, r: &str, ptr: &str) -> Result<NodeId, ConstraintError> {
        let (_, tptr) = self.resolve(r, ptr)?;
        if let Some(&id) = self.refs.get(&tptr) {
            return Ok(id);
        }
        let id = self.push(Node::Pending);
        self.refs.insert(tptr.clone(), id);
        self.queue.push((id, Job::Pointer(tptr)));
        Ok(id)
    }

    /// Compiles a keyword map we own: a `$ref` with siblings is a memoised merged reference,
    /// `allOf` is flattened, the rest is built directly.
    fn compile_map(&mut self, map: Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
        if let Some(Value::String(r)) = map.get("$ref") {
            let alone = map.keys().all(|k| k == "$ref" || !HANDLED.contains(&k.as_str()));
            if alone || self.legacy_ref {
                let r = r.clone();
                return self.reference(&r, ptr);
            }
            return self.merged_reference(&map, ptr);
        }
        if map.contains_key("allOf") {
            let flat = self.flatten(&map, ptr, 0)?;
            return self.build(&flat, ptr);
        }
        self.build(&map, ptr)
    }

    /// A `$ref` with sibling keywords: one node per (target, siblings), built later.
    fn merged_reference(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
        let Some(Value::String(r)) = map.get("$ref") else {
            return Err(err(ErrorCode::InvalidSource, ptr, "`$ref` must be a string"));
        };
        let (_, tptr) = self.resolve(r, ptr)?;
        let siblings: Map<String, Value> = map
            .iter()
            .filter(|(k, _)| *k != "$ref" && !ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let key = format!("{tptr}\u{0}{}", Value::Object(siblings));
        if let Some(&id) = self.refs.get(&key) {
            return Ok(id);
        }
        let id = self.push(Node::Pending);
        self.refs.insert(key, id);
        self.queue.push((id, Job::Merged(map.clone(), ptr.to_string())));
        Ok(id)
    }

    /// Which nodes admit some value: a union is productive when one of its branches is.
    fn productive(&self, root: NodeId) -> Vec<bool> {
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
    fn prune_unproductive(&mut self, good: &[bool]) {
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
    fn flatten_unions(&mut self) {
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

    fn set_flattened(&mut self, flat: Vec<(usize, Vec<NodeId>)>) {
        for (id, leaves) in flat {
            self.nodes[id] = Node::Union(leaves);
        }
    }

    fn check_keywords(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<(), ConstraintError> {
        if let Some(n) = map.get("not") {
            not_rule(n, ptr)?;
        }
        if ["dependentRequired", "dependencies", "dependentSchemas"].iter().any(|k| map.contains_key(*k)) {
            dependencies_of(map, ptr)?;
        }
        for k in map.keys() {
            if UNSUPPORTED.contains(&k.as_str()) {
                return Err(err(
                    ErrorCode::Unsupported,
                    &format!("{ptr}/{}", escape_pointer(k)),
                    format!("the keyword `{k}` is not supported yet"),
                ));
            }
            if !HANDLED.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) && !k.starts_with("x-") {
                self.warnings.push(Warning {
                    location: format!("#{ptr}/{}", escape_pointer(k)),
                    message: format!("unknown keyword `{k}` ignored"),
                });
            }
        }
        Ok(())
    }

    /// Inlines `$ref` siblings and merges `allOf` into one keyword map.
    fn flatten(
        &mut self,
        map: &Map<String, Value>,
        ptr: &str,
        depth: usize,
    ) -> Result<Map<String, Value>, ConstraintError> {
        if depth > 32 {
            return Err(err(
                ErrorCode::Unsupported,
                ptr,
                "`allOf`/`$ref` nest too deeply to merge (a recursive `$ref` inside `allOf`?)",
            ));
        }
        // `then` and `else` apply only beside their own `if`: without one they are dropped
        // here, before merging could pair them with another branch's `if`.
        let orphan = |k: &str| (k == "then" || k == "else") && !map.contains_key("if");
        let mut base: Map<String, Value> = map
            .iter()
            .filter(|(k, _)| *k != "allOf" && *k != "$ref" && !orphan(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut parts: Vec<(Map<String, Value>, String)> = Vec::new();
        if let Some(Value::String(r)) = map.get("$ref") {
            let (target, tptr) = self.resolve(r, ptr)?;
            match target {
                Value::Object(t) => {
                    self.check_keywords(t, &tptr)?;
                    parts.push((t.clone(), tptr));
                }
                Value::Bool(true) => {}
                Value::Bool(false) => parts.push((never_map(), tptr)),
                _ => return Err(err(ErrorCode::InvalidSource, &tptr, "a schema must be an object or a boolean")),
            }
        }
        if let Some(all) = map.get("allOf") {
            let all = all.as_array().ok_or_else(|| err(ErrorCode::InvalidSource, ptr, "`allOf` must be an array"))?;
            for (i, branch) in all.iter().enumerate() {
                let bptr = format!("{ptr}/allOf/{i}");
                match branch {
                    Value::Object(b) => {
                        self.check_keywords(b, &bptr)?;
                        parts.push((b.clone(), bptr));
                    }
                    Value::Bool(true) => {}
                    Value::Bool(false) => parts.push((never_map(), bptr)),
                    _ => return Err(err(ErrorCode::InvalidSource, &bptr, "a schema must be an object or a boolean")),
                }
            }
        }
        // Each branch's `if`/`then`/`else` stays its own: merged maps hold one conditional,
        // and several become the union of every combination of their cases.
        let mut conds: Vec<(Value, Value, Value, String)> = Vec::new();
        let conditionals = !self.no_conditionals;
        let take_conditional = |conds: &mut Vec<_>, m: &mut Map<String, Value>, at: &str| {
            if conditionals && let Some(c) = m.remove("if") {
                let then = m.remove("then").unwrap_or(Value::Bool(true));
                let otherwise = m.remove("else").unwrap_or(Value::Bool(true));
                conds.push((c, then, otherwise, at.to_string()));
            }
        };
        take_conditional(&mut conds, &mut base, ptr);
        for (part, pptr) in parts {
            let mut flat = self.flatten(&part, &pptr, depth + 1)?;
            take_conditional(&mut conds, &mut flat, &pptr);
            base = merge(base, flat, &pptr)?;
        }
        match conds.len() {
            0 => {}
            1 => {
                let (c, then, otherwise, _) = conds.remove(0);
                base.insert("if".into(), c);
                base.insert("then".into(), then);
                base.insert("else".into(), otherwise);
            }
            n if n > MAX_CONDITIONALS => {
                return Err(err(
                    ErrorCode::Unsupported,
                    ptr,
                    format!("more than {MAX_CONDITIONALS} `if` conditions in one `allOf` are not supported yet"),
                ));
            }
            _ => {
                if base.contains_key("anyOf") || base.contains_key("oneOf") {
                    return Err(err(
                        ErrorCode::Unsupported,
                        ptr,
                        "several `if` conditions beside `anyOf`/`oneOf` in one `allOf` cannot be merged yet",
                    ));
                }
                // Each condition holds (with its `then`) or fails in one of its ways (with its
                // `else`); every combination is one branch.
                let mut combos: Vec<Vec<Value>> = vec![Vec::new()];
                for (c, then, otherwise, at) in conds {
                    let mut cases = vec![serde_json::json!({ "allOf": [c.clone(), then] })];
                    for failing in disjuncts(negate(&c, &format!("{at}/if"))?) {
                        cases.push(serde_json::json!({ "allOf": [failing, otherwise.clone()] }));
                    }
                    combos = combos
                        .into_iter()
                        .flat_map(|combo| {
                            cases.iter().map(move |case| {
                                let mut next = combo.clone();
                                next.push(case.clone());
                                next
                            })
                        })
                        .collect();
                    if combos.len() > MAX_CONDITION_BRANCHES {
                        return Err(err(
                            ErrorCode::TooLarge,
                            ptr,
                            format!(
                                "the `if` conditions of one `allOf` combine into more than {MAX_CONDITION_BRANCHES} cases"
                            ),
                        ));
                    }
                }
                let alts: Vec<Value> = combos.into_iter().map(|parts| serde_json::json!({ "allOf": parts })).collect();
                base.insert("anyOf".into(), Value::Array(alts));
            }
        }
        Ok(base)
    }

    /// Builds the node of a flattened keyword map.
    fn build(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
        if map.contains_key("$never") {
            return Ok(NEVER);
        }
        if let Some(cond) = map.get("if") {
            if !self.no_conditionals {
                return self.conditional(map, cond, ptr);
            }
            self.warnings.push(Warning {
                location: format!("#{ptr}/if"),
                message: "`if`/`then`/`else` are not keywords of this schema's draft (4 or 6): ignored".into(),
            });
        }
        if let Some(n) = map.get("not")
            && let NotRule::Nothing = not_rule(n, ptr)?
        {
            return Ok(NEVER);
        }
        for (kw, other) in [("anyOf", "oneOf"), ("oneOf", "anyOf")] {
            if let Some(branches) = map.get(kw) {
                if map.contains_key(other) {
                    return Err(err(ErrorCode::Unsupported, ptr, "`anyOf` together with `oneOf` is not supported yet"));
                }
                let branches = branches
                    .as_array()
                    .ok_or_else(|| err(ErrorCode::InvalidSource, ptr, format!("`{kw}` must be an array")))?;
                let base: Map<String, Value> =
                    map.iter().filter(|(k, _)| *k != kw).map(|(k, v)| (k.clone(), v.clone())).collect();
                if kw == "oneOf"
                    && !disjoint_types(branches)
                    && let Some(id) = self.exclusive_one_of(&base, branches, ptr)
                {
                    return Ok(id);
                }
                let mut alts = Vec::new();
                for (i, b) in branches.iter().enumerate() {
                    let bptr = format!("{ptr}/{kw}/{i}");
                    let branch = match b {
                        Value::Bool(true) => Map::new(),
                        Value::Bool(false) => continue,
                        Value::Object(m) => {
                            self.check_keywords(m, &bptr)?;
                            m.clone()
                        }
                        _ => {
                            return Err(err(
                                ErrorCode::InvalidSource,
                                &bptr,
                                "a schema must be an object or a boolean",
                            ));
                        }
                    };
                    // A branch with `$ref` stays a reference (memoised), so a recursive
                    // schema (`anyOf: [{$ref: "#"}, ...]`) becomes a cycle, not an expansion.
                    let merged = if let Some(r) = branch.get("$ref") {
                        let mut m = base.clone();
                        if self.legacy_ref {
                            // Drafts 4-7 ignore the branch's own siblings of `$ref`, not the
                            // keywords beside the `anyOf`.
                            m.insert("$ref".into(), r.clone());
                        } else {
                            m.extend(branch);
                        }
                        let has_siblings = m.keys().any(|k| HANDLED.contains(&k.as_str()) && k != "$ref");
                        if has_siblings {
                            alts.push(self.merged_reference(&m, &bptr)?);
                            continue;
                        }
                        m
                    } else {
                        let flat = self.flatten(&branch, &bptr, 0)?;
                        merge(base.clone(), flat, &bptr)?
                    };
                    alts.push(self.compile_map(merged, &bptr)?);
                }
                if kw == "oneOf" && !disjoint_types(branches) {
                    self.warn_permissive(Warning {
                        location: format!("#{ptr}/oneOf"),
                        message: "`oneOf` is enforced as `anyOf`: an output matching several branches is not rejected"
                            .into(),
                    });
                }
                return Ok(if alts.is_empty() { NEVER } else { self.push(Node::Union(alts)) });
            }
        }
        // enum / const: the literal values that also fit `type`.
        let mut values: Option<Vec<Value>> = None;
        if let Some(e) = map.get("enum") {
            values = Some(
                e.as_array().ok_or_else(|| err(ErrorCode::InvalidSource, ptr, "`enum` must be an array"))?.clone(),
            );
        }
        if let Some(c) = map.get("const") {
            values = Some(match values {
                Some(vs) => vs.into_iter().filter(|v| json_eq(v, c)).collect(),
                None => vec![c.clone()],
            });
        }
        let types = self.types(map, ptr)?;
        if let Some(vs) = values {
            // A value must also satisfy the keywords beside `enum`/`const` (a `pattern`, bounds,
            // the branches of an `anyOf` an `allOf` merged in, ...). Values the check cannot
            // decide (objects and arrays under object or array keywords, `$ref`) are kept.
            let mut fitting: Vec<&Value> = Vec::new();
            for v in vs.iter().filter(|v| types.iter().any(|t| type_matches(t, v))) {
                if self.admits(map, v, ptr)? != Some(false) {
                    fitting.push(v);
                }
            }
            // Numbers compare by value (`1` equals `1.0`): each numeric value is a number node
            // bounded to exactly that value; everything else is a literal string of bytes.
            let mut alts: Vec<NodeId> = fitting
                .iter()
                .filter_map(|v| v.as_f64())
                .map(|x| {
                    self.push(Node::Number(NumberNode {
                        // Under `type: integer` the value is written as an integer.
                        integer: !types.iter().any(|t| t == "number"),
                        min: Some((x, false)),
                        max: Some((x, false)),
                        multiple_of: None,
                        exact: None,
                        keep_value: false,
                    }))
                })
                .collect();
            let encoded: Vec<Vec<u8>> =
                fitting.iter().filter(|v| !v.is_number()).map(|v| serde_json::to_vec(v).unwrap_or_default()).collect();
            if !encoded.is_empty() {
                alts.push(self.literal_node(&encoded));
            }
            return Ok(match alts.len() {
                0 => NEVER,
                1 => alts[0],
                _ => self.push(Node::Union(alts)),
            });
        }
        let mut alts = Vec::new();
        for t in &types {
            alts.push(match t.as_str() {
                "object" => self.object(map, ptr)?,
                "array" => self.array(map, ptr)?,
                "string" => self.string(map, ptr)?,
                "number" => self.number(map, ptr, false)?,
                "integer" => self.number(map, ptr, true)?,
                "boolean" => self.literal_node(&[b"true".to_vec(), b"false".to_vec()]),
                "null" => self.literal_node(&[b"null".to_vec()]),
                other => {
                    return Err(err(
                        ErrorCode::InvalidSource,
                        &format!("{ptr}/type"),
                        format!("unknown type `{other}`"),
                    ));
                }
            });
        }
        Ok(match alts.len() {
            0 => NEVER,
            1 => alts[0],
            _ => self.push(Node::Union(alts)),
        })
    }

    /// `if`/`then`/`else` as the union of its two cases, which exclude each other:
    /// `allOf: [rest, if, then]` or `allOf: [rest, not(if), else]`, with `not(if)` pushed
    /// inwards by [`negate`] (a missing `then` or `else` is `true`).
    fn conditional(&mut self, map: &Map<String, Value>, cond: &Value, ptr: &str) -> Result<NodeId, ConstraintError> {
        let rest: Map<String, Value> = map
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "if" | "then" | "else"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let then = map.get("then").cloned().unwrap_or(Value::Bool(true));
        let otherwise = map.get("else").cloned().unwrap_or(Value::Bool(true));
        let rest = Value::Object(rest);
        // One case per way the condition can fail, so that no case holds two `anyOf`s.
        let mut cases = vec![serde_json::json!({ "allOf": [rest.clone(), cond.clone(), then] })];
        for failing in disjuncts(negate(cond, &format!("{ptr}/if"))?) {
            cases.push(serde_json::json!({ "allOf": [rest.clone(), failing, otherwise.clone()] }));
        }
        let mut map = Map::new();
        map.insert("anyOf".into(), Value::Array(cases));
        self.compile_map(map, ptr)
    }

    /// The types allowed: `type` (with `integer` inside `number` dropped), or all of them.
    fn types(&self, map: &Map<String, Value>, ptr: &str) -> Result<Vec<String>, ConstraintError> {
        let all = ["object", "array", "string", "number", "boolean", "null"];
        let mut types: Vec<String> = match map.get("type") {
            None => all.iter().map(|s| s.to_string()).collect(),
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(ts)) => {
                ts.iter().map(|t| t.as_str().map(str::to_string)).collect::<Option<Vec<_>>>().ok_or_else(|| {
                    err(
                        ErrorCode::InvalidSource,
                        &format!("{ptr}/type"),
                        "`type` must be a string or an array of strings",
                    )
                })?
            }
            Some(_) => {
                return Err(err(
                    ErrorCode::InvalidSource,
                    &format!("{ptr}/type"),
                    "`type` must be a string or an array of strings",
                ));
            }
        };
        if types.iter().any(|t| t == "number") {
            types.retain(|t| t != "integer");
        }
        if let Some(n) = map.get("not")
            && let NotRule::Types(excluded) = not_rule(n, ptr)?
        {
            if excluded.iter().any(|t| t == "integer") && types.iter().any(|t| t == "number") {
                return Err(err(
                    ErrorCode::Unsupported,
                    &format!("{ptr}/not/type"),
                    "`not: {type: integer}` under `number` (numbers that are not integers) is not supported yet",
                ));
            }
            let number_excluded = excluded.iter().any(|x| x == "number");
            types.retain(|t| !(excluded.contains(t) || (t == "integer" && number_excluded)));
        }
        types.dedup();
        Ok(types)
    }

    fn object(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
        let required: Vec<String> = match map.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
            Some(_) => {
                return Err(err(
                    ErrorCode::InvalidSource,
                    &format!("{ptr}/required"),
                    "`required` must be an array of strings",
                ));
            }
        };
        let id = self.push(Node::Pending);
        // `propertyNames` as a pattern every key must match: undeclared keys become the
        // pattern's (with the `additionalProperties` schema), declared names that do not match
        // cannot appear.
        let names = property_names(map.get("propertyNames"), ptr)?;
        if let Some(NamesRule::Pattern(_)) = &names
            && map.contains_key("patternProperties")
        {
            return Err(err(
                ErrorCode::Unsupported,
                &format!("{ptr}/propertyNames"),
                "`propertyNames` together with `patternProperties` is not supported yet",
            ));
        }
        let additional = match (map.get("additionalProperties"), &names) {
            (_, Some(NamesRule::Pattern(_) | NamesRule::Nothing)) => NEVER,
            (None, _) => ANY,
            (Some(a), _) => self.schema_owned(a, &format!("{ptr}/additionalProperties"))?,
        };
        // patternProperties: up to four patterns; every subset of them gets the node of the
        // `allOf` of its schemas, so the value of an undeclared key is known when the key ends.
        let mut patterns: Vec<(String, Value)> = Vec::new();
        if let Some(pp) = map.get("patternProperties") {
            let pp = pp.as_object().ok_or_else(|| {
                err(
                    ErrorCode::InvalidSource,
                    &format!("{ptr}/patternProperties"),
                    "`patternProperties` must be an object",
                )
            })?;
            if pp.len() > 4 {
                return Err(err(
                    ErrorCode::Unsupported,
                    &format!("{ptr}/patternProperties"),
                    "more than four `patternProperties` are not supported yet",
                ));
            }
            patterns = pp.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
        if let Some(NamesRule::Pattern(p)) = &names {
            patterns = vec![(p.clone(), map.get("additionalProperties").cloned().unwrap_or(Value::Bool(true)))];
        }
        let mut pattern_dfas = Vec::new();
        for (p, _) in &patterns {
            let at = if names.is_some() {
                format!("{ptr}/propertyNames")
            } else {
                format!("{ptr}/patternProperties/{}", escape_pointer(p))
            };
            pattern_dfas.push(self.dfa(p, true, &at)?);
        }
        // Which patterns a declared name matches.
        let matches_name = |c: &Self, name: &str| -> Vec<bool> {
            pattern_dfas.iter().map(|&d| c.dfa_matches(d, name.as_bytes())).collect()
        };
        let mut pattern_nodes = vec![additional];
        for subset in 1..(1usize << patterns.len()) {
            let parts: Vec<Value> =
                (0..patterns.len()).filter(|i| subset & (1 << i) != 0).map(|i| patterns[i].1.clone()).collect();
            let combined = if parts.len() == 1 { parts[0].clone() } else { serde_json::json!({ "allOf": parts }) };
            pattern_nodes.push(self.schema_owned(&combined, &format!("{ptr}/patternProperties"))?);
        }
        let mut props = Vec::new();
        if let Some(p) = map.get("properties") {
            let p = p.as_object().ok_or_else(|| {
                err(ErrorCode::InvalidSource, &format!("{ptr}/properties"), "`properties` must be an object")
            })?;
            for (name, schema) in p {
                // A declared property whose name matches patterns must satisfy them too.
                let mut parts = vec![schema.clone()];
                let hits = matches_name(self, name);
                parts.extend(patterns.iter().zip(hits).filter(|(_, hit)| *hit).map(|((_, s), _)| s.clone()));
                let schema = if parts.len() == 1 { parts.remove(0) } else { serde_json::json!({ "allOf": parts }) };
                let mut node = self.schema_owned(&schema, &format!("{ptr}/properties/{}", escape_pointer(name)))?;
                let named_ok = match &names {
                    Some(NamesRule::Pattern(_)) => matches_name(self, name).first().copied().unwrap_or(false),
                    Some(NamesRule::Nothing) => false,
                    None => true,
                };
                if !named_ok {
                    node = NEVER;
                }
                props.push(Prop {
                    key: serde_json::to_vec(name).unwrap_or_default(),
                    node,
                    required: required.contains(name),
                });
            }
        }
        // A name the schema needs to track but does not declare becomes a declared property
        // with the schema an undeclared key of that name would get.
        let declare = |c: &Self, props: &mut Vec<Prop>, name: &str, required: bool| {
            if !props.iter().any(|p| p.key == serde_json::to_vec(name).unwrap_or_default()) {
                let subset: usize =
                    matches_name(c, name).iter().enumerate().filter(|(_, hit)| **hit).map(|(i, _)| 1 << i).sum();
                props.push(Prop {
                    key: serde_json::to_vec(name).unwrap_or_default(),
                    node: pattern_nodes[subset],
                    required,
                });
            }
        };
        for name in &required {
            declare(self, &mut props, name, true);
        }
        // Dependencies: their names are declared so their presence can be tracked.
        let (deps_by_name, dependent_exclusions) = dependencies_of(map, ptr)?;
        for name in deps_by_name.iter().flat_map(|(t, r)| std::iter::once(t).chain(r)) {
            declare(self, &mut props, name, false);
        }
        let index = |name: &str| props.iter().position(|p| p.key == serde_json::to_vec(name).unwrap_or_default());
        let mut deps = Vec::new();
        let mut dep_mask = 0u64;
        for (trigger, reqs) in &deps_by_name {
            let t = index(trigger).unwrap_or(usize::MAX);
            let r: Vec<usize> = reqs.iter().filter_map(|n| index(n)).collect();
            if t >= 64 || r.iter().any(|&i| i >= 64) {
                return Err(err(
                    ErrorCode::Unsupported,
                    &format!("{ptr}/dependentRequired"),
                    "dependencies among more than 64 properties are not supported yet",
                ));
            }
            if !deps_by_name.is_empty() && map.contains_key("maxProperties") {
                return Err(err(
                    ErrorCode::Unsupported,
                    &format!("{ptr}/maxProperties"),
                    "`maxProperties` together with dependencies is not supported yet",
                ));
            }
            let m = r.iter().fold(0u64, |m, &i| m | 1 << i);
            dep_mask |= m | 1 << t;
            deps.push((t as u16, m));
        }
        // `not: {required: [...]}` and its anyOf/allOf forms: sets that must not all appear.
        let mut forbidden_names: Vec<Vec<String>> = dependent_exclusions;
        if let Some(n) = map.get("not")
            && let NotRule::Absent(sets) = not_rule(n, ptr)?
        {
            forbidden_names.extend(sets);
        }
        for name in forbidden_names.iter().flatten() {
            declare(self, &mut props, name, false);
        }
        let sets: Vec<Vec<usize>> = forbidden_names
            .iter()
            .map(|set| {
                set.iter()
                    .filter_map(|n| props.iter().position(|p| p.key == serde_json::to_vec(n).unwrap_or_default()))
                    .collect()
            })
            .collect();
        let mut forbidden = Vec::new();
        for idx in sets {
            if idx.iter().any(|&i| i >= 64) {
                return Err(err(
                    ErrorCode::Unsupported,
                    &format!("{ptr}/not"),
                    "`not` over more than 64 properties is not supported yet",
                ));
            }
            if let [single] = idx[..] {
                // One name: that property cannot appear.
                props[single].node = NEVER;
                continue;
            }
            let m = idx.iter().fold(0u64, |m, &i| m | 1 << i);
            dep_mask |= m;
            forbidden.push(m);
        }
        let required_mask =
            props.iter().enumerate().filter(|(i, p)| *i < 64 && p.required).fold(0u64, |m, (i, _)| m | 1 << i);
        if forbidden.iter().any(|&set| set & !required_mask == 0) {
            // Every member is required: no object can satisfy both.
            self.nodes[id as usize] = Node::Never;
            return Ok(id);
        }
        // A trigger that requires a property which cannot appear cannot appear itself.
        for &(t, m) in &deps {
            if (0..64).any(|i| m & (1 << i) != 0 && props[i].node == NEVER) {
                props[t as usize].node = NEVER;
            }
        }
        // A property whose schema is `false` cannot appear; a required one makes the object
        // impossible.
        if props.iter().any(|p| p.required && p.node == NEVER) {
            self.nodes[id as usize] = Node::Never;
            return Ok(id);
        }
        // Properties with a `false` schema stay declared (so an additional key cannot take
        // their name) but are never offered.
        let keys = KeyTrie::build(&props);
        let min_props = u32_of(map.get("minProperties")).unwrap_or(0);
        let max_props = u32_of(map.get("maxProperties")).unwrap_or(u32::MAX);
        // More required members than `maxProperties` allows, or (a closed object) fewer
        // members on offer than `minProperties` asks: nothing can be written.
        let required = props.iter().filter(|p| p.required).count();
        let offered = props.iter().filter(|p| p.node != NEVER).count();
        let closed = additional == NEVER && pattern_dfas.is_empty();
        if min_props > max_props || required > max_props as usize || (closed && min_props as usize > offered) {
            self.nodes[id as usize] = Node::Never;
            return Ok(id);
        }
        self.nodes[id as usize] = Node::Object(ObjectNode {
            props,
            additional,
            patterns: pattern_dfas,
            pattern_nodes,
            keys,
            min_props,
            max_props,
            deps,
            forbidden,
            required_mask,
            dep_mask,
        });
        Ok(id)
    }

    /// Compiles a sub-schema that lives in a map we own (a merged copy): `$ref`s inside are
    /// resolved against the document.
    fn schema_owned(&mut self, v: &Value, ptr: &str) -> Result<NodeId, ConstraintError> {
        // Sub-schemas of merged maps are clones; compile them through a leaked-free path by
        // re-looking them up in the document when they are plain references.
        if let Value::Object(m) = v
            && let Some(Value::String(r)) = m.get("$ref")
            && (self.legacy_ref || m.keys().all(|k| k == "$ref" || ANNOTATIONS.contains(&k.as_str())))
        {
            return self.reference(r, ptr);
        }
        match v {
            Value::Bool(true) => Ok(ANY),
            Value::Bool(false) => Ok(NEVER),
            Value::Object(m) if m.contains_key("$ref") && !self.legacy_ref => {
                self.check_keywords(m, ptr)?;
                self.merged_reference(m, ptr)
            }
            Value::Object(m) => {
                self.check_keywords(m, ptr)?;
                if self.depth > MAX_DEPTH {
                    return Err(err(
                        ErrorCode::TooLarge,
                        ptr,
                        format!("the schema nests deeper than {MAX_DEPTH} levels"),
                    ));
                }
                self.depth += 1;
                let merged = self.flatten(m, ptr, 0);
                let r = merged.and_then(|m| self.build(&m, ptr));
                self.depth -= 1;
                r
            }
            _ => Err(err(ErrorCode::InvalidSource, ptr, "a schema must be an object or a boolean")),
        }
    }

    fn array(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
        let id = self.push(Node::Pending);
        let mut prefix = Vec::new();
        let mut items = ANY;
        if let Some(Value::Array(p)) = map.get("prefixItems") {
            for (i, s) in p.iter().enumerate() {
                prefix.push(self.schema_owned(s, &format!("{ptr}/prefixItems/{i}"))?);
            }
        }
        match map.get("items") {
            None => {}
            Some(Value::Array(p)) => {
                // Draft 4-2019: array-form `items` is the prefix; `additionalItems` the rest.
                for (i, s) in p.iter().enumerate() {
                    prefix.push(self.schema_owned(s, &format!("{ptr}/items/{i}"))?);
                }
                if let Some(a) = map.get("additionalItems") {
                    items = self.schema_owned(a, &format!("{ptr}/additionalItems"))?;
                }
            }
            Some(s) => items = self.schema_owned(s, &format!("{ptr}/items"))?,
        }
        let min_items = u32_of(map.get("minItems")).unwrap_or(0);
        let mut max_items = u32_of(map.get("maxItems")).unwrap_or(u32::MAX);
        if items == NEVER {
            max_items = max_items.min(prefix.len() as u32);
        }
        // An item position that admits nothing caps the array before it.
        if let Some(k) = prefix.iter().position(|&p| p == NEVER) {
            max_items = max_items.min(k as u32);
        }
        if let Some(Value::Bool(true)) = map.get("uniqueItems") {
            // Decided once every node is built (the items may be a `$ref` still pending).
            self.unique_arrays.push((id, ptr.to_string()));
        }
        if min_items > max_items {
            self.nodes[id as usize] = Node::Never;
            return Ok(id);
        }
        self.nodes[id as usize] = Node::Array(ArrayNode {
            prefix,
            items,
            min_items,
            max_items,
            unique: None,
            unique_text: false,
            unique_ints: false,
            unique_values: false,
        });
        Ok(id)
    }

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
    fn resolve_unique_arrays(&mut self) {
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

    /// `oneOf` exactly, where the branches can be negated (the forms `if` takes: `type`,
    /// `required`, `properties`, `const`, `enum`, bounds): the union over `i` of branch `i`
    /// with every other branch failing, each failure one of its ways to fail, at most 64
    /// cases. Tried only where the branches hold no `$ref` once branches that are a bare
    /// `$ref` are inlined, and the keywords beside the `oneOf` no `$ref` of their own (their
    /// subschemas may have some: they are compiled either way), so that a form the merge
    /// cannot take is an error here and the caller falls back to `anyOf` with a warning.
    fn exclusive_one_of(&mut self, base: &Map<String, Value>, branches: &[Value], ptr: &str) -> Option<NodeId> {
        if branches.len() > 16 || ["$ref", "$dynamicRef", "$recursiveRef"].iter().any(|k| base.contains_key(*k)) {
            return None;
        }
        self.one_of_cases(base, branches, ptr, false).or_else(|| {
            let id = self.one_of_cases(base, branches, ptr, true)?;
            self.warnings.push(Warning {
                location: format!("#{ptr}/oneOf"),
                message: "`oneOf` is enforced strictly: an output that matches one branch and also has a \
                          property another branch describes, with a value that branch refuses, is rejected \
                          (the negation of such property schemas, e.g. a `$ref`, is not built)"
                    .into(),
            });
            Some(id)
        })
    }

    /// The cases of [`Self::exclusive_one_of`]; with `strict`, branches may hold references
    /// and each branch fails in the ways [`negate_with`] can build when it skips properties
    /// (a subset of its failures: outputs stay valid, a few valid ones are refused), tried
    /// only where every branch requires a property some other branch does not.
    fn one_of_cases(
        &mut self,
        base: &Map<String, Value>,
        branches: &[Value],
        ptr: &str,
        strict: bool,
    ) -> Option<NodeId> {
        const MAX_CASES: usize = 64;
        // A branch that is a bare `$ref` to a schema without references is that schema.
        let mut inlined = Vec::with_capacity(branches.len());
        for b in branches {
            let target = match b.as_object().and_then(|m| m.get("$ref")) {
                Some(Value::String(r)) if b.as_object().is_some_and(|m| m.len() == 1) => {
                    self.resolve(r, ptr).ok()?.0.clone()
                }
                _ => b.clone(),
            };
            if has_ref(&target) && !strict {
                return None;
            }
            inlined.push(target);
        }
        let branches = &inlined[..];
        let mut failures: Vec<Vec<Value>> = Vec::with_capacity(branches.len());
        let mut skipped = false;
        for (j, b) in branches.iter().enumerate() {
            let failing = negate_with(b, &format!("{ptr}/oneOf/{j}"), strict.then_some(&mut skipped)).ok()?;
            // A branch that cannot fail in any way built here would refuse every other branch.
            if failing == Value::Bool(false) && strict {
                return None;
            }
            failures.push(disjuncts(failing));
        }
        if strict && !skipped {
            return None; // the exact attempt failed for another reason
        }
        // Strictly, a branch must still be able to fail while another holds by missing one of
        // its required properties: when the skipped property schemas are what tells the
        // branches apart (`status` matching `^success$` or `^fail$`), every case would be
        // empty.
        if strict {
            let required =
                |b: &Value| -> Vec<Value> { b.get("required").and_then(Value::as_array).cloned().unwrap_or_default() };
            for (i, a) in branches.iter().enumerate() {
                for (j, b) in branches.iter().enumerate() {
                    if i != j && required(b).iter().all(|r| required(a).contains(r)) {
                        return None;
                    }
                }
            }
        }
        let mut cases: Vec<Value> = Vec::new();
        for (i, b) in branches.iter().enumerate() {
            let mut partial: Vec<Vec<Value>> = vec![vec![b.clone()]];
            for (_, ways) in failures.iter().enumerate().filter(|&(j, _)| j != i) {
                let mut next = Vec::with_capacity(partial.len() * ways.len());
                for p in &partial {
                    // A way to fail by type that the base or this branch rules out adds an
                    // empty case (and would spend the budget of cases).
                    for w in ways.iter().filter(|w| !excluded_by_type(w, base, b)) {
                        let mut q = p.clone();
                        q.push(w.clone());
                        next.push(q);
                    }
                }
                if cases.len() + next.len() > MAX_CASES {
                    return None;
                }
                partial = next;
            }
            cases.extend(partial.into_iter().map(|parts| serde_json::json!({ "allOf": parts })));
        }
        let mut map = base.clone();
        map.insert("anyOf".into(), Value::Array(cases));
        let (warnings, unique) = (self.warnings.len(), self.unique_arrays.len());
        match self.compile_map(map, ptr) {
            Ok(id) => Some(id),
            Err(_) => {
                self.warnings.truncate(warnings);
                self.permissive.retain(|&i| i < warnings);
                self.unique_arrays.truncate(unique);
                None
            }
        }
    }

    /// The string node that node `id` is (following one-branch unions), if any prefix of it
    /// can be extended into infinitely many strings: no `maxLength`, and no pattern or
    /// format, or one whose every live state has infinitely many completions.
    fn open_string_of(&self, mut id: NodeId) -> Option<NodeId> {
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
    fn tracked_items_of(&self, id: NodeId) -> bool {
        self.every_branch(id, |node, id| match node {
            Node::String(s) if s.patterns.is_empty() && s.max_len >= 1 && s.min_len <= s.max_len => true,
            Node::String(_) => self.open_string_of(id).is_some(),
            Node::Literals(set) => self.literals[*set as usize].len() <= 64,
            _ => false,
        })
    }

    /// Whether `accept` holds for every node other than a union that `id` leads to through
    /// unions (at most 256 nodes; cycles of unions count once).
    fn every_branch(&self, id: NodeId, accept: impl Fn(&Node, NodeId) -> bool) -> bool {
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
    fn open_objects_of(&self, id: NodeId) -> bool {
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
    fn unique_integer_of(&self, mut id: NodeId, min_items: u32) -> Option<NumberNode> {
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
    fn literal_set_of(&self, mut id: NodeId) -> Option<u32> {
        for _ in 0..16 {
            match &self.nodes[id as usize] {
                Node::Literals(set) => return Some(*set),
                Node::Union(alts) if alts.len() == 1 => id = alts[0],
                _ => return None,
            }
        }
        None
    }

    fn string(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
        let min_len = u32_of(map.get("minLength")).unwrap_or(0);
        let format_max = match map.get("format") {
            Some(Value::String(f)) => formats::max_len(f),
            _ => u32::MAX,
        };
        let max_len = u32_of(map.get("maxLength")).unwrap_or(u32::MAX).min(format_max);
        let mut patterns = Vec::new();
        let mut sources: Vec<(String, bool, String)> = Vec::new();
        match map.get("pattern") {
            Some(Value::String(p)) => sources.push((p.clone(), true, format!("{ptr}/pattern"))),
            Some(Value::Array(ps)) => {
                // Merged `allOf` branches may carry several patterns.
                for p in ps.iter().filter_map(Value::as_str) {
                    sources.push((p.to_string(), true, format!("{ptr}/pattern")));
                }
            }
            _ => {}
        }
        if let Some(Value::String(f)) = map.get("format") {
            match formats::pattern(f) {
                Some((p, exact)) => {
                    if !exact {
                        let warning = Warning {
                            location: format!("#{ptr}/format"),
                            message: format!("format `{f}` is approximated {}", formats::approximation(f)),
                        };
                        if formats::approximation_admits_more(f) {
                            self.warn_permissive(warning);
                        } else {
                            self.warnings.push(warning);
                        }
                    }
                    sources.push((p.to_string(), false, format!("{ptr}/format")));
                }
                None => self.warn_permissive(Warning {
                    location: format!("#{ptr}/format"),
                    message: format!("unknown format `{f}`: any string is allowed"),
                }),
            }
        }
        if sources.len() > 2 {
            return Err(err(
                ErrorCode::Unsupported,
                ptr,
                "more than two patterns/formats on one string are not supported yet",
            ));
        }
        for (p, search, at) in sources {
            patterns.push(self.dfa(&p, search, &at)?);
        }
        // Nothing: the lengths contradict, or a pattern matches no text at all.
        if min_len > max_len || patterns.iter().any(|&p| !self.pattern_matches_some_text(p)) {
            return Ok(NEVER);
        }
        Ok(self.push(Node::String(StringNode { min_len, max_len, patterns })))
    }

    /// Whether some text matches the compiled pattern `index`: its start state is live.
    fn pattern_matches_some_text(&self, index: u32) -> bool {
        use regex_automata::dfa::Automaton;
        let (dfa, live) = (&self.dfas[index as usize], &self.live[index as usize]);
        let anchored = regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes);
        // No start state would have failed the build; count it as "may match" all the same.
        dfa.start_state(&anchored)
            .map_or(true, |start| live.dist.get(start.as_usize() >> live.stride2).is_some_and(|&d| d != u32::MAX))
    }

    /// Whether literal `v` satisfies the keywords of `map` other than `enum`/`const` at this
    /// level: `Some(true)`/`Some(false)`, or `None` where this check cannot decide (a `$ref`,
    /// object or array keywords on an object or array value). Keywords of another type hold
    /// vacuously, as JSON Schema says.
    fn admits(&mut self, map: &Map<String, Value>, v: &Value, ptr: &str) -> Result<Option<bool>, ConstraintError> {
        self.admits_at(map, v, ptr, 0)
    }

    /// [`Self::admits`] at nesting `depth` (0: the map whose `enum`/`const` the value comes
    /// from). Past [`MAX_ADMITS_DEPTH`] nested branches the answer is undecided, so a hostile
    /// chain of `not`s cannot exhaust the stack.
    fn admits_at(
        &mut self,
        map: &Map<String, Value>,
        v: &Value,
        ptr: &str,
        depth: usize,
    ) -> Result<Option<bool>, ConstraintError> {
        if depth > MAX_ADMITS_DEPTH {
            return Ok(None);
        }
        let top = depth == 0;
        let mut verdict = Some(true);
        // `Some(false)` decides; `None` only weakens a `Some(true)`.
        let mut meet = |r: Option<bool>| match (verdict, r) {
            (Some(false), _) | (_, Some(true)) => {}
            (_, Some(false)) => verdict = Some(false),
            (_, None) => verdict = None,
        };
        let number = v.as_f64();
        let exclusive = |k: &str| matches!(map.get(k), Some(Value::Bool(true)));
        for (k, x) in map {
            match (k.as_str(), x) {
                ("type", _) => {
                    let types: Vec<&str> = match x {
                        Value::String(t) => vec![t.as_str()],
                        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                        _ => continue,
                    };
                    meet(Some(types.iter().any(|t| type_matches(t, v) || (*t == "number" && v.is_number()))));
                }
                // The values being checked come from this level's own `enum`/`const`.
                ("enum" | "const", _) if top => {}
                // A long list beside a long list would be quadratic: left undecided.
                ("enum", Value::Array(values)) if values.len() > MAX_ENUM_CHECK => meet(None),
                ("enum", Value::Array(values)) => meet(Some(values.iter().any(|w| json_eq(v, w)))),
                ("const", c) => meet(Some(json_eq(v, c))),
                ("pattern", Value::String(p)) => {
                    if let Some(text) = v.as_str() {
                        // A pattern the automata cannot take leaves the value undecided here.
                        let d = self.dfa(p, true, &format!("{ptr}/pattern")).ok();
                        meet(d.map(|d| self.dfa_matches(d, text.as_bytes())));
                    }
                }
                ("format", Value::String(f)) => {
                    if let (Some(text), Some((p, _))) = (v.as_str(), crate::formats::pattern(f)) {
                        let d = self.dfa(&p, false, &format!("{ptr}/format")).ok();
                        let short = text.chars().count() as u64 <= crate::formats::max_len(f) as u64;
                        meet(d.map(|d| short && self.dfa_matches(d, text.as_bytes())));
                    }
                }
                ("minLength" | "maxLength", n) => {
                    if let (Some(text), Some(n)) = (v.as_str(), n.as_u64()) {
                        let len = text.chars().count() as u64;
                        meet(Some(if k == "minLength" { len >= n } else { len <= n }));
                    }
                }
                ("minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum", bound) => {
                    if let (Some(x), Some(b)) = (number, bound.as_f64()) {
                        meet(Some(match k.as_str() {
                            "minimum" if exclusive("exclusiveMinimum") => x > b,
                            "minimum" => x >= b,
                            "maximum" if exclusive("exclusiveMaximum") => x < b,
                            "maximum" => x <= b,
                            "exclusiveMinimum" => x > b,
                            _ => x < b,
                        }));
                    }
                }
                ("multipleOf", m) => {
                    if let (Some(x), Some(m)) = (number, m.as_f64())
                        && m > 0.0
                    {
                        let q = x / m;
                        meet(Some((q - q.round()).abs() <= 1e-9 * q.abs().max(1.0)));
                    }
                }
                ("allOf" | "anyOf" | "oneOf", Value::Array(branches)) => {
                    let mut results = Vec::with_capacity(branches.len());
                    for (i, b) in branches.iter().enumerate() {
                        results.push(match b {
                            Value::Bool(b) => Some(*b),
                            Value::Object(m) => self.admits_at(m, v, &format!("{ptr}/{k}/{i}"), depth + 1)?,
                            _ => None,
                        });
                    }
                    let yes = results.iter().filter(|r| **r == Some(true)).count();
                    let unknown = results.iter().any(Option::is_none);
                    meet(match k.as_str() {
                        "allOf" if results.contains(&Some(false)) => Some(false),
                        "allOf" if unknown => None,
                        "allOf" => Some(true),
                        "anyOf" if yes > 0 => Some(true),
                        "anyOf" if unknown => None,
                        "anyOf" => Some(false),
                        _ if yes > 1 => Some(false),
                        _ if unknown => None,
                        _ => Some(yes == 1),
                    });
                }
                ("not", n) => {
                    let inner = match n {
                        Value::Bool(b) => Some(*b),
                        Value::Object(m) => self.admits_at(m, v, &format!("{ptr}/not"), depth + 1)?,
                        _ => None,
                    };
                    meet(inner.map(|b| !b));
                }
                ("$ref" | "$dynamicRef" | "$recursiveRef" | "if", _) => meet(None),
                // Object and array keywords constrain only objects and arrays.
                (_, _)
                    if (v.is_object() || v.is_array())
                        && !ANNOTATIONS.contains(&k.as_str())
                        && !k.starts_with("x-") =>
                {
                    meet(None)
                }
                _ => {}
            }
        }
        Ok(verdict)
    }

    /// Whether pattern automaton `d` matches `text` whole (search patterns match anywhere).
    fn dfa_matches(&self, d: u32, text: &[u8]) -> bool {
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
    fn dfa(&mut self, pattern: &str, search: bool, at: &str) -> Result<u32, ConstraintError> {
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

    fn number(&mut self, map: &Map<String, Value>, ptr: &str, integer: bool) -> Result<NodeId, ConstraintError> {
        let f = |k: &str| map.get(k).and_then(Value::as_f64);
        let mut min = f("minimum").map(|m| (m, false));
        let mut max = f("maximum").map(|m| (m, false));
        match map.get("exclusiveMinimum") {
            Some(Value::Bool(true)) => min = min.map(|(m, _)| (m, true)),
            Some(v) if v.is_number() => {
                let e = v.as_f64().unwrap_or(f64::MIN);
                if min.is_none_or(|(m, _)| e >= m) {
                    min = Some((e, true));
                }
            }
            _ => {}
        }
        match map.get("exclusiveMaximum") {
            Some(Value::Bool(true)) => max = max.map(|(m, _)| (m, true)),
            Some(v) if v.is_number() => {
                let e = v.as_f64().unwrap_or(f64::MAX);
                if max.is_none_or(|(m, _)| e <= m) {
                    max = Some((e, true));
                }
            }
            _ => {}
        }
        let multiple_of = f("multipleOf").filter(|m| *m > 0.0);
        // Bounds are compared as f64: past 2^53 neighbouring integers share a value, so a
        // number just beyond such a bound can pass. Integers whose bounds the schema gives
        // exactly are compared as integers instead; elsewhere this is said, not hidden.
        let beyond = [min, max].iter().flatten().any(|(x, _)| x.abs() > EXACT);
        let exact = (integer && beyond && multiple_of.is_none()).then(|| exact_integer_bounds(map)).flatten();
        for (k, b) in [("minimum", min), ("maximum", max)] {
            if let Some((x, _)) = b
                && x.abs() > EXACT
                && exact.is_none()
            {
                self.warn_permissive(Warning {
                    location: format!("#{ptr}/{k}"),
                    message: format!(
                        "a bound beyond 2^53 is compared in floating point: numbers within {} of it may pass",
                        x.abs() * f64::EPSILON
                    ),
                });
            }
        }
        if multiple_of.is_some() && !integer {
            self.warn_permissive(Warning {
                location: format!("#{ptr}/multipleOf"),
                message: "`multipleOf` on a non-integer is checked with a floating-point tolerance".into(),
            });
        }
        if admits_no_number(integer, min, max, multiple_of, exact) {
            // As for `minLength` above `maxLength`: nothing, so that a schema left with
            // nothing is a compile-time error rather than a dead end while writing.
            return Ok(NEVER);
        }
        Ok(self.push(Node::Number(NumberNode { integer, min, max, multiple_of, exact, keep_value: false })))
    }
}

/// Whether no number (no integer, for an `integer` node) satisfies the bounds and, for integers
/// with an integral `multipleOf`, that too. Only where that is certain: f64 comparisons are
/// exact for bounds up to 2^53 in magnitude, and [`NumberNode::exact`] bounds are integers;
/// beyond that, and for fractional `multipleOf` (checked with a tolerance while writing), the
/// answer is "some number may fit".
fn admits_no_number(
    integer: bool,
    min: Option<(f64, bool)>,
    max: Option<(f64, bool)>,
    multiple_of: Option<f64>,
    exact: Option<(i128, i128)>,
) -> bool {
    if exact.is_some_and(|(lo, hi)| lo > hi) {
        return true;
    }
    let (Some((lo, lo_exclusive)), Some((hi, hi_exclusive))) = (min, max) else {
        return false;
    };
    if lo > hi || (lo == hi && (lo_exclusive || hi_exclusive)) {
        return true;
    }
    if !integer || lo.abs() > EXACT || hi.abs() > EXACT {
        return false;
    }
    // The first and last integers in range, exact as integers below 2^53.
    let first = if lo_exclusive { lo.floor() + 1.0 } else { lo.ceil() } as i128;
    let last = if hi_exclusive { hi.ceil() - 1.0 } else { hi.floor() } as i128;
    if first > last {
        return true;
    }
    match multiple_of {
        Some(m) if m.fract() == 0.0 && m <= EXACT => {
            let m = m as i128;
            let first_multiple = first.div_euclid(m) * m + if first.rem_euclid(m) == 0 { 0 } else { m };
            first_multiple > last
        }
        _ => false,
    }
}

/// The inclusive integer bounds of an integer schema's `minimum`, `maximum`,
/// `exclusiveMinimum` and `exclusiveMaximum` (both draft forms), exactly: `None` when one of
/// them is a number that is neither a 64-bit integer nor a float below 2^53 (where its
/// floor and ceiling are exact).
fn exact_integer_bounds(map: &Map<String, Value>) -> Option<(i128, i128)> {
    /// The value's floor and ceiling as integers.
    fn int(v: &Value) -> Option<(i128, i128)> {
        let n = v.as_number()?;
        if let Some(i) = n.as_i64() {
            return Some((i as i128, i as i128));
        }
        if let Some(u) = n.as_u64() {
            return Some((u as i128, u as i128));
        }
        let f = n.as_f64().filter(|f| f.abs() <= EXACT)?;
        Some((f.floor() as i128, f.ceil() as i128))
    }
    let flag = |k: &str| matches!(map.get(k), Some(Value::Bool(true)));
    let (mut lo, mut hi) = (i128::MIN, i128::MAX);
    if let Some(v) = map.get("minimum") {
        let (floor, ceil) = int(v)?;
        // Draft 4: `exclusiveMinimum: true` makes `minimum` exclusive.
        lo = lo.max(if flag("exclusiveMinimum") { floor + 1 } else { ceil });
    }
    if let Some(v) = map.get("maximum") {
        let (floor, ceil) = int(v)?;
        hi = hi.min(if flag("exclusiveMaximum") { ceil - 1 } else { floor });
    }
    if let Some(v) = map.get("exclusiveMinimum").filter(|v| v.is_number()) {
        lo = lo.max(int(v)?.0 + 1);
    }
    if let Some(v) = map.get("exclusiveMaximum").filter(|v| v.is_number()) {
        hi = hi.min(int(v)?.1 - 1);
    }
    Some((lo, hi))
}

fn never_map() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("$never".into(), Value::Bool(true));
    m
}

fn u32_of(v: Option<&Value>) -> Option<u32> {
    v.and_then(Value::as_f64).map(|f| {
        if f <= 0.0 {
            0
        } else if f >= u32::MAX as f64 {
            u32::MAX
        } else {
            f.ceil() as u32
        }
    })
}

/// JSON equality with numbers compared by value (1 == 1.0).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    }
}

/// Whether every branch names its `type`s and no type is in two branches.
fn disjoint_types(branches: &[Value]) -> bool {
    let mut seen: Vec<String> = Vec::new();
    for b in branches {
        let ts: Vec<String> = match b.get("type") {
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(a)) => a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect(),
            _ => return false,
        };
        for t in ts {
            let t = if t == "integer" { "number".to_string() } else { t };
            if seen.contains(&t) {
                return false;
            }
            seen.push(t);
        }
    }
    true
}

/// What a `not` removes, in the forms that can be pushed inwards.
enum NotRule {
    /// `not: {}` / `not: true`: nothing is valid.
    Nothing,
    /// `not: false`: no constraint.
    Free,
    /// `not: {required: [...]}` (and `anyOf`/`allOf` of those): sets of property names that
    /// must not all be present.
    Absent(Vec<Vec<String>>),
    /// `not: {type: ...}`: these types are excluded.
    Types(Vec<String>),
}

/// The names of a `{required: [...]}` schema (annotations allowed), if it is one.
fn required_only(v: &Value) -> Option<Vec<String>> {
    let m = v.as_object()?;
    if m.keys().any(|k| k != "required" && !ANNOTATIONS.contains(&k.as_str())) {
        return None;
    }
    m.get("required")?.as_array()?.iter().map(|x| x.as_str().map(str::to_string)).collect()
}

/// Reads `not` (at `ptr/not`) in the forms it can be enforced in; any other is an error naming it.
fn not_rule(v: &Value, ptr: &str) -> Result<NotRule, ConstraintError> {
    let at = format!("{ptr}/not");
    let unsupported = || {
        err(
            ErrorCode::Unsupported,
            &at,
            "the keyword `not` is supported as `not: {}`, `not: {required: [...]}` (or an anyOf/allOf of those) and `not: {type: ...}`; this form is not yet",
        )
    };
    let m = match v {
        Value::Bool(true) => return Ok(NotRule::Nothing),
        Value::Bool(false) => return Ok(NotRule::Free),
        Value::Object(m) => m,
        _ => return Err(err(ErrorCode::InvalidSource, &at, "`not` must be a schema")),
    };
    let keys: Vec<&str> = m.keys().map(String::as_str).filter(|k| !ANNOTATIONS.contains(k)).collect();
    match keys.as_slice() {
        [] => Ok(NotRule::Nothing),
        ["required"] => Ok(NotRule::Absent(vec![required_only(v).ok_or_else(unsupported)?])),
        ["anyOf"] => {
            let sets: Option<Vec<Vec<String>>> =
                m["anyOf"].as_array().map(|a| a.iter().map(required_only).collect()).unwrap_or(None);
            sets.map(NotRule::Absent).ok_or_else(unsupported)
        }
        ["allOf"] => {
            let sets: Option<Vec<Vec<String>>> =
                m["allOf"].as_array().map(|a| a.iter().map(required_only).collect()).unwrap_or(None);
            let mut union: Vec<String> = Vec::new();
            for n in sets.ok_or_else(unsupported)?.into_iter().flatten() {
                if !union.contains(&n) {
                    union.push(n);
                }
            }
            Ok(NotRule::Absent(vec![union]))
        }
        ["type"] => {
            let types: Vec<String> = match &m["type"] {
                Value::String(t) => vec![t.clone()],
                Value::Array(a) => a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect(),
                _ => return Err(unsupported()),
            };
            Ok(NotRule::Types(types))
        }
        _ => Err(unsupported()),
    }
}

/// A schema that holds exactly where `v` (the schema at `at`) fails, in forms the compiler
/// enforces: boolean schemas; `type`; `required`; `properties` whose values negate in turn;
/// `const` and `enum` of strings, numbers, booleans and null; `minimum`/`maximum` and their
/// exclusive forms; `min`/`max` `Length`, `Items` and `Properties`. Any other keyword is an
/// error naming it.
fn negate(v: &Value, at: &str) -> Result<Value, ConstraintError> {
    negate_with(v, at, None)
}

/// [`negate`], or with `skipped` some part of it: a property whose schema cannot be negated
/// (a `$ref`, a `pattern`, ...) contributes no way to fail (so the result is a subset of the
/// failures), and `skipped` is set.
fn negate_with(v: &Value, at: &str, mut skipped: Option<&mut bool>) -> Result<Value, ConstraintError> {
    use serde_json::json;
    let m = match v {
        Value::Bool(b) => return Ok(Value::Bool(!b)),
        Value::Object(m) => m,
        _ => return Err(err(ErrorCode::InvalidSource, at, "a schema must be an object or a boolean")),
    };
    // `v` holds when every keyword does, so it fails when one of them fails. `required` and
    // `properties` hold for any non-object, so their failures are objects.
    let mut cases: Vec<Value> = Vec::new();
    for (k, x) in m {
        match k.as_str() {
            k if ANNOTATIONS.contains(&k) || k.starts_with("x-") => {}
            "type" => cases.push(json!({ "not": { "type": x } })),
            "required" => {
                let names = x.as_array().ok_or_else(|| {
                    err(ErrorCode::InvalidSource, &format!("{at}/required"), "`required` must be an array")
                })?;
                for n in names {
                    cases.push(json!({ "type": "object", "not": { "required": [n] } }));
                }
            }
            "properties" => {
                let props = x.as_object().ok_or_else(|| {
                    err(ErrorCode::InvalidSource, &format!("{at}/properties"), "`properties` must be an object")
                })?;
                for (name, s) in props {
                    let at = format!("{at}/properties/{}", escape_pointer(name));
                    let failing = match (negate_with(s, &at, skipped.as_deref_mut()), skipped.as_deref_mut()) {
                        (Ok(failing), _) => failing,
                        (Err(_), Some(skipped)) => {
                            *skipped = true;
                            continue;
                        }
                        (Err(e), None) => return Err(e),
                    };
                    if failing != Value::Bool(false) {
                        cases.push(json!({ "type": "object", "required": [name], "properties": { name: failing } }));
                    }
                }
            }
            // Bounds hold for every value of another type, so they fail inside their type.
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" if x.is_number() => {
                let opposite = match k.as_str() {
                    "minimum" => "exclusiveMaximum",
                    "maximum" => "exclusiveMinimum",
                    "exclusiveMinimum" => "maximum",
                    _ => "minimum",
                };
                cases.push(json!({ "type": "number", opposite: x }));
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties" => {
                let n = x.as_u64().ok_or_else(|| {
                    err(ErrorCode::InvalidSource, &format!("{at}/{k}"), format!("`{k}` must be a non-negative integer"))
                })?;
                let (kind, what) = match &k[3..] {
                    "Length" => ("string", "Length"),
                    "Items" => ("array", "Items"),
                    _ => ("object", "Properties"),
                };
                if k.starts_with("min") {
                    if n > 0 {
                        cases.push(json!({ "type": kind, format!("max{what}"): n - 1 }));
                    }
                } else {
                    cases.push(json!({ "type": kind, format!("min{what}"): n + 1 }));
                }
            }
            "const" => cases.push(complement(std::slice::from_ref(x), &format!("{at}/const"))?),
            "enum" => {
                let values = x
                    .as_array()
                    .ok_or_else(|| err(ErrorCode::InvalidSource, &format!("{at}/enum"), "`enum` must be an array"))?;
                cases.push(complement(values, &format!("{at}/enum"))?);
            }
            other => {
                return Err(err(
                    ErrorCode::Unsupported,
                    &format!("{at}/{}", escape_pointer(other)),
                    format!(
                        "`if` is supported with `type`, `required`, `properties`, `const`, `enum`, numeric \
                         bounds and size bounds (the forms whose negation can be enforced); `{other}` in it \
                         is not yet"
                    ),
                ));
            }
        }
    }
    Ok(match cases.len() {
        0 => Value::Bool(false),
        1 => cases.remove(0),
        _ => json!({ "anyOf": cases }),
    })
}

/// Whether `way` is `{"not": {"type": T}}` with `T` the one type `base` or `branch` demands,
/// so that nothing satisfies both.
fn excluded_by_type(way: &Value, base: &Map<String, Value>, branch: &Value) -> bool {
    let Some(Value::String(t)) = way
        .get("not")
        .filter(|_| way.as_object().is_some_and(|m| m.len() == 1))
        .and_then(|n| n.as_object().filter(|m| m.len() == 1).and_then(|m| m.get("type")))
    else {
        return false;
    };
    let demands = |v: Option<&Value>| matches!(v, Some(Value::String(x)) if x == t);
    demands(base.get("type")) || demands(branch.get("type"))
}

/// Whether a schema has a reference anywhere inside.
fn has_ref(v: &Value) -> bool {
    match v {
        Value::Object(m) => has_ref_in(m),
        Value::Array(a) => a.iter().any(has_ref),
        _ => false,
    }
}

/// [`has_ref`] for a keyword map.
fn has_ref_in(m: &Map<String, Value>) -> bool {
    m.keys().any(|k| matches!(k.as_str(), "$ref" | "$dynamicRef" | "$recursiveRef")) || m.values().any(has_ref)
}

/// The branches of a schema that is a bare `anyOf`, else the schema itself.
fn disjuncts(v: Value) -> Vec<Value> {
    match v {
        Value::Object(mut m) if m.len() == 1 && matches!(m.get("anyOf"), Some(Value::Array(_))) => {
            match m.remove("anyOf") {
                Some(Value::Array(branches)) => branches,
                _ => Vec::new(),
            }
        }
        other => vec![other],
    }
}

/// A schema for every JSON value other than `values` (strings, numbers, booleans, null).
fn complement(values: &[Value], at: &str) -> Result<Value, ConstraintError> {
    use serde_json::json;
    let kind = |v: &Value| match v {
        Value::String(_) => Ok("string"),
        Value::Number(_) => Ok("number"),
        Value::Bool(_) => Ok("boolean"),
        Value::Null => Ok("null"),
        _ => Err(err(ErrorCode::Unsupported, at, "`if` on an object or array `const`/`enum` is not supported yet")),
    };
    let mut kinds: Vec<&str> = Vec::new();
    for v in values {
        let k = kind(v)?;
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let mut cases = vec![json!({ "not": { "type": kinds } })];
    let strings: Vec<&str> = values.iter().filter_map(Value::as_str).collect();
    if !strings.is_empty() {
        cases.push(json!({ "type": "string", "pattern": none_of(&strings, at)? }));
    }
    let mut numbers: Vec<f64> = values.iter().filter_map(Value::as_f64).collect();
    numbers.sort_by(f64::total_cmp);
    numbers.dedup();
    if let (Some(&lo), Some(&hi)) = (numbers.first(), numbers.last()) {
        cases.push(json!({ "type": "number", "exclusiveMaximum": lo }));
        for w in numbers.windows(2) {
            cases.push(json!({ "type": "number", "exclusiveMinimum": w[0], "exclusiveMaximum": w[1] }));
        }
        cases.push(json!({ "type": "number", "exclusiveMinimum": hi }));
    }
    let bools: Vec<bool> = values.iter().filter_map(Value::as_bool).collect();
    if !bools.is_empty() {
        for b in [true, false] {
            if !bools.contains(&b) {
                cases.push(json!({ "const": b }));
            }
        }
    }
    Ok(json!({ "anyOf": cases }))
}

/// An anchored pattern for every string except `words`: the words' character trie, where at
/// each node the string may end (if no word ends there), leave the trie by a character no
/// word continues with, or follow a child.
fn none_of(words: &[&str], at: &str) -> Result<String, ConstraintError> {
    /// Past this many characters of words the pattern is refused (it grows with them).
    const MAX_CHARS: usize = 4096;
    if words.iter().map(|w| w.chars().count()).sum::<usize>() > MAX_CHARS {
        return Err(err(
            ErrorCode::TooLarge,
            at,
            "`if` on more than 4,096 characters of string values is not supported",
        ));
    }
    #[derive(Default)]
    struct Node {
        end: bool,
        children: std::collections::BTreeMap<char, Node>,
    }
    let mut root = Node::default();
    for w in words {
        let mut n = &mut root;
        for c in w.chars() {
            n = n.children.entry(c).or_default();
        }
        n.end = true;
    }
    fn class_char(c: char) -> String {
        if c.is_ascii_alphanumeric() { c.to_string() } else { format!("\\u{{{:x}}}", c as u32) }
    }
    fn pattern(n: &Node) -> String {
        let mut alts: Vec<String> = Vec::new();
        if !n.end {
            alts.push(String::new());
        }
        if n.children.is_empty() {
            alts.push("[\\s\\S]+".into());
        } else {
            let set: String = n.children.keys().map(|&c| class_char(c)).collect();
            alts.push(format!("[^{set}][\\s\\S]*"));
        }
        for (&c, child) in &n.children {
            alts.push(format!("{}{}", class_char(c), pattern(child)));
        }
        format!("(?:{})", alts.join("|"))
    }
    Ok(format!("^{}$", pattern(&root)))
}

/// `not: a` and `not: b` as one `not`, where both are `type` forms (the union of the types) or
/// both are `required` forms (each a set that must not all appear): `None` otherwise.
/// The `multipleOf` that two together ask for: the least common multiple of two integers
/// (while it stays below 2^53), or the larger of two values when it is a whole multiple of
/// the smaller. `None` otherwise (`0.3` and `0.5`).
fn common_multiple(a: &Value, b: &Value) -> Option<Value> {
    let (x, y) = (a.as_f64().filter(|x| *x > 0.0)?, b.as_f64().filter(|y| *y > 0.0)?);
    if x == y {
        return Some(a.clone());
    }
    let whole = |v: f64| v.fract() == 0.0 && v <= EXACT;
    if whole(x) && whole(y) {
        let (x, y) = (x as u64, y as u64);
        let gcd = |mut p: u64, mut q: u64| {
            while q != 0 {
                (p, q) = (q, p % q);
            }
            p
        };
        let lcm = (x / gcd(x, y)).checked_mul(y)?;
        return (lcm as f64 <= EXACT).then(|| Value::from(lcm));
    }
    let (small, large, large_value) = if x < y { (x, y, b) } else { (y, x, a) };
    let q = large / small;
    ((q - q.round()).abs() <= 1e-9 * q).then(|| large_value.clone())
}

fn merge_nots(a: &Value, b: &Value) -> Option<Value> {
    let types = |v: &Value| -> Option<Vec<Value>> {
        let m = v.as_object()?;
        if m.keys().any(|k| k != "type" && !ANNOTATIONS.contains(&k.as_str())) {
            return None;
        }
        match m.get("type")? {
            Value::Array(a) => Some(a.clone()),
            t => Some(vec![t.clone()]),
        }
    };
    if let (Some(mut ta), Some(tb)) = (types(a), types(b)) {
        for t in tb {
            if !ta.contains(&t) {
                ta.push(t);
            }
        }
        return Some(serde_json::json!({ "type": ta }));
    }
    // The sets of a `required` form: one for `{required}` and for `{allOf: [required...]}`
    // (their union), one per branch of `{anyOf: [required...]}`.
    let sets = |v: &Value| -> Option<Vec<Value>> {
        if let Some(names) = required_only(v) {
            return Some(vec![serde_json::json!(names)]);
        }
        let m = v.as_object()?;
        match (m.get("anyOf"), m.get("allOf"), m.len()) {
            (Some(Value::Array(branches)), None, 1) => {
                branches.iter().map(|b| required_only(b).map(|n| serde_json::json!(n))).collect()
            }
            (None, Some(Value::Array(branches)), 1) => {
                let mut union: Vec<String> = Vec::new();
                for b in branches {
                    for n in required_only(b)? {
                        if !union.contains(&n) {
                            union.push(n);
                        }
                    }
                }
                Some(vec![serde_json::json!(union)])
            }
            _ => None,
        }
    };
    let mut all = sets(a)?;
    all.extend(sets(b)?);
    let branches: Vec<Value> = all.into_iter().map(|names| serde_json::json!({ "required": names })).collect();
    Some(serde_json::json!({ "anyOf": branches }))
}

/// What `propertyNames` allows.
enum NamesRule {
    /// Keys must match this pattern (search semantics, as `pattern`).
    Pattern(String),
    /// No key at all (`propertyNames: false`).
    Nothing,
}

/// `propertyNames` as one pattern: from `pattern`, `enum`/`const`, or `minLength`/`maxLength`
/// (one of them; `type: "string"` is implied). `None` when it constrains nothing.
fn property_names(v: Option<&Value>, ptr: &str) -> Result<Option<NamesRule>, ConstraintError> {
    let at = format!("{ptr}/propertyNames");
    let map = match v {
        None | Some(Value::Bool(true)) => return Ok(None),
        Some(Value::Bool(false)) => return Ok(Some(NamesRule::Nothing)),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(err(ErrorCode::InvalidSource, &at, "`propertyNames` must be a schema")),
    };
    let mut rules = Vec::new();
    for (k, v) in map {
        match (k.as_str(), v) {
            ("type", Value::String(t)) if t == "string" => {}
            ("pattern", Value::String(p)) => rules.push(p.clone()),
            ("enum" | "const", v) => {
                let names: Vec<&Value> =
                    if k == "const" { vec![v] } else { v.as_array().map(|a| a.iter().collect()).unwrap_or_default() };
                let alts: Vec<String> = names.iter().filter_map(|n| n.as_str()).map(escape_regex).collect();
                rules.push(if alts.is_empty() { "[^\\s\\S]".into() } else { format!("^(?:{})$", alts.join("|")) });
            }
            ("minLength" | "maxLength", _) => {
                if !rules.iter().any(|r: &String| r.starts_with("^(?s:.){")) {
                    let min = u32_of(map.get("minLength")).unwrap_or(0);
                    let max = u32_of(map.get("maxLength")).map(|m| m.to_string()).unwrap_or_default();
                    rules.push(format!("^(?s:.){{{min},{max}}}$"));
                }
            }
            (other, _) if ANNOTATIONS.contains(&other) => {}
            (other, _) => {
                return Err(err(
                    ErrorCode::Unsupported,
                    &format!("{at}/{}", escape_pointer(other)),
                    format!(
                        "`propertyNames` with `{other}` is not supported yet (pattern, enum, const, minLength, maxLength are)"
                    ),
                ));
            }
        }
    }
    match rules.len() {
        0 => Ok(None),
        1 => Ok(rules.pop().map(NamesRule::Pattern)),
        _ => Err(err(
            ErrorCode::Unsupported,
            &at,
            "`propertyNames` combining several of pattern, enum and lengths is not supported yet",
        )),
    }
}

/// A regex matching exactly `text`.
fn escape_regex(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_string() } else { format!("\\x{{{:X}}}", c as u32) })
        .collect()
}

/// Whether a schema value accepts everything (`true`, `{}`).
fn trivially_true(v: &Value) -> bool {
    matches!(v, Value::Bool(true)) || v.as_object().is_some_and(|m| m.is_empty())
}

/// What a dependent schema (`dependentSchemas`, schema-valued `dependencies`) says, in the
/// forms that reduce to presence: `{required: [...]}` (names the trigger requires) and
/// `{not: ...}` with a required form (sets that must not all be present with the trigger).
enum DependentForm {
    Requires(Vec<String>),
    Excludes(Vec<Vec<String>>),
    Nothing,
}

fn dependent_form(v: &Value, at: &str) -> Option<DependentForm> {
    if trivially_true(v) {
        return Some(DependentForm::Nothing);
    }
    if let Some(names) = required_only(v) {
        return Some(DependentForm::Requires(names));
    }
    let m = v.as_object()?;
    if m.keys().any(|k| k != "not" && !ANNOTATIONS.contains(&k.as_str())) {
        return None;
    }
    match not_rule(m.get("not")?, at).ok()? {
        NotRule::Absent(sets) => Some(DependentForm::Excludes(sets)),
        _ => None,
    }
}

/// The presence rules of an object schema: (trigger, names it requires) from
/// `dependentRequired` and the array and reducible schema forms of `dependencies` /
/// `dependentSchemas`, and sets that must not all be present (from dependent `not`s).
type Presence = (Vec<(String, Vec<String>)>, Vec<Vec<String>>);

fn dependencies_of(map: &Map<String, Value>, ptr: &str) -> Result<Presence, ConstraintError> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut excluded: Vec<Vec<String>> = Vec::new();
    for key in ["dependentRequired", "dependencies", "dependentSchemas"] {
        let Some(v) = map.get(key) else { continue };
        let m = v.as_object().ok_or_else(|| {
            err(ErrorCode::InvalidSource, &format!("{ptr}/{key}"), format!("`{key}` must be an object"))
        })?;
        for (name, value) in m {
            let at = format!("{ptr}/{key}/{}", escape_pointer(name));
            let reqs: Vec<String> = match value {
                Value::Array(a) if key != "dependentSchemas" => {
                    a.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<_>>>().ok_or_else(|| {
                        err(ErrorCode::InvalidSource, &at, "a dependency must be an array of property names")
                    })?
                }
                other => match dependent_form(other, &at) {
                    Some(DependentForm::Nothing) => continue,
                    Some(DependentForm::Requires(names)) => names,
                    Some(DependentForm::Excludes(sets)) => {
                        excluded.extend(sets.into_iter().map(|mut set| {
                            set.push(name.clone());
                            set
                        }));
                        continue;
                    }
                    None => {
                        return Err(err(
                            ErrorCode::Unsupported,
                            &at,
                            format!(
                                "a dependent schema in `{key}` is supported as `{{required: [...]}}` or `{{not: {{required: [...]}}}}`; this one is not yet"
                            ),
                        ));
                    }
                },
            };
            match out.iter_mut().find(|(n, _)| n == name) {
                Some((_, r)) => r.extend(reqs.into_iter().filter(|x| !r.contains(x)).collect::<Vec<_>>()),
                None => out.push((name.clone(), reqs)),
            }
        }
    }
    for (name, reqs) in &mut out {
        reqs.retain(|r| r != name);
    }
    out.retain(|(_, r)| !r.is_empty());
    Ok((out, excluded))
}

/// Merges two keyword maps as `allOf` would.
fn merge(mut a: Map<String, Value>, b: Map<String, Value>, ptr: &str) -> Result<Map<String, Value>, ConstraintError> {
    // Properties declared on one side only must also satisfy the other side's
    // `additionalProperties`.
    let a_props: Vec<String> =
        a.get("properties").and_then(Value::as_object).map(|m| m.keys().cloned().collect()).unwrap_or_default();
    let b_props: Vec<String> =
        b.get("properties").and_then(Value::as_object).map(|m| m.keys().cloned().collect()).unwrap_or_default();
    let a_addl = a.get("additionalProperties").cloned();
    let b_addl = b.get("additionalProperties").cloned();
    let positional =
        |m: &Map<String, Value>| m.contains_key("prefixItems") || m.get("items").is_some_and(Value::is_array);
    if (positional(&a) && b.contains_key("items")) || (positional(&b) && a.contains_key("items")) {
        return Err(err(
            ErrorCode::Unsupported,
            ptr,
            "`allOf` branches mixing positional and general `items` cannot be merged yet",
        ));
    }
    for (k, vb) in b {
        let Some(va) = a.get(&k).cloned() else {
            a.insert(k, vb);
            continue;
        };
        if json_eq(&va, &vb) && k != "properties" {
            continue;
        }
        let merged = match k.as_str() {
            "prefixItems" | "items" | "additionalItems" if va.is_array() || vb.is_array() || k == "prefixItems" => {
                return Err(err(
                    ErrorCode::Unsupported,
                    ptr,
                    format!("`allOf` branches with positional `{k}` cannot be merged yet"),
                ));
            }
            "properties" => {
                let mut out = va.as_object().cloned().unwrap_or_default();
                for (name, sb) in vb.as_object().cloned().unwrap_or_default() {
                    let combined = match out.get(&name) {
                        Some(sa) if json_eq(sa, &sb) => sa.clone(),
                        Some(sa) => serde_json::json!({ "allOf": [sa, sb] }),
                        None => sb,
                    };
                    out.insert(name, combined);
                }
                Value::Object(out)
            }
            "required" => {
                let mut r = va.as_array().cloned().unwrap_or_default();
                for x in vb.as_array().cloned().unwrap_or_default() {
                    if !r.contains(&x) {
                        r.push(x);
                    }
                }
                Value::Array(r)
            }
            "type" => {
                let set = |v: &Value| -> Vec<String> {
                    match v {
                        Value::String(s) => vec![s.clone()],
                        Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
                        _ => Vec::new(),
                    }
                };
                let (sa, sb) = (set(&va), set(&vb));
                let mut out: Vec<Value> = Vec::new();
                for t in &sa {
                    let keep = sb.contains(t) || (t == "integer" && sb.iter().any(|x| x == "number"));
                    if keep {
                        out.push(Value::String(t.clone()));
                    } else if t == "number" && sb.iter().any(|x| x == "integer") {
                        out.push(Value::String("integer".into()));
                    }
                }
                if out.is_empty() {
                    return Ok(never_map());
                }
                Value::Array(out)
            }
            "minimum" | "minLength" | "minItems" | "minProperties" | "exclusiveMinimum"
                if va.is_number() && vb.is_number() =>
            {
                if va.as_f64() >= vb.as_f64() {
                    va
                } else {
                    vb
                }
            }
            "maximum" | "maxLength" | "maxItems" | "maxProperties" | "exclusiveMaximum"
                if va.is_number() && vb.is_number() =>
            {
                if va.as_f64() <= vb.as_f64() {
                    va
                } else {
                    vb
                }
            }
            "additionalProperties" | "items" | "additionalItems" => serde_json::json!({ "allOf": [va, vb] }),
            "dependentRequired" | "dependencies" | "dependentSchemas" => {
                let mut out = va.as_object().cloned().unwrap_or_default();
                for (name, rb) in vb.as_object().cloned().unwrap_or_default() {
                    let merged = match (out.get(&name), &rb) {
                        (Some(Value::Array(ra)), Value::Array(rb)) => {
                            let mut r = ra.clone();
                            r.extend(rb.iter().filter(|x| !ra.contains(x)).cloned());
                            Value::Array(r)
                        }
                        (Some(sa), _) if !json_eq(sa, &rb) => serde_json::json!({ "allOf": [sa, rb] }),
                        _ => rb,
                    };
                    out.insert(name, merged);
                }
                Value::Object(out)
            }
            "enum" => {
                let bs = vb.as_array().cloned().unwrap_or_default();
                Value::Array(
                    va.as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|x| bs.iter().any(|y| json_eq(x, y)))
                        .collect(),
                )
            }
            "const" => return Ok(never_map()),
            "pattern" => {
                let mut ps = match va {
                    Value::Array(a) => a,
                    other => vec![other],
                };
                ps.push(vb);
                Value::Array(ps)
            }
            // A format is an annotation unless a validator opts in: the first one is kept.
            "format" => va,
            "uniqueItems" => Value::Bool(va.as_bool().unwrap_or(false) || vb.as_bool().unwrap_or(false)),
            "multipleOf" => common_multiple(&va, &vb).ok_or_else(|| {
                err(
                    ErrorCode::Unsupported,
                    ptr,
                    format!(
                        "`allOf` branches ask for multiples of {va} and of {vb}; their common multiple is not supported"
                    ),
                )
            })?,
            // `not A` and `not B` is `not (A or B)`, in the forms `not` takes.
            "not" => merge_nots(&va, &vb).ok_or_else(|| {
                err(ErrorCode::Unsupported, ptr, "`allOf` branches disagree on `not` and cannot be merged")
            })?,
            "anyOf" | "oneOf" => {
                return Err(err(
                    ErrorCode::Unsupported,
                    ptr,
                    format!("two `{k}` lists inside one `allOf` cannot be merged yet"),
                ));
            }
            other if ANNOTATIONS.contains(&other) || other.starts_with("x-") || !HANDLED.contains(&other) => va,
            other => {
                return Err(err(
                    ErrorCode::Unsupported,
                    ptr,
                    format!("`allOf` branches disagree on `{other}` and cannot be merged"),
                ));
            }
        };
        a.insert(k, merged);
    }
    // additionalProperties across branches.
    if let Some(Value::Object(props)) = a.get_mut("properties") {
        for (name, schema) in props.iter_mut() {
            let only_b = b_props.contains(name) && !a_props.contains(name);
            let only_a = a_props.contains(name) && !b_props.contains(name);
            let other = if only_b {
                &a_addl
            } else if only_a {
                &b_addl
            } else {
                &None
            };
            if let Some(addl) = other
                && !(a_props.is_empty() && only_b && a_addl.is_none())
            {
                *schema = serde_json::json!({ "allOf": [schema.clone(), addl] });
            }
        }
    }
    Ok(a)
}

/// Automata built by earlier compiles, by (pattern, search): formats (`date-time`, `uri`,
/// `email`) and common patterns recur across schemas, and determinising one costs far more
/// (up to tens of milliseconds for a counted repetition under search semantics) than the
/// lookup. Bounded by the automata's memory; emptied when full.
static BUILT: Mutex<Option<BuiltAutomata>> = Mutex::new(None);

/// A pattern's automaton and its live states, shared between the graphs that use it.
type Automaton = (Arc<dense::DFA<Vec<u32>>>, Arc<LiveTable>);

/// The contents of [`BUILT`].
#[derive(Default)]
struct BuiltAutomata {
    by_pattern: HashMap<(String, bool), Automaton>,
    bytes: usize,
}

/// The most automaton memory [`BUILT`] keeps.
const MAX_BUILT_BYTES: usize = 32 << 20;

/// The automaton of `pattern` built by an earlier compile, if kept.
fn built_automaton(pattern: &str, search: bool) -> Option<Automaton> {
    let built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    built.as_ref()?.by_pattern.get(&(pattern.to_string(), search)).cloned()
}

/// Keeps a built automaton for later compiles.
fn remember_automaton(pattern: &str, search: bool, built: &Automaton) {
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
fn build_automaton(
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
            format!("(?s:.)*(?:{translated})(?s:.)*\\z")
        } else {
            format!("{head}(?:{body}){tail}\\z")
        }
    } else {
        format!("(?:{translated})\\z")
    };
    let dfa = dense::Builder::new()
        .configure(
            dense::Config::new()
                .start_kind(StartKind::Anchored)
                .match_kind(MatchKind::All)
                .dfa_size_limit(Some(MAX_DFA_BYTES))
                .determinize_size_limit(Some(MAX_DFA_BYTES)),
        )
        .build(&full)
        .map_err(|e| err(ErrorCode::TooLarge, at, format!("pattern `{pattern}` is too complex to compile: {e}")))?;
    let live = live_states(&dfa)
        .ok_or_else(|| err(ErrorCode::TooLarge, at, format!("pattern `{pattern}` has too many automaton states")))?;
    Ok((dfa, live))
}

/// The states of `dfa` from which a match at the end of input is reachable (None when the
/// automaton has more than 100,000 states).
fn live_states(dfa: &dense::DFA<Vec<u32>>) -> Option<LiveTable> {
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
        for b in 0..=255u8 {
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
fn every_live_state_infinite(
    dfa: &dense::DFA<Vec<u32>>,
    order: &[regex_automata::util::primitives::StateID],
    seen: &HashMap<u32, usize>,
    dist: &[u32],
    stride2: usize,
) -> bool {
    use regex_automata::dfa::Automaton;
    let live = |k: usize| dist[order[k].as_usize() >> stride2] != u32::MAX;
    let writable = |b: u8| b >= 0x20 || matches!(b, 0x08 | 0x09 | 0x0A | 0x0C | 0x0D);
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
const MAX_SAFE_CHECK_STATES: usize = 512;

/// By state index: whether every well-formed UTF-8 continuation from the state (at a
/// character boundary) keeps the automaton able to match. A search pattern that has matched
/// is safe, and so is one padded with `.*` before it matches: content then needs no walk
/// through the automaton. Over (state, UTF-8 decoder position) pairs: a pair is unsafe when
/// a byte well-formed there leads to the dead state or one that cannot match, or to an
/// unsafe pair.
fn safe_states(
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
            for b in 0..=255u8 {
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

/// How deep [`Compiler::admits`] follows nested `allOf`/`anyOf`/`oneOf`/`not` branches.
const MAX_ADMITS_DEPTH: usize = 32;

/// Beyond this many values, an `enum` met while checking another `enum`'s values is not
/// searched (the check would be quadratic in hostile schemas); the values are kept.
const MAX_ENUM_CHECK: usize = 256;

/// Whether `p` has a `|` outside any group or class.
fn top_level_alternation(p: &str) -> bool {
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
fn ecma_to_rust(p: &str) -> String {
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

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..(i + 3).min(s.len())], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}
