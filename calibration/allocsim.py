#!/usr/bin/env python3
"""Replays an allocation sequence through a model of PyTorch's CUDA caching allocator and
reports the peaks of allocated and reserved memory.

The model (c10/cuda/CUDACachingAllocator.cpp, defaults: one stream, no `max_split_size_mb`,
no expandable segments, no `roundup_power2_divisions`):

* a request is rounded up to a multiple of 512 bytes (`round_size`, `kMinBlockSize`);
* requests up to 1 MiB (`kSmallSize`) use the small pool, the rest the large pool;
* a request is served by the smallest cached free block of its pool that is large enough
  (`get_free_block`: `lower_bound` on (size, address));
* the block is split when the rest is at least 512 bytes (small pool) or more than 1 MiB
  (large pool) (`should_split`);
* with no block, a segment is `cudaMalloc`ed: 2 MiB for small requests (`kSmallBuffer`),
  20 MiB for requests under 10 MiB (`kLargeBuffer`, `kMinLargeAlloc`), else the request
  rounded up to 2 MiB (`kRoundLarge`) (`get_allocation_size`);
* a freed block merges with free neighbours of its own segment, never across segments;
* `empty_cache` returns the segments that are wholly free.

Events (JSON list): `["a", key, nbytes]` allocates, `["f", key]` frees, `["reset"]` empties
the cache and resets the peaks (what a measurement does after loading the model).
"""
import bisect
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(n: int) -> int:
    return MIN_BLOCK if n < MIN_BLOCK else MIN_BLOCK * ((n + MIN_BLOCK - 1) // MIN_BLOCK)


def segment_size(n: int) -> int:
    if n <= SMALL_SIZE:
        return SMALL_BUFFER
    if n < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((n + ROUND_LARGE - 1) // ROUND_LARGE)


class _Block:
    __slots__ = ("segment", "addr", "size", "free", "prev", "next", "small")

    def __init__(self, segment: int, addr: int, size: int, small: bool):
        self.segment, self.addr, self.size, self.small = segment, addr, size, small
        self.free = True
        self.prev: Optional["_Block"] = None
        self.next: Optional["_Block"] = None


class Allocator:
    """The caching allocator's bookkeeping, without memory."""

    def __init__(self) -> None:
        self._free: Dict[bool, List[Tuple[int, int]]] = {True: [], False: []}
        self._blocks: Dict[int, _Block] = {}
        self._segments: Dict[int, int] = {}
        self._next_addr = 0
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0

    def _cache(self, b: _Block) -> None:
        bisect.insort(self._free[b.small], (b.size, b.addr))
        self._blocks[b.addr] = b

    def _uncache(self, b: _Block) -> None:
        pool = self._free[b.small]
        i = bisect.bisect_left(pool, (b.size, b.addr))
        pool.pop(i)

    def malloc(self, nbytes: int) -> int:
        """Allocates; returns the block's address."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            b = self._blocks[pool[i][1]]
            self._uncache(b)
        else:
            seg = segment_size(size)
            b = _Block(self._next_addr, self._next_addr, seg, small)
            self._segments[b.segment] = seg
            # Segments are never adjacent: blocks of two segments never merge.
            self._next_addr += seg + ROUND_LARGE
            self.reserved += seg
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = b.size - size
        if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_SIZE):
            r = _Block(b.segment, b.addr + size, rest, small)
            r.prev, r.next = b, b.next
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, size
            self._cache(r)
        b.free = False
        self._blocks[b.addr] = b
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return b.addr

    def free(self, addr: int) -> None:
        b = self._blocks[addr]
        self.allocated -= b.size
        b.free = True
        prev, nxt = b.prev, b.next
        if prev is not None and prev.free:
            self._uncache(prev)
            b = self._join(prev, b)
        if nxt is not None and nxt.free:
            self._uncache(nxt)
            b = self._join(b, nxt)
        self._cache(b)

    def _join(self, left: _Block, right: _Block) -> _Block:
        """Merges `right` into `left`, its neighbour in the same segment."""
        del self._blocks[right.addr]
        left.size += right.size
        left.next = right.next
        if right.next is not None:
            right.next.prev = left
        return left

    def empty_cache(self) -> None:
        for b in [b for b in self._blocks.values()
                  if b.free and b.prev is None and b.next is None]:
            self._uncache(b)
            del self._blocks[b.addr]
            self.reserved -= self._segments.pop(b.segment)

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


def replay(events: List[List[Any]]) -> Allocator:
    """Runs the events; frees of unknown keys are ignored."""
    a = Allocator()
    live: Dict[Any, int] = {}
    for ev in events:
        op = ev[0]
        if op == "a":
            if int(ev[2]) > 0:
                live[ev[1]] = a.malloc(int(ev[2]))
        elif op == "f":
            addr = live.pop(ev[1], None)
            if addr is not None:
                a.free(addr)
        elif op == "reset":
            a.empty_cache()
            a.reset_peaks()
    return a


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print("usage: allocsim.py EVENTS.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        a = replay(json.load(f))
    print(json.dumps({"peak_allocated_bytes": a.peak_allocated,
                      "peak_reserved_bytes": a.peak_reserved}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
