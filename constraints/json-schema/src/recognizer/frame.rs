//! The parse stack's frames ([`Frame`]) and the phases they move through, and a string's
//! escape and UTF-8 progress ([`Chars`], [`advance_chars`]).

use std::num::NonZeroU64;
use std::sync::Arc;

use crate::graph::NodeId;

/// Object parsing phases.
pub(crate) const OBJ_OPEN: u8 = 0; // after `{`: a key or `}`

pub(crate) const OBJ_COMMA: u8 = 1; // after `,`: a key

pub(crate) const OBJ_KEY: u8 = 2; // after a key: `:`

pub(crate) const OBJ_VALUE: u8 = 3; // after a value: `,` or `}`

pub(crate) const OBJ_CLOSE: u8 = 4; // indented layout, after the newline before `}`: only `}`

/// Array parsing phases.
pub(crate) const ARR_OPEN: u8 = 0;

pub(crate) const ARR_COMMA: u8 = 1;

pub(crate) const ARR_VALUE: u8 = 2;

pub(crate) const ARR_CLOSE: u8 = 3; // indented layout, after the newline before `]`: only `]`

/// [`Frame::Arr`]'s `start` when no captured item is being written.
pub(crate) const NO_ITEM: u32 = u32::MAX;

/// Number phases (JSON grammar).
pub(crate) const NUM_START: u8 = 0;

pub(crate) const NUM_MINUS: u8 = 1;

pub(crate) const NUM_ZERO: u8 = 2;

pub(crate) const NUM_INT: u8 = 3;

pub(crate) const NUM_DOT: u8 = 4;

pub(crate) const NUM_FRAC: u8 = 5;

pub(crate) const NUM_E: u8 = 6;

pub(crate) const NUM_ESIGN: u8 = 7;

pub(crate) const NUM_EXP: u8 = 8;

/// A string's escape/UTF-8 progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Chars {
    /// 0: plain; 1: after `\`; 2..=5: that many hex digits of `\u` still to read, plus one;
    /// 6: a high surrogate was read, `\` must follow; 7: then `u`.
    pub(crate) esc: u8,
    /// UTF-8 continuation bytes still expected.
    pub(crate) utf8: u8,
    /// The allowed range of the next continuation byte when it is not 0x80..=0xBF (Unicode
    /// table 3-7): 1: A0..BF, 2: 80..9F, 3: 90..BF, 4: 80..8F.
    pub(crate) first: u8,
    /// The `\u` escape being read must be a low surrogate (DC00..DFFF).
    pub(crate) low: bool,
    /// The `\u` code unit read so far.
    pub(crate) hex: u16,
    /// While a low surrogate's `\u` escape is read: the high surrogate before it.
    pub(crate) high: u16,
}

/// One level of the parse stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    /// The end of the document: nothing may follow.
    End,
    /// A value of `node` is expected next.
    Value(NodeId),
    /// Inside an object.
    Obj {
        /// The object's node.
        node: NodeId,
        /// Where in the object (`OBJ_*`).
        phase: u8,
        /// Schema order: the index of the next declared property that may appear.
        next: u16,
        /// Any order: declared properties already written (first 64).
        seen: u64,
        /// Members written.
        count: u32,
        /// The node of the value after the current key.
        pending: NodeId,
    },
    /// Inside a declared key (bytes of its JSON encoding, through the object's key trie).
    Key {
        /// The object's node.
        obj: NodeId,
        /// The position in the object's key trie.
        trie: u32,
        /// The first declared property the key may still be (schema order).
        lo: u16,
        /// The last one.
        hi: u16,
        /// The object's properties already written.
        seen: u64,
    },
    /// Inside a key that is not declared (an additional property).
    FreeKey {
        /// The object's node.
        obj: NodeId,
        /// The position in the key trie while the text still follows a declared name.
        trie: Option<u32>,
        /// Escape and UTF-8 progress.
        chars: Chars,
        /// The state of each `patternProperties` automaton.
        dfa: [u32; 4],
    },
    /// Inside an array.
    Arr {
        /// The array's node.
        node: NodeId,
        /// Where in the array (`ARR_*`).
        phase: u8,
        /// Items written.
        count: u32,
        /// Under an exact `uniqueItems` over literals, those already written.
        used: u64,
        /// Under one over open strings, integers or objects, the sorted hashes (or integer
        /// keys) of the items written.
        texts: Option<Arc<Vec<u64>>>,
        /// Under one over objects ([`crate::graph::ArrayNode::unique_values`]), where the item
        /// being written begins in the stack's capture (`NO_ITEM` between items).
        start: u32,
    },
    /// Inside a string.
    Str {
        /// The string's node.
        node: NodeId,
        /// Characters written, kept only under a length bound.
        len: u32,
        /// Escape and UTF-8 progress.
        chars: Chars,
        /// The state of each pattern automaton.
        dfa: [u32; 2],
        /// For an item under an exact `uniqueItems` over open strings, the hash of its decoded
        /// text so far (see `unique::extend_text`).
        text: Option<NonZeroU64>,
    },
    /// Inside a number; the value is tracked only when the node has bounds.
    Num {
        /// The number's node.
        node: NodeId,
        /// Where in the number grammar (`NUM_*`).
        phase: u8,
        /// A `-` was written.
        neg: bool,
        /// The magnitude so far, as f64 bits.
        value: u64,
        /// Fraction digits written.
        frac: u16,
        /// The exponent so far.
        exp: u16,
        /// The exponent is negative.
        exp_neg: bool,
    },
    /// Inside one of a literal set's strings.
    Lit {
        /// The literal set.
        set: u32,
        /// The position in its trie.
        trie: u32,
        /// An item of an array with an exact `uniqueItems`: the literals already written there
        /// (which it must not repeat).
        unique: Option<u64>,
    },
    /// Inside layout whitespace that must be written exactly (separators, indentation).
    Pad {
        /// Which fixed text ([`super::layout::Layout`]'s pads).
        text: u16,
        /// Bytes of it written.
        pos: u16,
    },
    /// Inside free whitespace between tokens.
    Ws {
        /// The state of the whitespace automaton.
        s: u32,
    },
}

