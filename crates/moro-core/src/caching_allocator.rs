//! A model of PyTorch's CUDA caching allocator: replaying a sequence of allocations and frees
//! gives the peaks of allocated and reserved memory (`torch.cuda.max_memory_allocated` /
//! `max_memory_reserved`).
//!
//! The rules (c10/cuda/CUDACachingAllocator.cpp, defaults: one stream, no
//! `max_split_size_mb`, no expandable segments, no `roundup_power2_divisions`):
//!
//! - a request is rounded up to a multiple of 512 bytes (`round_size`, `kMinBlockSize`);
//! - requests up to 1 MiB (`kSmallSize`) use the small pool, the rest the large pool;
//! - a request is served by the smallest cached free block of its pool that is large enough,
//!   the lowest address first among equal sizes (`get_free_block`: `lower_bound` on
//!   (size, address));
//! - the block is split when the rest is at least 512 bytes (small pool) or more than 1 MiB
//!   (large pool) (`should_split`);
//! - with no such block a segment is `cudaMalloc`ed: 2 MiB for small requests
//!   (`kSmallBuffer`), 20 MiB for requests under 10 MiB (`kLargeBuffer`, `kMinLargeAlloc`),
//!   else the request rounded up to 2 MiB (`kRoundLarge`) (`get_allocation_size`);
//! - a freed block merges with free neighbours of its own segment, never across segments;
//! - `empty_cache` returns the segments that are wholly free.
//!
//! Streams: a segment belongs to the stream that `cudaMalloc`ed it, and a free block is handed
//! only to a request on that stream (`BlockComparatorSize` orders by stream first and
//! `get_free_block` takes only its own stream's blocks). A block used on other streams
//! (`record_stream`) is counted as freed at once but stays unavailable until those streams'
//! work is done (`free` → `insert_events`; `process_events` returns it). FSDP gathers and
//! reduces on their own streams, so their blocks cannot serve the compute stream.
//!
//! `calibration/allocsim.py` is the same model in Python; replaying the allocations of real
//! training steps through it reproduced an H200's reserved peaks (`calibration/README.md`).

mod large_pool;
mod small_pool;

use large_pool::LargePool;
use small_pool::SmallPool;

const MIN_BLOCK: u64 = 512;
/// Requests up to this size come from the small pool, whose blocks never serve the large
/// pool's (`kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;

/// `round_size`: the bytes a request of `n` occupies.
#[must_use]
pub const fn round_size(n: u64) -> u64 {
    if n < MIN_BLOCK {
        MIN_BLOCK
    } else {
        n.div_ceil(MIN_BLOCK) * MIN_BLOCK
    }
}

/// `get_allocation_size`: the segment `cudaMalloc`ed for a rounded request of `size`.
#[must_use]
pub const fn segment_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// A CUDA stream; [`Stream::COMPUTE`] is the default stream the model runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Stream(pub u32);

impl Stream {
    /// The stream a training step computes on.
    pub const COMPUTE: Self = Self(0);
}

#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: u64,
    small: bool,
    stream: Stream,
    free: bool,
    prev: Option<u32>,
    next: Option<u32>,
}

/// A block's index as a link between neighbours.
fn index(i: usize) -> u32 {
    u32::try_from(i).expect("fewer than 2^32 blocks")
}

/// A handle to an allocated block: its index plus one, so that `Option<Handle>` takes four
/// bytes (a replay keeps one for every tensor it has made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle(std::num::NonZeroU32);

impl Handle {
    fn of(i: usize) -> Self {
        Self(std::num::NonZeroU32::MIN.saturating_add(index(i)))
    }

    const fn index(self) -> usize {
        (self.0.get() - 1) as usize
    }
}

/// A cached free block: (stream, size, address, block index).
type FreeKey = (Stream, u64, u64, usize);

