//! Incremental text of a generation, with stop strings that may span tokens.
//!
//! Token bytes arrive one token at a time; a UTF-8 character may be split across tokens, so
//! bytes wait until they form whole characters (invalid bytes become U+FFFD). Stop strings are
//! searched in the text as it grows; the text is cut where the first one starts, and that
//! string is not part of the output (OpenAI's behaviour) unless vLLM's
//! `include_stop_str_in_output` asks for it, when the text ends with it. A streaming delta
//! holds back any tail that could still become a stop string, so a client never sees text that
//! is later taken back.
//!
//! Bytes pushed with [`OutputText::push_unwatched`] (the tokens before a request's
//! `min_tokens`) are not searched; a stop string is found when the token that completes it is
//! pushed with [`OutputText::push`], even if it began in unwatched text (vLLM's rule).

/// The growing text of one sequence.
#[derive(Debug, Default)]
pub struct OutputText {
    pending: Vec<u8>,
    text: String,
    emitted: usize,
    stops: Vec<String>,
    include_stop: bool,
    stopped: bool,
    /// The stop string that ended the text (an index into `stops`).
    matched: Option<usize>,
}

impl OutputText {
    /// Empty text watching for `stops` (empty strings are ignored); with `include_stop`, the
    /// text keeps the stop string that ends it.
    pub fn new(stops: Vec<String>, include_stop: bool) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), include_stop, ..Self::default() }
    }

    /// Appends a token's bytes. Returns `true` when a stop string has appeared; the text then
    /// ends before it (or with it, under `include_stop`) and later bytes are ignored.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        if self.stopped {
            return true;
        }
        let before = self.append(bytes);
        self.find_stop(before)
    }

    /// Appends a token's bytes without looking for stop strings in them.
    pub fn push_unwatched(&mut self, bytes: &[u8]) {
        if !self.stopped {
            self.append(bytes);
        }
    }

    /// Appends bytes, keeping an unfinished UTF-8 character pending; returns the text's
    /// length before.
    fn append(&mut self, bytes: &[u8]) -> usize {
        self.pending.extend_from_slice(bytes);
        let before = self.text.len();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    self.text.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix was just checked to be UTF-8.
                    self.text.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                        Some(bad) => {
                            self.text.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
        before
    }

    fn find_stop(&mut self, before: usize) -> bool {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = before.saturating_sub(longest.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        // The earliest start wins; at one start, the first stop string listed.
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(index, s)| self.text[from..].find(s.as_str()).map(|i| (from + i, index)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, index)) = hit {
            self.matched = Some(index);
            self.text.truncate(if self.include_stop { at + self.stops[index].len() } else { at });
            self.pending.clear();
            self.stopped = true;
        }
        self.stopped
    }

    /// Whether a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The stop string that ended the text, if one did.
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// The whole text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Text not yet returned. Unless `finished`, a tail that could begin a stop string is held
    /// back.
    pub fn delta(&mut self, finished: bool) -> String {
        let end = if finished || self.stopped { self.text.len() } else { self.text.len() - self.held_back() };
        let end = end.max(self.emitted);
        let delta = self.text[self.emitted..end].to_string();
        self.emitted = end;
        delta
    }

    fn held_back(&self) -> usize {
        self.stops
            .iter()
            .filter_map(|s| (1..s.len()).rev().find(|&k| s.is_char_boundary(k) && self.text.ends_with(&s[..k])))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_split_across_tokens_wait() {
        let mut t = OutputText::new(vec![], false);
        let e_acute = "é".as_bytes();
        t.push(b"caf");
        t.push(&e_acute[..1]);
        assert_eq!(t.delta(false), "caf");
        t.push(&e_acute[1..]);
        assert_eq!(t.delta(false), "é");
        t.push(&[0xff, b'x']);
        assert_eq!(t.delta(true), "\u{FFFD}x");
    }

    #[test]
    fn stop_strings_across_tokens_are_cut_and_never_streamed() {
        let mut t = OutputText::new(vec!["END".into(), "\n\n".into()], false);
        assert!(!t.push(b"hello E"));
        assert_eq!(t.delta(false), "hello ");
        assert!(!t.push(b"N"));
        assert_eq!(t.delta(false), "");
        assert_eq!(t.matched_stop(), None);
        assert!(t.push(b"Dmore"));
        assert_eq!(t.delta(false), "");
        assert_eq!(t.text(), "hello ");
        assert_eq!(t.matched_stop(), Some("END"));
        assert!(t.push(b"ignored"));
        assert_eq!(t.text(), "hello ");
    }

    #[test]
    fn a_false_start_is_released() {
        let mut t = OutputText::new(vec!["END".into()], false);
        t.push(b"the E");
        assert_eq!(t.delta(false), "the ");
        t.push(b"nd");
        assert_eq!(t.delta(false), "End");
        t.push(b" EN");
        assert_eq!(t.delta(true), " EN");
    }

    #[test]
    fn an_included_stop_string_ends_the_text() {
        let mut t = OutputText::new(vec!["END".into(), "ENDING".into()], true);
        assert!(!t.push(b"hello E"));
        assert_eq!(t.delta(false), "hello ");
        assert!(t.push(b"NDING and more"));
        assert_eq!(t.text(), "hello END");
        assert_eq!(t.matched_stop(), Some("END"));
        assert_eq!(t.delta(false), "END");
    }

    #[test]
    fn unwatched_text_is_not_searched_but_a_stop_completed_later_is_found() {
        let mut t = OutputText::new(vec!["END".into()], false);
        t.push_unwatched(b"an END here, E");
        assert!(!t.stopped());
        assert!(!t.push(b"x"));
        assert_eq!(t.text(), "an END here, Ex");
        t.push_unwatched(b" E");
        assert!(t.push(b"ND tail"));
        assert_eq!(t.text(), "an END here, Ex ");
    }
}
