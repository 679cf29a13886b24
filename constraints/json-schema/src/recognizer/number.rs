//! Numbers: the JSON number grammar byte by byte, with the value tracked where bounds or
//! `multipleOf` apply, and the prefix checks that refuse a digit, `.`, `e` or sign once no
//! completion can end inside the bounds.

use super::SchemaRecognizer;
use super::frame::{Frame, NUM_DOT, NUM_E, NUM_ESIGN, NUM_EXP, NUM_FRAC, NUM_INT, NUM_MINUS, NUM_START, NUM_ZERO};
use super::state::Config;
use super::unique::{int_key, is_unique_int_item, record_item, written_items};
use crate::graph::{Graph, Node, NodeId, integer_bounds};

impl SchemaRecognizer {
    /// Feeds `b` to a number (`top`, a [`Frame::Num`]) through [`Self::number_step`]; at its end,
    /// the byte goes on to the frame below.
    pub(crate) fn step_number(&self, mut stack: Config, top: Frame, b: u8, out: &mut Vec<Config>, depth: u32) {
        let Frame::Num { node, phase, neg, value, frac, exp, exp_neg } = top else { return };
        let g = &self.graph;
        let Node::Number(n) = g.node(node) else { return };
        // An item under an exact `uniqueItems` over integers: a zero cannot go on, so
        // a written one is refused at its digit; another repeat where it ends.
        let unique = n.keep_value && is_unique_int_item(g, &stack, node);
        match self.number_step(n, phase, neg, value, frac, exp, exp_neg, b) {
            NumStep::Continue(NumFrame { phase, neg, value, frac, exp, exp_neg }) => {
                if unique && !fresh_int_completion(n, phase, neg, f64::from_bits(value), written_items(&stack)) {
                    return;
                }
                stack.push(Frame::Num { node, phase, neg, value, frac, exp, exp_neg });
                out.push(stack);
            }
            NumStep::End => {
                if number_ok(n, phase, neg, value, frac, exp, exp_neg)
                    && (!unique || record_item(&mut stack, int_key(neg, value)))
                {
                    self.step(stack, b, out, depth + 1);
                }
            }
            NumStep::Reject => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn number_step(
        &self,
        n: &crate::graph::NumberNode,
        phase: u8,
        neg: bool,
        value: u64,
        frac: u16,
        exp: u16,
        exp_neg: bool,
        b: u8,
    ) -> NumStep {
        if let Some((lo, hi)) = n.exact {
            return exact_integer_step(lo, hi, phase, neg, value, b);
        }
        let tracked = n.min.is_some() || n.max.is_some() || n.multiple_of.is_some();
        // Without bounds the value decides nothing and is kept at 0, so that states repeat;
        // but for an item under an exact `uniqueItems`.
        let keep = tracked || n.keep_value;
        let v = f64::from_bits(value);
        let frame = |phase, neg, v: f64, frac, exp, exp_neg| {
            NumStep::Continue(NumFrame { phase, neg, value: if keep { v.to_bits() } else { 0 }, frac, exp, exp_neg })
        };
        let digit = b.is_ascii_digit();
        let d = (b.wrapping_sub(b'0')) as f64;
        // Pruning: a positive number only grows with more integer digits, a negative one
        // only shrinks; once past a bound there is no way back.
        // Integers have no fraction or exponent to come back with: their bounds are exact
        // (as inclusive integer bounds), so a prefix is refused as soon as no integer fits.
        let (lo, hi) = if n.integer { integer_bounds(n) } else { (n.min.map(|(m, _)| m), n.max.map(|(m, _)| m)) };
        let over = |v: f64| if neg { lo.is_some_and(|m| -v < m) } else { hi.is_some_and(|m| v > m) };
        match (phase, b) {
            (NUM_START, b'-') => {
                // The negative number closest to zero: -1 for integers (`-0` is not written),
                // as close as wanted for others.
                let refused =
                    if n.integer { lo.is_some_and(|m| m > -1.0) } else { n.min.is_some_and(|(m, _)| m >= 0.0) };
                if refused {
                    return NumStep::Reject;
                }
                frame(NUM_MINUS, true, 0.0, 0, 0, false)
            }
            // `-0` is a float (-0.0) to most parsers: integers are written `0`.
            (NUM_MINUS, b'0') if n.integer => NumStep::Reject,
            (NUM_START | NUM_MINUS, b'0') => {
                // A leading zero is 0 (integer) or below 1 (number): reject it when the
                // minimum cannot be reached that way.
                let can_reach_min = if n.integer {
                    n.min.is_none_or(|(m, e)| m < 0.0 || (m == 0.0 && !e))
                } else {
                    n.min.is_none_or(|(m, _)| m < 1.0)
                };
                if !can_reach_min && !neg {
                    return NumStep::Reject;
                }
                if !neg && n.max.is_some_and(|(m, e)| m < 0.0 || (m == 0.0 && e)) {
                    return NumStep::Reject;
                }
                frame(NUM_ZERO, neg, 0.0, 0, 0, false)
            }
            (NUM_START | NUM_MINUS, b'1'..=b'9') => {
                if !neg && n.max.is_some_and(|(m, _)| m < 0.0) {
                    return NumStep::Reject;
                }
                if over(d) || (tracked && !int_prefix_feasible(n, neg, d)) {
                    return NumStep::Reject;
                }
                frame(NUM_INT, neg, d, 0, 0, false)
            }
            (NUM_INT, _) if digit => {
                let nv = v * 10.0 + d;
                if over(nv) || (tracked && !int_prefix_feasible(n, neg, nv)) {
                    return NumStep::Reject;
                }
                frame(NUM_INT, neg, nv, 0, 0, false)
            }
            (NUM_ZERO | NUM_INT, b'.') if !n.integer => {
                if !neg && n.min.is_some_and(|(m, _)| v + 1.0 <= m) {
                    return NumStep::Reject;
                }
                frame(NUM_DOT, neg, v, 0, 0, false)
            }
            // Integers are written without a fraction: `1.0` is an integer to JSON Schema, but
            // not to every consumer (nor to the `jsonschema` crate).
            // Under a whole `multipleOf` (`multipleOf: 1` on a number) only a zero fraction
            // stays a multiple whatever follows: a nonzero digit would need an exponent large
            // enough to shift it away, which the bounds usually forbid (a dead end).
            (NUM_DOT | NUM_FRAC, _) if digit && b != b'0' && whole_multiple(n) => NumStep::Reject,
            (NUM_DOT | NUM_FRAC, _) if digit => {
                let k = frac.saturating_add(1);
                let nv = v + d * 10f64.powi(-(k as i32));
                if over(nv) {
                    return NumStep::Reject;
                }
                frame(NUM_FRAC, neg, nv, if tracked { k } else { 0 }, 0, false)
            }
            // A zero mantissa stays zero whatever the exponent: refused where zero is.
            (NUM_ZERO | NUM_INT | NUM_FRAC, b'e' | b'E') if !n.integer => {
                if tracked && v == 0.0 && !admits_zero(n) {
                    return NumStep::Reject;
                }
                // Some exponent, either sign, must end inside (`9e` under `enum: [5, 10]`
                // has none, and wrote exponent digits forever).
                let signs = [false, !whole_multiple(n)];
                if tracked && !signs.iter().any(|&exp_neg| exponent_completes(n, neg, v, frac, 0, exp_neg)) {
                    return NumStep::Reject;
                }
                frame(NUM_E, neg, v, frac, 0, false)
            }
            // With bounds, an exponent sign or digit is refused once no completion can land
            // inside them: a non-negative exponent only grows the magnitude, a negative one
            // only shrinks it.
            (NUM_E, b'+') if !tracked || exponent_completes(n, neg, v, frac, 0, false) => {
                frame(NUM_ESIGN, neg, v, frac, 0, false)
            }
            (NUM_E, b'-') if !whole_multiple(n) && (!tracked || exponent_completes(n, neg, v, frac, 0, true)) => {
                frame(NUM_ESIGN, neg, v, frac, 0, true)
            }
            // At most two exponent digits (untracked) so that every number stays finite.
            (NUM_E | NUM_ESIGN | NUM_EXP, _) if digit && (tracked || phase != NUM_EXP || exp < 1) => {
                let e = if tracked {
                    exp.saturating_mul(10).saturating_add(d as u16).min(400)
                } else {
                    u16::from(phase == NUM_EXP)
                };
                if tracked && !exponent_completes(n, neg, v, frac, e, exp_neg) {
                    return NumStep::Reject;
                }
                frame(NUM_EXP, neg, v, frac, e, exp_neg)
            }
            (NUM_ZERO | NUM_INT | NUM_FRAC | NUM_EXP, _) => {
                let _ = exp;
                NumStep::End
            }
            _ => NumStep::Reject,
        }
    }
}

/// The fields of a number frame after one byte.
pub(crate) struct NumFrame {
    pub(crate) phase: u8,
    pub(crate) neg: bool,
    pub(crate) value: u64,
    pub(crate) frac: u16,
    pub(crate) exp: u16,
    pub(crate) exp_neg: bool,
}

pub(crate) enum NumStep {
    Continue(NumFrame),
    End,
    Reject,
}

/// Whether a number node's `multipleOf` is a whole number (its values are integers).
pub(crate) fn whole_multiple(n: &crate::graph::NumberNode) -> bool {
    n.multiple_of.is_some_and(|m| m >= 1.0 && m.fract() == 0.0)
}

/// Whether an integer part `v` (sign `neg`) can still be completed, by more digits (and, for
/// non-integers, a fraction), into a value within the bounds: the completions with `j` more
/// digits span `[v·10^j, (v+1)·10^j)`.
pub(crate) fn int_prefix_feasible(n: &crate::graph::NumberNode, neg: bool, v: f64) -> bool {
    // Integers: exact inclusive bounds. Others: exclusive ends ignored (a fraction or an
    // exponent can still land inside), a conservative "feasible" that keeps valid documents
    // reachable.
    let (min, max) = if n.integer { integer_bounds(n) } else { (n.min.map(|(m, _)| m), n.max.map(|(m, _)| m)) };
    // An integer node with a whole `multipleOf`: a range of completions must also hold a
    // multiple (below 2^53, where f64 holds integers exactly), or the writer would be stuck
    // after `3` under `minimum: 2, maximum: 3, multipleOf: 2`.
    let step = n.multiple_of.filter(|_| n.integer && whole_multiple(n));
    let inside = |lo: f64, hi: f64| {
        let (a, b) = if neg { (-hi, -lo) } else { (lo, hi) };
        // A non-integer's completions never reach `hi` (`9` and its fractions stay below 10):
        // that end is open, so `9` is refused under `enum: [10]` instead of left stuck.
        let open_end_misses = !n.integer && if neg { max.is_some_and(|m| a >= m) } else { min.is_some_and(|m| b <= m) };
        let (a, b) = (min.map_or(a, |m| a.max(m)), max.map_or(b, |m| b.min(m)));
        match step {
            _ if a > b || open_end_misses => false,
            Some(k) if a.abs() <= crate::compile::EXACT && b.abs() <= crate::compile::EXACT => (a / k).ceil() * k <= b,
            _ => true,
        }
    };
    let mut scale = 1.0f64;
    for _ in 0..20 {
        let lo = v * scale;
        let hi = if n.integer { lo + scale - 1.0 } else { lo + scale };
        if inside(lo, hi) {
            return true;
        }
        // Magnitudes only grow from here: stop once past the far bound.
        let far = if neg { min.map(|m| -m) } else { max };
        if far.is_some_and(|f| lo > f) {
            return false;
        }
        scale *= 10.0;
    }
    false
}

/// [`SchemaRecognizer::number_step`] for an integer node with exact bounds `lo..=hi` (see
/// [`crate::graph::NumberNode::exact`]): `magnitude` is the integer written so far, saturated
/// at `u64::MAX` only where the bound it grows towards is absent.
pub(crate) fn exact_integer_step(lo: i128, hi: i128, phase: u8, neg: bool, magnitude: u64, b: u8) -> NumStep {
    let next = |phase, neg, value| NumStep::Continue(NumFrame { phase, neg, value, frac: 0, exp: 0, exp_neg: false });
    match (phase, b) {
        // Some integer <= -1 must fit.
        (NUM_START, b'-') if lo <= hi.min(-1) => next(NUM_MINUS, true, 0),
        // `-0` is a float (-0.0) to most parsers: integers are written `0`.
        (NUM_START, b'0') if lo <= 0 && 0 <= hi => next(NUM_ZERO, false, 0),
        (NUM_START | NUM_MINUS, b'1'..=b'9') | (NUM_INT, b'0'..=b'9') => {
            let d = (b - b'0') as u64;
            let before = if phase == NUM_INT { magnitude } else { 0 };
            match before.checked_mul(10).and_then(|x| x.checked_add(d)) {
                Some(m) if exact_prefix_feasible(lo, hi, neg, m) => next(NUM_INT, neg, m),
                Some(_) => NumStep::Reject,
                // Past 64 bits: beyond any bound on that side, fine where there is none.
                None if (neg && lo == i128::MIN) || (!neg && hi == i128::MAX) => next(NUM_INT, neg, u64::MAX),
                None => NumStep::Reject,
            }
        }
        (NUM_ZERO | NUM_INT, _) => NumStep::End,
        _ => NumStep::Reject,
    }
}

/// Whether the integer magnitude `m` (sign `neg`) written so far can be completed, by more
/// digits, into an integer within `lo..=hi`: with `j` more digits the magnitudes span
/// `m·10^j ..= (m+1)·10^j - 1`.
pub(crate) fn exact_prefix_feasible(lo: i128, hi: i128, neg: bool, m: u64) -> bool {
    let (mut a, mut b) = (m as i128, m as i128);
    for _ in 0..40 {
        let (x, y) = if neg { (b.saturating_neg(), a.saturating_neg()) } else { (a, b) };
        if x <= hi && y >= lo {
            return true;
        }
        // Magnitudes only grow from here: stop once past the far bound.
        if (!neg && a > hi) || (neg && a.saturating_neg() < lo) {
            return false;
        }
        a = a.saturating_mul(10);
        b = b.saturating_mul(10).saturating_add(9);
    }
    false
}

/// Whether the exponent `e` written so far (sign `exp_neg`) can be completed, as it is or by
/// more digits, into a number within the node's bounds (mantissa `v`, sign `neg`): some
/// exponent among `e`, `10e..=10e+9`, `100e..=100e+99`, ... (up to the 400 the recogniser
/// caps it at) must end inside. Only the exponent's range is searched, each candidate with
/// the check the number's end applies, so `1e2` under `1000..=5000` is refused at the `2`
/// instead of left with no way to end.
pub(crate) fn exponent_completes(
    n: &crate::graph::NumberNode,
    neg: bool,
    v: f64,
    frac: u16,
    e: u16,
    exp_neg: bool,
) -> bool {
    const MAX_EXP: u32 = 400;
    // The exponents below `skip` leave the magnitude short of the bound it has to reach (by
    // at least a factor 10, so a rounding of `log10` does not matter): the search starts
    // there rather than at 0, and stays a few steps long (this runs per byte in a mask).
    let reach = match (exp_neg, neg) {
        (false, false) => n.min.map(|(m, _)| m).filter(|m| *m > 0.0),
        (false, true) => n.max.map(|(m, _)| -m).filter(|m| *m > 0.0),
        (true, false) => n.max.map(|(m, _)| m).filter(|m| *m > 0.0),
        (true, true) => n.min.map(|(m, _)| -m).filter(|m| *m > 0.0),
    };
    let skip = match reach {
        Some(t) if v > 0.0 => {
            let ratio = if exp_neg { v / t } else { t / v };
            (ratio.log10().floor() - 1.0).clamp(0.0, MAX_EXP as f64) as u32
        }
        _ => 0,
    };
    // Exponents in increasing order, until one ends inside, or the magnitude is past the
    // bound it moves towards (larger exponents only move it further).
    let search = |range: std::ops::Range<u32>| {
        for x in range.start.max(skip)..range.end {
            if number_ok(n, NUM_EXP, neg, v.to_bits(), frac, x as u16, exp_neg) {
                return Some(true);
            }
            let magnitude = scaled(v, x as u16, exp_neg);
            if if exp_neg { shrinks_past(n, neg, magnitude) } else { grows_past(n, neg, magnitude) } {
                return Some(false);
            }
        }
        None
    };
    if e == 0 {
        // Leading zeros: every exponent is still reachable.
        return search(0..MAX_EXP + 1).unwrap_or(false);
    }
    let (mut first, mut count) = (u32::from(e), 1u32);
    while first <= MAX_EXP {
        if let Some(found) = search(first..(first + count).min(MAX_EXP + 1)) {
            return found;
        }
        first *= 10;
        count *= 10;
    }
    false
}

/// `v * 10^(±e)` (zero for a zero `v`, where `10^e` may be infinite).
pub(crate) fn scaled(v: f64, e: u16, neg_exp: bool) -> f64 {
    if v == 0.0 {
        return 0.0;
    }
    if neg_exp { v / 10f64.powi(e as i32) } else { v * 10f64.powi(e as i32) }
}

/// Whether zero is within a number node's bounds.
pub(crate) fn admits_zero(n: &crate::graph::NumberNode) -> bool {
    n.min.is_none_or(|(m, excl)| m < 0.0 || (m == 0.0 && !excl))
        && n.max.is_none_or(|(m, excl)| m > 0.0 || (m == 0.0 && !excl))
}

/// Whether a magnitude of `v` (sign `neg`) is already past the bound it grows towards.
pub(crate) fn grows_past(n: &crate::graph::NumberNode, neg: bool, v: f64) -> bool {
    if neg { n.min.is_some_and(|(m, _)| -v < m) } else { n.max.is_some_and(|(m, _)| v > m) }
}

/// Whether a magnitude of `v` (sign `neg`) is already short of the bound it shrinks away from.
pub(crate) fn shrinks_past(n: &crate::graph::NumberNode, neg: bool, v: f64) -> bool {
    if neg { n.max.is_some_and(|(m, _)| m < 0.0 && -v > m) } else { n.min.is_some_and(|(m, _)| m > 0.0 && v < m) }
}

/// Whether a finished number satisfies its node.
pub(crate) fn number_ok(
    n: &crate::graph::NumberNode,
    phase: u8,
    neg: bool,
    value: u64,
    _frac: u16,
    exp: u16,
    exp_neg: bool,
) -> bool {
    if !matches!(phase, NUM_ZERO | NUM_INT | NUM_FRAC | NUM_EXP) {
        return false;
    }
    if n.min.is_none() && n.max.is_none() && n.multiple_of.is_none() {
        return true;
    }
    if let Some((lo, hi)) = n.exact {
        let v = if neg { -(value as i128) } else { value as i128 };
        return matches!(phase, NUM_ZERO | NUM_INT) && lo <= v && v <= hi;
    }
    let mag = if phase == NUM_EXP { scaled(f64::from_bits(value), exp, exp_neg) } else { f64::from_bits(value) };
    let v = if neg { -mag } else { mag };
    if let Some((m, excl)) = n.min
        && (v < m || (excl && v <= m))
    {
        return false;
    }
    if let Some((m, excl)) = n.max
        && (v > m || (excl && v >= m))
    {
        return false;
    }
    if let Some(k) = n.multiple_of {
        let q = v / k;
        if (q - q.round()).abs() > 1e-9 * q.abs().max(1.0) {
            return false;
        }
    }
    true
}

/// Under an exact `uniqueItems` over integers: whether the integer written so far (`phase`,
/// sign `neg`, magnitude `v`) can still be completed into a value within the bounds that is
/// not among `written` ([`int_key`]s). A nonzero prefix with `j` more digits spans the
/// magnitudes `[v·10^j, (v+1)·10^j)`, `0` is zero alone, `-` every negative integer; the
/// values of those within the bounds are counted and compared with the written ones among
/// them. Unbounded in the prefix's direction, there is always one more.
pub(crate) fn fresh_int_completion(
    n: &crate::graph::NumberNode,
    phase: u8,
    neg: bool,
    v: f64,
    written: &[u64],
) -> bool {
    let (lo, hi) = integer_bounds(n);
    // Signed values within the bounds in the magnitudes [a, b].
    let count = |a: f64, b: f64| {
        let (x, y) = if neg { (-b, -a) } else { (a, b) };
        let (x, y) = (lo.map_or(x, |l| x.max(l)), hi.map_or(y, |h| y.min(h)));
        (y - x + 1.0).max(0.0)
    };
    let total = match phase {
        NUM_ZERO => count(0.0, 0.0),
        NUM_MINUS if lo.is_none() => return true,
        NUM_MINUS => count(1.0, f64::MAX),
        NUM_INT if (if neg { lo } else { hi }).is_none() => return true,
        NUM_INT => {
            let far = if neg { lo.map_or(0.0, |l| -l) } else { hi.unwrap_or(0.0) };
            let (mut total, mut scale) = (0.0, 1.0f64);
            while v * scale <= far && scale < 1e20 {
                total += count(v * scale, (v + 1.0) * scale - 1.0);
                scale *= 10.0;
            }
            total
        }
        _ => return true,
    };
    let prefix = v as u64;
    let in_prefix = |key: u64| {
        let (wneg, w) = (key >> 63 == 1, f64::from_bits(key & (u64::MAX >> 1)));
        match phase {
            NUM_ZERO => w == 0.0,
            NUM_MINUS => wneg && w >= 1.0,
            _ => {
                let mut x = w as u64;
                while x > prefix {
                    x /= 10;
                }
                wneg == neg && w >= 1.0 && x == prefix
            }
        }
    };
    total > written.iter().filter(|&&k| in_prefix(k)).count() as f64
}

/// Whether an array of integer items (`items`) under an exact `uniqueItems` has a value
/// within the bounds left once `written` are: what a `,` needs.
pub(crate) fn int_values_left(g: &Graph, items: NodeId, written: usize) -> bool {
    let Node::Number(n) = g.node(items) else { return true };
    match integer_bounds(n) {
        (Some(lo), Some(hi)) => hi - lo + 1.0 > written as f64,
        _ => true,
    }
}
