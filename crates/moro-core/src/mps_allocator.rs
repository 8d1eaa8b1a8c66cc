//! A model of PyTorch's MPS allocator (Apple GPUs): replaying a sequence of allocations and
//! frees gives the peaks of allocated memory and of the heaps it reserves
//! (`torch.accelerator.max_memory_allocated()` / `max_memory_reserved()`; `torch.mps` has no
//! peak counters).
//!
//! The rules, from torch 2.15's placement-heap allocator (`aten/src/ATen/mps/MPSAllocator.h`
//! and `MPSAllocator.mm`; one stream, no memory pressure, every buffer idle when reused):
//!
//! - a request is aligned to the heap buffer alignment ([`ALIGNMENT`]); above 1 MiB it is
//!   rounded up to one of 32 buckets per power of two, unless that moves it to a larger heap
//!   tier (`get_allocation_size`);
//! - requests up to 1 MiB (`kMaxSmallAlloc`) use the small pool, the rest the large pool;
//! - a request first takes the smallest free block that still holds a buffer, whole, if it
//!   exceeds the request by less than the pool's split threshold (the alignment in the small
//!   pool, 1 MiB in the large); else the smallest free block that is large enough, split
//!   where the rest reaches the threshold, the request at its low end (`get_free_buffer`,
//!   `split_free_block`); free blocks are ordered by size, then heap, then offset;
//! - with no block large enough, the first run of adjacent free blocks of a heap (heaps in
//!   the order they were made) that is large enough is merged and split
//!   (`coalesce_free_blocks`);
//! - else a heap is made: 8 MiB for small requests (`kSmallHeap`), 32 MiB under 10 MiB
//!   (`kLargeHeap`), 1 GiB under 512 MiB (`kXLargeHeap`), else the request rounded up to
//!   2 MiB (`kRoundLarge`) (`HeapBlock::createHeapBlock`);
//! - a freed block goes back to the free blocks with its buffer, merged with nothing; heaps
//!   are kept until `empty_cache()` or memory pressure.
//!
//! Not modelled: memory pressure (past the low watermark, 1.4 × the GPU's recommended
//! working set, a request that would take a 1 GiB heap gets one of its own size and
//! wholly free heaps are released), and buffers the GPU still reads when the CPU frees
//! them, which real runs cannot reuse at once and which then take new heaps.

use std::collections::BTreeSet;

const MIB: u64 = 1 << 20;
/// Alignment of a heap buffer (`heapBufferSizeAndAlignWithLength:`), a device answer the
/// source does not fix: the 16 KiB page of arm64 macOS (`vm_page_size`) is taken.
/// [UNVERIFIED] `PYTORCH_DEBUG_MPS_ALLOCATOR=2` prints it on a Mac.
pub const ALIGNMENT: u64 = 16 << 10;
/// `kMaxSmallAlloc`: the largest request of the small pool.
const MAX_SMALL: u64 = MIB;
/// `kMinLargeAlloc`: requests from here on take 1 GiB heaps.
const MIN_LARGE: u64 = 10 * MIB;
/// `kXLargeHeap`; requests from half of it on take a heap of their own.
const XLARGE_HEAP: u64 = 1024 * MIB;
/// `kRoundLarge`: a heap of its own is rounded up to this.
const ROUND_LARGE: u64 = 2 * MIB;

/// `getHeapTier`: small, large, extra large, or a heap of its own.
const fn tier(size: u64) -> u8 {
    if size <= MAX_SMALL {
        0
    } else if size < MIN_LARGE {
        1
    } else if size < XLARGE_HEAP / 2 {
        2
    } else {
        3
    }
}

/// The heap size a request of `size` (rounded) makes (`HeapBlock::createHeapBlock`).
#[must_use]
pub const fn heap_size(size: u64) -> u64 {
    match tier(size) {
        0 => 8 * MIB,
        1 => 32 * MIB,
        2 => XLARGE_HEAP,
        _ => size.div_ceil(ROUND_LARGE) * ROUND_LARGE,
    }
}

