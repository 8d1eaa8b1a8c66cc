#!/usr/bin/env python
"""Fake-tensor trace of a training step of a transformers 5 MoE model (gpt-oss, ...).

transformers 5 runs routed experts through `grouped_mm` (`integrations/moe.py`,
`experts_implementation="grouped_mm"`, the default), which asks the device for its compute
capability before picking the kernel. On a machine without a GPU that question fails, so this
wrapper answers it as an sm90 GPU (H100/H200) would, then runs the fake-CUDA oracle
(../shared/oracle/oracle.py) unchanged: every option is the oracle's.

`--matrix gpt-oss` regenerates validation/oracle-traces/gpt-oss.jsonl (the cases
crates/moro-core/tests/gpt_oss.rs checks; about 5 minutes on two cores). The model config
is data/models/openai--gpt-oss-20b.json without its `quantization_config` (a fine-tune
dequantizes the MXFP4 experts to bf16: `Mxfp4Config(dequantize=True)`, as the OpenAI
cookbook and TRL's gpt-oss recipe load it).

Example (PY = the oracle venv's python, from the repository root):
  $PY calibration/moe_trace.py --config /tmp/gpt-oss-20b.json --method lora \\
      --lora-targets q_proj,k_proj,v_proj,o_proj --precision bf16 --attn eager \\
      --batch 1 --seq 1024
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
ORACLE_DIR = os.environ.get("MORO_ORACLE_DIR") or os.path.normpath(
    os.path.join(ROOT, "..", "shared", "oracle")
)
TRACES = os.path.join(ROOT, "validation", "oracle-traces", "gpt-oss.jsonl")
CONFIG = os.path.join(ROOT, "data", "models", "openai--gpt-oss-20b.json")

# (label, oracle arguments) of the traced cases.
ATTN = ["--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--attn", "eager"]
MATRIX = [
    ("lora bf16 1x1024", ["--method", "lora", "--precision", "bf16", "--batch", "1", "--seq", "1024"]),
    ("lora bf16 2x2048 ckpt", ["--method", "lora", "--precision", "bf16", "--batch", "2", "--seq", "2048", "--grad-ckpt"]),
    ("lora bf16-mixed 1x1024", ["--method", "lora", "--precision", "bf16-mixed", "--batch", "1", "--seq", "1024"]),
    ("full bf16 fused 1x4096", ["--method", "full", "--precision", "bf16", "--adamw-impl", "fused", "--batch", "1", "--seq", "4096"]),
    ("full bf16 1x2048 ckpt", ["--method", "full", "--precision", "bf16", "--adamw-impl", "foreach", "--batch", "1", "--seq", "2048", "--grad-ckpt"]),
    ("qlora bf16 1x1024 ckpt", ["--method", "qlora", "--precision", "bf16", "--batch", "1", "--seq", "1024", "--grad-ckpt"]),
]


def answer_compute_capability() -> None:
    """`torch.cuda.get_device_capability` as on an sm90 GPU (no driver here)."""
    import torch

    torch.cuda.get_device_capability = lambda device=None: (9, 0)


def dequantized_config() -> str:
    """The gpt-oss-20b config without `quantization_config`, in a temporary file."""
    with open(CONFIG) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    path = os.path.join(tempfile.mkdtemp(), "openai--gpt-oss-20b.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run_matrix() -> None:
    """Every case, one subprocess each, into TRACES (cases already there are kept: delete
    the file to trace everything again)."""
    done = set()
    if os.path.exists(TRACES):
        with open(TRACES) as f:
            done = {json.loads(line).get("label") for line in f}
    config = dequantized_config()
    try:
        for case, args in MATRIX:
            label = "gpt-oss-20b " + case
            if label in done:
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "--config", config,
                   *args, *ATTN, "--label", label, "--out", TRACES]
            print(label, flush=True)
            subprocess.run(cmd, check=True)
    finally:
        os.unlink(config)
        os.rmdir(os.path.dirname(config))


def main() -> None:
    if sys.argv[1:] == ["--matrix", "gpt-oss"]:
        run_matrix()
        return
    answer_compute_capability()
    sys.path.insert(0, ORACLE_DIR)
    import oracle

    args = oracle.build_parser().parse_args(sys.argv[1:])
    res = oracle.run(args)
    res["label"] = args.label
    res["env"]["device_capability_answered"] = "9.0"
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    m = res["measured"]
    print("peak_allocated %.4f GiB at %s" % (m["peak_allocated_gib"], m["peak_at"]))
    print(json.dumps(m["breakdown_at_peak_gib"]))


if __name__ == "__main__":
    main()
