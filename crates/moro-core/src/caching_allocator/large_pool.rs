//! The large pool's cached free blocks of one stream, in the order `get_free_block` searches
//! them: by size, then address (`BlockComparatorSize`, c10/cuda/CUDACachingAllocator.cpp).
//!
//! A step's large pool holds up to hundreds of free blocks, of as many sizes, and takes and
//! returns one at nearly every event: the pool files them in classes of sizes within 1/64 of
//! each other (a class per 1/64th of each power of two, as the small pool has one per 512
//! bytes), each class in order, with a bitmap of the classes that hold any. A search looks
//! in its own class, then jumps to the next class that holds a block. A class that grows
//! past [`FEW`] blocks becomes a ring buffer: its blocks are mostly taken from the front
//! (the lowest address of the smallest size) and returned at the back.

use std::collections::VecDeque;

use super::{SMALL_SIZE, Stream};

/// Classes per power of two: a class holds the sizes within 1/64 of each other.
const SUB: u32 = 64;
/// The smallest power of two of a large block (a large request is over 1 MiB).
const LOW: u32 = SMALL_SIZE.trailing_zeros();
/// Powers of two up to 2^64.
const WORDS: usize = (64 - LOW) as usize;
const _: () = assert!(WORDS <= 64, "one bit of `words` per word");

/// A size's class: its power of two, then its 1/64th within it.
const fn class(size: u64) -> usize {
    let power = 63 - size.leading_zeros();
    let sub = (size >> power.saturating_sub(SUB.trailing_zeros())) as u32 & (SUB - 1);
    ((power.saturating_sub(LOW)) * SUB + sub) as usize
}

/// One entry: (size, address, block index).
type Entry = (u64, u64, u32);

/// Entries above which a class turns from a sorted vector into a sorted ring buffer: a class
/// can hold thousands of blocks of one size (ZeRO-3's partitions), taken from the front and
/// returned at the back, where a vector moves the whole class each time and a ring buffer
/// moves nothing (in the middle it moves the shorter side).
const FEW: usize = 128;

/// One class's blocks: a few from the largest size and highest address down (the block a
/// request takes is then near the end, and a vector moves little), many in a ring buffer
/// from the smallest size and lowest address up (taken from the front).
#[derive(Debug, Clone)]
enum Class {
    Few(Vec<Entry>),
    Many(VecDeque<Entry>),
}

impl Default for Class {
    fn default() -> Self {
        Self::Few(Vec::new())
    }
}

/// A few entries in the ring buffer's order.
fn ascending(mut v: Vec<Entry>) -> VecDeque<Entry> {
    v.reverse();
    v.into()
}

/// A ring buffer's entries in the order of a few.
fn descending(ring: VecDeque<Entry>) -> Vec<Entry> {
    let mut v: Vec<Entry> = ring.into();
    v.reverse();
    v
}

impl Class {
    fn insert(&mut self, e: Entry) {
        if let Self::Few(v) = self
            && v.len() >= FEW
        {
            *self = Self::Many(ascending(std::mem::take(v)));
        }
        match self {
            Self::Few(v) => {
                let at = v.partition_point(|x| (x.0, x.1) > (e.0, e.1));
                v.insert(at, e);
            }
            // Mostly returned at the back: no search then.
            Self::Many(ring) if ring.back().is_none_or(|x| (x.0, x.1) < (e.0, e.1)) => {
                ring.push_back(e);
            }
            Self::Many(ring) => {
                let at = ring.partition_point(|x| (x.0, x.1) < (e.0, e.1));
                ring.insert(at, e);
            }
        }
    }

    /// Removes the entry of `size` at `addr`; whether the class is empty then.
    fn remove(&mut self, size: u64, addr: u64) -> bool {
        match self {
            Self::Few(v) => {
                if let Ok(at) = v.binary_search_by(|x| (size, addr).cmp(&(x.0, x.1))) {
                    v.remove(at);
                }
                v.is_empty()
            }
            Self::Many(ring) => {
                if let Ok(at) = ring.binary_search_by(|x| (x.0, x.1).cmp(&(size, addr))) {
                    ring.remove(at);
                }
                self.thin();
                self.is_empty()
            }
        }
    }

