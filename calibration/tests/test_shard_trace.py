"""Tests of calibration/shard_trace.py (sharded training on fake tensors).

The expected numbers are computed here from the model config and FSDP's documented
sharding rules, not taken from the tracer. Each traced case runs the tracer in a
child process (one process is one rank of the fake process group), about 10 s each.

Run: python3 -m unittest discover -s calibration/tests -p 'test_shard_trace.py'
     (or pytest calibration/tests/test_shard_trace.py)
Needs the oracle venv's python (torch 2.15, transformers, peft, accelerate,
bitsandbytes) and the oracle at ../shared/oracle; skipped otherwise. The fixture checks
at the end need neither.
"""

import glob
import importlib.util
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TRACER = os.path.join(ROOT, "calibration", "shard_trace.py")
ORACLE = os.environ.get("MORO_ORACLE_DIR") or os.path.normpath(os.path.join(ROOT, "..", "shared", "oracle"))
TRACES = os.path.join(ROOT, "validation", "oracle-traces")


def _have_stack():
    """The tracer's stack, in the torch version whose fake-CUDA patch the oracle verified
    (another torch makes the oracle refuse loudly); MORO_SHARD_TRACE_TESTS=1 forces a run."""
    names = ("torch", "transformers", "peft", "accelerate", "bitsandbytes")
    if not (all(importlib.util.find_spec(n) is not None for n in names) and os.path.isdir(ORACLE)):
        return False
    if os.environ.get("MORO_SHARD_TRACE_TESTS") == "1":
        return True
    from importlib.metadata import version

    return version("torch").startswith("2.15.")


HAVE_STACK = _have_stack()

# A small Llama whose sizes exercise FSDP's padding: hidden 252 (not a multiple of 8,
# so use_orig_params' 16-byte alignment inserts padding after the norms and the
# embedding), vocab 1001 and kv width 126 (not multiples of 4, so dim-0 chunks differ
# between rank 0 and the last rank). head_dim 126 (RoPE needs an even one).
CFG = dict(hidden=252, inter=690, vocab=1001, layers=2, heads=2, kv_heads=1)
OVERRIDES = ["--builtin", "tiny-llama", "--override", "hidden_size=252", "--override", "intermediate_size=690",
             "--override", "vocab_size=1001", "--override", "num_hidden_layers=2",
             "--override", "num_attention_heads=2", "--override", "num_key_value_heads=1"]


def rounded(n):
    return 0 if n <= 0 else (n + 511) // 512 * 512


def layer_shapes(c):
    H, I, hd = c["hidden"], c["inter"], c["hidden"] // c["heads"]
    kv = c["kv_heads"] * hd
    # named_parameters order of LlamaDecoderLayer
    return [(H, H), (kv, H), (kv, H), (H, H), (I, H), (I, H), (H, I), (H,), (H,)]


def root_shapes(c):
    # what the root FSDP unit keeps: embed_tokens, final norm, lm_head (untied)
    return [(c["vocab"], c["hidden"]), (c["hidden"],), (c["vocab"], c["hidden"])]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def fsdp1_layout(shapes, world, itemsize):
    """FSDP1 FlatParameter with use_orig_params=True: each parameter starts at a
    16-byte boundary (padding inserted before it), the total is padded to a multiple
    of the world size, and every rank holds total/world elements.
    Returns (shard_numel, [(start, numel) of each parameter])."""
    align = 16 // itemsize
    off, spans = 0, []
    for s in shapes:
        if off % align:
            off += align - off % align
        spans.append((off, numel(s)))
        off += numel(s)
    if off % world:
        off += world - off % world
    return off // world, spans


def fsdp1_views_in_shard(spans, shard, rank):
    lo, hi = rank * shard, (rank + 1) * shard
    return [max(0, min(hi, a + n) - max(lo, a)) for a, n in spans]