/// `get_allocation_size`: the bytes a request of `n` occupies.
#[must_use]
pub const fn round_size(n: u64) -> u64 {
    let aligned = if n == 0 {
        ALIGNMENT
    } else {
        n.div_ceil(ALIGNMENT) * ALIGNMENT
    };
    if aligned <= MAX_SMALL {
        return aligned;
    }
    // 32 buckets per power of two, at least a page each.
    let power = 1u64 << (63 - aligned.leading_zeros());
    let granule = if power >> 5 > ALIGNMENT {
        power >> 5
    } else {
        ALIGNMENT
    };
    let bucketed = aligned.div_ceil(granule) * granule;
    if tier(bucketed) == tier(aligned) {
        bucketed
    } else {
        aligned
    }
}

#[derive(Debug, Clone)]
struct Block {
    heap: u32,
    offset: u64,
    size: u64,
    in_use: bool,
    /// A buffer is placed on the block (freed blocks keep theirs; split remainders, new
    /// heaps and merged runs have none).
    buffer: bool,
    /// Neighbours in the heap, by offset.
    prev: Option<u32>,
    next: Option<u32>,
}

#[derive(Debug, Clone)]
struct Heap {
    small: bool,
    first: u32,
}

/// A free block: (size, heap, offset, block), the order `available_buffers` keeps.
type FreeKey = (u64, u32, u64, u32);

/// A handle to an allocated block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpsHandle(u32);

/// The allocator's bookkeeping, without memory.
#[derive(Debug, Clone, Default)]
pub struct MpsAllocator {
    blocks: Vec<Block>,
    heaps: Vec<Heap>,
    /// Free blocks of each pool (small, large).
    free: [BTreeSet<FreeKey>; 2],
    /// The free blocks of each pool that hold a buffer.
    cached: [BTreeSet<FreeKey>; 2],
    /// Slots of `blocks` merged away, for new blocks to reuse.
    spare: Vec<u32>,
    allocated: u64,
    reserved: u64,
    peak_allocated: u64,
    peak_reserved: u64,
}

