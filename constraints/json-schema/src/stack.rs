//! [`Stack`]: a persistent parse stack. Cloning one is a frame copy and a reference-count
//! bump, so the token-trie walk (which clones the state at every node) does not allocate while
//! only the top frame changes, as it does inside strings and numbers.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use dspark_guest::key;

use crate::recognizer::Frame;

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

/// A stack of frames; the top may be held unboxed.
#[derive(Clone, Default)]
pub struct Stack {
    top: Option<Frame>,
    below: Option<Arc<Link>>,
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

    fn hash_value(&self) -> u64 {
        match &self.top {
            Some(t) => key::mix(key::of(t), chain_hash(&self.below)),
            None => chain_hash(&self.below),
        }
    }
}

impl PartialEq for Stack {
    fn eq(&self, other: &Self) -> bool {
        self.hash_value() == other.hash_value() && self.iter().eq(other.iter())
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
}