/// The allocator's bookkeeping, without memory.
#[derive(Debug, Clone, Default)]
pub struct CachingAllocator {
    blocks: Vec<Block>,
    /// Cached free blocks of the small pool, one [`SmallPool`] a stream.
    small_free: Vec<SmallPool>,
    /// Cached free blocks of the large pool, one [`LargePool`] a stream.
    large_free: Vec<LargePool>,
    /// Slots of `blocks` merged into a neighbour, for new blocks to reuse: the table stays
    /// as long as the blocks alive at once, not as the blocks ever made.
    merged: Vec<usize>,
    /// Freed blocks still in use on other streams.
    pending: Vec<usize>,
    /// The streams other than its own each block was used on (`record_stream`), for the
    /// blocks that were (only FSDP's streams record them: a short list).
    uses: Vec<(usize, Vec<Stream>)>,
    next_addr: u64,
    allocated: u64,
    reserved: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    /// Bytes in segments that are wholly free now ([`Self::peak_needed`]).
    idle: u64,
    /// The most bytes in segments that hold an allocated block.
    peak_needed: u64,
    /// Bytes in segments per stream now, and each stream's peak.
    by_stream: Vec<(Stream, u64, u64)>,
}

impl CachingAllocator {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes in allocated blocks now.
    #[must_use]
    pub const fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes in `cudaMalloc`ed segments now.
    #[must_use]
    pub const fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The allocated peak since the start or the last [`Self::reset_peaks`].
    #[must_use]
    pub const fn peak_allocated(&self) -> u64 {
        self.peak_allocated
    }

    /// The reserved peak since the start or the last [`Self::reset_peaks`].
    #[must_use]
    pub const fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    /// The most bytes at once in segments that hold an allocated block: the reserved peak
    /// of a GPU only just large enough, where every `cudaMalloc` that fails first returns
    /// the wholly free segments and tries again (`release_cached_blocks`,
    /// CUDACachingAllocator.cpp `alloc_block`). A larger GPU keeps those cached:
    /// [`Self::peak_reserved`].
    #[must_use]
    pub const fn peak_needed(&self) -> u64 {
        self.peak_needed
    }

    /// The most bytes `stream`'s segments held at once (since the start).
    #[must_use]
    pub fn peak_reserved_on(&self, stream: Stream) -> u64 {
        self.by_stream
            .iter()
            .find(|s| s.0 == stream)
            .map_or(0, |s| s.2)
    }

    fn reserve_on(&mut self, stream: Stream, seg: u64) {
        self.reserved += seg;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        if let Some(s) = self.by_stream.iter_mut().find(|s| s.0 == stream) {
            s.1 += seg;
            s.2 = s.2.max(s.1);
        } else {
            self.by_stream.push((stream, seg, seg));
        }
    }

    /// The small pool of `stream`, made on first use.
    fn small_pool(&mut self, stream: Stream) -> &mut SmallPool {
        if self.small_free.first().is_some_and(|p| p.stream == stream) {
            return &mut self.small_free[0];
        }
        let k = match self.small_free.iter().position(|p| p.stream == stream) {
            Some(k) => k,
            None => {
                self.small_free.push(SmallPool::new(stream));
                self.small_free.len() - 1
            }
        };
        &mut self.small_free[k]
    }

    /// The large pool of `stream`, made on first use.
    fn large_pool(&mut self, stream: Stream) -> &mut LargePool {
        if self.large_free.first().is_some_and(|p| p.stream == stream) {
            return &mut self.large_free[0];
        }
        let k = match self.large_free.iter().position(|p| p.stream == stream) {
            Some(k) => k,
            None => {
                self.large_free.push(LargePool::new(stream));
                self.large_free.len() - 1
            }
        };
        &mut self.large_free[k]
    }

    fn cache(&mut self, i: usize) {
        let (stream, size, addr, small) = {
            let b = &self.blocks[i];
            (b.stream, b.size, b.addr, b.small)
        };
        if small {
            self.small_pool(stream).insert(size, addr, i);
        } else {
            self.large_pool(stream).insert(size, addr, i);
        }
    }