def run_tracer(args, timeout=600):
    proc = subprocess.run([sys.executable, TRACER] + args + ["--print-row"], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError("tracer failed (rc=%d):\n%s" % (proc.returncode, proc.stderr[-3000:]))
    return json.loads(lines[-1])


class HandRulesTest(unittest.TestCase):
    """The tracer's own torch-free helpers against the rules above (no torch needed)."""

    def test_helpers(self):
        sys.path.insert(0, os.path.join(ROOT, "calibration"))
        import shard_trace as st

        self.assertEqual(st.rounded(1), 512)
        self.assertEqual(st.rounded(513), 1024)
        shapes = layer_shapes(CFG)
        for w in (2, 4):
            shard, spans = fsdp1_layout(shapes, w, 2)
            self.assertEqual(st.fsdp1_flat_numel([numel(s) for s in shapes], 2, w), shard * w)
        self.assertEqual([st.fsdp2_local_rows(1001, 4, r) for r in range(4)], [251, 251, 251, 248])
        self.assertEqual([st.fsdp2_local_rows(126, 4, r) for r in range(4)], [32, 32, 32, 30])


@unittest.skipUnless(HAVE_STACK, "needs torch/transformers/peft/accelerate/bitsandbytes and the oracle")
class ShardedBytesTest(unittest.TestCase):
    def test_fsdp1_flat_param_shards(self):
        """FSDP1 (accelerate: bf16 load, flat params upcast to fp32): per-unit shard numel
        and the bytes of all sharded parameters on rank 0 and the last rank of 4."""
        L = CFG["layers"]
        want_units = []
        for shapes in [root_shapes(CFG)] + [layer_shapes(CFG)] * L:
            shard, _ = fsdp1_layout(shapes, 4, 2)  # aligned when flattened in bf16
            want_units.append(shard)
        want_bytes = sum(rounded(4 * s) for s in want_units)  # then fp32
        for rank in (0, 3):
            row = run_tracer(OVERRIDES + ["--fsdp", "1", "--method", "full", "--world", "4", "--rank", str(rank),
                                          "--batch", "1", "--seq", "8", "--steps", "1"])
            got = sorted(u["shard_numel"] for u in row["units"] for _ in range(u["count"]))
            self.assertEqual(got, sorted(want_units))
            self.assertEqual(row["dist"]["sharded_param_storage_bytes"], want_bytes)
            self.assertEqual(row["measured"]["phases"]["after_wrap"]["end_by_category"]["params_sharded_trainable"],
                             want_bytes)

    def test_fsdp2_dim0_chunks(self):
        """FSDP2 (torchtune style, bf16): each parameter is chunked on dim 0 into
        ceil(d0/4) rows, the local storage padded to that size on every rank, while the
        last rank's unpadded shard is smaller."""
        shapes = root_shapes(CFG) + layer_shapes(CFG) * CFG["layers"]
        want_storage = sum(rounded(2 * (-(-s[0] // 4)) * numel(s[1:])) for s in shapes)
        local = {}
        for rank in (0, 3):
            rows = lambda s: max(0, min(-(-s[0] // 4), s[0] - rank * (-(-s[0] // 4))))  # noqa: E731
            want_local = sum(rows(s) * numel(s[1:]) for s in shapes)
            row = run_tracer(OVERRIDES + ["--fsdp", "2", "--stack", "torchtune", "--method", "full", "--world", "4",
                                          "--rank", str(rank), "--batch", "1", "--seq", "8", "--steps", "1"])
            self.assertEqual(row["dist"]["sharded_param_storage_bytes"], want_storage)
            local[rank] = sum(u["local_numel"] * u["count"] for u in row["units"])
            self.assertEqual(local[rank], want_local)
        self.assertGreater(local[0], local[3])


@unittest.skipUnless(HAVE_STACK, "needs torch/transformers/peft/accelerate/bitsandbytes and the oracle")
class PeakHandCalcTest(unittest.TestCase):
    def test_fsdp1_full_foreach_peak(self):
        """FSDP1 full fine-tune, foreach AdamW, 8 tokens, no clipping: the peak is
        optimizer.step()'s `_foreach_sqrt` over every parameter. At that moment each
        rank holds, all fp32: its flat-parameter shards (one storage per unit), their
        sharded gradients (one per unit), exp_avg and exp_avg_sq per original parameter
        view in its shard (use_orig_params gives the optimizer views) and one sqrt temp
        per view, the two int64 input tensors, and the bf16 copies FSDP1's MixedPrecision
        (buffer_dtype=bf16) makes of the two rotary buffers (inv_freq, original_inv_freq).
        Stated tolerance: 512 B (one allocator block); the two ranks differ by the
        rounding of their different parameter views."""
        units = [root_shapes(CFG)] + [layer_shapes(CFG)] * CFG["layers"]
        for rank in (0, 1):
            shards = views = 0
            for shapes in units:
                shard, spans = fsdp1_layout(shapes, 2, 2)
                shards += rounded(4 * shard)
                views += sum(rounded(4 * n) for n in fsdp1_views_in_shard(spans, shard, rank))
            head_dim = CFG["hidden"] // CFG["heads"]
            hand = 2 * shards + 3 * views + 2 * rounded(8 * 8) + 2 * rounded(2 * head_dim // 2)
            row = run_tracer(OVERRIDES + ["--fsdp", "1", "--method", "full", "--world", "2", "--rank", str(rank),
                                          "--batch", "1", "--seq", "8", "--adamw-impl", "foreach",
                                          "--max-grad-norm", "0"])
            m = row["measured"]
            self.assertIn("optimizer", m["peak_at"]["phase"])
            self.assertIn("_foreach_sqrt", m["peak_at"]["op"])
            self.assertLessEqual(abs(m["peak_allocated_bytes"] - hand), 512,
                                 "rank %d: traced %d, hand %d" % (rank, m["peak_allocated_bytes"], hand))
            b = m["breakdown_at_peak"]
            self.assertEqual(b["params_sharded_trainable"], shards)
            self.assertEqual(b["grads"], shards)
            self.assertEqual(b["optimizer_states"], 2 * views)


@unittest.skipUnless(HAVE_STACK, "needs torch/transformers/peft/accelerate/bitsandbytes and the oracle")
class MemTrackerAgreementTest(unittest.TestCase):
    def test_fsdp2_torchtune_tiny(self):
        """torch's FSDPMemTracker (entered after step 1) and the tracer agree on the
        peak of steps 2-3, to the byte, and on the sharded parameters."""
        row = run_tracer(OVERRIDES + ["--fsdp", "2", "--stack", "torchtune", "--method", "full", "--world", "2",
                                      "--rank", "1", "--batch", "2", "--seq", "64", "--grad-ckpt", "--memtracker",
                                      "--steps", "3"])
        fmt = row["fsdp_mem_tracker_peak"]
        self.assertEqual(fmt["Total"], row["measured"]["peak_from_step2_bytes"])
        self.assertEqual(fmt["Sharded Param"], row["dist"]["sharded_param_storage_bytes"])


class FixtureRowsTest(unittest.TestCase):
    """The committed fixtures have the oracle's row fields plus `dist` (no torch needed)."""

    def test_rows(self):
        files = sorted(glob.glob(os.path.join(TRACES, "fsdp-*.jsonl")))
        if not files:
            self.skipTest("no fsdp-*.jsonl fixtures yet")
        for path in files:
            self.assertLess(os.path.getsize(path), 320 * 1024, path)
            labels = set()
            with open(path) as f:
                for line in f:
                    row = json.loads(line)
                    for k in ("label", "config", "config_name", "env", "job", "measured", "dist"):
                        self.assertIn(k, row, path)
                    for k in ("peak_allocated_bytes", "peak_at", "after_load_bytes", "phases", "breakdown_at_peak",
                              "by_stream_at_peak"):
                        self.assertIn(k, row["measured"], path)
                    for k in ("world_size", "rank", "fsdp_version", "sharding_strategy", "wrap_policy",
                              "use_orig_params", "mixed_precision", "loading_path", "cpu_offload"):
                        self.assertIn(k, row["dist"], path)
                    m = row["measured"]
                    self.assertEqual(sum(m["breakdown_at_peak"].values()), m["peak_allocated_bytes"], row["label"])
                    self.assertEqual(sum(m["by_stream_at_peak"].values()), m["peak_allocated_bytes"], row["label"])
                    self.assertNotIn(row["label"], labels)
                    labels.add(row["label"])


if __name__ == "__main__":
    unittest.main()
