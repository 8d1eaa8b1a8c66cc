"""compare_trace.py on hand-made sequences (each figure by hand)."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import compare_trace as c  # noqa: E402

MIB = 1 << 20


def moro_line(op, tensor, nbytes, phase="forward_end", step=1, name="saved"):
    return json.dumps({"op": op, "tensor": tensor, "name": name, "component": "activations",
                       "phase": phase, "step": step, "bytes": nbytes, "dtype_bytes": 2,
                       "stream": 0})


class CompareTraceTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.moro = os.path.join(self.dir.name, "moro.jsonl")
        with open(self.moro, "w") as f:
            f.write("\n".join([
                moro_line("alloc", 0, 40 * MIB, phase="load", step=0, name="weight"),
                moro_line("alloc", 1, 30 * MIB),
                moro_line("free", 1, 30 * MIB),
                moro_line("alloc", 2, 20 * MIB, name="logits"),
            ]) + "\n")
        self.events = os.path.join(self.dir.name, "events.jsonl")
        with open(self.events, "w") as f:
            # 40 MiB loaded, 30 MiB made and freed, then 24 MiB: the 30 MiB block serves it.
            f.write(json.dumps({"label": "x", "events": [
                [40 * MIB, 0, 0], [30 * MIB, 0, 0], [-2], [24 * MIB, 0, 0]]}) + "\n")

    def tearDown(self):
        self.dir.cleanup()

    def test_peaks_and_the_first_divergence(self):
        ours, allocs = c.read_moro(self.moro, skip_load=False)
        rec, sizes = c.read_step_events(self.events, "x")
        out = c.compare(ours, allocs, rec, sizes, 16 * MIB)
        # moro: 40 + 30 live at most (70 MiB); recorded the same; 20 MiB fits the freed 30.
        self.assertEqual(out["moro_allocated_peak_bytes"], 70 * MIB)
        self.assertEqual(out["recorded_allocated_peak_bytes"], 70 * MIB)
        self.assertEqual(out["moro_reserved_peak_bytes"], 70 * MIB)
        self.assertEqual(out["recorded_reserved_peak_bytes"], 70 * MIB)
        # The third large allocation: 24 MiB recorded, 20 MiB in moro's trace.
        self.assertIn("large allocation 2: recorded %d B, moro %d B (logits" % (24 * MIB, 20 * MIB),
                      out["first_divergence"])

    def test_the_compact_form_reads_as_the_long_one(self):
        compact = os.path.join(self.dir.name, "compact.jsonl")
        with open(compact, "w") as f:
            # sizes[2] loaded, reset, sizes[1] made and freed (one allocation back), sizes[0].
            f.write(json.dumps({"label": "x", "sizes": [24 * MIB, 30 * MIB, 40 * MIB],
                                "events": "2 r 1 -1 0"}) + "\n")
        rec, sizes = c.read_step_events(compact, "x")
        self.assertEqual(rec, [["a", 0, 40 * MIB], ["reset"], ["a", 1, 30 * MIB], ["f", 1],
                               ["a", 2, 24 * MIB]])
        self.assertEqual(sizes, [40 * MIB, 30 * MIB, 24 * MIB])

    def test_a_snapshot_leaves_moros_loading_out(self):
        ours, allocs = c.read_moro(self.moro, skip_load=True)
        self.assertEqual([e[0] for e in ours], ["a", "f", "a"])
        self.assertEqual(len(allocs), 2)


if __name__ == "__main__":
    unittest.main()
