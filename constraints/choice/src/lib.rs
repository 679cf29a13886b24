//! The built-in `choice` plugin: the output is exactly one of a list of strings.
//!
//! The source is a JSON array of strings (vLLM's `guided_choice`). The choices are put in a
//! byte trie whose node index is the recogniser state and the state key, so every request for
//! the same list shares one small path tree, and the unique rest of a choice is forced.
//!
//! Options: none are defined yet; anything but `{}` is an `invalid-options` error.

use dspark_guest::{ConstraintError, ErrorCode, Recognizer, key};

/// The most choices accepted.
pub const MAX_CHOICES: usize = 100_000;
/// The most bytes of all choices together.
pub const MAX_TOTAL_BYTES: usize = 8 * 1024 * 1024;

#[derive(Default)]
struct Node {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    terminal: bool,
}

/// A set of strings as a byte recogniser.
pub struct ChoiceRecognizer {
    nodes: Vec<Node>,
}

impl ChoiceRecognizer {
    /// Builds the recogniser of exactly `choices`.
    pub fn new(choices: &[String]) -> Result<Self, ConstraintError> {
        if choices.is_empty() {
            return Err(ConstraintError::new(ErrorCode::InvalidSource, "the list of choices is empty"));
        }
        if choices.len() > MAX_CHOICES {
            return Err(ConstraintError::new(
                ErrorCode::TooLarge,
                format!("{} choices; the limit is {MAX_CHOICES}", choices.len()),
            ));
        }
        let total: usize = choices.iter().map(String::len).sum();
        if total > MAX_TOTAL_BYTES {
            return Err(ConstraintError::new(
                ErrorCode::TooLarge,
                format!("the choices total {total} bytes; the limit is {MAX_TOTAL_BYTES}"),
            ));
        }
        let mut nodes = vec![Node::default()];
        for (i, c) in choices.iter().enumerate() {
            if c.is_empty() {
                return Err(
                    ConstraintError::new(ErrorCode::InvalidSource, "a choice is the empty string").at(format!("/{i}"))
                );
            }
            let mut n = 0usize;
            for &b in c.as_bytes() {
                n = match nodes[n].children.binary_search_by_key(&b, |&(cb, _)| cb) {
                    Ok(k) => nodes[n].children[k].1 as usize,
                    Err(k) => {
                        let id = nodes.len() as u32;
                        nodes[n].children.insert(k, (b, id));
                        nodes.push(Node::default());
                        id as usize
                    }
                };
            }
            nodes[n].terminal = true;
        }
        Ok(Self { nodes })
    }
}

impl Recognizer for ChoiceRecognizer {
    type State = u32;

    fn start(&self) -> u32 {
        0
    }

    #[inline]
    fn advance(&self, state: &u32, byte: u8) -> Option<u32> {
        let children = &self.nodes[*state as usize].children;
        children.binary_search_by_key(&byte, |&(b, _)| b).ok().map(|k| children[k].1)
    }

    fn is_accepting(&self, state: &u32) -> bool {
        self.nodes[*state as usize].terminal
    }

    fn state_key(&self, state: &u32) -> u64 {
        key::mix(*state as u64, 0x63686f696365)
    }

    fn forced_byte(&self, state: &u32) -> Option<u8> {
        match self.nodes[*state as usize].children.as_slice() {
            [(b, _)] => Some(*b),
            _ => None,
        }
    }

    fn can_extend(&self, state: &u32) -> bool {
        !self.nodes[*state as usize].children.is_empty()
    }
}

/// A choice constraint from its source: a JSON array of strings.
fn from_source(source: &str) -> Result<ChoiceRecognizer, ConstraintError> {
    let choices: Vec<String> = serde_json::from_str(source).map_err(|e| {
        ConstraintError::new(ErrorCode::InvalidSource, format!("the source must be a JSON array of strings: {e}"))
    })?;
    ChoiceRecognizer::new(&choices)
}

dspark_guest::recognizer_plugin!(ChoicePlugin, "choice", from_source);

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dspark_guest::testing::walk_text;
    use dspark_guest::{Plugin, TokenTable};

    use super::*;

    #[test]
    fn only_the_choices_are_accepted_and_unique_tails_are_forced() {
        let table = Arc::new(TokenTable::byte_level_for_tests(&["pos", "neg", "itive"]));
        let c = ChoicePlugin.compile("choice", r#"["positive","negative","neutral"]"#, "{}", &table).unwrap();
        for ok in ["positive", "negative", "neutral"] {
            let w = walk_text(&mut *c.new_matcher(), &table, ok.as_bytes());
            assert!(w.accepted() && !w.mask_commit_mismatch, "{ok}: {w:?}");
        }
        for bad in ["pos", "neutrals", "other"] {
            assert!(!walk_text(&mut *c.new_matcher(), &table, bad.as_bytes()).accepted(), "{bad}");
        }
        let mut m = c.new_matcher();
        let r = m.commit(&[b'p' as u32]).unwrap();
        assert_eq!(r.forced, table.tokenize(b"ositive"));
        assert!(r.stop);
        // Committing nothing at the start reports the span that is already certain.
        let single = ChoicePlugin.compile("choice", r#"["only"]"#, "{}", &table).unwrap();
        let r = single.new_matcher().commit(&[]).unwrap();
        assert_eq!(r.forced, table.tokenize(b"only"));
        assert!(r.stop);
    }

    #[test]
    fn bad_sources_are_errors() {
        let table = Arc::new(TokenTable::byte_level_for_tests(&[]));
        for (src, code) in [
            ("[]", ErrorCode::InvalidSource),
            ("[1]", ErrorCode::InvalidSource),
            (r#"["a",""]"#, ErrorCode::InvalidSource),
        ] {
            assert_eq!(ChoicePlugin.compile("choice", src, "{}", &table).err().unwrap().code, code, "{src}");
        }
    }
}
