//! The block manager of the paged KV cache, with prefix caching.
//!
//! The cache is `num_blocks` blocks of `block_size` token slots. A sequence owns a block
//! table (its blocks in position order). Blocks are reference-counted: a full block whose
//! content is known (hash of its tokens chained with its parent's hash) is registered in a
//! table, and a later sequence with the same prefix shares it instead of recomputing it.
//! When its last user frees a registered block it stays cached, evictable in LRU order; an
//! allocation takes never-registered free blocks first, then evicts the least recently used.
//! A lookup compares the stored tokens, so a hash collision can never share wrong K/V.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// A block id.
pub type BlockId = u32;

#[derive(Debug, Default)]
struct Block {
    refs: u32,
    /// Set while registered in the prefix table.
    content: Option<Content>,
    /// LRU key while evictable.
    lru_tick: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Content {
    hash: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

/// Hash of a full block's tokens chained with its parent's hash (0 for the first block).
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// Counters for the prefix cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Blocks looked up.
    pub queried_blocks: u64,
    /// Blocks found.
    pub hit_blocks: u64,
}

/// Allocation, sharing and eviction of KV blocks.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    blocks: Vec<Block>,
    /// Free blocks with no cached content.
    free: Vec<BlockId>,
    /// Free blocks with cached content, by last use.
    evictable: BTreeMap<u64, BlockId>,
    /// Registered full blocks by content hash.
    cached: HashMap<u64, BlockId>,
    tick: u64,
    prefix_caching: bool,
    stats: PrefixStats,
}

impl BlockManager {
    /// A manager of `num_blocks` blocks of `block_size` slots.
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        Self {
            block_size,
            blocks: (0..num_blocks).map(|_| Block::default()).collect(),
            // Popped from the back: hand out low ids first.
            free: (0..num_blocks as BlockId).rev().collect(),
            evictable: BTreeMap::new(),
            cached: HashMap::new(),
            tick: 0,
            prefix_caching,
            stats: PrefixStats::default(),
        }
    }

    /// Slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// All blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks an allocation can take now (free plus evictable).
    pub fn num_available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Fraction of blocks in use by sequences.
    pub fn usage(&self) -> f64 {
        1.0 - self.num_available() as f64 / self.blocks.len().max(1) as f64
    }

    /// Prefix-cache counters.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.stats
    }

    /// Takes a block (refcount 1), evicting the least recently used cached block if needed.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let (_, id) = self.evictable.pop_first()?;
                let block = &mut self.blocks[id as usize];
                block.lru_tick = None;
                if let Some(content) = block.content.take() {
                    self.cached.remove(&content.hash);
                }
                id
            }
        };
        self.blocks[id as usize].refs = 1;
        Some(id)
    }

    /// Drops one reference. A block nobody uses becomes free (or evictable if cached).
    pub fn release(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        debug_assert!(block.refs > 0, "block {id} released twice");
        block.refs = block.refs.saturating_sub(1);
        if block.refs == 0 {
            if block.content.is_some() {
                self.tick += 1;
                block.lru_tick = Some(self.tick);
                self.evictable.insert(self.tick, id);
            } else {
                self.free.push(id);
            }
        }
    }

    /// The longest run of cached full blocks that starts `tokens`, at most `max_blocks` of
    /// them, each with a new reference. Returns the blocks and the hash of the last one.
    pub fn lookup_prefix(&mut self, tokens: &[u32], max_blocks: usize) -> (Vec<BlockId>, u64) {
        let mut found = Vec::new();
        let mut parent = 0;
        if !self.prefix_caching {
            return (found, parent);
        }
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            self.stats.queried_blocks += 1;
            let hash = block_hash(parent, chunk);
            let Some(&id) = self.cached.get(&hash) else { break };
            let block = &mut self.blocks[id as usize];
            match &block.content {
                Some(c) if c.parent == parent && *c.tokens == *chunk => {}
                _ => break,
            }
            if block.refs == 0
                && let Some(tick) = block.lru_tick.take()
            {
                self.evictable.remove(&tick);
            }
            block.refs += 1;
            self.stats.hit_blocks += 1;
            found.push(id);
            parent = hash;
        }
        (found, parent)
    }

    /// Records that block `id` is full with `tokens` after a prefix hashing to `parent`.
    /// Returns the block's hash (the parent of the next block).
    pub fn register_full(&mut self, id: BlockId, parent: u64, tokens: &[u32]) -> u64 {
        let hash = block_hash(parent, tokens);
        if self.prefix_caching && !self.cached.contains_key(&hash) && self.blocks[id as usize].content.is_none() {
            self.blocks[id as usize].content = Some(Content { hash, parent, tokens: tokens.into() });
            self.cached.insert(hash, id);
        }
        hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_blocks_are_reused_and_counted() {
        let mut m = BlockManager::new(4, 2, true);
        let a = m.allocate().unwrap();
        let b = m.allocate().unwrap();
        let h = m.register_full(a, 0, &[1, 2]);
        m.register_full(b, h, &[3, 4]);
        let (found, last) = m.lookup_prefix(&[1, 2, 3, 4, 5], 8);
        assert_eq!(found, vec![a, b]);
        assert_eq!(last, block_hash(h, &[3, 4]));
        // A different second block shares only the first.
        let (found, _) = m.lookup_prefix(&[1, 2, 9, 9], 8);
        assert_eq!(found, vec![a]);
        assert_eq!(m.prefix_stats(), PrefixStats { queried_blocks: 4, hit_blocks: 3 });
    }

    #[test]
    fn freed_cached_blocks_are_evicted_least_recently_used_first() {
        let mut m = BlockManager::new(2, 1, true);
        let a = m.allocate().unwrap();
        let b = m.allocate().unwrap();
        let ha = m.register_full(a, 0, &[7]);
        m.register_full(b, ha, &[8]);
        assert_eq!(m.allocate(), None);
        m.release(b);
        m.release(a);
        assert_eq!(m.num_available(), 2);
        // b was released first: it goes first, and its content is forgotten.
        assert_eq!(m.allocate(), Some(b));
        let (found, _) = m.lookup_prefix(&[7, 8], 2);
        assert_eq!(found, vec![a]);
        assert_eq!(m.num_available(), 0);
    }

    #[test]
    fn without_prefix_caching_nothing_is_shared() {
        let mut m = BlockManager::new(2, 1, false);
        let a = m.allocate().unwrap();
        m.register_full(a, 0, &[1]);
        assert!(m.lookup_prefix(&[1], 1).0.is_empty());
        m.release(a);
        assert_eq!(m.num_available(), 2);
    }
}
