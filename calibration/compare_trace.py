#!/usr/bin/env python3
"""Compares moro's step trace (`moro estimate --trace FILE`) with a recorded one.

The recorded sequence is either a row of `step_events.py` (fake CUDA tensors; the whole
step from loading) or a real allocator trace the harness wrote with `--snapshot`
(`OUTPUT.traces/ID.json`, allocsim events recorded after the model was built: moro's
loading events are then left out and its loaded tensors counted as already there).

Both are replayed through `allocsim.py` and the allocated and reserved peaks compared; the
first allocation of at least `--min-mib` where the two differ by more than 5 % in size is
printed with what moro calls it.

  moro estimate --model ... --trace /tmp/moro.jsonl
  python3 calibration/compare_trace.py /tmp/moro.jsonl \\
      --events validation/oracle-traces/step-events.jsonl --label LABEL
  python3 calibration/compare_trace.py /tmp/moro.jsonl --snapshot OUT.traces/ID.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocsim  # noqa: E402

MIB = 1 << 20


def read_moro(path: str, skip_load: bool) -> Tuple[List[List[Any]], List[Dict[str, Any]]]:
    """moro's JSON lines as allocsim events, and the allocations themselves."""
    events: List[List[Any]] = []
    allocs: List[Dict[str, Any]] = []
    loaded = set()
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            e = json.loads(line)
            if skip_load and e["phase"] == "load":
                loaded.add(e["tensor"])
                continue
            if e["op"] == "alloc":
                events.append(["a", e["tensor"], e["bytes"]])
                allocs.append(e)
            elif e["tensor"] not in loaded:
                events.append(["f", e["tensor"]])
    return events, allocs


def read_step_events(path: str, label: Optional[str]) -> Tuple[List[List[Any]], List[int]]:
    """A `step_events.py` row as allocsim events, and its allocation sizes in order."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    row = next((r for r in rows if label is None or r.get("label") == label), None)
    if row is None:
        raise SystemExit("no row labelled %r in %s" % (label, path))
    events: List[List[Any]] = []
    sizes: List[int] = []
    if "sizes" in row:
        # The compact form of `--matrix-h200` (step_events.py's module doc).
        made = 0
        for token in row["events"].split():
            if token == "r":
                events.append(["reset"])
            elif token.startswith("-"):
                events.append(["f", made - int(token[1:])])
            else:
                size = row["sizes"][int(token)]
                events.append(["a", made, size])
                sizes.append(size)
                made += 1
        return events, sizes
    for i, e in enumerate(row["events"]):
        if len(e) == 3:
            events.append(["a", i, e[0]])
            sizes.append(e[0])
        else:
            events.append(["f", -1 - e[0]])
    return events, sizes


def read_snapshot(path: str) -> Tuple[List[List[Any]], List[int]]:
    """A harness allocator trace (allocsim events), and its allocation sizes in order."""
    with open(path) as f:
        events = json.load(f)
    return events, [e[2] for e in events if e[0] == "a"]


def first_divergence(recorded: List[int], ours: List[Dict[str, Any]], min_bytes: int) -> Optional[str]:
    """The first large allocation whose sizes differ by more than 5 %, in words."""
    big_rec = [s for s in recorded if s >= min_bytes]
    big_ours = [e for e in ours if e["bytes"] >= min_bytes]
    for k, (r, o) in enumerate(zip(big_rec, big_ours)):
        if abs(o["bytes"] / r - 1.0) > 0.05:
            where = " ".join(str(x) for x in (o.get("module"), "layer %s" % o["layer"] if "layer" in o else None) if x)
            return "large allocation %d: recorded %d B, moro %d B (%s %s, %s of step %d)" % (
                k, r, o["bytes"], o["name"], where, o["phase"], o["step"])
    if len(big_rec) != len(big_ours):
        return "%d large allocations recorded, %d in moro's trace" % (len(big_rec), len(big_ours))
    return None


def compare(ours_events, ours_allocs, rec_events, rec_sizes, min_bytes) -> Dict[str, Any]:
    a = allocsim.replay(ours_events)
    b = allocsim.replay(rec_events)
    return {
        "moro_allocated_peak_bytes": a.peak_allocated,
        "moro_reserved_peak_bytes": a.peak_reserved,
        "recorded_allocated_peak_bytes": b.peak_allocated,
        "recorded_reserved_peak_bytes": b.peak_reserved,
        "allocated_error": a.peak_allocated / b.peak_allocated - 1.0 if b.peak_allocated else None,
        "reserved_error": a.peak_reserved / b.peak_reserved - 1.0 if b.peak_reserved else None,
        "first_divergence": first_divergence(rec_sizes, ours_allocs, min_bytes),
    }


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("moro", help="moro's trace (moro estimate --trace FILE)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--events", help="a step_events.py fixture (JSON lines)")
    src.add_argument("--snapshot", help="a harness allocator trace (OUTPUT.traces/ID.json)")
    p.add_argument("--label", help="the row of --events to compare (default: the first)")
    p.add_argument("--min-mib", type=float, default=16.0, help="allocations compared for the divergence")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    ours_events, ours_allocs = read_moro(args.moro, skip_load=args.snapshot is not None)
    if args.snapshot:
        rec_events, rec_sizes = read_snapshot(args.snapshot)
    else:
        rec_events, rec_sizes = read_step_events(args.events, args.label)
    out = compare(ours_events, ours_allocs, rec_events, rec_sizes, int(args.min_mib * MIB))
    if args.json:
        print(json.dumps(out))
        return 0
    gib = 1 << 30
    print("allocated peak: moro %.3f GiB, recorded %.3f GiB (%+.2f %%)" % (
        out["moro_allocated_peak_bytes"] / gib, out["recorded_allocated_peak_bytes"] / gib,
        100 * (out["allocated_error"] or 0)))
    print("reserved peak:  moro %.3f GiB, recorded %.3f GiB (%+.2f %%)" % (
        out["moro_reserved_peak_bytes"] / gib, out["recorded_reserved_peak_bytes"] / gib,
        100 * (out["reserved_error"] or 0)))
    print("first divergence: %s" % (out["first_divergence"] or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
