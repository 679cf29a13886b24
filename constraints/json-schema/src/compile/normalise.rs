//! Normalisation before building: keywords checked against what is supported, `allOf`
//! merged into one schema (properties per key, bounds tightened, `multipleOf` combined into a
//! common multiple), sibling keywords pushed into `anyOf`/`oneOf` branches, conditionals
//! rewritten as unions, dependencies collected, and `not` negated where its complement is
//! expressible.

use dspark_guest::{ConstraintError, ErrorCode, Warning};
use serde_json::{Map, Value};

use super::{
    ANNOTATIONS, Compiler, EXACT, HANDLED, MAX_CONDITION_BRANCHES, MAX_CONDITIONALS, UNSUPPORTED, err, escape_pointer,
    json_eq, never_map,
};

impl<'a> Compiler<'a> {
    pub(super) fn check_keywords(&mut self, map: &Map<String, Value>, ptr: &str) -> Result<(), ConstraintError> {
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
    pub(super) fn flatten(
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
}

/// Whether every branch names its `type`s and no type is in two branches.
pub(super) fn disjoint_types(branches: &[Value]) -> bool {
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
pub(super) enum NotRule {
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
pub(super) fn required_only(v: &Value) -> Option<Vec<String>> {
    let m = v.as_object()?;
    if m.keys().any(|k| k != "required" && !ANNOTATIONS.contains(&k.as_str())) {
        return None;
    }
    m.get("required")?.as_array()?.iter().map(|x| x.as_str().map(str::to_string)).collect()
}

/// Reads `not` (at `ptr/not`) in the forms it can be enforced in; any other is an error naming it.
pub(super) fn not_rule(v: &Value, ptr: &str) -> Result<NotRule, ConstraintError> {
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
pub(super) fn negate(v: &Value, at: &str) -> Result<Value, ConstraintError> {
    negate_with(v, at, None)
}

/// [`negate`], or with `skipped` some part of it: a property whose schema cannot be negated
/// (a `$ref`, a `pattern`, ...) contributes no way to fail (so the result is a subset of the
/// failures), and `skipped` is set.
pub(super) fn negate_with(v: &Value, at: &str, mut skipped: Option<&mut bool>) -> Result<Value, ConstraintError> {
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
pub(super) fn excluded_by_type(way: &Value, base: &Map<String, Value>, branch: &Value) -> bool {
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

/// The branches of a schema that is a bare `anyOf`, else the schema itself.
pub(super) fn disjuncts(v: Value) -> Vec<Value> {
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
pub(super) fn complement(values: &[Value], at: &str) -> Result<Value, ConstraintError> {
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
pub(super) fn none_of(words: &[&str], at: &str) -> Result<String, ConstraintError> {
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
pub(super) fn common_multiple(a: &Value, b: &Value) -> Option<Value> {
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

pub(super) fn merge_nots(a: &Value, b: &Value) -> Option<Value> {
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

/// Whether a schema value accepts everything (`true`, `{}`).
pub(super) fn trivially_true(v: &Value) -> bool {
    matches!(v, Value::Bool(true)) || v.as_object().is_some_and(|m| m.is_empty())
}

/// What a dependent schema (`dependentSchemas`, schema-valued `dependencies`) says, in the
/// forms that reduce to presence: `{required: [...]}` (names the trigger requires) and
/// `{not: ...}` with a required form (sets that must not all be present with the trigger).
pub(super) enum DependentForm {
    Requires(Vec<String>),
    Excludes(Vec<Vec<String>>),
    Nothing,
}

pub(super) fn dependent_form(v: &Value, at: &str) -> Option<DependentForm> {
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
pub(super) type Presence = (Vec<(String, Vec<String>)>, Vec<Vec<String>>);

pub(super) fn dependencies_of(map: &Map<String, Value>, ptr: &str) -> Result<Presence, ConstraintError> {
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
pub(super) fn merge(
    mut a: Map<String, Value>,
    b: Map<String, Value>,
    ptr: &str,
) -> Result<Map<String, Value>, ConstraintError> {
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
