//! `uniqueItems` bookkeeping on the stack: the literals, text hashes, integer keys and value
//! hashes of the items an array has written, and the checks that refuse a repeat.

use std::num::NonZeroU64;
use std::sync::Arc;

use super::frame::{Chars, Decoded, Frame, advance_chars, decoded_bytes};
use super::state::Config;
use crate::graph::{Graph, Node, NodeId};

/// Where a captured item ends: the capture's hash and length, the item's start in it, and
/// its last byte.
pub(crate) type ItemEnd = (u64, u32, u32, u8);

/// The value key of the captured item that begins at `start` and ends with byte `last`.
/// A mask meets the same item end once per token that closes it (`}`, `},`, `}]`, ...), so
/// the last few are remembered by the capture's hash rather than parsed again.
pub(crate) fn captured_item_key(stack: &Config, start: u32, last: u8) -> u64 {
    let id = stack.capture_key().map(|(hash, len)| (hash, len, start, last));
    if let Some(id) = id
        && let Some(key) = ITEM_KEYS.with(|keys| keys.borrow().iter().find(|(k, _)| *k == id).map(|(_, v)| *v))
    {
        return key;
    }
    let mut bytes = stack.captured_since(start);
    bytes.push(last);
    let key = crate::values::canonical_hash(&bytes);
    if let Some(id) = id {
        ITEM_KEYS.with(|keys| {
            let mut keys = keys.borrow_mut();
            if keys.len() >= 16 {
                keys.remove(0);
            }
            keys.push((id, key));
        });
    }
    key
}

/// Records literal `value` as written in the array below the top of `stack`, for an item
/// under an exact `uniqueItems` (`unique` is `Some`); otherwise leaves the stack alone.
pub(crate) fn mark_used(stack: &mut Config, unique: Option<u64>, value: u32) {
    if unique.is_none() || value >= 64 {
        return;
    }
    if let Some(Frame::Arr { node, phase, count, used, texts, start }) = stack.pop() {
        stack.push(Frame::Arr { node, phase, count, used: used | 1 << value, texts, start });
    }
}

/// The bytes of the decoded string that raw byte `b` completes, as [`decoded_bytes`] but
/// with a surrogate pair decoded to its own character (patterns see U+FFFD there), so that
/// a character hashes the same escaped or not.
pub(crate) fn text_bytes(before: Chars, after: Chars, b: u8) -> Decoded {
    if before.esc == 2 && before.low {
        let low = (before.hex << 4) | (b as char).to_digit(16).unwrap_or(0) as u16;
        let code = 0x10000 + ((before.high as u32).wrapping_sub(0xD800) << 10) + (low as u32).wrapping_sub(0xDC00);
        let mut d = Decoded { buf: [0; 4], len: 0 };
        d.len = char::from_u32(code).unwrap_or('\u{FFFD}').encode_utf8(&mut d.buf).len();
        return d;
    }
    decoded_bytes(before, after, b)
}

/// The hash of an empty tracked string (FNV-1a's offset basis).
pub(crate) const TEXT_START: NonZeroU64 = NonZeroU64::new(0xcbf2_9ce4_8422_2325).unwrap();

/// Extends the hash of a tracked string's decoded text by `decoded` bytes: FNV-1a, kept off
/// zero. Items are compared by this 64-bit hash: two different texts that collide (about
/// 2^-64 per pair) would make the second unwritable, never a repeat writable.
pub(crate) fn hash_text(h: NonZeroU64, decoded: &[u8]) -> NonZeroU64 {
    let mut h = h.get();
    for &b in decoded {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    NonZeroU64::new(h).unwrap_or(NonZeroU64::MIN)
}

/// The hash of a tracked string whose text so far hashes to `h`, after the raw (JSON-escaped)
/// bytes `raw` written from between characters; `None` when `raw` is not string content.
pub(crate) fn extend_text(h: NonZeroU64, raw: &[u8]) -> Option<NonZeroU64> {
    let (mut c, mut h) = (Chars::default(), h);
    for &b in raw {
        let next = advance_chars(c, b)?;
        h = hash_text(h, text_bytes(c, next, b).as_slice());
        c = next;
    }
    Some(h)
}

/// At the closing quote of a string: records a tracked item's text in the array below the
/// top of `stack`; `false` when that array holds the same text already (a repeat).
pub(crate) fn record_text(stack: &mut Config, text: Option<NonZeroU64>) -> bool {
    let Some(h) = text else { return true };
    record_item(stack, h.get())
}

/// Whether the number of `node` on top of `stack` (popped) is an item of an array with an
/// exact `uniqueItems` over integers (the array's frame is the next one down).
pub(crate) fn is_unique_int_item(g: &Graph, stack: &Config, node: NodeId) -> bool {
    match stack.top() {
        Some(Frame::Arr { node: arr, .. }) => {
            matches!(g.node(*arr), Node::Array(a) if a.unique_ints && a.items == node)
        }
        _ => false,
    }
}

/// Whether the frame popped off `stack` is an item of an array under an exact `uniqueItems`
/// over strings and literals (the array's frame is the next one down).
pub(crate) fn is_tracked_item(g: &Graph, stack: &Config) -> bool {
    match stack.top() {
        Some(Frame::Arr { node, .. }) => matches!(g.node(*node), Node::Array(a) if a.unique_text),
        _ => false,
    }
}

/// The literals of `lits` (of the first 64) whose keys the array below the top of `stack`
/// has written, as bits.
pub(crate) fn written_literals(stack: &Config, lits: &crate::graph::LiteralTrie) -> u64 {
    let Some(Frame::Arr { texts: Some(items), .. }) = stack.top() else { return 0 };
    lits.keys
        .iter()
        .take(64)
        .enumerate()
        .filter(|(_, k)| items.binary_search(k).is_ok())
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// The key of an integer item in its array's list: the bits of its magnitude as `f64` (an
/// integer beyond 2^53 shares its key with its neighbours, which makes them unwritable
/// after it, never a repeat writable), the sign in the top bit.
pub(crate) fn int_key(neg: bool, value: u64) -> u64 {
    value | (neg as u64) << 63
}

/// Whether the array below the top of `stack` holds item `key` already.
pub(crate) fn item_written(stack: &Config, key: u64) -> bool {
    match stack.top() {
        Some(Frame::Arr { texts: Some(items), .. }) => items.binary_search(&key).is_ok(),
        _ => false,
    }
}

/// The item keys the array below the top of `stack` has recorded, sorted.
pub(crate) fn written_items(stack: &Config) -> &[u64] {
    match stack.top() {
        Some(Frame::Arr { texts: Some(items), .. }) => items,
        _ => &[],
    }
}

/// Records item `key` (a tracked string's text hash, an integer's [`int_key`]) in the array
/// below the top of `stack`; `false` when it is there already (a repeat).
pub(crate) fn record_item(stack: &mut Config, key: u64) -> bool {
    if !matches!(stack.top(), Some(Frame::Arr { .. })) {
        return true;
    }
    let Some(Frame::Arr { node, phase, count, used, texts, start }) = stack.pop() else { return true };
    let mut items = texts.as_deref().cloned().unwrap_or_default();
    match items.binary_search(&key) {
        Ok(_) => false,
        Err(at) => {
            items.insert(at, key);
            stack.push(Frame::Arr { node, phase, count, used, texts: Some(Arc::new(items)), start });
            true
        }
    }
}

thread_local! {
    /// The value keys of the last captured items met ([`captured_item_key`]).
    static ITEM_KEYS: std::cell::RefCell<Vec<(ItemEnd, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}
