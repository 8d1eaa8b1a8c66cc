//! The large pool's cached free blocks of one stream, in the order `get_free_block` searches
//! them: by size, then address (`BlockComparatorSize`, c10/cuda/CUDACachingAllocator.cpp).
//!
//! A LoRA step's large pool holds a few dozen free blocks at a time (53 at most over the
//! 142,461 events of a 70B QLoRA step at 4,096 tokens), where a sorted vector's binary search
//! and short move beat a B-tree's node walks; a full fine-tune's or an unchecked QLoRA
//! step's holds hundreds (526 for Qwen2.5-32B at 4,096 tokens without checkpointing), where
//! the moves grow with the list and the tree wins. The pool switches between the two.

use std::collections::BTreeMap;

use super::Stream;

/// Above this many free blocks the pool is a tree; below a quarter of it, a vector again.
const FEW: usize = 96;

/// A free block's place in the order: its size, then its address.
const fn key(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

/// (key, block index), by key.
#[derive(Debug, Clone)]
enum Free {
    Few(Vec<(u128, usize)>),
    Many(BTreeMap<u128, usize>),
}

#[derive(Debug, Clone)]
pub(super) struct LargePool {
    pub(super) stream: Stream,
    free: Free,
}

impl LargePool {
    pub(super) const fn new(stream: Stream) -> Self {
        Self {
            stream,
            free: Free::Few(Vec::new()),
        }
    }

    pub(super) fn insert(&mut self, size: u64, addr: u64, block: usize) {
        let k = key(size, addr);
        match &mut self.free {
            Free::Few(v) if v.len() < FEW => {
                let at = v.partition_point(|&(x, _)| x < k);
                v.insert(at, (k, block));
            }
            Free::Few(v) => {
                let mut tree: BTreeMap<u128, usize> = v.drain(..).collect();
                tree.insert(k, block);
                self.free = Free::Many(tree);
            }
            Free::Many(tree) => {
                tree.insert(k, block);
            }
        }
    }

    pub(super) fn remove(&mut self, size: u64, addr: u64) {
        let k = key(size, addr);
        match &mut self.free {
            Free::Few(v) => {
                if let Ok(at) = v.binary_search_by_key(&k, |&(x, _)| x) {
                    v.remove(at);
                }
            }
            Free::Many(tree) => {
                tree.remove(&k);
                if tree.len() < FEW / 4 {
                    let v = std::mem::take(tree).into_iter().collect();
                    self.free = Free::Few(v);
                }
            }
        }
    }

    /// The smallest free block of at least `size` bytes, the lowest address among equals.
    pub(super) fn best_fit(&self, size: u64) -> Option<usize> {
        let k = key(size, 0);
        match &self.free {
            Free::Few(v) => v.get(v.partition_point(|&(x, _)| x < k)).map(|&(_, i)| i),
            Free::Many(tree) => tree.range(k..).next().map(|(_, &i)| i),
        }
    }

    /// Every free block as (size, block index), by size then address.
    pub(super) fn blocks(&self) -> Vec<(u64, usize)> {
        let size = |k: u128| (k >> 64) as u64;
        match &self.free {
            Free::Few(v) => v.iter().map(|&(k, i)| (size(k), i)).collect(),
            Free::Many(tree) => tree.iter().map(|(&k, &i)| (size(k), i)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// The smallest block that fits, the lowest address among equal sizes; a removed block
    /// is no longer offered.
    #[test]
    fn best_fit_is_the_smallest_then_the_lowest_address() {
        let mut p = LargePool::new(Stream::COMPUTE);
        assert_eq!(p.best_fit(2 * MIB), None);
        p.insert(40 * MIB, 0, 1);
        p.insert(8 * MIB, 900 * MIB, 2);
        p.insert(8 * MIB, 500 * MIB, 3);
        p.insert(3 * MIB, 700 * MIB, 4);
        assert_eq!(p.best_fit(2 * MIB), Some(4));
        assert_eq!(p.best_fit(4 * MIB), Some(3), "lowest address of the size");
        p.remove(8 * MIB, 500 * MIB);
        assert_eq!(p.best_fit(4 * MIB), Some(2));
        p.remove(8 * MIB, 900 * MIB);
        assert_eq!(p.best_fit(4 * MIB), Some(1));
        assert_eq!(p.best_fit(41 * MIB), None);
        assert_eq!(p.blocks(), [(3 * MIB, 4), (40 * MIB, 1)]);
    }

    /// The same answers across the switch to a tree and back: sizes 2 MiB up, inserted out
    /// of order, two blocks of each size (the second at the lower address).
    #[test]
    fn many_blocks_keep_the_order() {
        let mut p = LargePool::new(Stream::COMPUTE);
        let n = 4 * FEW as u64;
        let size = |j: u64| (j * 37 % n + 2) * MIB;
        for j in 0..n {
            p.insert(size(j), 2 * size(j), 2 * j as usize);
            p.insert(size(j), size(j), 2 * j as usize + 1);
        }
        assert!(matches!(p.free, Free::Many(_)));
        // 11 MiB is the smallest size over 10 MiB; its lower address is the second block.
        let j = (0..n).find(|&j| size(j) == 11 * MIB).unwrap_or(0) as usize;
        assert_eq!(p.best_fit(10 * MIB + 1), Some(2 * j + 1));
        let blocks = p.blocks();
        assert_eq!(blocks.len(), 2 * n as usize);
        assert!(blocks.windows(2).all(|w| w[0].0 <= w[1].0));
        for j in 0..n {
            p.remove(size(j), 2 * size(j));
            p.remove(size(j), size(j));
        }
        assert!(matches!(p.free, Free::Few(_)));
        assert_eq!(p.best_fit(MIB), None);
    }
}
