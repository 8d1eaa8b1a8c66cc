"""The count of skippable stretches on hand-made traces (each figure by hand)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import replay_windows as w  # noqa: E402

MIB = 1 << 20


def ev(op, tensor, nbytes, layer):
    return {"op": op, "tensor": tensor, "bytes": nbytes, "step": 1, "phase": "forward",
            "layer": layer}


class ReplayWindowsTest(unittest.TestCase):
    def test_a_run_is_cut_where_none_of_its_own_tensors_is_live(self):
        run = [ev("alloc", 1, MIB, 0), ev("alloc", 2, MIB, 0), ev("free", 1, MIB, 0),
               ev("free", 2, MIB, 0), ev("free", 9, MIB, 0), ev("alloc", 3, MIB, 0),
               ev("free", 3, MIB, 0), ev("alloc", 4, MIB, 0)]
        cut = [([e["tensor"] for e in evs], closed) for evs, closed in w.stretches(run)]
        self.assertEqual(cut, [([1, 2, 1, 2], True), ([9], False), ([3, 3], True),
                               ([4], False)])

    def test_a_stretch_is_skippable_once_it_finds_a_state_again(self):
        # A kept 100 MiB tensor, then three layers that each make and free 30 MiB: the
        # first makes a segment, the second finds the state the first left, the third the
        # same state as the second: only the third's two events could be skipped.
        events = [ev("alloc", 0, 100 * MIB, None)]
        for layer in (1, 2, 3):
            events += [ev("alloc", layer, 30 * MIB, layer), ev("free", layer, 30 * MIB, layer)]
        closed, skippable = w.count(events)
        self.assertEqual(closed, 6)
        self.assertEqual(skippable, {"both pools": 2, "large pool": 2, "large pool's sizes": 2})


if __name__ == "__main__":
    unittest.main()
