//! Prompt lookup: draft tokens for speculative decoding found in the sequence itself.
//!
//! An extraction answer copies its values from the prompt (an order id, a product name, a
//! price), and structured output repeats its own earlier text. [`PromptLookup::propose`]
//! takes the last `n` tokens of a sequence (prompt and output), finds their most recent
//! earlier occurrence, and proposes the tokens that followed it there: vLLM's `ngram`
//! speculative method (`prompt_lookup_max`, `prompt_lookup_min`, `num_speculative_tokens`),
//! with no draft model. The engine feeds the draft as extra rows of the sequence's step and
//! keeps the longest prefix that sampling then draws, so outputs are those of plain decoding;
//! a wrong draft costs the rows' compute.
//!
//! The longest `n` first: a longer match is more likely to continue the same way. Among
//! occurrences of one `n`, the most recent: structured output repeats its latest record more
//! faithfully than an older one, and a copy from the prompt is usually the only occurrence.

/// The prompt-lookup settings: what to match and how much to propose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// The most tokens proposed per step (vLLM's `num_speculative_tokens`).
    pub max_draft: usize,
    /// The longest suffix matched (vLLM's `prompt_lookup_max`).
    pub max_ngram: usize,
    /// The shortest suffix matched (vLLM's `prompt_lookup_min`).
    pub min_ngram: usize,
}

/// The default: one token after a three-token match, the best of the settings measured on
/// the 2-core Xeon (Sapphire Rapids) with one sequence running: 1.04-1.14x per request against
/// two tokens on the `orders` workload, 1.02-1.06x against no lookup, the same as two tokens
/// on `text`. On a 2-core AMD EPYC, two
/// tokens had measured 1.11-1.17x requests/s against no lookup and one token (after a
/// two-token match) 1.07x. Longer drafts and shorter matches waste rows on both.
impl Default for PromptLookup {
    fn default() -> Self {
        Self { max_draft: 1, max_ngram: 3, min_ngram: 3 }
    }
}

/// How far back a match is searched: the scan costs a few microseconds per thousand tokens,
/// and a sequence's recent text (its prompt's records, its own last lines) is what it copies.
pub const MAX_LOOKBACK: usize = 8192;

impl PromptLookup {
    /// Appends to `draft` (at most `limit` and [`Self::max_draft`] tokens) what followed the
    /// most recent earlier occurrence of the longest suffix of `tokens` of between
    /// [`Self::min_ngram`] and [`Self::max_ngram`] tokens. Nothing when no suffix recurs.
    pub fn propose(&self, tokens: &[u32], limit: usize, draft: &mut Vec<u32>) {
        let want = self.max_draft.min(limit);
        if want == 0 || self.min_ngram == 0 {
            return;
        }
        let window = &tokens[tokens.len().saturating_sub(MAX_LOOKBACK)..];
        for n in (self.min_ngram..=self.max_ngram.min(window.len().saturating_sub(1))).rev() {
            let suffix = &window[window.len() - n..];
            // An occurrence must end before the suffix itself and have a token after it.
            let found = (0..window.len() - n).rev().find(|&start| &window[start..start + n] == suffix);
            if let Some(start) = found {
                let follow = &window[start + n..];
                draft.extend_from_slice(&follow[..want.min(follow.len())]);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(lookup: PromptLookup, tokens: &[u32], limit: usize) -> Vec<u32> {
        let mut draft = Vec::new();
        lookup.propose(tokens, limit, &mut draft);
        draft
    }

    #[test]
    fn the_tokens_after_the_latest_occurrence_of_the_longest_suffix_are_proposed() {
        let lookup = PromptLookup { max_draft: 3, max_ngram: 3, min_ngram: 1 };
        // `7 8` recurs at 1 (followed by 9 10 11) and `8` alone at 6 (followed by 5):
        // the longer match wins.
        assert_eq!(propose(lookup, &[1, 7, 8, 9, 10, 11, 8, 5, 2, 7, 8], 8), vec![9, 10, 11]);
        // Two occurrences of the same length: the later one.
        assert_eq!(propose(lookup, &[4, 1, 4, 2, 3, 4], 8), vec![2, 3, 4]);
        // The draft is cut at the limit and at the end of the text.
        assert_eq!(propose(lookup, &[1, 7, 8, 9, 10, 11, 2, 7, 8], 2), vec![9, 10]);
        assert_eq!(propose(lookup, &[5, 6, 5], 8), vec![6, 5]);
    }

    #[test]
    fn nothing_is_proposed_without_a_long_enough_match() {
        let lookup = PromptLookup { max_draft: 4, max_ngram: 3, min_ngram: 2 };
        assert_eq!(propose(lookup, &[1, 2, 3, 1], 8), Vec::<u32>::new(), "a one-token match is too short");
        assert_eq!(propose(lookup, &[1, 2, 3, 1, 2], 8), vec![3, 1, 2]);
        assert_eq!(propose(lookup, &[], 8), Vec::<u32>::new());
        assert_eq!(propose(lookup, &[1], 8), Vec::<u32>::new());
        assert_eq!(propose(lookup, &[1, 2, 1, 2], 0), Vec::<u32>::new(), "no room");
        let off = PromptLookup { max_draft: 0, ..lookup };
        assert_eq!(propose(off, &[1, 2, 3, 1, 2], 8), Vec::<u32>::new());
    }

    #[test]
    fn the_suffix_is_never_matched_against_itself() {
        let lookup = PromptLookup { max_draft: 4, max_ngram: 4, min_ngram: 1 };
        // A repeated token: the latest earlier `3 3` is at 1, followed by the last `3`.
        assert_eq!(propose(lookup, &[9, 3, 3, 3], 8), vec![3]);
        assert_eq!(propose(lookup, &[3, 3], 8), vec![3]);
    }
}
