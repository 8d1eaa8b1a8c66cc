//! The small pool's cached free blocks of one stream, found best-fit without a tree.
//!
//! Small blocks live in 2 MiB segments (`kSmallBuffer`) and are multiples of 512 bytes, so
//! a block's size is one of 4,096 classes. A bitmap marks the classes that hold a free
//! block; each class keeps its blocks by address. The smallest fitting block, the lowest
//! address first among equal sizes, is then the first set bit at or above the request's
//! class and the lowest address of that class: the order of `BlockComparatorSize`
//! (c10/cuda/CUDACachingAllocator.cpp) that the large pool's ordered set follows.

use super::{MIN_BLOCK, SMALL_BUFFER, Stream};

/// Size classes: 512 bytes to 2 MiB.
const CLASSES: usize = (SMALL_BUFFER / MIN_BLOCK) as usize + 1;
const WORDS: usize = CLASSES.div_ceil(64);

#[derive(Debug, Clone)]
pub(super) struct SmallPool {
    pub(super) stream: Stream,
    occupied: [u64; WORDS],
    /// Each class's free blocks as (address, block index), the highest address first: the
    /// lowest, which a request takes, is the last.
    by_class: Vec<Vec<(u64, usize)>>,
}

const fn class(size: u64) -> usize {
    (size / MIN_BLOCK) as usize
}

impl SmallPool {
    pub(super) fn new(stream: Stream) -> Self {
        Self {
            stream,
            occupied: [0; WORDS],
            by_class: Vec::new(),
        }
    }

    pub(super) fn insert(&mut self, size: u64, addr: u64, block: usize) {
        let c = class(size);
        if self.by_class.len() <= c {
            self.by_class.resize_with(c + 1, Vec::new);
        }
        let list = &mut self.by_class[c];
        let at = list.partition_point(|&(a, _)| a > addr);
        list.insert(at, (addr, block));
        self.occupied[c / 64] |= 1 << (c % 64);
    }

    pub(super) fn remove(&mut self, size: u64, addr: u64) {
        let c = class(size);
        let Some(list) = self.by_class.get_mut(c) else {
            return;
        };
        if let Ok(at) = list.binary_search_by(|&(a, _)| addr.cmp(&a)) {
            list.remove(at);
            if list.is_empty() {
                self.occupied[c / 64] &= !(1 << (c % 64));
            }
        }
    }

    /// Removes and returns the smallest free block of at least `size` bytes, the lowest
    /// address among equals.
    pub(super) fn take(&mut self, size: u64) -> Option<usize> {
        let c = class(size);
        let mut w = c / 64;
        let mut bits = self.occupied.get(w)? & (u64::MAX << (c % 64));
        while bits == 0 {
            w += 1;
            bits = *self.occupied.get(w)?;
        }
        let k = w * 64 + bits.trailing_zeros() as usize;
        let list = &mut self.by_class[k];
        let (_, i) = list.pop()?;
        if list.is_empty() {
            self.occupied[k / 64] &= !(1 << (k % 64));
        }
        Some(i)
    }

    /// Every free block as (size, block index).
    pub(super) fn blocks(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.by_class
            .iter()
            .enumerate()
            .flat_map(|(c, list)| list.iter().map(move |&(_, i)| (c as u64 * MIN_BLOCK, i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest block that fits, the lowest address among equal sizes, across the
    /// bitmap's words; a taken or removed block is no longer offered.
    #[test]
    fn take_is_the_smallest_then_the_lowest_address() {
        let mut p = SmallPool::new(Stream::COMPUTE);
        assert_eq!(p.take(512), None);
        p.insert(SMALL_BUFFER, 0, 1);
        p.insert(64 * MIN_BLOCK, 9000, 2);
        p.insert(64 * MIN_BLOCK, 5000, 3);
        p.insert(3 * MIN_BLOCK, 7000, 4);
        p.insert(64 * MIN_BLOCK, 1000, 5);
        assert_eq!(p.take(512), Some(4));
        assert_eq!(
            p.take(4 * MIN_BLOCK),
            Some(5),
            "lowest address of the class"
        );
        p.remove(64 * MIN_BLOCK, 5000);
        assert_eq!(p.blocks().count(), 2);
        assert_eq!(p.take(4 * MIN_BLOCK), Some(2));
        assert_eq!(p.take(4 * MIN_BLOCK), Some(1), "the next word's class");
        assert_eq!(p.take(512), None);
    }
}
