//! `oneOf` made exact where it can be: each branch joined with the negation of every other
//! (see the module docs of [`super`] for when that is tried and what is warned).

use dspark_guest::Warning;
use serde_json::{Map, Value};

use super::normalise::{disjuncts, excluded_by_type, negate_with};
use super::{Compiler, has_ref};
use crate::graph::NodeId;

impl<'a> Compiler<'a> {
    /// `oneOf` exactly, where the branches can be negated (the forms `if` takes: `type`,
    /// `required`, `properties`, `const`, `enum`, bounds): the union over `i` of branch `i`
    /// with every other branch failing, each failure one of its ways to fail, at most 64
    /// cases. Tried only where the branches hold no `$ref` once branches that are a bare
    /// `$ref` are inlined, and the keywords beside the `oneOf` no `$ref` of their own (their
    /// subschemas may have some: they are compiled either way), so that a form the merge
    /// cannot take is an error here and the caller falls back to `anyOf` with a warning.
    pub(super) fn exclusive_one_of(
        &mut self,
        base: &Map<String, Value>,
        branches: &[Value],
        ptr: &str,
    ) -> Option<NodeId> {
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
    pub(super) fn one_of_cases(
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
}
