//! Native test mode: drive a plugin's matchers from `cargo test`, without wasm, the way the
//! host drives them.

use crate::api::Matcher;
use crate::bitset::Mask;
use crate::table::TokenTable;

/// What happened when a text was walked through a matcher token by token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// The tokens of the text, in the table's tokenisation.
    pub tokens: Vec<u32>,
    /// The index of the first token the mask disallowed or the commit rejected, if any.
    pub rejected_at: Option<usize>,
    /// How many of the text's tokens arrived as forced spans that matched the text.
    pub forced_tokens: usize,
    /// Whether the matcher was accepting after the last token.
    pub accepting: bool,
    /// Whether a token's mask verdict and its commit verdict disagreed (a plugin bug).
    pub mask_commit_mismatch: bool,
}

impl Walk {
    /// Whether the text was accepted whole: no token rejected and the end accepting.
    pub fn accepted(&self) -> bool {
        self.rejected_at.is_none() && self.accepting
    }
}

/// Tokenises `text` with the table and walks it through `matcher`: at each token the mask
/// is computed and checked, the token committed, and a forced span consumed when the text's
/// next tokens are exactly that span (otherwise the span is rolled back and the text's own
/// tokens are committed).
pub fn walk_text(matcher: &mut dyn Matcher, table: &TokenTable, text: &[u8]) -> Walk {
    let tokens = table.tokenize(text);
    walk_tokens(matcher, table, &tokens)
}

/// [`walk_text`] over given tokens.
pub fn walk_tokens(matcher: &mut dyn Matcher, table: &TokenTable, tokens: &[u32]) -> Walk {
    let mut walk = Walk { tokens: tokens.to_vec(), ..Walk::default() };
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i];
        let allowed = match matcher.compute_mask() {
            Ok(m) => allows(&m, t, table.vocab_size()),
            Err(_) => false,
        };
        let result = matcher.commit(&[t]);
        if allowed != result.is_ok() {
            walk.mask_commit_mismatch = true;
        }
        let Ok(result) = result else {
            walk.rejected_at = Some(i);
            return walk;
        };
        if !allowed {
            walk.rejected_at = Some(i);
            return walk;
        }
        i += 1;
        let span = &result.forced;
        if !span.is_empty() {
            if tokens.get(i..i + span.len()) == Some(span.as_slice()) {
                walk.forced_tokens += span.len();
                i += span.len();
            } else if matcher.rollback(span.len() as u32).is_err() {
                walk.rejected_at = Some(i);
                return walk;
            }
        }
    }
    walk.accepting = matcher.is_accepting();
    walk
}

fn allows(mask: &Mask, token: u32, vocab: usize) -> bool {
    (token as usize) < vocab && mask.allows(token)
}
