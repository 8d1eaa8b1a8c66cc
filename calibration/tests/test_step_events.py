"""The compact form of `step_events.py --matrix-h200` (no torch needed)."""
import json
import os
import sys
import unittest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, ".."))
import step_events  # noqa: E402

FIXTURE = os.path.join(HERE, "..", "..", "validation", "oracle-traces", "step-events-h200.jsonl")


class CompactTest(unittest.TestCase):
    def test_a_hand_made_row(self):
        # Loading makes a 100-byte parameter; the step makes 2 MiB, then 100 bytes, frees the
        # 2 MiB (-2: the second-last allocation), then the 100 bytes (-1: the last).
        row = {"phases": ["forward", "setup"], "categories": ["activations", "params_frozen"],
               "events": [[100, 1, 1], [2 << 20, 0, 0], [100, 0, 0], [-2], [-3]],
               "label": "x"}
        out = step_events.compact(row, "moro-cal-x")
        self.assertEqual(out["sizes"], [100, 2 << 20])
        self.assertEqual(out["events"], "0 r 1 0 -2 -1")
        self.assertEqual(out["h200_row"], "moro-cal-x")
        self.assertNotIn("phases", out)

    def test_the_fixture_decodes(self):
        with open(FIXTURE) as f:
            rows = [json.loads(line) for line in f]
        self.assertEqual(len(rows), 2)
        self.assertLess(os.path.getsize(FIXTURE), 320 * 1024)
        for row in rows:
            made, live = 0, set()
            tokens = row["events"].split(" ")
            self.assertEqual(tokens.count("r"), 1)
            for t in tokens:
                if t == "r":
                    continue
                if t.startswith("-"):
                    i = made - int(t[1:])
                    self.assertIn(i, live)
                    live.remove(i)
                else:
                    self.assertLess(int(t), len(row["sizes"]))
                    live.add(made)
                    made += 1


if __name__ == "__main__":
    unittest.main()
