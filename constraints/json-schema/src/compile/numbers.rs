//! Numeric bounds: `minimum`/`maximum` (exclusive or not), `multipleOf` and integers as one
//! number node, and the bounds that admit no number at all (a compile-time error).

use dspark_guest::{ConstraintError, Warning};
use serde_json::{Map, Value};

use super::{Compiler, EXACT};
use crate::graph::{NEVER, Node, NodeId, NumberNode};

impl<'a> Compiler<'a> {
    pub(super) fn number(
        &mut self,
        map: &Map<String, Value>,
        ptr: &str,
        integer: bool,
    ) -> Result<NodeId, ConstraintError> {
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
pub(super) fn admits_no_number(
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
pub(super) fn exact_integer_bounds(map: &Map<String, Value>) -> Option<(i128, i128)> {
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
