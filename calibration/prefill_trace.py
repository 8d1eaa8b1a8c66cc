#!/usr/bin/env python
"""The allocated peak of a prefill (one forward under `torch.no_grad` with a KV cache, the
last position's logits kept, as `generate` runs it) on fake CUDA tensors, with the
fake-CUDA oracle's tracker (../shared/oracle: the real transformers model built from its
config, bf16 weights, SDPA as an sm80+ GPU picks it).

  $PY calibration/prefill_trace.py --config CONFIG.json --seq 4096 [--label L] [--out FILE]

`--config` takes a config.json; keys of `--set KEY=JSON` override it. The row holds the
config, the overrides, the sequence and the peak; `crates/moro-core/tests/` compares moro's
inference estimate with it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
ORACLE_DIR = os.environ.get("MORO_ORACLE_DIR") or os.path.normpath(
    os.path.join(ROOT, "..", "shared", "oracle"))


def fake_inference_setup():
    """The oracle's fake CUDA, transformers' fake-tensor patches and an sm80+ GPU's SDPA
    choice, for a forward under `no_grad`; returns the oracle module and a fresh tracker."""
    sys.path.insert(0, ORACLE_DIR)
    import torch

    import fakecuda
    import oracle
    from tracker import LiveStorageTracker

    fakecuda.ensure_fake_cuda_backward()
    fakecuda.stub_cuda_queries()
    # transformers 5's `grouped_mm` experts ask for the compute capability (as moe_trace.py
    # answers it): an sm90 GPU's.
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    fakecuda.patch_module_apply_for_fake()
    warnings.filterwarnings("ignore")
    oracle.patch_transformers_for_fake()
    torch.nn.functional.scaled_dot_product_attention = oracle.GpuLikeSDPA("auto")
    return oracle, LiveStorageTracker("cuda")


def load_config(path, sets):
    """A config.json with `KEY=JSON` overrides as transformers builds it, SDPA its attention:
    the config, its keys (overrides applied, `model_type` taken out), the model type and
    the overrides."""
    from transformers import AutoConfig

    with open(path) as f:
        d = json.load(f)
    overrides = {}
    for kv in sets:
        k, v = kv.split("=", 1)
        overrides[k] = json.loads(v)
    d.update(overrides)
    model_type = d.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **d)
    cfg._attn_implementation = "sdpa"
    return cfg, d, model_type, overrides


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--set", action="append", default=[], help="config override KEY=JSON")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--label", default="")
    p.add_argument("--out")
    p.add_argument("--top", type=int, default=0, help="list N largest live tensor groups at the peak")
    args = p.parse_args(argv)

    oracle, tracker = fake_inference_setup()
    tracker.snapshot_top_at_peak = args.top > 0
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from transformers import AutoModelForCausalLM

    cfg, d, model_type, overrides = load_config(args.config, args.set)
    with FakeTensorMode(allow_non_fake_inputs=True):
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.eval()
        for p_ in model.parameters():
            tracker.register(p_, "params_frozen", "param")
        for b in model.buffers():
            tracker.register(b, "buffers", "buffer")
        with tracker:
            ids = torch.randint(0, cfg.vocab_size, (1, args.seq), device="cuda")
            with torch.no_grad():
                model(input_ids=ids, use_cache=True, logits_to_keep=1)
    row = {
        "tracer": "moro-prefill-trace/1",
        "label": args.label,
        "config": dict(d, model_type=model_type),
        "overrides": overrides,
        "seq_len": args.seq,
        "env": oracle.versions(),
        "peak_allocated_bytes": tracker.peak,
        "params_bytes": tracker.peak_cats.get("params_frozen", 0),
    }
    if args.top > 0:
        row["top_live_at_peak"] = tracker.top_live_at_peak(args.top)
    line = json.dumps(row)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
