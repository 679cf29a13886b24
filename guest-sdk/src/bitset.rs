//! [`TokenSet`]: a fixed-size bitset over the vocabulary, in the contract's bit layout, and the
//! choice of the smallest [`Mask`] form for it.

/// The allowed tokens of one step, in the contract's four forms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Every token.
    All,
    /// Exactly these ids.
    Allow(Vec<u32>),
    /// The union of half-open ranges `[start, end)`.
    Ranges(Vec<(u32, u32)>),
    /// One bit per token, least significant bit first, `ceil(vocab / 32)` words.
    Bitset(Vec<u32>),
}

impl Mask {
    /// Whether `token` is allowed by this mask.
    pub fn allows(&self, token: u32) -> bool {
        match self {
            Mask::All => true,
            Mask::Allow(ids) => ids.contains(&token),
            Mask::Ranges(r) => r.iter().any(|&(s, e)| s <= token && token < e),
            Mask::Bitset(words) => words.get((token / 32) as usize).is_some_and(|w| w >> (token % 32) & 1 == 1),
        }
    }

    /// Expands the mask into a [`TokenSet`] over `vocab_size` tokens.
    pub fn to_set(&self, vocab_size: usize) -> TokenSet {
        let mut set = TokenSet::new(vocab_size);
        match self {
            Mask::All => set.fill(),
            Mask::Allow(ids) => ids.iter().for_each(|&t| set.insert(t)),
            Mask::Ranges(r) => r.iter().for_each(|&(s, e)| (s..e).for_each(|t| set.insert(t))),
            Mask::Bitset(words) => set.words_mut().copy_from_slice(words),
        }
        set
    }
}

/// A set of token ids as a bitset: token `i` is bit `i % 32` of word `i / 32`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSet {
    words: Vec<u32>,
    len: usize,
}

impl TokenSet {
    /// An empty set over `len` tokens.
    pub fn new(len: usize) -> Self {
        Self { words: vec![0; len.div_ceil(32)], len }
    }

    /// The number of tokens the set ranges over (the vocabulary size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the set ranges over no tokens at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `token`; ids outside the vocabulary are ignored.
    #[inline]
    pub fn insert(&mut self, token: u32) {
        if (token as usize) < self.len {
            self.words[(token / 32) as usize] |= 1 << (token % 32);
        }
    }

    /// Adds every token of `tokens`; ids outside the vocabulary are ignored.
    #[inline]
    pub fn insert_all(&mut self, tokens: &[u32]) {
        let len = self.len;
        for &t in tokens {
            if (t as usize) < len
                && let Some(word) = self.words.get_mut(t as usize / 32)
            {
                *word |= 1 << (t % 32);
            }
        }
    }

    /// Removes `token`.
    #[inline]
    pub fn remove(&mut self, token: u32) {
        if (token as usize) < self.len {
            self.words[(token / 32) as usize] &= !(1 << (token % 32));
        }
    }

    /// Whether `token` is in the set.
    #[inline]
    pub fn contains(&self, token: u32) -> bool {
        (token as usize) < self.len && self.words[(token / 32) as usize] >> (token % 32) & 1 == 1
    }

    /// Empties the set, keeping its size.
    pub fn clear(&mut self) {
        self.words.fill(0);
    }

    /// Adds every token of the vocabulary.
    pub fn fill(&mut self) {
        self.words.fill(u32::MAX);
        let tail = self.len % 32;
        if let (true, Some(last)) = (tail != 0, self.words.last_mut()) {
            *last = (1u32 << tail) - 1;
        }
    }

    /// The number of tokens in the set.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The raw words, `ceil(len / 32)` of them.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The raw words, mutable.
    pub fn words_mut(&mut self) -> &mut [u32] {
        &mut self.words
    }

    /// The ids in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 32 + bit)
            })
        })
    }

    /// The maximal runs of consecutive ids, as half-open ranges.
    pub fn ranges(&self) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for t in self.iter() {
            match out.last_mut() {
                Some((_, end)) if *end == t => *end = t + 1,
                _ => out.push((t, t + 1)),
            }
        }
        out
    }

    /// The smallest contract form of this set, by the number of 32-bit words sent: `all`
    /// (none), an allow list (one per id), ranges (two per range), or the bitset.
    pub fn to_mask(&self) -> Mask {
        let count = self.count();
        if count == self.len {
            return Mask::All;
        }
        let words = self.words.len();
        if count <= words / 2 {
            return Mask::Allow(self.iter().collect());
        }
        // Counting runs is one pass over the words; only build the ranges if they win.
        let mut runs = 0usize;
        let mut prev_bit = 0u32;
        for &w in &self.words {
            // A run starts at each 0->1 transition; carry the last bit of the previous word.
            let starts = w & !((w << 1) | prev_bit);
            runs += starts.count_ones() as usize;
            prev_bit = w >> 31;
        }
        let (allow, ranges, bitset) = (count, runs * 2, words);
        if ranges < allow && ranges < bitset {
            Mask::Ranges(self.ranges())
        } else if allow <= bitset {
            Mask::Allow(self.iter().collect())
        } else {
            Mask::Bitset(self.words.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_contains_count_and_tail_of_fill() {
        let mut s = TokenSet::new(70);
        s.insert(0);
        s.insert(33);
        s.insert(69);
        s.insert(70); // out of range: ignored
        assert!(s.contains(33) && s.contains(69) && !s.contains(70) && !s.contains(1));
        assert_eq!(s.count(), 3);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 33, 69]);
        s.fill();
        assert_eq!(s.count(), 70);
        assert_eq!(s.words()[2], 0b111111);
    }

    #[test]
    fn smallest_form_is_chosen() {
        let mut s = TokenSet::new(1000);
        assert_eq!(s.to_mask(), Mask::Allow(vec![]));
        s.insert(5);
        assert_eq!(s.to_mask(), Mask::Allow(vec![5]));
        for t in 100..900 {
            s.insert(t);
        }
        assert_eq!(s.to_mask(), Mask::Ranges(vec![(5, 6), (100, 900)]));
        let mut alt = TokenSet::new(1000);
        for t in (0..1000).step_by(2) {
            alt.insert(t);
        }
        assert!(matches!(alt.to_mask(), Mask::Bitset(w) if w.len() == 32));
        alt.fill();
        assert_eq!(alt.to_mask(), Mask::All);
    }

    #[test]
    fn insert_all_adds_the_ids_inside_the_vocabulary() {
        let mut s = TokenSet::new(40);
        s.insert_all(&[0, 31, 32, 39, 40, 63, 1000]);
        let ids: Vec<u32> = (0..64).filter(|&i| s.contains(i)).collect();
        assert_eq!(ids, vec![0, 31, 32, 39]);
        assert_eq!(s.count(), 4, "no bit past the vocabulary is set");
    }

    #[test]
    fn mask_round_trips_through_set() {
        let mut s = TokenSet::new(300);
        for t in [1, 2, 3, 64, 65, 299] {
            s.insert(t);
        }
        for m in [s.to_mask(), Mask::Bitset(s.words().to_vec()), Mask::Ranges(s.ranges())] {
            assert_eq!(m.to_set(300), s);
            assert!(m.allows(64) && !m.allows(66));
        }
    }
}
