//! Node building: one graph node per normalised schema by type (objects, arrays, strings,
//! unions, conditionals), `propertyNames`, and the check of `enum` / `const` values against the
//! schema around them.

use dspark_guest::{ConstraintError, ErrorCode, Warning};
use serde_json::{Map, Value};

use super::automata::escape_regex;
use super::normalise::{NotRule, dependencies_of, disjoint_types, disjuncts, merge, negate, not_rule};
use super::{ANNOTATIONS, Compiler, HANDLED, err, escape_pointer, json_eq, type_matches, u32_of};
use crate::formats;
use crate::graph::{ANY, ArrayNode, KeyTrie, NEVER, Node, NodeId, NumberNode, ObjectNode, Prop, StringNode};

impl<'a> Compiler<'a> {
    /// Builds the node of a flattened keyword map.
    pub(super) fn build(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
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
    pub(super) fn conditional(
        &mut self,
        map: &Map<String, Value>,
        cond: &Value,
        ptr: &str,
    ) -> Result<NodeId, ConstraintError> {
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
    pub(super) fn types(&self, map: &Map<String, Value>, ptr: &str) -> Result<Vec<String>, ConstraintError> {
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

    pub(super) fn object(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
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

    pub(super) fn array(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
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

    pub(super) fn string(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<NodeId, ConstraintError> {
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
        // Nothing: the lengths contradict, a pattern matches no text at all, or none short
        // enough for `maxLength`.
        if min_len > max_len
            || patterns.iter().any(|&p| !self.pattern_matches_some_text(p))
            || patterns.iter().any(|&p| self.pattern_min_chars(p).is_none_or(|n| n > max_len))
        {
            return Ok(NEVER);
        }
        // Two automata: they must be able to match the same text, and the walk may only
        // enter pairs of states from which they still can.
        if let [a, b] = patterns[..]
            && let Some(table) = self.pair_live(a, b)
        {
            let empty = table.live.is_empty();
            self.pairs.insert((a, b), std::sync::Arc::new(table));
            if empty {
                return Ok(NEVER);
            }
        }
        Ok(self.push(Node::String(StringNode { min_len, max_len, patterns })))
    }

    /// Whether literal `v` satisfies the keywords of `map` other than `enum`/`const` at this
    /// level: `Some(true)`/`Some(false)`, or `None` where this check cannot decide (a `$ref`,
    /// object or array keywords on an object or array value). Keywords of another type hold
    /// vacuously, as JSON Schema says.
    pub(super) fn admits(
        &mut self,
        map: &Map<String, Value>,
        v: &Value,
        ptr: &str,
    ) -> Result<Option<bool>, ConstraintError> {
        self.admits_at(map, v, ptr, 0)
    }

    /// [`Self::admits`] at nesting `depth` (0: the map whose `enum`/`const` the value comes
    /// from). Past [`MAX_ADMITS_DEPTH`] nested branches the answer is undecided, so a hostile
    /// chain of `not`s cannot exhaust the stack.
    pub(super) fn admits_at(
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
}

/// What `propertyNames` allows.
pub(super) enum NamesRule {
    /// Keys must match this pattern (search semantics, as `pattern`).
    Pattern(String),
    /// No key at all (`propertyNames: false`).
    Nothing,
}

/// `propertyNames` as one pattern: from `pattern`, `enum`/`const`, or `minLength`/`maxLength`
/// (one of them; `type: "string"` is implied). `None` when it constrains nothing.
pub(super) fn property_names(v: Option<&Value>, ptr: &str) -> Result<Option<NamesRule>, ConstraintError> {
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

/// How deep [`Compiler::admits`] follows nested `allOf`/`anyOf`/`oneOf`/`not` branches.
pub(super) const MAX_ADMITS_DEPTH: usize = 32;

/// Beyond this many values, an `enum` met while checking another `enum`'s values is not
/// searched (the check would be quadratic in hostile schemas); the values are kept.
pub(super) const MAX_ENUM_CHECK: usize = 256;