    fn uncache(&mut self, i: usize) {
        let (stream, size, addr, small) = {
            let b = &self.blocks[i];
            (b.stream, b.size, b.addr, b.small)
        };
        if small {
            self.small_pool(stream).remove(size, addr);
        } else {
            self.large_pool(stream).remove(size, addr);
        }
    }

    /// Allocates `nbytes` on the compute stream.
    pub fn malloc(&mut self, nbytes: u64) -> Handle {
        self.malloc_on(Stream::COMPUTE, nbytes)
    }

    /// Allocates `nbytes` on `stream`: only that stream's cached blocks can serve it.
    pub fn malloc_on(&mut self, stream: Stream, nbytes: u64) -> Handle {
        let size = round_size(nbytes);
        let small = size <= SMALL_SIZE;
        let found = if small {
            self.small_pool(stream).take(size)
        } else {
            self.large_pool(stream).take(size)
        };
        let i = if let Some(i) = found {
            if self.is_whole(i) {
                self.idle -= self.blocks[i].size;
            }
            i
        } else {
            let seg = segment_size(size);
            let i = self.add_block(Block {
                addr: self.next_addr,
                size: seg,
                small,
                stream,
                free: true,
                prev: None,
                next: None,
            });
            // Segments are never adjacent: blocks of two segments never merge.
            self.next_addr += seg + ROUND_LARGE;
            self.reserve_on(stream, seg);
            i
        };
        let rest = self.blocks[i].size - size;
        if (small && rest >= MIN_BLOCK) || (!small && rest > SMALL_SIZE) {
            let b = &self.blocks[i];
            let r = self.add_block(Block {
                addr: b.addr + size,
                size: rest,
                small,
                stream,
                free: true,
                prev: Some(index(i)),
                next: b.next,
            });
            if let Some(n) = self.blocks[i].next {
                self.blocks[n as usize].prev = Some(index(r));
            }
            self.blocks[i].next = Some(index(r));
            self.blocks[i].size = size;
            self.cache(r);
        }
        self.blocks[i].free = false;
        self.allocated += self.blocks[i].size;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        self.peak_needed = self.peak_needed.max(self.reserved - self.idle);
        Handle::of(i)
    }

    /// `Tensor.record_stream(stream)`: the block is also used on `stream`, so a free waits
    /// for that stream's work (`recordStream` adds to `stream_uses`; its own stream is
    /// ignored).
    pub fn record_stream(&mut self, h: Handle, stream: Stream) {
        let i = h.index();
        if stream == self.blocks[i].stream {
            return;
        }
        match self.uses.iter_mut().find(|u| u.0 == i) {
            Some((_, streams)) if !streams.contains(&stream) => streams.push(stream),
            Some(_) => {}
            None => self.uses.push((i, vec![stream])),
        }
    }

    /// Frees a block allocated by [`Self::malloc`] (once). It no longer counts as allocated;
    /// if it was used on other streams it is cached only once they [`Self::synchronize`].
    pub fn free(&mut self, h: Handle) {
        let i = h.index();
        debug_assert!(!self.blocks[i].free, "double free");
        self.allocated -= self.blocks[i].size;
        if !self.uses.iter().any(|u| u.0 == i) {
            self.release(i);
        } else {
            self.pending.push(i);
        }
    }

    /// `stream`'s queued work is done: the freed blocks that waited only for it (and
    /// streams already done) return to the cache (`process_events`).
    pub fn synchronize(&mut self, stream: Stream) {
        let mut ready = Vec::new();
        let uses = &mut self.uses;
        self.pending.retain(|&i| {
            let Some(k) = uses.iter().position(|u| u.0 == i) else {
                ready.push(i);
                return false;
            };
            uses[k].1.retain(|&s| s != stream);
            let done = uses[k].1.is_empty();
            if done {
                uses.swap_remove(k);
                ready.push(i);
            }
            !done
        });
        for i in ready {
            self.release(i);
        }
    }