impl MpsAllocator {
    /// An empty allocator.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes in blocks in use (`torch.mps.current_allocated_memory()`).
    #[must_use]
    pub const fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes of heaps (the reserved level; `driver_allocated_memory()` adds Metal's own).
    #[must_use]
    pub const fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The largest [`Self::allocated`] so far.
    #[must_use]
    pub const fn peak_allocated(&self) -> u64 {
        self.peak_allocated
    }

    /// The largest [`Self::reserved`] so far.
    #[must_use]
    pub const fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    /// Allocates `nbytes`.
    pub fn malloc(&mut self, nbytes: u64) -> MpsHandle {
        let size = round_size(nbytes);
        let small = size <= MAX_SMALL;
        let pool = usize::from(!small);
        let min_split = if small { ALIGNMENT } else { MIB };
        let cached = self.cached[pool]
            .range((size, 0, 0, 0)..)
            .next()
            .copied()
            .filter(|k| k.0 - size < min_split);
        let i = if let Some(k) = cached {
            self.unfree(pool, k);
            k.3
        } else if let Some(k) = self.free[pool].range((size, 0, 0, 0)..).next().copied() {
            self.unfree(pool, k);
            self.split(pool, k.3, size, min_split);
            k.3
        } else {
            let i = self
                .coalesced(small, size)
                .unwrap_or_else(|| self.new_heap(small, size));
            self.split(pool, i, size, min_split);
            i
        };
        let b = &mut self.blocks[i as usize];
        b.in_use = true;
        b.buffer = true;
        self.allocated += b.size;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        MpsHandle(i)
    }

    /// Frees a block [`Self::malloc`] gave (once): it keeps its buffer and is merged with
    /// nothing.
    pub fn free(&mut self, h: MpsHandle) {
        let b = &mut self.blocks[h.0 as usize];
        debug_assert!(b.in_use, "double free");
        b.in_use = false;
        self.allocated -= b.size;
        let pool = usize::from(!self.heaps[b.heap as usize].small);
        let k = (b.size, b.heap, b.offset, h.0);
        self.free[pool].insert(k);
        self.cached[pool].insert(k);
    }

    /// Takes a free block out of the free sets.
    fn unfree(&mut self, pool: usize, k: FreeKey) {
        self.free[pool].remove(&k);
        self.cached[pool].remove(&k);
    }

    /// `split_free_block`: block `i` (out of the free sets) keeps the first `size` bytes;
    /// a rest of at least `min_split` becomes a free block of its own, without a buffer.
    fn split(&mut self, pool: usize, i: u32, size: u64, min_split: u64) {
        let b = self.blocks[i as usize].clone();
        let rest = b.size - size;
        if rest < min_split {
            return;
        }
        let r = self.add(Block {
            heap: b.heap,
            offset: b.offset + size,
            size: rest,
            in_use: false,
            buffer: false,
            prev: Some(i),
            next: b.next,
        });
        if let Some(n) = b.next {
            self.blocks[n as usize].prev = Some(r);
        }
        let b = &mut self.blocks[i as usize];
        b.next = Some(r);
        b.size = size;
        b.buffer = false;
        self.free[pool].insert((rest, b.heap, b.offset + size, r));
    }

    /// `coalesce_free_blocks`: the first run of adjacent free blocks of `size` bytes or more,
    /// heaps in the order they were made, merged into one block without a buffer (out of the
    /// free sets).
    fn coalesced(&mut self, small: bool, size: u64) -> Option<u32> {
        let pool = usize::from(!small);
        for h in 0..self.heaps.len() {
            if self.heaps[h].small != small {
                continue;
            }
            let mut run: Vec<u32> = Vec::new();
            let mut sum = 0;
            let mut at = Some(self.heaps[h].first);
            while let Some(i) = at {
                let b = &self.blocks[i as usize];
                at = b.next;
                if b.in_use {
                    run.clear();
                    sum = 0;
                    continue;
                }
                run.push(i);
                sum += b.size;
                if sum >= size {
                    return Some(self.merge(pool, &run, sum));
                }
            }
        }
        None
    }

    /// Merges the adjacent free blocks `run` (in offset order, `sum` bytes) into the first.
    fn merge(&mut self, pool: usize, run: &[u32], sum: u64) -> u32 {
        for &i in run {
            let b = &self.blocks[i as usize];
            let k = (b.size, b.heap, b.offset, i);
            self.unfree(pool, k);
        }
        let (&first, rest) = run.split_first().expect("a run has a block");
        let next = rest.last().map_or(self.blocks[first as usize].next, |&l| {
            self.blocks[l as usize].next
        });
        if let Some(n) = next {
            self.blocks[n as usize].prev = Some(first);
        }
        let b = &mut self.blocks[first as usize];
        b.size = sum;
        b.next = next;
        b.buffer = false;
        self.spare.extend_from_slice(rest);
        first
    }

    /// `alloc_heap`: a new heap for a request of `size`; its one block (out of the free
    /// sets).
    fn new_heap(&mut self, small: bool, size: u64) -> u32 {
        let total = heap_size(size);
        let heap = u32::try_from(self.heaps.len()).expect("fewer than 2^32 heaps");
        let i = self.add(Block {
            heap,
            offset: 0,
            size: total,
            in_use: false,
            buffer: false,
            prev: None,
            next: None,
        });
        self.heaps.push(Heap { small, first: i });
        self.reserved += total;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        i
    }

    fn add(&mut self, b: Block) -> u32 {
        if let Some(i) = self.spare.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            u32::try_from(self.blocks.len() - 1).expect("fewer than 2^32 blocks")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;

    /// Rounding by hand from `get_allocation_size`: pages up to 1 MiB, then 1/32 of the
    /// power of two, kept where a bucket would cross into a larger heap tier.
    #[test]
    fn rounding_follows_the_buckets() {
        assert_eq!(round_size(4), 16 * KIB);
        assert_eq!(round_size(MIB), MIB);
        // 1.5 MiB: a 32 KiB granule.
        assert_eq!(round_size(3 * MIB / 2 + 1), 3 * MIB / 2 + 32 * KIB);
        // 95.4 MiB: a 2 MiB granule, 96 MiB.
        assert_eq!(round_size(95 * MIB + 400 * KIB), 96 * MIB);
        // 9.9 MiB would round to 10 MiB, a larger tier: only page-aligned.
        assert_eq!(round_size(9 * MIB + 900 * KIB), 9 * MIB + 912 * KIB);
        // 510 MiB would reach 512 MiB, a heap of its own: kept.
        assert_eq!(round_size(510 * MIB), 510 * MIB);
        // 600 MiB: a 16 MiB granule, 608 MiB.
        assert_eq!(round_size(600 * MIB), 608 * MIB);
    }

    /// The heaps by tier: 8 MiB, 32 MiB, 1 GiB, then the request's own rounded to 2 MiB.
    #[test]
    fn heaps_by_tier() {
        let mut a = MpsAllocator::new();
        a.malloc(100);
        assert_eq!(a.reserved(), 8 * MIB);
        a.malloc(2 * MIB);
        assert_eq!(a.reserved(), 40 * MIB);
        a.malloc(64 * MIB);
        assert_eq!(a.reserved(), 40 * MIB + 1024 * MIB);
        // The 1 GiB heap has room for fifteen more of 64 MiB.
        for _ in 0..15 {
            a.malloc(64 * MIB);
        }
        assert_eq!(a.reserved(), 1064 * MIB);
        a.malloc(64 * MIB);
        assert_eq!(a.reserved(), 2088 * MIB);
        // 1,000 MiB rounds to 1,008 MiB, more than the 960 MiB left: a heap of its own.
        a.malloc(1000 * MIB);
        assert_eq!(a.reserved(), 2088 * MIB + 1008 * MIB);
        assert_eq!(
            a.allocated(),
            16 * KIB + 2 * MIB + 17 * 64 * MIB + 1008 * MIB
        );
        assert_eq!(a.peak_reserved(), a.reserved());
    }

    /// A freed block is reused whole by a request less than 1 MiB under it, and split by
    /// one further under; the rest serves a later request.
    #[test]
    fn reuse_whole_or_split() {
        let mut a = MpsAllocator::new();
        let x = a.malloc(20 * MIB);
        a.free(x);
        let y = a.malloc(19 * MIB + 512 * KIB);
        assert_eq!(a.allocated(), 20 * MIB, "taken whole");
        a.free(y);
        let _z = a.malloc(8 * MIB);
        assert_eq!(a.allocated(), 8 * MIB, "split");
        // The 12 MiB left of the freed block serves before the heap's 1,004 MiB tail.
        let _w = a.malloc(12 * MIB);
        assert_eq!(a.allocated(), 20 * MIB);
        // 990 MiB rounds to 992 MiB: the tail holds it.
        let _v = a.malloc(990 * MIB);
        assert_eq!(a.reserved(), 1024 * MIB);
        assert_eq!(a.allocated(), 1012 * MIB);
        assert_eq!(a.peak_allocated(), 1012 * MIB);
    }

    /// Thousands of random allocations and frees of sizes from bytes to a gigabyte: each
    /// heap's blocks tile it exactly, in offset order; the free sets hold exactly the free
    /// blocks (the cached set those with a buffer); the allocated bytes are the blocks in
    /// use, each at least its rounded request; the reserved bytes are the heaps.
    #[test]
    fn random_traffic_keeps_the_books() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut a = MpsAllocator::new();
        let mut live: Vec<(MpsHandle, u64)> = Vec::new();
        for step in 0..4000 {
            if live.len() > 40 || (!live.is_empty() && next() % 3 == 0) {
                let i = (next() % live.len() as u64) as usize;
                let (h, _) = live.swap_remove(i);
                a.free(h);
            } else {
                // Sizes spread over every tier: up to 2^30 bytes, log-uniform.
                let bits = next() % 31;
                let n = (next() % (1 << bits)).max(1);
                let h = a.malloc(n);
                assert!(a.blocks[h.0 as usize].size >= round_size(n), "step {step}");
                live.push((h, n));
            }
            check(&a, step);
        }
    }

    fn check(a: &MpsAllocator, step: usize) {
        let mut in_use = 0;
        let mut heaps = 0;
        for (h, heap) in a.heaps.iter().enumerate() {
            let total = heap_size_of(a, h);
            heaps += total;
            let mut offset = 0;
            let mut at = Some(heap.first);
            let mut prev = None;
            while let Some(i) = at {
                let b = &a.blocks[i as usize];
                assert_eq!(b.heap as usize, h, "step {step}");
                assert_eq!(b.offset, offset, "step {step}: blocks tile the heap");
                assert_eq!(b.prev, prev, "step {step}");
                let pool = usize::from(!heap.small);
                let k = (b.size, b.heap, b.offset, i);
                assert_eq!(a.free[pool].contains(&k), !b.in_use, "step {step}");
                assert_eq!(
                    a.cached[pool].contains(&k),
                    !b.in_use && b.buffer,
                    "step {step}"
                );
                if b.in_use {
                    in_use += b.size;
                }
                offset += b.size;
                prev = Some(i);
                at = b.next;
            }
            assert!(
                total.is_multiple_of(ROUND_LARGE) && total >= 8 * MIB,
                "step {step}: heap {h} of {total} bytes"
            );
        }
        let free_blocks: usize = a.free.iter().map(BTreeSet::len).sum();
        let tiled_free = a
            .heaps
            .iter()
            .map(|heap| {
                let mut n = 0;
                let mut at = Some(heap.first);
                while let Some(i) = at {
                    n += usize::from(!a.blocks[i as usize].in_use);
                    at = a.blocks[i as usize].next;
                }
                n
            })
            .sum::<usize>();
        assert_eq!(free_blocks, tiled_free, "step {step}: no stray free entry");
        assert_eq!(a.allocated(), in_use, "step {step}");
        assert_eq!(a.reserved(), heaps, "step {step}");
        assert!(a.peak_reserved() >= a.reserved() && a.peak_allocated() >= a.allocated());
    }

    /// A heap's size as its blocks tile it.
    fn heap_size_of(a: &MpsAllocator, h: usize) -> u64 {
        let mut total = 0;
        let mut at = Some(a.heaps[h].first);
        while let Some(i) = at {
            total += a.blocks[i as usize].size;
            at = a.blocks[i as usize].next;
        }
        total
    }

    /// Free neighbours merge only when no single free block is large enough: two adjacent
    /// freed 256 MiB blocks serve a 500 MiB request (504 MiB rounded) in the same heap.
    #[test]
    fn adjacent_free_blocks_merge_on_demand() {
        let mut a = MpsAllocator::new();
        let x = a.malloc(256 * MIB);
        let y = a.malloc(256 * MIB);
        let _z = a.malloc(256 * MIB);
        a.free(x);
        a.free(y);
        a.malloc(500 * MIB);
        assert_eq!(a.reserved(), 1024 * MIB);
        assert_eq!(a.allocated(), 760 * MIB);
        // The heap's 256 MiB tail takes 200 MiB; then 8 MiB and 56 MiB are free apart, and
        // 60 MiB needs a new heap.
        a.malloc(200 * MIB);
        assert_eq!(a.reserved(), 1024 * MIB);
        a.malloc(60 * MIB);
        assert_eq!(a.reserved(), 2048 * MIB);
    }
}
