"""The caching-allocator model on hand-made sequences (each figure by hand)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import allocsim as s  # noqa: E402

MIB = 1 << 20


class AllocatorTest(unittest.TestCase):
    def test_rounding_and_segment_sizes(self):
        self.assertEqual(s.round_size(1), 512)
        self.assertEqual(s.round_size(513), 1024)
        self.assertEqual(s.segment_size(MIB), 2 * MIB)
        self.assertEqual(s.segment_size(MIB + 512), 20 * MIB)
        self.assertEqual(s.segment_size(10 * MIB), 10 * MIB)
        self.assertEqual(s.segment_size(10 * MIB + 1), 12 * MIB)

    def test_small_requests_share_a_segment(self):
        a = s.replay([["a", 1, 600 * 1024], ["a", 2, 600 * 1024], ["a", 3, 900 * 1024]])
        # 600 KiB + 600 KiB fit one 2 MiB segment; the third needs another.
        self.assertEqual(a.reserved, 4 * MIB)
        self.assertEqual(a.allocated, 2100 * 1024)

    def test_a_large_block_is_split_and_its_rest_reused(self):
        a = s.replay([["a", 1, 5 * MIB], ["a", 2, 12 * MIB]])
        # 5 MiB takes a 20 MiB segment; the 15 MiB rest serves 12 MiB.
        self.assertEqual(a.reserved, 20 * MIB)
        a = s.replay([["a", 1, 5 * MIB], ["a", 2, 16 * MIB]])
        self.assertEqual(a.reserved, 36 * MIB)

    def test_a_split_block_fragments_the_cache(self):
        a = s.replay([["a", 1, 100 * MIB], ["f", 1], ["a", 2, 30 * MIB], ["a", 3, 100 * MIB]])
        # 30 MiB is cut from the cached 100 MiB block; the next 100 MiB needs a new segment.
        self.assertEqual((a.peak_allocated, a.peak_reserved), (130 * MIB, 200 * MIB))

    def test_best_fit_picks_the_smallest_block(self):
        a = s.replay([["a", 1, 100 * MIB], ["a", 2, 40 * MIB], ["f", 1], ["f", 2],
                      ["a", 3, 30 * MIB], ["a", 4, 100 * MIB]])
        # 30 MiB goes to the 40 MiB block, so the 100 MiB block is whole for the last request.
        self.assertEqual(a.peak_reserved, 140 * MIB)

    def test_freed_neighbours_merge_within_a_segment(self):
        a = s.replay([["a", 1, 100 * MIB], ["f", 1],
                      ["a", 2, 30 * MIB], ["a", 3, 30 * MIB], ["a", 4, 40 * MIB],
                      ["f", 3], ["f", 2], ["f", 4], ["a", 5, 100 * MIB]])
        self.assertEqual(a.peak_reserved, 100 * MIB)

    def test_empty_cache_returns_only_wholly_free_segments(self):
        a = s.replay([["a", 1, 100 * MIB], ["a", 2, 50 * MIB], ["a", 3, 10 * MIB],
                      ["f", 1], ["f", 3], ["reset"]])
        self.assertEqual(a.reserved, 50 * MIB)
        self.assertEqual((a.peak_allocated, a.peak_reserved), (50 * MIB, 50 * MIB))


if __name__ == "__main__":
    unittest.main()
