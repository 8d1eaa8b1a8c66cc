//! The large pool's cached free blocks of one stream, in the order `get_free_block` searches
//! them: by size, then address (`BlockComparatorSize`, c10/cuda/CUDACachingAllocator.cpp).
//!
//! A step's large pool holds up to hundreds of free blocks, of as many sizes, and takes and
//! returns one at nearly every event: the pool files them in classes of sizes within 1/64 of
//! each other (a class per 1/64th of each power of two, as the small pool has one per 512
//! bytes), each class in order, with a bitmap of the classes that hold any. A search looks
//! in its own class, then jumps to the next class that holds a block.

use super::{SMALL_SIZE, Stream};

/// Classes per power of two: a class holds the sizes within 1/64 of each other.
const SUB: u32 = 64;
/// The smallest power of two of a large block (a large request is over 1 MiB).
const LOW: u32 = SMALL_SIZE.trailing_zeros();
/// Powers of two up to 2^64.
const WORDS: usize = (64 - LOW) as usize;

/// A size's class: its power of two, then its 1/64th within it.
const fn class(size: u64) -> usize {
    let power = 63 - size.leading_zeros();
    let sub = (size >> power.saturating_sub(SUB.trailing_zeros())) as u32 & (SUB - 1);
    ((power.saturating_sub(LOW)) * SUB + sub) as usize
}

/// One entry: (size, address, block index).
type Entry = (u64, u64, u32);

#[derive(Debug, Clone)]
pub(super) struct LargePool {
    pub(super) stream: Stream,
    /// Bit `c % 64` of word `c / 64` is set where class `c` holds a block.
    occupied: [u64; WORDS],
    /// Each class's blocks by size, then address.
    by_class: Vec<Vec<Entry>>,
}

impl LargePool {
    pub(super) fn new(stream: Stream) -> Self {
        Self {
            stream,
            occupied: [0; WORDS],
            by_class: vec![Vec::new(); WORDS * SUB as usize],
        }
    }

    pub(super) fn insert(&mut self, size: u64, addr: u64, block: usize) {
        let c = class(size);
        let list = &mut self.by_class[c];
        let at = list.partition_point(|&(s, a, _)| (s, a) < (size, addr));
        list.insert(at, (size, addr, super::index(block)));
        self.occupied[c / 64] |= 1 << (c % 64);
    }

    pub(super) fn remove(&mut self, size: u64, addr: u64) {
        let c = class(size);
        let list = &mut self.by_class[c];
        if let Ok(at) = list.binary_search_by(|&(s, a, _)| (s, a).cmp(&(size, addr))) {
            list.remove(at);
            if list.is_empty() {
                self.occupied[c / 64] &= !(1 << (c % 64));
            }
        }
    }

    /// The smallest cached block of at least `size` bytes, the lowest address first: in
    /// `size`'s own class, else the first of the next class that holds one.
    pub(super) fn best_fit(&self, size: u64) -> Option<usize> {
        let c = class(size);
        let own = &self.by_class[c];
        if let Some(&(_, _, i)) = own.get(own.partition_point(|&(s, _, _)| s < size)) {
            return Some(i as usize);
        }
        let mut w = c / 64;
        let mut bits = self.occupied[w] & u64::MAX.checked_shl(c as u32 % 64 + 1).unwrap_or(0);
        loop {
            if bits != 0 {
                let k = w * 64 + bits.trailing_zeros() as usize;
                return self.by_class[k].first().map(|&(_, _, i)| i as usize);
            }
            w += 1;
            bits = *self.occupied.get(w)?;
        }
    }

    pub(super) fn blocks(&self) -> Vec<(u64, usize)> {
        self.by_class
            .iter()
            .flatten()
            .map(|&(size, _, i)| (size, i as usize))
            .collect()
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
        let n = 400;
        let size = |j: u64| (j * 37 % n + 2) * MIB;
        for j in 0..n {
            p.insert(size(j), 2 * size(j), 2 * j as usize);
            p.insert(size(j), size(j), 2 * j as usize + 1);
        }
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
        assert!(p.occupied.iter().all(|&w| w == 0));
        assert_eq!(p.best_fit(MIB), None);
    }
}
