#!/usr/bin/env python3
"""Whether a step's replay could skip work exactly: how often the allocator, at the start of a
stretch of events that frees all it makes, is in a state it was in before that same stretch.

A stretch of one layer's events that allocates and frees only its own tensors, and makes no
new segment, leaves the caching allocator as it found it; where the allocator's cached free
blocks (and segments) are the same as the last time the same stretch ran, the stretch's
blocks, peaks and end state are the same too, and a replay could skip it. This script
replays a trace (`moro estimate --trace FILE`) through `allocsim.py`, cuts each
(step, phase, layer) run of events at the points where none of its own tensors is live,
and counts the events of the stretches that find such a state, three ways: both pools'
free blocks with their addresses, the large pool's alone, and the sizes of the large
pool's free blocks alone (docs/speed.md has what a 70B QLoRA step gives).

Usage: replay_windows.py TRACE.jsonl
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocsim  # noqa: E402


def states(a: allocsim.Allocator):
    """The allocator's state three ways, from the most to the least it says."""
    large = tuple(a._free[False])
    return {
        "both pools": (tuple(a._free[True]), large, a.reserved),
        "large pool": (large, a.reserved),
        "large pool's sizes": tuple(size for size, _ in large),
    }


def runs(events):
    """The events cut into runs of one step, phase and layer."""
    out = []
    for e in events:
        key = (e["step"], e["phase"], e.get("layer"))
        if not out or out[-1][0] != key:
            out.append((key, []))
        out[-1][1].append(e)
    return out


def stretches(run):
    """A run cut where none of its own tensors is live: (events, closed) pairs, closed where
    the stretch makes and frees only its own tensors."""
    made = {e["tensor"] for e in run if e["op"] == "alloc"}
    freed = {e["tensor"] for e in run if e["op"] == "free"}
    out, cur, live = [], [], 0
    for e in run:
        t = e["tensor"]
        own = t in made and t in freed
        if not own:
            if cur:
                out.append((cur, False))
                cur, live = [], 0
            out.append(([e], False))
            continue
        cur.append(e)
        live += 1 if e["op"] == "alloc" else -1
        if live == 0:
            out.append((cur, True))
            cur = []
    if cur:
        out.append((cur, False))
    return out


def count(events):
    """(closed events, {way: events that find a state seen before}) of a trace's events."""
    a = allocsim.Allocator()
    live = {}
    seen = {way: set() for way in states(a)}
    skippable = {way: 0 for way in seen}
    closed_events = 0

    def apply(e):
        if e["op"] == "alloc":
            live[e["tensor"]] = a.malloc(e["bytes"])
        else:
            a.free(live.pop(e["tensor"]))

    for _, run in runs(events):
        for evs, closed in stretches(run):
            if not closed:
                for e in evs:
                    apply(e)
                continue
            closed_events += len(evs)
            content = tuple((e["op"], e["bytes"]) for e in evs)
            before = states(a)
            reserved = a.reserved
            for e in evs:
                apply(e)
            no_new_segment = a.reserved == reserved
            for way, state in before.items():
                key = (content, state)
                if key in seen[way] and no_new_segment:
                    skippable[way] += len(evs)
                seen[way].add(key)
    return closed_events, skippable


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        events = [json.loads(line) for line in f if line.strip()]
    closed_events, skippable = count(events)
    print(f"{len(events)} events, {closed_events} in stretches that free all they make")
    for way, n in skippable.items():
        print(f"  {way}: {n} events find a state seen before")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
