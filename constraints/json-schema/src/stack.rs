//! [`Stack`]: a persistent parse stack. Cloning one is a frame copy and a reference-count
//! bump, so the token-trie walk (which clones the state at every node) does not allocate while
//! only the top frame changes, as it does inside strings and numbers.
//!
//! A stack may also carry the bytes of a value being captured ([`Stack::begin_capture`]): an
//! item of an array whose `uniqueItems` compares whole values (objects), which can only be
//! told apart from the earlier items once it ends. The bytes are a persistent list too, so
//! writing one is one allocation and never copies what is already there.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use dspark_guest::key;

use crate::recognizer::frame::Frame;

struct Link {
    frame: Frame,
    next: Option<Arc<Link>>,
    /// Hash of this frame and everything below it.
    hash: u64,
}

const EMPTY_HASH: u64 = 0x005e_ed0f_e397_7ac4;

fn chain_hash(l: &Option<Arc<Link>>) -> u64 {
    l.as_ref().map_or(EMPTY_HASH, |l| l.hash)
}

/// One captured byte and those before it.
struct Captured {
    byte: u8,
    prev: Option<Arc<Captured>>,
    /// Bytes captured up to and including this one (0 for the empty start).
    len: u32,
    /// Hash of the bytes up to and including this one.
    hash: u64,
}

const CAPTURE_START_HASH: u64 = 0x0c0f_fee0_5eed_1e55;

/// A stack of frames; the top may be held unboxed.
#[derive(Clone, Default)]
pub struct Stack {
    top: Option<Frame>,
    below: Option<Arc<Link>>,
    /// The bytes captured so far, while a capture is open.
    capture: Option<Arc<Captured>>,
}

impl Stack {
    /// A stack of `frames`, bottom first.
    pub fn from_frames(frames: impl IntoIterator<Item = Frame>) -> Self {
        let mut s = Stack::default();
        for f in frames {
            s.push(f);
        }
        s
    }

    /// Pushes a frame.
    #[inline]
    pub fn push(&mut self, f: Frame) {
        if let Some(t) = self.top.take() {
            let next = self.below.take();
            let hash = key::mix(key::of(&t), chain_hash(&next));
            self.below = Some(Arc::new(Link { frame: t, next, hash }));
        }
        self.top = Some(f);
    }

    /// Pops the top frame.
    #[inline]
    pub fn pop(&mut self) -> Option<Frame> {
        if let Some(t) = self.top.take() {
            return Some(t);
        }
        let l = self.below.take()?;
        self.below = l.next.clone();
        Some(l.frame.clone())
    }

    /// The top frame.
    pub fn top(&self) -> Option<&Frame> {
        self.top.as_ref().or_else(|| self.below.as_ref().map(|l| &l.frame))
    }

    /// The frames, top first.
    pub fn iter(&self) -> impl Iterator<Item = &Frame> {
        let mut link = self.below.as_deref();
        self.top.iter().chain(std::iter::from_fn(move || {
            let l = link?;
            link = l.next.as_deref();
            Some(&l.frame)
        }))
    }

    /// The number of frames.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether the stack has no frames.
    pub fn is_empty(&self) -> bool {
        self.top.is_none() && self.below.is_none()
    }

    /// Opens a capture (if none is open): from now on [`Self::capture_byte`] records bytes.
    pub fn begin_capture(&mut self) {
        if self.capture.is_none() {
            self.capture = Some(Arc::new(Captured { byte: 0, prev: None, len: 0, hash: CAPTURE_START_HASH }));
        }
    }

    /// How many bytes the open capture holds; `None` when none is open.
    pub fn capture_len(&self) -> Option<u32> {
        self.capture.as_ref().map(|c| c.len)
    }

    /// Records `byte` in the open capture; does nothing when none is open.
    #[inline]
    pub fn capture_byte(&mut self, byte: u8) {
        if let Some(prev) = self.capture.take() {
            let (len, hash) = (prev.len + 1, key::mix(prev.hash, byte as u64));
            self.capture = Some(Arc::new(Captured { byte, prev: Some(prev), len, hash }));
        }
    }

    /// The hash and length of the bytes captured so far; `None` when no capture is open.
    pub fn capture_key(&self) -> Option<(u64, u32)> {
        self.capture.as_ref().map(|c| (c.hash, c.len))
    }

    /// The captured bytes from offset `start` on.
    pub fn captured_since(&self, start: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = self.capture.as_deref();
        while let Some(c) = at.filter(|c| c.len > start) {
            out.push(c.byte);
            at = c.prev.as_deref();
        }
        out.reverse();
        out
    }

    /// Closes the capture, dropping its bytes.
    pub fn end_capture(&mut self) {
        self.capture = None;
    }

    fn hash_value(&self) -> u64 {
        let frames = match &self.top {
            Some(t) => key::mix(key::of(t), chain_hash(&self.below)),
            None => chain_hash(&self.below),
        };
        match &self.capture {
            Some(c) => key::mix(frames, c.hash ^ (c.len as u64) << 32),
            None => frames,
        }
    }
}

impl PartialEq for Stack {
    fn eq(&self, other: &Self) -> bool {
        // Captured bytes compare by their 64-bit hash and length.
        let captured = |s: &Self| s.capture.as_ref().map(|c| (c.len, c.hash));
        self.hash_value() == other.hash_value() && captured(self) == captured(other) && self.iter().eq(other.iter())
    }
}

impl Eq for Stack {}

impl Hash for Stack {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash_value());
    }
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_sequences_are_equal_however_built() {
        let mut a = Stack::from_frames([Frame::End, Frame::Value(3), Frame::Value(4)]);
        let b = Stack::from_frames([Frame::End, Frame::Value(3)]);
        assert_ne!(a, b);
        assert_eq!(a.pop(), Some(Frame::Value(4)));
        assert_eq!(a, b);
        assert_eq!(key::of(&a), key::of(&b));
        let mut c = b.clone();
        c.pop();
        c.push(Frame::Value(3));
        assert_eq!(c, b);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn captured_bytes_are_kept_in_order_and_tell_stacks_apart() {
        let plain = Stack::from_frames([Frame::End]);
        let mut a = plain.clone();
        a.capture_byte(b'x'); // no capture open: nothing recorded
        assert_eq!(a, plain);
        a.begin_capture();
        assert_ne!(a, plain);
        for &b in b"{\"k\":1}" {
            a.capture_byte(b);
        }
        let b = a.clone();
        assert_eq!(a.capture_len(), Some(7));
        assert_eq!(a.captured_since(0), b"{\"k\":1}");
        assert_eq!(a.captured_since(5), b"1}");
        a.capture_byte(b' ');
        assert_ne!(a, b);
        assert_eq!(b.captured_since(0), b"{\"k\":1}", "a clone keeps its own bytes");
        a.end_capture();
        assert_eq!(a, plain);
    }
}
