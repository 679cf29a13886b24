//! Reference resolution: `$ref` by JSON pointer, `$anchor` and `$id` anchors, `$defs`, and
//! the worklist that compiles reference targets without recursion (long chains stay off the
//! stack; a recursive reference becomes a cycle of the graph).

use dspark_guest::{ConstraintError, ErrorCode};
use serde_json::{Map, Value};

use super::{ANNOTATIONS, Compiler, HANDLED, Job, MAX_DEPTH, MAX_NODES, err, escape_pointer};
use crate::graph::{ANY, NEVER, Node, NodeId};

impl<'a> Compiler<'a> {
    pub(super) fn collect_anchors(&mut self, v: &Value, ptr: String, depth: usize) {
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
    pub(super) fn resolve(&self, reference: &str, at: &str) -> Result<(&'a Value, String), ConstraintError> {
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
    pub(super) fn schema(&mut self, v: &'a Value, ptr: &str) -> Result<NodeId, ConstraintError> {
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

    pub(super) fn schema_inner(&mut self, v: &'a Value, ptr: &str) -> Result<NodeId, ConstraintError> {
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
    pub(super) fn reference(&mut self, r: &str, ptr: &str) -> Result<NodeId, ConstraintError> {
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
    pub(super) fn compile_map(&mut self, map: Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
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
    pub(super) fn merged_reference(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
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

    /// Compiles a sub-schema that lives in a map we own (a merged copy): `$ref`s inside are
    /// resolved against the document.
    pub(super) fn schema_owned(&mut self, v: &Value, ptr: &str) -> Result<NodeId, ConstraintError> {
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
}

pub(super) fn percent_decode(s: &str) -> String {
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
