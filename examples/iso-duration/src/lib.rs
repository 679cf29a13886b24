//! An example plugin: the output is an ISO 8601 duration.
//!
//! `P` then date units in order (`nY nM nD`, each optional, at least one unless a time part
//! follows), then optionally `T` and time units in order (`nH nM nS`, at least one); or `PnW`
//! alone. Numbers have 1 to 9 digits; only seconds may have a fraction (`PT0.5S`). Upper-case
//! designators only, as RFC 3339 and most parsers expect.
//!
//! The guest SDK's tutorial (`guest-sdk/README.md`) walks through this file. The whole state
//! is a few small numbers, so it is its own state key: two prefixes that leave the same
//! section, next unit, digit count and fraction have the same future, and the host shares
//! their masks.
//!
//! Kind `iso8601-duration`; the source must be empty; options: `{"max_digits": N}` (1 to 9,
//! default 9) bounds every number.

use std::sync::Arc;

use dspark_guest::{
    CompiledConstraint, ConstraintError, ErrorCode, Plugin, Recognizer, RecognizerConstraint, TokenTable, key,
};

/// Where in a duration the output is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct State {
    /// `P` was written.
    started: bool,
    /// In the time part (after `T`).
    time: bool,
    /// The index of the next unit allowed in this part (date: Y M D; time: H M S).
    next_unit: u8,
    /// Digits of the number being written.
    digits: u8,
    /// 0: no fraction; 1: `.` written; 2: fraction digits written.
    frac: u8,
    /// A unit was written in this part.
    any: bool,
    /// `PnW` was written: nothing may follow.
    week: bool,
}

/// The recogniser.
pub struct IsoDuration {
    max_digits: u8,
}

const DATE_UNITS: [u8; 3] = *b"YMD";
const TIME_UNITS: [u8; 3] = *b"HMS";

impl Recognizer for IsoDuration {
    type State = State;

    fn start(&self) -> State {
        State::default()
    }

    fn advance(&self, s: &State, byte: u8) -> Option<State> {
        let mut n = *s;
        if !s.started {
            n.started = byte == b'P';
            return n.started.then_some(n);
        }
        if s.week {
            return None;
        }
        // A number must be able to end in a unit: after a part's last unit (`D`, `S`) no
        // number may start. A recogniser must never enter a state from which no match can be
        // completed (the host would be left with no allowed token).
        let unit_can_follow = s.next_unit <= 2 || (!s.time && !s.any);
        match byte {
            b'0'..=b'9' if !unit_can_follow => None,
            b'0'..=b'9' if s.frac == 1 || s.frac == 2 => {
                n.frac = 2;
                (s.digits < self.max_digits).then(|| State { digits: s.digits + 1, ..n })
            }
            b'0'..=b'9' => (s.digits < self.max_digits).then(|| State { digits: s.digits + 1, ..n }),
            // A fraction needs room for at least one more digit.
            b'.' => (s.time && s.digits > 0 && s.digits < self.max_digits && s.frac == 0 && s.next_unit <= 2)
                .then_some(State { frac: 1, ..n }),
            b'T' => (!s.time && s.digits == 0).then_some(State { time: true, next_unit: 0, any: false, ..n }),
            b'W' => (!s.time && !s.any && s.digits > 0).then_some(State { week: true, digits: 0, any: true, ..n }),
            unit => {
                let units = if s.time { TIME_UNITS } else { DATE_UNITS };
                let idx = units.iter().position(|&u| u == unit)? as u8;
                let fraction_ok = s.frac == 0 || (s.frac == 2 && s.time && unit == b'S');
                (s.digits > 0 && idx >= s.next_unit && fraction_ok).then(|| State {
                    next_unit: idx + 1,
                    digits: 0,
                    frac: 0,
                    any: true,
                    ..n
                })
            }
        }
    }

    fn is_accepting(&self, s: &State) -> bool {
        s.started && s.digits == 0 && s.frac == 0 && s.any
    }

    fn state_key(&self, s: &State) -> u64 {
        key::of(s)
    }
}

/// The plugin.
#[derive(Default)]
pub struct IsoDurationPlugin;

/// The plugin's options, typed: `{"max_digits": N}`, N from 1 to 9 (9 when absent).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    #[serde(default = "Options::default_max_digits")]
    max_digits: u8,
}

impl Options {
    fn default_max_digits() -> u8 {
        9
    }

    fn parse(options: &str) -> Result<Self, ConstraintError> {
        let options: Options = dspark_guest::options::parse(options)?;
        if !(1..=9).contains(&options.max_digits) {
            return Err(ConstraintError::new(
                ErrorCode::InvalidOptions,
                format!("options.max_digits must be from 1 to 9; got {}", options.max_digits),
            )
            .at("max_digits"));
        }
        Ok(options)
    }
}