    /// A ring buffer grown thin becomes a few again.
    fn thin(&mut self) {
        if let Self::Many(ring) = self
            && ring.len() < FEW / 4
        {
            *self = Self::Few(descending(std::mem::take(ring)));
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Self::Few(v) => v.is_empty(),
            Self::Many(ring) => ring.is_empty(),
        }
    }

    /// Whether a block of at least `size` bytes is here.
    fn has_at_least(&self, size: u64) -> bool {
        match self {
            Self::Few(v) => v.first().is_some_and(|x| x.0 >= size),
            Self::Many(ring) => ring.back().is_some_and(|x| x.0 >= size),
        }
    }

    /// Removes and returns the first block of at least `size` bytes: the smallest, the
    /// lowest address among equal sizes.
    fn take_at_least(&mut self, size: u64) -> Option<u32> {
        match self {
            Self::Few(v) => {
                let at = v.partition_point(|x| x.0 >= size);
                (at > 0).then(|| v.remove(at - 1).2)
            }
            Self::Many(ring) => {
                let at = ring.partition_point(|x| x.0 < size);
                let taken = ring.remove(at).map(|x| x.2);
                self.thin();
                taken
            }
        }
    }

    fn entries(&self) -> Box<dyn Iterator<Item = &Entry> + '_> {
        match self {
            Self::Few(v) => Box::new(v.iter().rev()),
            Self::Many(ring) => Box::new(ring.iter()),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct LargePool {
    pub(super) stream: Stream,
    /// Bit `c % 64` of word `c / 64` is set where class `c` holds a block.
    occupied: [u64; WORDS],
    /// Bit `w` is set where word `w` of `occupied` is not zero.
    words: u64,
    /// Where each class's blocks are in `lists` ([`NONE`]: nowhere yet), up to the largest
    /// class used: a table without destructors, however many classes the sizes span.
    slot: Vec<u32>,
    /// The blocks of each class used so far.
    lists: Vec<Class>,
}

/// A class with no list yet.
const NONE: u32 = u32::MAX;

impl LargePool {
    pub(super) const fn new(stream: Stream) -> Self {
        Self {
            stream,
            occupied: [0; WORDS],
            words: 0,
            slot: Vec::new(),
            lists: Vec::new(),
        }
    }

    pub(super) fn insert(&mut self, size: u64, addr: u64, block: usize) {
        let c = class(size);
        if self.slot.len() <= c {
            self.slot.resize(c + 1, NONE);
        }
        if self.slot[c] == NONE {
            self.slot[c] = super::index(self.lists.len());
            self.lists.push(Class::default());
        }
        self.lists[self.slot[c] as usize].insert((size, addr, super::index(block)));
        self.occupied[c / 64] |= 1 << (c % 64);
        self.words |= 1 << (c / 64);
    }

    pub(super) fn remove(&mut self, size: u64, addr: u64) {
        let c = class(size);
        if let Some(class) = self.list_mut(c)
            && class.remove(size, addr)
        {
            self.vacate(c);
        }
    }

    /// Class `c` holds no block any more.
    const fn vacate(&mut self, c: usize) {
        self.occupied[c / 64] &= !(1 << (c % 64));
        if self.occupied[c / 64] == 0 {
            self.words &= !(1 << (c / 64));
        }
    }

    /// Removes and returns the smallest cached block of at least `size` bytes, the lowest
    /// address first: in `size`'s own class, else the first of the next class that holds one.
    pub(super) fn take(&mut self, size: u64) -> Option<usize> {
        let c = class(size);
        let (k, size) = match self.list(c) {
            Some(own) if own.has_at_least(size) => (c, size),
            _ => (self.next_occupied(c)?, 0),
        };
        let list = self.list_mut(k)?;
        let i = list.take_at_least(size)?;
        if list.is_empty() {
            self.vacate(k);
        }
        Some(i as usize)
    }

    /// The first class above `c` that holds a block.
    fn next_occupied(&self, c: usize) -> Option<usize> {
        let above = |x: u64, from: usize| x & u64::MAX.checked_shl(from as u32).unwrap_or(0);
        let mut w = c / 64;
        let mut bits = above(self.occupied[w], c % 64 + 1);
        if bits == 0 {
            let later = above(self.words, w + 1);
            if later == 0 {
                return None;
            }
            w = later.trailing_zeros() as usize;
            bits = self.occupied[w];
        }
        Some(w * 64 + bits.trailing_zeros() as usize)
    }

    pub(super) fn blocks(&self) -> Vec<(u64, usize)> {
        // In the order of the classes: by size.
        self.slot
            .iter()
            .filter(|&&k| k != NONE)
            .flat_map(|&k| self.lists[k as usize].entries())
            .map(|&(size, _, i)| (size, i as usize))
            .collect()
    }

    fn list(&self, c: usize) -> Option<&Class> {
        let k = *self.slot.get(c)?;
        self.lists.get(k as usize)
    }

    fn list_mut(&mut self, c: usize) -> Option<&mut Class> {
        let k = *self.slot.get(c)?;
        self.lists.get_mut(k as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// The smallest block that fits, the lowest address among equal sizes; a taken or
    /// removed block is no longer offered.
    #[test]
    fn take_is_the_smallest_then_the_lowest_address() {
        let mut p = LargePool::new(Stream::COMPUTE);
        assert_eq!(p.take(2 * MIB), None);
        p.insert(40 * MIB, 0, 1);
        p.insert(8 * MIB, 900 * MIB, 2);
        p.insert(8 * MIB, 500 * MIB, 3);
        p.insert(3 * MIB, 700 * MIB, 4);
        p.insert(8 * MIB, 100 * MIB, 5);
        assert_eq!(p.take(2 * MIB), Some(4));
        assert_eq!(p.take(4 * MIB), Some(5), "lowest address of the size");
        p.remove(8 * MIB, 500 * MIB);
        assert_eq!(p.take(4 * MIB), Some(2));
        assert_eq!(p.blocks(), [(40 * MIB, 1)]);
        assert_eq!(p.take(41 * MIB), None);
        assert_eq!(p.take(4 * MIB), Some(1), "the next occupied class");
        assert_eq!(p.take(2 * MIB), None);
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
        assert_eq!(p.take(10 * MIB + 1), Some(2 * j + 1));
        p.insert(11 * MIB, 11 * MIB, 2 * j + 1);
        let blocks = p.blocks();
        assert_eq!(blocks.len(), 2 * n as usize);
        assert!(blocks.windows(2).all(|w| w[0].0 <= w[1].0));
        for j in 0..n {
            p.remove(size(j), 2 * size(j));
            p.remove(size(j), size(j));
        }
        assert!(p.occupied.iter().all(|&w| w == 0));
        assert_eq!(p.take(MIB), None);
    }

    /// Thousands of blocks of one size (ZeRO-3's partitions) are served lowest address
    /// first, through a ring buffer and back.
    #[test]
    fn one_size_many_blocks() {
        let mut p = LargePool::new(Stream::COMPUTE);
        let n = 8 * FEW as u64;
        for j in (0..n).rev() {
            p.insert(6 * MIB, j * 8 * MIB, j as usize);
        }
        p.insert(7 * MIB, 0, n as usize);
        assert!(matches!(p.list(class(6 * MIB)), Some(Class::Many(_))));
        p.remove(6 * MIB, 8 * MIB);
        assert_eq!(p.take(5 * MIB), Some(0));
        for j in 2..n {
            assert_eq!(p.take(5 * MIB), Some(j as usize));
        }
        assert!(matches!(p.list(class(6 * MIB)), Some(Class::Few(_))));
        assert_eq!(p.take(5 * MIB), Some(n as usize), "the next size up");
    }

    /// A crowded class filled from the back, then given a block in its middle, serves the
    /// lowest address first.
    #[test]
    fn a_crowded_class_keeps_its_order() {
        let mut p = LargePool::new(Stream::COMPUTE);
        let n = 2 * FEW as u64;
        for j in 0..n {
            p.insert(6 * MIB, 16 * j * MIB, j as usize);
        }
        assert!(matches!(p.list(class(6 * MIB)), Some(Class::Many(_))));
        p.insert(6 * MIB, 8 * MIB, n as usize);
        assert_eq!(p.take(5 * MIB), Some(0));
        assert_eq!(p.take(5 * MIB), Some(n as usize), "the middle one");
        for j in 1..n {
            assert_eq!(p.take(5 * MIB), Some(j as usize));
        }
        assert_eq!(p.take(5 * MIB), None);
    }
}
