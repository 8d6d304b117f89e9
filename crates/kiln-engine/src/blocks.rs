//! The block manager of the paged KV cache: which fixed-size blocks of KV memory each sequence
//! owns, which full blocks hold a prompt prefix that later sequences can share, and which blocks
//! are free.
//!
//! The KV memory itself (per layer, `n_blocks * block_size` rows of keys and values) belongs to
//! the backend; this module only hands out block numbers. A sequence's [`BlockTable`] lists its
//! blocks in order: token `i` of the sequence lives in row `i % block_size` of block
//! `table.blocks()[i / block_size]`.
//!
//! **Prefix caching.** A block that is *full* and whose tokens are known is registered under a
//! hash chained over the whole prefix (`hash(parent's hash, this block's tokens)`), so equal
//! hashes mean equal prefixes, not merely equal blocks; the block also keeps its tokens, and a
//! lookup compares them, so a hash collision can never hand out wrong KV rows. A new prompt
//! takes every leading full block already cached (reference counted: several running
//! sequences share one block) and allocates the rest. A full block is never written again, so
//! sharing needs no copy-on-write; only a sequence's last, partial block is written, and it is
//! always its own.
//!
//! **Eviction.** When a sequence ends, its blocks' counts drop; a block no sequence uses goes to
//! the free list if it has no registered prefix, or stays cached (and reusable) in a
//! least-recently-used order if it has one. Allocation takes from the free list first, then
//! evicts the least recently used cached block. So every block is, at any time, exactly one of:
//! *in use* (count > 0), *cached and idle* (count 0, registered), or *free* (count 0, not
//! registered) — and [`BlockPool::check`] verifies that partition in tests.
//!
//! **Invariants** (kept by every method; out-of-memory is an error that changes nothing):
//! - `free + idle + in use == n_blocks`; a block is in at most one of the free list and the
//!   LRU list, and in one of them exactly when its count is 0.
//! - A registered block is full and immutable; the hash map and the blocks agree both ways.
//! - A block table holds `ceil(len / block_size)` blocks.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// A block's index in the pool.
pub type BlockId = u32;

/// Not enough free blocks for a request (nothing was allocated).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the KV cache needs {needed} more blocks, {available} are free")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub available: usize,
}

/// A pool that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolSizeError {
    #[error("a KV block must hold at least one token")]
    EmptyBlocks,
    #[error("{n_blocks} KV blocks are more than block ids (32-bit) can number")]
    TooManyBlocks { n_blocks: usize },
}

/// The blocks of one sequence, in token order, and how many tokens they hold.
#[derive(Debug, Default)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    /// The sequence's tokens so far (kept to register full blocks for prefix caching).
    tokens: Vec<u32>,
    /// Prefix hash of each full block registered or looked up so far (`hashes.len()` full
    /// blocks are accounted for).
    hashes: Vec<u64>,
}

impl BlockTable {
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The prefix hashes of the full blocks accounted for so far (shared at allocation or
    /// registered since).
    pub fn prefix_hashes(&self) -> &[u64] {
        &self.hashes
    }
}

/// What [`BlockPool::allocate_prompt`] found in the prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixHit {
    /// Leading prompt tokens whose KV rows are already in the table's blocks (a multiple of the
    /// block size, and always less than the prompt: the last prompt token is computed anyway,
    /// for its logits).
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Default)]
struct Block {
    refs: u32,
    /// The prefix hash this block is registered under, with its tokens.
    registered: Option<(u64, Box<[u32]>)>,
    /// Position in the LRU order while idle (count 0 and registered).
    lru_stamp: Option<u64>,
}

/// Hit statistics of the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Full prompt blocks looked up.
    pub queried_blocks: u64,
    /// Of those, found in the cache.
    pub hit_blocks: u64,
}

/// A pool of `n_blocks` KV blocks of `block_size` tokens.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    blocks: Vec<Block>,
    /// Blocks with count 0 and no registered prefix.
    free: Vec<BlockId>,
    /// Idle registered blocks by last use (stamp → block), oldest first.
    lru: BTreeMap<u64, BlockId>,
    next_stamp: u64,
    /// Registered prefix hashes.
    by_hash: HashMap<u64, BlockId>,
    stats: PrefixStats,
}