impl Plugin for IsoDurationPlugin {
    fn kinds(&self) -> Vec<String> {
        vec!["iso8601-duration".into()]
    }

    fn compile(
        &self,
        kind: &str,
        source: &str,
        options: &str,
        table: &Arc<TokenTable>,
    ) -> Result<Arc<dyn CompiledConstraint>, ConstraintError> {
        dspark_guest::check_kind(kind, &["iso8601-duration"])?;
        if !source.trim().is_empty() {
            return Err(ConstraintError::new(
                ErrorCode::InvalidSource,
                "iso8601-duration takes no source; leave it empty",
            ));
        }
        let rec = IsoDuration { max_digits: Options::parse(options)?.max_digits };
        Ok(RecognizerConstraint::new(rec, table, Vec::new()))
    }
}

dspark_guest::export_plugin!(IsoDurationPlugin);

#[cfg(test)]
mod tests {
    use super::*;
    use dspark_guest::testing::walk_text;

    fn compile(options: &str) -> (Arc<TokenTable>, Arc<dyn CompiledConstraint>) {
        let table = Arc::new(TokenTable::byte_level_for_tests(&["PT", "12", "30M", "DT"]));
        let c = IsoDurationPlugin.compile("iso8601-duration", "", options, &table).unwrap();
        (table, c)
    }

    #[test]
    fn durations() {
        let (table, c) = compile("{}");
        for ok in ["P3Y6M4DT12H30M5S", "PT0.5S", "P2W", "P1D", "PT36H", "P1YT1S", "P0D"] {
            let w = walk_text(&mut *c.new_matcher(), &table, ok.as_bytes());
            assert!(w.accepted() && !w.mask_commit_mismatch, "{ok}: {w:?}");
        }
        for bad in ["P", "PT", "P1DT", "P1M1Y", "P1.5D", "PT1.S", "P2W1D", "p1d", "P1H", "1D", "P1234567890D"] {
            let w = walk_text(&mut *c.new_matcher(), &table, bad.as_bytes());
            assert!(!w.accepted() && !w.mask_commit_mismatch, "{bad} must be rejected: {w:?}");
        }
    }

    #[test]
    fn no_prefix_is_a_dead_end() {
        // Every state within 12 bytes, for the tightest and the default digit bounds: the
        // search that would have caught `P100M120D120`.
        for max_digits in [1, 9] {
            dspark_guest::testing::assert_no_dead_ends(&IsoDuration { max_digits }, 12);
        }
    }

    #[test]
    fn no_number_starts_after_a_parts_last_unit() {
        let (_, c) = compile("{}");
        for prefix in ["P1D", "PT1S", "P1YT2S"] {
            let mut m = c.new_matcher();
            for &b in prefix.as_bytes() {
                m.commit(&[b as u32]).unwrap();
            }
            let mask = m.compute_mask().unwrap();
            assert!(!(b'0'..=b'9').any(|d| mask.allows(d as u32)), "{prefix}: a digit would be a dead end");
        }
    }

    #[test]
    fn options_bound_the_digits() {
        let (table, c) = compile(r#"{"max_digits": 2}"#);
        assert!(walk_text(&mut *c.new_matcher(), &table, b"P12D").accepted());
        assert!(!walk_text(&mut *c.new_matcher(), &table, b"P123D").accepted());
        let table = Arc::new(TokenTable::byte_level_for_tests(&[]));
        let e = IsoDurationPlugin.compile("iso8601-duration", "", r#"{"max_digits": 0}"#, &table).err().unwrap();
        assert_eq!(e.code, ErrorCode::InvalidOptions);
        assert_eq!(
            (e.message.as_str(), e.location.as_deref()),
            ("options.max_digits must be from 1 to 9; got 0", Some("max_digits"))
        );
        let e = IsoDurationPlugin.compile("iso8601-duration", "", r#"{"max_digits": "2"}"#, &table).err().unwrap();
        assert_eq!(e.message, "options.max_digits: invalid type: string \"2\", expected u8 at line 1 column 18");
        let e = IsoDurationPlugin.compile("iso8601-duration", "P1D", "{}", &table).err().unwrap();
        assert_eq!(e.code, ErrorCode::InvalidSource);
    }

    #[test]
    fn p_is_forced_at_the_start() {
        let (table, c) = compile("{}");
        let mut m = c.new_matcher();
        let r = m.commit(&[]).unwrap();
        // `P` is the only way on, but held back: it could merge with `T` into the token `PT`.
        assert!(r.forced.is_empty());
        let mask = m.compute_mask().unwrap();
        assert!(mask.allows(b'P' as u32) && !mask.allows(b'1' as u32));
        assert!(mask.allows(table.tokenize(b"PT")[0]));
    }
}
