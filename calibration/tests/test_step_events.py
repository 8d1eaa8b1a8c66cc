"""The compact form of `step_events.py --matrix-h200` (no torch needed)."""
import json
import os
import sys
import unittest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, ".."))
import step_events  # noqa: E402

TRACES = os.path.join(HERE, "..", "..", "validation", "oracle-traces")
FIXTURES = [os.path.join(TRACES, f) for f in ("step-events-h200.jsonl",
                                                "step-events-h200-dora.jsonl")]


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

    def test_the_fixtures_decode(self):
        rows = []
        for path in FIXTURES:
            self.assertLess(os.path.getsize(path), 320 * 1024, path)
            with open(path) as f:
                rows += [json.loads(line) for line in f]
        self.assertEqual(len(rows), 3)
        self.assertEqual(sum(1 for r in rows if r["job"].get("peft", {}).get("use_dora")), 1)
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