impl BlockPool {
    /// A pool of `n_blocks` blocks of `block_size` tokens each.
    pub fn new(n_blocks: usize, block_size: usize) -> Result<BlockPool, PoolSizeError> {
        if block_size == 0 {
            return Err(PoolSizeError::EmptyBlocks);
        }
        if n_blocks > BlockId::MAX as usize {
            return Err(PoolSizeError::TooManyBlocks { n_blocks });
        }
        Ok(BlockPool {
            block_size,
            blocks: vec![Block::default(); n_blocks],
            // Popped from the end: block 0 first.
            free: (0..n_blocks as BlockId).rev().collect(),
            lru: BTreeMap::new(),
            next_stamp: 0,
            by_hash: HashMap::new(),
            stats: PrefixStats::default(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be handed out now: free ones plus idle cached ones (evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks used by at least one sequence.
    pub fn in_use(&self) -> usize {
        self.blocks.len() - self.available()
    }

    /// Idle blocks that still hold a cached prefix.
    pub fn cached_idle(&self) -> usize {
        self.lru.len()
    }

    pub fn prefix_stats(&self) -> PrefixStats {
        self.stats
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// A table for `prompt`: the longest cached prefix of whole blocks is shared (short of the
    /// last token, see [`PrefixHit`]), the rest allocated. Fails, changing nothing, when the
    /// pool cannot supply the blocks.
    pub fn allocate_prompt(
        &mut self,
        prompt: &[u32],
    ) -> Result<(BlockTable, PrefixHit), OutOfBlocks> {
        self.allocate_prompt_within(prompt, usize::MAX)
    }

    /// [`BlockPool::allocate_prompt`], sharing at most `max_shared` leading blocks (a sequence
    /// whose windowed layers find fewer cached blocks computes the rest again).
    pub fn allocate_prompt_within(
        &mut self,
        prompt: &[u32],
        max_shared: usize,
    ) -> Result<(BlockTable, PrefixHit), OutOfBlocks> {
        let bs = self.block_size;
        // Full blocks that may be shared: never the one holding the last token.
        let shareable = prompt.len().saturating_sub(1) / bs;
        // The leading run of cached blocks; the hashes of the blocks after it are computed by
        // `register_computed`, once their rows exist.
        let (hashes, hits): (Vec<u64>, Vec<BlockId>) =
            self.cached_run(prompt, max_shared).into_iter().unzip();
        let needed = self.blocks_for(prompt.len()) - hits.len();
        // Hit blocks that are idle stop being available once taken.
        let idle_hits = hits
            .iter()
            .filter(|&&b| self.blocks[b as usize].refs == 0)
            .count();
        let available = self.available() - idle_hits;
        if needed > available {
            return Err(OutOfBlocks { needed, available });
        }
        self.stats.queried_blocks += shareable as u64;
        self.stats.hit_blocks += hits.len() as u64;
        let mut table = BlockTable {
            blocks: Vec::with_capacity(hits.len() + needed),
            tokens: prompt.to_vec(),
            hashes,
        };
        for &b in &hits {
            self.retain(b);
            table.blocks.push(b);
        }
        for _ in 0..needed {
            let b = self.take_block().expect("checked above: enough blocks");
            table.blocks.push(b);
        }
        let cached_tokens = hits.len() * bs;
        Ok((table, PrefixHit { cached_tokens }))
    }

    /// The registered block of prefix hash `hash` holding `tokens`, if one is cached (in use or
    /// idle).
    pub fn cached(&self, hash: u64, tokens: &[u32]) -> Option<BlockId> {
        self.by_hash.get(&hash).copied().filter(|&b| {
            self.blocks[b as usize]
                .registered
                .as_ref()
                .is_some_and(|(rh, toks)| *rh == hash && **toks == *tokens)
        })
    }

    /// The prefix hashes of the leading full blocks of `prompt` that are cached, as
    /// [`BlockPool::allocate_prompt`] would share them (nothing is taken).
    pub fn cached_prefix(&self, prompt: &[u32]) -> Vec<u64> {
        let run = self.cached_run(prompt, usize::MAX);
        run.into_iter().map(|(h, _)| h).collect()
    }

    /// The prefix hash and block of each leading full block of `prompt` that is cached, at most
    /// `limit` of them, and never the block holding the last token.
    fn cached_run(&self, prompt: &[u32], limit: usize) -> Vec<(u64, BlockId)> {
        let shareable = prompt.len().saturating_sub(1) / self.block_size;
        let mut run = Vec::new();
        let mut parent = 0u64;
        for chunk in prompt
            .chunks_exact(self.block_size)
            .take(shareable.min(limit))
        {
            let h = chain_hash(parent, chunk);
            let Some(b) = self.cached(h, chunk) else {
                break;
            };
            run.push((h, b));
            parent = h;
        }
        run
    }

    /// Room for `n` more tokens at the end of `table` (allocating blocks as needed). Fails,
    /// changing nothing, when the pool cannot supply them.
    pub fn reserve(&mut self, table: &BlockTable, n: usize) -> Result<usize, OutOfBlocks> {
        let needed = self
            .blocks_for(table.len() + n)
            .saturating_sub(table.blocks.len());
        if needed > self.available() {
            return Err(OutOfBlocks {
                needed,
                available: self.available(),
            });
        }
        Ok(needed)
    }

    /// Appends `tokens` to the sequence of `table`, allocating blocks as needed. Fails, changing
    /// nothing, when the pool cannot supply them.
    pub fn append(&mut self, table: &mut BlockTable, tokens: &[u32]) -> Result<(), OutOfBlocks> {
        let needed = self.reserve(table, tokens.len())?;
        for _ in 0..needed {
            let b = self.take_block().expect("reserved above");
            table.blocks.push(b);
        }
        table.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Registers the table's full blocks whose KV rows are now computed (the first
    /// `computed_tokens` tokens) in the prefix cache, so later prompts can share them. A block
    /// whose prefix is already registered elsewhere stays private (the other copy serves hits).
    pub fn register_computed(&mut self, table: &mut BlockTable, computed_tokens: usize) {
        let bs = self.block_size;
        let full = computed_tokens.min(table.tokens.len()) / bs;
        while table.hashes.len() < full {
            let i = table.hashes.len();
            let parent = if i == 0 { 0 } else { table.hashes[i - 1] };
            let chunk = &table.tokens[i * bs..(i + 1) * bs];
            let h = chain_hash(parent, chunk);
            table.hashes.push(h);
            let b = table.blocks[i];
            let block = &mut self.blocks[b as usize];
            if block.registered.is_none() && !self.by_hash.contains_key(&h) {
                block.registered = Some((h, chunk.into()));
                self.by_hash.insert(h, b);
            }
        }
    }

    /// Releases `table`'s blocks (the sequence ended, was cancelled or preempted). Blocks no
    /// sequence uses any more become idle cached blocks (when registered) or free.
    pub fn release(&mut self, table: BlockTable) {
        // Later blocks first: of one sequence's idle blocks, its deepest prefix is evicted
        // first, so a shorter shared prefix outlives it.
        for &b in table.blocks.iter().rev() {
            self.drop_ref(b);
        }
    }

    /// Drops one reference to block `b`: unused, it becomes idle cached (registered) or free.
    fn drop_ref(&mut self, b: BlockId) {
        let block = &mut self.blocks[b as usize];
        debug_assert!(block.refs > 0, "block {b} released more often than taken");
        block.refs = block.refs.saturating_sub(1);
        if block.refs == 0 {
            if block.registered.is_some() {
                let stamp = self.next_stamp;
                self.next_stamp += 1;
                block.lru_stamp = Some(stamp);
                self.lru.insert(stamp, b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// Takes one more reference on a block (idle blocks leave the LRU order).
    fn retain(&mut self, b: BlockId) {
        let block = &mut self.blocks[b as usize];
        if block.refs == 0 {
            if let Some(stamp) = block.lru_stamp.take() {
                self.lru.remove(&stamp);
            }
        }
        block.refs += 1;
    }

    /// A block for exclusive use: a free one, else the least recently used idle cached one
    /// (its prefix is forgotten).
    fn take_block(&mut self) -> Option<BlockId> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                let block = &mut self.blocks[b as usize];
                block.lru_stamp = None;
                if let Some((h, _)) = block.registered.take() {
                    self.by_hash.remove(&h);
                }
                b
            }
        };
        self.blocks[b as usize].refs = 1;
        Some(b)
    }

    /// Verifies the module invariants against the given live tables (tests and debugging);
    /// returns a description of the first violation.
    pub fn check(&self, live: &[&BlockTable]) -> Result<(), String> {
        for t in live {
            if t.blocks.len() != self.blocks_for(t.len()) {
                return Err(format!(
                    "a table of {} tokens holds {} blocks",
                    t.len(),
                    t.blocks.len()
                ));
            }
        }
        let held: Vec<&[BlockId]> = live.iter().map(|t| t.blocks()).collect();
        self.check_held(&held)
    }

    /// [`BlockPool::check`] for the blocks that live tables hold, whatever kind of table
    /// ([`WindowTable::held`] for a window's).
    pub fn check_held(&self, live: &[&[BlockId]]) -> Result<(), String> {
        let mut refs = vec![0u32; self.blocks.len()];
        for t in live {
            for &b in t.iter() {
                let Some(r) = refs.get_mut(b as usize) else {
                    return Err(format!("block {b} is outside the pool"));
                };
                *r += 1;
            }
        }
        let mut seen = vec![false; self.blocks.len()];
        for &b in self.free.iter().chain(self.lru.values()) {
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(format!("block {b} is listed twice as available"));
            }
        }
        for (i, block) in self.blocks.iter().enumerate() {
            if block.refs != refs[i] {
                return Err(format!(
                    "block {i}: count {} but {} tables hold it",
                    block.refs, refs[i]
                ));
            }
            if (block.refs == 0) != seen[i] {
                return Err(format!(
                    "block {i}: count {} but available {}",
                    block.refs, seen[i]
                ));
            }
            if let Some((h, toks)) = &block.registered {
                if self.by_hash.get(h) != Some(&(i as BlockId)) || toks.len() != self.block_size {
                    return Err(format!("block {i}: registration out of step"));
                }
            }
            if block.lru_stamp.is_some() != (block.refs == 0 && block.registered.is_some()) {
                return Err(format!("block {i}: LRU membership out of step"));
            }
        }
        if self.by_hash.len()
            != self
                .blocks
                .iter()
                .filter(|b| b.registered.is_some())
                .count()
        {
            return Err("hash map and blocks disagree".into());
        }
        Ok(())
    }
}

/// The blocks of one sequence's windowed layers, in a pool of their own: entry `t` holds
/// logical block `t` (tokens `t * block_size..`) while some query can still see it, else
/// [`WindowTable::UNMAPPED`]. The scheduler maps the blocks a pass needs before it
/// ([`BlockPool::map_window`]) and hands back those that fall out of every window after it
/// ([`BlockPool::release_window_below`]), so a sequence holds about `window + pass` positions
/// of these layers however long it grows.
///
/// Prefix caching works as in the main pool: a full block whose rows are computed is
/// registered under the same prefix hash as the sequence's block in the main table
/// ([`BlockPool::register_window`]), so a later prompt can share it while it stays cached.
#[derive(Debug, Default)]
pub struct WindowTable {
    blocks: Vec<BlockId>,
    /// Entries below this one are registered or were never full-and-held.
    registered: usize,
}

impl WindowTable {
    /// The entry of a block not held.
    pub const UNMAPPED: BlockId = BlockId::MAX;

    /// The table, one entry per logical block so far ([`WindowTable::UNMAPPED`] where none is
    /// held).
    pub fn entries(&self) -> &[BlockId] {
        &self.blocks
    }

    /// The blocks held.
    pub fn held(&self) -> Vec<BlockId> {
        self.blocks
            .iter()
            .copied()
            .filter(|&b| b != Self::UNMAPPED)
            .collect()
    }
}

impl BlockPool {
    /// A window table holding the cached blocks `first..hashes.len()` of a prompt whose leading
    /// full blocks have the prefix hashes `hashes` (the caller checked with
    /// [`BlockPool::cached`] that each is cached).
    pub fn share_window(&mut self, prompt: &[u32], hashes: &[u64], first: usize) -> WindowTable {
        let bs = self.block_size;
        let mut t = WindowTable {
            blocks: vec![WindowTable::UNMAPPED; hashes.len()],
            registered: hashes.len(),
        };
        for (i, &h) in hashes.iter().enumerate().skip(first) {
            if let Some(b) = self.cached(h, &prompt[i * bs..(i + 1) * bs]) {
                self.retain(b);
                t.blocks[i] = b;
            }
        }
        t
    }

    /// Maps every block of tokens `rows` in `t` (allocating the missing ones). Fails, changing
    /// nothing, when the pool cannot supply them.
    pub fn map_window(
        &mut self,
        t: &mut WindowTable,
        rows: std::ops::Range<usize>,
    ) -> Result<(), OutOfBlocks> {
        if rows.is_empty() {
            return Ok(());
        }
        let bs = self.block_size;
        let (first, end) = (rows.start / bs, rows.end.div_ceil(bs));
        let missing = (first..end)
            .filter(|&i| t.blocks.get(i).is_none_or(|&b| b == WindowTable::UNMAPPED))
            .count();
        if missing > self.available() {
            return Err(OutOfBlocks {
                needed: missing,
                available: self.available(),
            });
        }
        if t.blocks.len() < end {
            t.blocks.resize(end, WindowTable::UNMAPPED);
        }
        for i in first..end {
            if t.blocks[i] == WindowTable::UNMAPPED {
                t.blocks[i] = self.take_block().expect("checked above: enough blocks");
            }
        }
        Ok(())
    }

    /// Registers the held full blocks of `t` that `main` has registered (same prefix hashes;
    /// see [`BlockPool::register_computed`]), so that later prompts can share them.
    pub fn register_window(&mut self, t: &mut WindowTable, main: &BlockTable) {
        let bs = self.block_size;
        while t.registered < main.hashes.len().min(t.blocks.len()) {
            let i = t.registered;
            t.registered += 1;
            let b = t.blocks[i];
            if b == WindowTable::UNMAPPED {
                continue;
            }
            let h = main.hashes[i];
            let block = &mut self.blocks[b as usize];
            if block.registered.is_none() && !self.by_hash.contains_key(&h) {
                block.registered = Some((h, main.tokens[i * bs..(i + 1) * bs].into()));
                self.by_hash.insert(h, b);
            }
        }
    }

    /// Releases the blocks of `t` that hold only tokens before `row` (no window sees them any
    /// more).
    pub fn release_window_below(&mut self, t: &mut WindowTable, row: usize) {
        let below = (row / self.block_size).min(t.blocks.len());
        for i in (0..below).rev() {
            let b = std::mem::replace(&mut t.blocks[i], WindowTable::UNMAPPED);
            if b != WindowTable::UNMAPPED {
                self.drop_ref(b);
            }
        }
    }

    /// Releases every block of `t` (the sequence ended, was cancelled or preempted).
    pub fn release_window(&mut self, mut t: WindowTable) {
        self.release_window_below(&mut t, usize::MAX);
    }
}

/// The prefix hash of a block of `tokens` after the prefix hashed to `parent` (0 for the first
/// block). SipHash with fixed keys: the same on every run, so hits do not depend on the process.
fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    #[test]
    fn impossible_sizes_are_errors() {
        assert_eq!(
            BlockPool::new(4, 0).unwrap_err(),
            PoolSizeError::EmptyBlocks
        );
        assert!(matches!(
            BlockPool::new(usize::MAX, 16),
            Err(PoolSizeError::TooManyBlocks { .. })
        ));
        let empty = BlockPool::new(0, 16).unwrap();
        assert_eq!(empty.available(), 0);
    }

    #[test]
    fn a_prompt_gets_the_blocks_its_tokens_need() {
        let mut pool = BlockPool::new(10, 4).unwrap();
        let (t, hit) = pool.allocate_prompt(&toks(0..10)).unwrap();
        assert_eq!(t.blocks(), &[0, 1, 2]);
        assert_eq!(hit.cached_tokens, 0);
        assert_eq!((pool.in_use(), pool.available()), (3, 7));
        pool.check(&[&t]).unwrap();
        pool.release(t);
        assert_eq!(pool.available(), 10);
        pool.check(&[]).unwrap();
    }

    #[test]
    fn appending_crosses_block_boundaries() {
        let mut pool = BlockPool::new(4, 4).unwrap();
        let (mut t, _) = pool.allocate_prompt(&toks(0..3)).unwrap();
        assert_eq!(t.blocks().len(), 1);
        pool.append(&mut t, &[3]).unwrap();
        assert_eq!(t.blocks().len(), 1);
        pool.append(&mut t, &[4]).unwrap();
        assert_eq!(t.blocks().len(), 2);
        pool.append(&mut t, &toks(5..16)).unwrap();
        assert_eq!(t.blocks().len(), 4);
        assert_eq!(t.len(), 16);
        // The pool is empty now: one more token fails and changes nothing.
        let err = pool.append(&mut t, &[16]).unwrap_err();
        assert_eq!(
            err,
            OutOfBlocks {
                needed: 1,
                available: 0
            }
        );
        assert_eq!(t.len(), 16);
        pool.check(&[&t]).unwrap();
    }

    #[test]
    fn shared_prefixes_are_reused_and_counted() {
        let mut pool = BlockPool::new(8, 4).unwrap();
        let system = toks(100..112); // three full blocks
        let mut a_prompt = system.clone();
        a_prompt.extend([1, 2]);
        let (mut a, hit) = pool.allocate_prompt(&a_prompt).unwrap();
        assert_eq!(hit.cached_tokens, 0);
        // Nothing is shared before the KV rows exist.
        let mut b_prompt = system.clone();
        b_prompt.extend([7, 8, 9]);
        pool.register_computed(&mut a, a_prompt.len());
        let (b, hit) = pool.allocate_prompt(&b_prompt).unwrap();
        assert_eq!(hit.cached_tokens, 12);
        assert_eq!(&b.blocks()[..3], &a.blocks()[..3]);
        assert_ne!(b.blocks()[3], a.blocks()[3]);
        assert_eq!(pool.in_use(), 5);
        assert_eq!(
            pool.prefix_stats(),
            PrefixStats {
                queried_blocks: 3 + 3,
                hit_blocks: 3
            }
        );
        pool.check(&[&a, &b]).unwrap();
        // A ends: the shared blocks stay in use by B.
        pool.release(a);
        assert_eq!(pool.in_use(), 4);
        pool.check(&[&b]).unwrap();
        pool.release(b);
        assert_eq!(pool.in_use(), 0);
        assert_eq!(pool.cached_idle(), 3);
        pool.check(&[]).unwrap();
        // Idle cached blocks still serve a later prompt.
        let (c, hit) = pool.allocate_prompt(&b_prompt).unwrap();
        assert_eq!(hit.cached_tokens, 12);
        pool.check(&[&c]).unwrap();
    }

    #[test]
    fn the_last_prompt_token_is_never_served_from_the_cache() {
        let mut pool = BlockPool::new(8, 4).unwrap();
        let prompt = toks(0..8);
        let (mut a, _) = pool.allocate_prompt(&prompt).unwrap();
        pool.register_computed(&mut a, 8);
        // Same 8 tokens: only the first block is shared, the second (holding the last token)
        // is computed again.
        let (b, hit) = pool.allocate_prompt(&prompt).unwrap();
        assert_eq!(hit.cached_tokens, 4);
        assert_eq!(b.blocks()[0], a.blocks()[0]);
        assert_ne!(b.blocks()[1], a.blocks()[1]);
        pool.check(&[&a, &b]).unwrap();
    }

    #[test]
    fn a_prefix_differing_early_shares_nothing_after_the_difference() {
        let mut pool = BlockPool::new(12, 4).unwrap();
        let (mut a, _) = pool.allocate_prompt(&toks(0..13)).unwrap();
        pool.register_computed(&mut a, 13);
        let mut other = toks(0..13);
        other[5] = 999; // second block differs; third block is equal but its prefix is not
        let (b, hit) = pool.allocate_prompt(&other).unwrap();
        assert_eq!(hit.cached_tokens, 4);
        assert_eq!(b.blocks()[0], a.blocks()[0]);
        assert!(b.blocks()[1..].iter().all(|x| !a.blocks().contains(x)));
        pool.check(&[&a, &b]).unwrap();
    }

    #[test]
    fn idle_cached_blocks_are_evicted_least_recently_used_first() {
        let mut pool = BlockPool::new(4, 2).unwrap();
        let (mut a, _) = pool.allocate_prompt(&[1, 2, 3]).unwrap(); // blocks 0, 1
        pool.register_computed(&mut a, 3);
        pool.release(a); // block 0 cached and idle, block 1 (partial) free
        let (mut b, _) = pool.allocate_prompt(&[5, 6, 7]).unwrap();
        pool.register_computed(&mut b, 3);
        pool.release(b);
        assert_eq!(pool.cached_idle(), 2);
        // A 3-block prompt: 2 free blocks, then the older cached block ([1, 2]) is evicted.
        let (c, hit) = pool.allocate_prompt(&[9, 9, 9, 9, 9]).unwrap();
        assert_eq!(hit.cached_tokens, 0);
        assert_eq!(pool.cached_idle(), 1);
        pool.check(&[&c]).unwrap();
        pool.release(c);
        let (d, hit) = pool.allocate_prompt(&[5, 6, 7]).unwrap();
        assert_eq!(hit.cached_tokens, 2, "[5, 6] survived");
        pool.release(d);
        let (e, hit) = pool.allocate_prompt(&[1, 2, 3]).unwrap();
        assert_eq!(hit.cached_tokens, 0, "[1, 2] was evicted");
        pool.check(&[&e]).unwrap();
    }

    #[test]
    fn running_out_changes_nothing_and_counts_idle_hits() {
        let mut pool = BlockPool::new(3, 2).unwrap();
        let (mut a, _) = pool.allocate_prompt(&[1, 2, 3]).unwrap();
        pool.register_computed(&mut a, 3);
        pool.release(a);
        // 3 available (1 idle cached + 2 free). A prompt reusing the cached block needs 3 new
        // blocks besides it, but only 2 remain once the hit is taken.
        let stats = pool.prefix_stats();
        let err = pool.allocate_prompt(&[1, 2, 4, 5, 6, 7, 8]).unwrap_err();
        assert_eq!(
            err,
            OutOfBlocks {
                needed: 3,
                available: 2
            }
        );
        assert_eq!((pool.available(), pool.cached_idle()), (3, 1));
        assert_eq!(
            pool.prefix_stats(),
            stats,
            "a failed request is not counted"
        );
        pool.check(&[]).unwrap();
        let (b, hit) = pool.allocate_prompt(&[1, 2, 4, 5, 6]).unwrap();
        assert_eq!(hit.cached_tokens, 2);
        assert_eq!(pool.available(), 0);
        pool.check(&[&b]).unwrap();
    }

    #[test]
    fn an_equal_prefix_computed_twice_is_registered_once() {
        let mut pool = BlockPool::new(8, 2).unwrap();
        let (mut a, _) = pool.allocate_prompt(&[1, 2, 3]).unwrap();
        let (mut b, _) = pool.allocate_prompt(&[1, 2, 3]).unwrap(); // before a registered
        pool.register_computed(&mut a, 3);
        pool.register_computed(&mut b, 3);
        pool.check(&[&a, &b]).unwrap();
        pool.release(a);
        pool.release(b);
        // b's copy was never registered: it went back to the free list.
        assert_eq!(pool.cached_idle(), 1);
        pool.check(&[]).unwrap();
    }

    #[test]
    fn random_workloads_keep_the_invariants() {
        let mut rng = crate::Rng::new(7);
        let mut pool = BlockPool::new(32, 4).unwrap();
        let mut live: Vec<BlockTable> = Vec::new();
        for step in 0..3000 {
            match rng.next_u64() % 4 {
                0 | 1 => {
                    // Prompts from a few shared prefixes.
                    let base = (rng.next_u64() % 3) as u32 * 100;
                    let len = 1 + (rng.next_u64() % 20) as usize;
                    let prompt: Vec<u32> = (0..len as u32)
                        .map(|i| if i < 12 { base + i } else { 1000 + i })
                        .collect();
                    if let Ok((mut t, hit)) = pool.allocate_prompt(&prompt) {
                        assert!(hit.cached_tokens < prompt.len());
                        pool.register_computed(&mut t, prompt.len());
                        live.push(t);
                    }
                }
                2 if !live.is_empty() => {
                    let i = (rng.next_u64() as usize) % live.len();
                    let mut t = std::mem::take(&mut live[i]);
                    if pool.append(&mut t, &[7]).is_ok() {
                        let n = t.len();
                        pool.register_computed(&mut t, n);
                    }
                    live[i] = t;
                }
                _ if !live.is_empty() => {
                    let i = (rng.next_u64() as usize) % live.len();
                    pool.release(live.swap_remove(i));
                }
                _ => {}
            }
            let refs: Vec<&BlockTable> = live.iter().collect();
            if let Err(e) = pool.check(&refs) {
                panic!("step {step}: {e}");
            }
        }
        for t in live.drain(..) {
            pool.release(t);
        }
        assert_eq!(pool.available(), 32);
        pool.check(&[]).unwrap();
        assert!(pool.prefix_stats().hit_blocks > 0);
    }
}