/// Advances the escape/UTF-8 tracker of a string by one raw byte.
pub(crate) fn advance_chars(c: Chars, b: u8) -> Option<Chars> {
    match c.esc {
        1 => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(Chars::default()),
            b'u' => Some(Chars { esc: 5, hex: 0, ..Chars::default() }),
            _ => None,
        },
        6 => (b == b'\\').then_some(Chars { esc: 7, ..c }),
        7 => (b == b'u').then_some(Chars { esc: 5, hex: 0, low: true, high: c.hex, ..Chars::default() }),
        2..=5 => {
            let h = (b as char).to_digit(16)? as u16;
            let hex = c.hex << 4 | h;
            // Surrogates (D800..DFFF) only as a high-low pair, decided by the first two digits
            // so that no prefix is a dead end.
            match c.esc {
                5 if c.low && h != 0xD => return None,
                4 if c.low && !(0xC..=0xF).contains(&h) => return None,
                4 if !c.low && hex >> 4 == 0xD && h >= 0xC => return None,
                _ => {}
            }
            if c.esc > 2 {
                return Some(Chars { esc: c.esc - 1, hex, ..c });
            }
            if !c.low && (0xD800..=0xDBFF).contains(&hex) {
                return Some(Chars { esc: 6, hex, ..Chars::default() });
            }
            Some(Chars::default())
        }
        _ => {
            if c.utf8 > 0 {
                let ok = match c.first {
                    1 => (0xA0..=0xBF).contains(&b),
                    2 => (0x80..=0x9F).contains(&b),
                    3 => (0x90..=0xBF).contains(&b),
                    4 => (0x80..=0x8F).contains(&b),
                    _ => (0x80..=0xBF).contains(&b),
                };
                return ok.then_some(Chars { utf8: c.utf8 - 1, first: 0, ..c });
            }
            let lead = |n: u8, first: u8| Some(Chars { utf8: n, first, ..c });
            match b {
                b'\\' => Some(Chars { esc: 1, ..c }),
                b'"' => None,
                0x00..=0x1F => None,
                0x20..=0x7F => Some(c),
                0xC2..=0xDF => lead(1, 0),
                0xE0 => lead(2, 1),
                0xED => lead(2, 2),
                0xE1..=0xEF => lead(2, 0),
                0xF0 => lead(3, 3),
                0xF4 => lead(3, 4),
                0xF1..=0xF3 => lead(3, 0),
                _ => None,
            }
        }
    }
}

/// A few bytes, inline.
pub(crate) struct Decoded {
    pub(crate) buf: [u8; 4],
    pub(crate) len: usize,
}

impl Chars {
    /// Between characters: not inside an escape or a UTF-8 sequence.
    pub fn is_plain(&self) -> bool {
        self.esc == 0 && self.utf8 == 0
    }
}

impl Decoded {
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The bytes of the decoded string that raw byte `b` completes (none while an escape is
/// still being read).
pub(crate) fn decoded_bytes(before: Chars, after: Chars, b: u8) -> Decoded {
    let mut d = Decoded { buf: [0; 4], len: 0 };
    match before.esc {
        0 if b == b'\\' => {}
        0 => {
            d.buf[0] = b;
            d.len = 1;
        }
        1 if b == b'u' => {}
        1 => {
            d.buf[0] = match b {
                b'b' => 0x08,
                b'f' => 0x0C,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                other => other,
            };
            d.len = 1;
        }
        2 => {
            // A high surrogate waits for its pair; the pair is given to patterns as U+FFFD.
            let unit = (before.hex << 4) | (b as char).to_digit(16).unwrap_or(0) as u16;
            if after.esc != 6 {
                let ch = char::from_u32(unit as u32).unwrap_or('\u{FFFD}');
                d.len = ch.encode_utf8(&mut d.buf).len();
            }
        }
        _ => {}
    }
    d
}
