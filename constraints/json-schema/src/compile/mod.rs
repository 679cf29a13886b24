//! JSON Schema to [`Graph`]: normalisation (inline `$ref`, merge `allOf`, push sibling keywords
//! into `anyOf`/`oneOf` branches) and node building.
//!
//! The phases, one file each, in the order a schema meets them: [`Compiler::compile`] starts at
//! the root; `refs` resolves references and compiles their targets from a worklist;
//! `normalise` checks the keywords, merges `allOf` and rewrites conditionals and `not`;
//! `one_of` makes `oneOf` exclusive; `build` makes one node per schema, with `numbers` for
//! numeric bounds and `automata` for patterns and formats; after the whole graph is built,
//! `unique` decides `uniqueItems` and `passes` prunes what can never finish and flattens
//! unions.
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
//! - `not` is enforced for boolean schemas, `type` and `required` (and `anyOf`/`allOf` of
//!   `required`); `if`/`then`/`else` becomes a union of its cases (the condition negated as
//!   `oneOf`'s branches are). Forms that cannot be enforced by a left-to-right automaton yet
//!   (other `not`s, dependent schemas other than `{required}` and `{not: {required}}`,
//!   `contains`, `unevaluated*`, dynamic refs) are errors naming pointer and keyword: never
//!   silently ignored. `uniqueItems` is enforced where the items come from an `enum` of at most 64
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
use std::sync::Arc;

use dspark_guest::{ConstraintError, ErrorCode, Warning};
use regex_automata::dfa::dense;
use serde_json::{Map, Value};

use crate::graph::{
    ANY, ArrayNode, Graph, KeyTrie, LiteralTrie, LiveTable, Node, NodeId, NumberNode, ObjectNode, PairLive,
    PropertyOrder, StringNode,
};

mod automata;
mod build;
mod normalise;
mod numbers;
mod one_of;
mod passes;
mod refs;
mod unique;

/// Size limits that keep a hostile schema from exhausting the sandbox.
pub const MAX_NODES: usize = 200_000;

/// Deepest nesting of schemas followed while compiling.
pub const MAX_DEPTH: usize = 200;

/// 2^53: below it in magnitude every integer is an f64, so bounds and multiples there compare
/// exactly as f64 values.
pub(crate) const EXACT: f64 = 9_007_199_254_740_992.0;

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
    /// Live state pairs of automata used together on one string.
    pairs: HashMap<(u32, u32), Arc<PairLive>>,
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
            pairs: HashMap::new(),
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
            Graph {
                nodes: self.nodes,
                literals: self.literals,
                dfas: self.dfas,
                live: self.live,
                pairs: self.pairs,
                root,
                order,
            },
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
        Graph { nodes: c.nodes, literals: c.literals, dfas: c.dfas, live: c.live, pairs: c.pairs, root, order }
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