    /// Returns block `i` to its pool, merged with free neighbours of its segment.
    fn release(&mut self, mut i: usize) {
        self.blocks[i].free = true;
        if let Some(p) = self.blocks[i]
            .prev
            .map(|p| p as usize)
            .filter(|&p| self.blocks[p].free)
        {
            self.uncache(p);
            self.join(p, i);
            i = p;
        }
        if let Some(n) = self.blocks[i]
            .next
            .map(|n| n as usize)
            .filter(|&n| self.blocks[n].free)
        {
            self.uncache(n);
            self.join(i, n);
        }
        if self.is_whole(i) {
            self.idle += self.blocks[i].size;
        }
        self.cache(i);
    }

    /// Block `i` is its whole segment.
    fn is_whole(&self, i: usize) -> bool {
        self.blocks[i].prev.is_none() && self.blocks[i].next.is_none()
    }

    /// Merges block `right` into `left`, its neighbour in the same segment.
    fn join(&mut self, left: usize, right: usize) {
        let (size, next) = (self.blocks[right].size, self.blocks[right].next);
        self.blocks[left].size += size;
        self.blocks[left].next = next;
        if let Some(n) = next {
            self.blocks[n as usize].prev = Some(index(left));
        }
        self.blocks[right].size = 0;
        self.merged.push(right);
    }

    /// Stores a new block in a merged block's slot, or at the end; returns its index.
    fn add_block(&mut self, b: Block) -> usize {
        if let Some(i) = self.merged.pop() {
            self.blocks[i] = b;
            i
        } else {
            self.blocks.push(b);
            self.blocks.len() - 1
        }
    }

    /// `torch.cuda.empty_cache()`: returns the wholly free segments.
    pub fn empty_cache(&mut self) {
        let small = self
            .small_free
            .iter()
            .flat_map(|p| p.blocks().map(|(size, i)| (p.stream, size, 0, i)));
        let large = self.large_free.iter().flat_map(|p| {
            p.blocks()
                .into_iter()
                .map(|(size, i)| (p.stream, size, 0, i))
        });
        let whole: Vec<FreeKey> = small
            .chain(large)
            .filter(|&(_, _, _, i)| self.is_whole(i))
            .collect();
        for (stream, size, _, i) in whole {
            self.uncache(i);
            self.reserved -= size;
            self.idle -= size;
            if let Some(s) = self.by_stream.iter_mut().find(|s| s.0 == stream) {
                s.1 -= size;
            }
        }
    }

    /// `torch.cuda.reset_peak_memory_stats()`: the peaks become the current values.
    pub const fn reset_peaks(&mut self) {
        self.peak_allocated = self.allocated;
        self.peak_reserved = self.reserved;
        self.peak_needed = self.reserved - self.idle;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn sizes_round_as_pytorch_does() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(segment_size(round_size(1000)), 2 * MIB);
        assert_eq!(segment_size(3 * MIB), 20 * MIB);
        assert_eq!(segment_size(10 * MIB + 1), 12 * MIB);
    }

    /// A freed block is reused by a smaller request, split; the remainder serves the next.
    #[test]
    fn best_fit_with_splitting() {
        let mut a = CachingAllocator::new();
        let x = a.malloc(100 * MIB);
        a.free(x);
        let y = a.malloc(60 * MIB);
        let z = a.malloc(40 * MIB);
        assert_eq!(a.reserved(), 100 * MIB);
        assert_eq!(a.allocated(), 100 * MIB);
        // Nothing fits a third request: a new segment.
        let w = a.malloc(30 * MIB);
        assert_eq!(a.reserved(), 130 * MIB);
        for h in [y, z, w] {
            a.free(h);
        }
        assert_eq!(a.allocated(), 0);
        assert_eq!(a.peak_reserved(), 130 * MIB);
    }

    /// Fragmentation: a block pinned in the middle of a freed segment keeps the next large
    /// request from fitting, though the free bytes would.
    #[test]
    fn a_pinned_block_fragments_the_segment() {
        let mut a = CachingAllocator::new();
        let big = a.malloc(64 * MIB);
        a.free(big);
        let left = a.malloc(30 * MIB);
        let pin = a.malloc(4 * MIB);
        a.free(left);
        // 30 + 30 MiB are free in the segment, but not contiguous.
        let again = a.malloc(40 * MIB);
        assert_eq!(a.reserved(), 64 * MIB + 40 * MIB);
        a.free(pin);
        a.free(again);
        // Now the first segment is whole again and empty_cache returns both.
        a.empty_cache();
        assert_eq!(a.reserved(), 0);
    }

    /// A tensor that grows by copying (a KV cache's `torch.cat`) leaves each old block
    /// behind once the new size outgrows its segment: cached, reserved, but wholly free, so
    /// a GPU short of memory would return it rather than fail.
    #[test]
    fn wholly_free_segments_are_not_needed() {
        let mut a = CachingAllocator::new();
        let first = a.malloc(11 * MIB);
        // 12 MiB segment, 1 MiB tail not split off (a rest of at most 1 MiB stays).
        let second = a.malloc(13 * MIB);
        a.free(first);
        let third = a.malloc(15 * MIB);
        a.free(second);
        // Segments of 12, 14 and 16 MiB; the first two wholly free.
        assert_eq!(a.reserved(), 42 * MIB);
        assert_eq!(a.peak_reserved(), 42 * MIB);
        // At the third request the second and third segments held blocks.
        assert_eq!(a.peak_needed(), 14 * MIB + 16 * MIB);
        // Reusing a wholly free segment makes it needed again: 12 + 16 MiB now.
        let small = a.malloc(11 * MIB);
        assert_eq!(a.reserved(), 42 * MIB);
        assert_eq!(a.peak_needed(), 30 * MIB);
        a.free(third);
        a.free(small);
        a.empty_cache();
        assert_eq!(a.reserved(), 0);
        let again = a.malloc(3 * MIB);
        assert_eq!(a.reserved(), 20 * MIB);
        a.free(again);
    }

    /// Small and large requests never share a segment.
    #[test]
    fn pools_are_separate() {
        let mut a = CachingAllocator::new();
        let s = a.malloc(4096);
        let l = a.malloc(2 * MIB);
        assert_eq!(a.reserved(), 2 * MIB + 20 * MIB);
        a.free(s);
        a.free(l);
        a.reset_peaks();
        assert_eq!(a.peak_reserved(), 22 * MIB);
    }

    /// A block freed on a side stream serves that stream again, never the compute stream.
    #[test]
    fn streams_keep_their_own_blocks() {
        let mut a = CachingAllocator::new();
        let side = Stream(1);
        let gathered = a.malloc_on(side, 100 * MIB);
        a.free(gathered);
        let compute = a.malloc(100 * MIB);
        assert_eq!(
            a.reserved(),
            200 * MIB,
            "the side stream's block is not reused"
        );
        let again = a.malloc_on(side, 100 * MIB);
        assert_eq!(a.reserved(), 200 * MIB, "its own stream reuses it");
        a.free(compute);
        a.free(again);
    }

    /// `record_stream` delays the reuse of a freed block until the stream is done; it is
    /// no longer counted as allocated meanwhile.
    #[test]
    fn a_recorded_stream_defers_the_free() {
        let mut a = CachingAllocator::new();
        let grad = a.malloc(64 * MIB);
        a.record_stream(grad, Stream(2));
        a.free(grad);
        assert_eq!(a.allocated(), 0);
        let next = a.malloc(64 * MIB);
        assert_eq!(a.reserved(), 128 * MIB, "still in use on stream 2");
        a.free(next);
        a.synchronize(Stream(2));
        let third = a.malloc(64 * MIB);
        let fourth = a.malloc(64 * MIB);
        assert_eq!(a.reserved(), 128 * MIB, "both blocks are back in the cache");
        a.free(third);
        a.free(fourth);
    }
}
