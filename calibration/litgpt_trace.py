#!/usr/bin/env python
"""litgpt's own LoRA fine-tuning step on fake CUDA tensors: the allocated peak.

Runs the training loop of litgpt's `finetune/lora.py` (the model, `mark_only_lora_as_trainable`,
torch's AdamW, `lm_head_chunk_size=128`, `chunked_cross_entropy`) from a litgpt source tree at
the commit a measured row names, on the fake-CUDA oracle (`../shared/oracle`: FakeTensors, no
weights, every storage tracked). What Fabric's `bf16-true` precision plugin does around the
model is done here in the same order (lightning/fabric/plugins/precision/half.py, 2.4):
parameters are made with the default dtype set to bf16, the forward runs with the default
dtype bf16, and its output is cast back to the default dtype, fp32 (`convert_output`).

Two steps of `--accum` micro-batches each; the loop keeps the previous micro-batch's `logits`
and `loss` alive during the next forward, as the script's loop variables do (with
`--longest-first`, the first micro-batch is the only long one, as lit-gpt 2023 ordered them). Validation and
sample generation (which the published tables also include) are not run: this is the
training step's peak.

  git -C litgpt archive f247be87 litgpt | tar -x -C /tmp/litgpt-f247
  $PY calibration/litgpt_trace.py --litgpt-src /tmp/litgpt-f247 \\
      --config Phi-3-mini-4k-instruct --targets query,key,value,projection,mlp,head \\
      --lora-r 8 --batch 4 --seq 512
  $PY calibration/litgpt_trace.py --matrix --litgpt-repo ../litgpt   # a clone of Lightning-AI/litgpt

`--matrix` traces the published litgpt rows of `validation/measured.jsonl` listed in MATRIX,
each at the litgpt commit it was measured with, and writes `validation/oracle-litgpt.jsonl`: each
row is its measured row with the traced peak as the measurement (about 3 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import types
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
ORACLE_DIR = os.environ.get("MORO_ORACLE_DIR") or os.path.normpath(
    os.path.join(ROOT, "..", "shared", "oracle"))

TRACER = "moro-litgpt-trace/1"
MEASURED = os.path.join(ROOT, "validation", "measured.jsonl")
FIXTURE = os.path.join(ROOT, "validation", "oracle-litgpt.jsonl")

# Published rows traced by `--matrix`: (row id, litgpt config name, AdamW weight decay of
# the script at that commit: 0.01 in lit-gpt 2023's `finetune/lora.py`, 0.0 in the 2024
# config hub's yaml files, the commit traced).
# The commit is the one named here, else the row's (`framework_version` "@commit"). The
# resource tables name lit-gpt 8641822 (2023-10-16), but their Llama 2 7B figure is
# reproduced only with the fp32 RMSNorm of "Half precision fixes" (6178c7cc, 2023-10-24),
# which the commit that added the tables (0cc02afa, 2023-10-27) has: 21.23 GB traced there
# against 21.30 published, 20.54 at 8641822. StableLM (LayerNorm) traces the same at both.
MATRIX = [
    ("litgpt-resource-tables-006", "stablelm-base-alpha-3b", 0.01, "0cc02afa"),
    ("litgpt-resource-tables-009", "stablelm-base-alpha-3b", 0.01, "0cc02afa"),
    ("litgpt-resource-tables-011", "Llama-2-7b-hf", 0.01, "0cc02afa"),
    ("litgpt-resource-tables-016", "Llama-2-13b-hf", 0.01, "0cc02afa"),
    ("litgpt-resource-tables-017", "Llama-2-13b-hf", 0.01, "0cc02afa"),
    ("litgpt-finetune-lora-doc-001", "stablelm-base-alpha-3b", 0.01, "982abcbc"),
    ("litgpt-finetune-lora-doc-004", "stablelm-base-alpha-3b", 0.01, None),
    ("litgpt-config-hub-034", "Phi-3-mini-4k-instruct", 0.0, None),
    ("litgpt-config-hub-037", "stablelm-base-alpha-3b", 0.0, None),
]


@contextlib.contextmanager
def default_dtype(dtype):
    import torch

    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def import_litgpt(src: str):
    """litgpt's modules from `src` without its package `__init__` (which imports the CLI):
    `litgpt/` from 2024, `lit_gpt/` before."""
    import importlib

    name = "litgpt" if os.path.isdir(os.path.join(src, "litgpt")) else "lit_gpt"
    pkg = types.ModuleType(name)
    pkg.__path__ = [os.path.join(src, name)]
    sys.modules[name] = pkg
    importlib.import_module(name + ".model")  # first, as the package's __init__ does
    return importlib.import_module(name + ".lora"), importlib.import_module(name + ".utils")


def quantize(model, double_quant: bool, saves_input: bool) -> None:
    """Fabric's `BitsandbytesPrecision` (lightning 2.1): every `nn.Linear`, lm_head included,
    becomes a 4-bit NF4 Linear (the oracle's `qlora_approx`, bitsandbytes' own code). With
    `saves_input`, `MatMul4Bit` keeps its input as bitsandbytes before 0.43.2 did
    (`ctx.tensors = (A, B)`, 0.41.1 `autograd/_functions.py`) for as long as the graph lives."""
    import torch
    import qlora_approx

    qlora_approx.quantize_linears_nf4(model, compute_dtype=torch.bfloat16, blocksize=64,
                                      double_quant=double_quant, skip=())
    if saves_input:
        from bitsandbytes.autograd._functions import MatMul4Bit

        forward = MatMul4Bit.forward
        if getattr(forward, "_keeps_input", False):
            return

        def keeps_input(ctx, A, B, *rest, **kw):
            out = forward(ctx, A, B, *rest, **kw)
            if any(ctx.needs_input_grad[:2]):
                ctx.tensors = (A, ctx.tensors[1])
            return out

        keeps_input._keeps_input = True
        MatMul4Bit.forward = staticmethod(keeps_input)


def lora_config(lora, args, targets, overrides):
    """The LoRA config in the field names of the tree's release (`lora_r`, `lora_query`, ...
    from 2024; `r`, `to_query`, ... before)."""
    fields = lora.Config.__dataclass_fields__
    new = "lora_r" in fields
    kw = {"lora_r" if new else "r": args.lora_r, "lora_alpha" if new else "alpha": args.lora_alpha,
          "lora_dropout" if new else "dropout": args.lora_dropout}
    for t in ("query", "key", "value", "projection", "mlp", "head"):
        kw[("lora_" if new else "to_") + t] = t in targets
    return lora.Config.from_name(args.config, **kw, **overrides)


def run(args) -> dict:
    sys.path.insert(0, ORACLE_DIR)
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fakecuda
    import oracle
    from tracker import LiveStorageTracker

    notes = ["backward patch: " + fakecuda.ensure_fake_cuda_backward()]
    fakecuda.stub_cuda_queries()
    fakecuda.patch_module_apply_for_fake()
    warnings.filterwarnings("ignore")
    lora, utils = import_litgpt(args.litgpt_src)
    # Some releases divide the loss by `max(1, non_masked_elems)`, a Python comparison with a
    # tensor that fake tensors cannot decide; the count is a positive scalar either way.
    utils.max = lambda a, b: b if isinstance(b, torch.Tensor) else max(a, b)

    sdpa = oracle.GpuLikeSDPA("auto")
    F.scaled_dot_product_attention = sdpa
    torch.nn.functional.scaled_dot_product_attention = sdpa

    targets = set(t for t in args.targets.split(",") if t)
    overrides = {}
    if args.layers:
        overrides["n_layer"] = args.layers
    config = lora_config(lora, args, targets, overrides)

    tracker = LiveStorageTracker("cuda")
    tracker.snapshot_top_at_peak = args.top > 0
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    B, T = args.batch, args.seq
    with fm:
        mixed = args.precision == "bf16-mixed"
        with torch.device("cuda"), default_dtype(torch.float32 if mixed else torch.bfloat16):
            model = lora.GPT(config)
        model.max_seq_length = min(T, config.block_size)
        if args.quantize:
            quantize(model, args.quantize == "nf4-dq", args.bnb_saves_input)
        lora.mark_only_lora_as_trainable(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        for p in model.parameters():
            tracker.register(p, "params_trainable" if p.requires_grad else "params_frozen", "param")
        for b in model.buffers():
            tracker.register(b, "buffers", "buffer")
        if args.quantize:
            import qlora_approx

            for t in qlora_approx.quant_state_tensors(model):
                tracker.register(t, "params_frozen", "nf4 quant_state")
        for p in trainable:
            p.register_post_accumulate_grad_hook(lambda q: tracker.retag(q.grad, "grads"))
        # bitsandbytes' PagedAdamW keeps its states in managed memory, which
        # `max_memory_allocated` does not count: no optimizer is traced for it.
        opt = None if args.paged_optimizer else torch.optim.AdamW(
            trainable, lr=2e-4, weight_decay=args.weight_decay)
        tagger = opt and oracle._OptStateTagger(opt, tracker)
        n_total = sum(p.numel() for p in model.parameters())
        n_train = sum(p.numel() for p in trainable)

        def fabric_forward(input_ids):
            # `_FabricModule.forward`: the forward under `forward_context` (default dtype
            # bf16), then `convert_output` to fp32 before the loop rebinds `logits`, so the
            # previous fp32 list, the bf16 chunks and their fp32 copies meet.
            context = (torch.autocast("cuda", dtype=torch.bfloat16) if mixed
                       else default_dtype(torch.bfloat16))
            with context:
                out = model(input_ids, lm_head_chunk_size=128)
            return [x.to(torch.get_default_dtype()) for x in out]

        vocab = config.padded_vocab_size
        logits = loss = None
        with tracker:
            tracker.set_phase("setup", "after_load")
            after_load = tracker.current
            for step in range(1, args.steps + 1):
                for micro in range(args.accum):
                    label = "step%d.micro%d" % (step, micro)
                    tracker.set_phase("idle", label + ".inputs")
                    first = step == 1 and micro == 0
                    t = T if first or not args.longest_first else max(1, T // 4)
                    input_ids = torch.randint(0, vocab, (B, t), device="cuda")
                    target_ids = torch.randint(0, vocab, (B, t), device="cuda")
                    tracker.set_phase("forward", label + ".forward")
                    logits = fabric_forward(input_ids)
                    logits[-1] = logits[-1][..., :-1, :]
                    loss = utils.chunked_cross_entropy(logits, target_ids[..., 1:])
                    tracker.set_phase("backward", label + ".backward")
                    (loss / args.accum).backward()
                tracker.set_phase("optimizer", "step%d.optimizer" % step)
                if opt is not None:
                    opt.step()
                    tagger.tag()
                tracker.set_phase("zero_grad", "step%d.zero_grad" % step)
                if opt is not None:
                    opt.zero_grad(set_to_none=True)
                else:
                    for p in trainable:
                        p.grad = None
                gc.collect()
            tracker.set_phase("idle", "end")
            tracker.finish()

    return {
        "tracer": TRACER,
        "litgpt_config": args.config,
        "job": {
            "method": "lora", "precision": args.precision, "lora_r": args.lora_r,
            "lora_alpha": args.lora_alpha, "lora_dropout": args.lora_dropout,
            "targets": sorted(targets), "micro_batch": B, "seq_len": T, "accum": args.accum,
            "steps": args.steps, "layers": config.n_layer, "optimizer": "torch.optim.AdamW",
            "longest_first": args.longest_first,
        },
        "params": {"total": n_total, "trainable": n_train},
        "attention_calls": sdpa.calls,
        "measured": {
            "peak_allocated_bytes": tracker.peak,
            "peak_at": tracker.peak_where,
            "after_load_bytes": after_load,
            "breakdown_at_peak": {k: v for k, v in tracker.peak_cats.items() if v},
        },
        "notes": notes,
        **({"top_live_at_peak": tracker.top_live_at_peak(args.top)} if args.top > 0 else {}),
    }


def matrix(repo: str) -> None:
    """Traces every MATRIX row at its commit and writes FIXTURE."""
    import re
    import subprocess
    import tempfile

    measured = {}
    with open(MEASURED) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                measured[r["id"]] = r
    out = []
    for row_id, config, decay, named in MATRIX:
        row = measured[row_id]
        found = re.search(r"@([0-9a-f]{7,40})", row["framework_version"])
        commit = named or found.group(1)
        with tempfile.TemporaryDirectory() as src:
            archive = subprocess.run(["git", "-C", repo, "archive", commit], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
            lora = row["lora"]
            argv = [
                sys.executable, __file__, "--litgpt-src", src, "--config", config,
                "--targets", ",".join(lora["target_modules"]), "--lora-r", str(lora["r"]),
                "--lora-alpha", str(lora["alpha"]), "--lora-dropout", str(lora["dropout"]),
                "--weight-decay", str(decay), "--batch", str(row["micro_batch_size"]),
                "--seq", str(row["seq_len"]),
                "--precision", "bf16-mixed" if "mixed" in row["precision"] else "bf16-true",
            ]
            quant = row.get("quantization") or {}
            if "nf4" in (quant.get("type") or ""):
                argv += ["--quantize", "nf4-dq" if quant.get("double_quant") else "nf4"]
                # bitsandbytes before 0.43.2 kept each 4-bit matmul's input.
                if re.search(r"bitsandbytes 0\.(3|4[0-2])\b", row["framework_version"]):
                    argv.append("--bnb-saves-input")
            if "Paged" in (row.get("optimizer") or ""):
                argv.append("--paged-optimizer")
            if "longest" in (row.get("notes") or "") + row.get("seq_len_kind", ""):
                if "not forced" not in (row.get("notes") or ""):
                    argv.append("--longest-first")
            res = json.loads(subprocess.run(argv, check=True, capture_output=True,
                                            text=True).stdout.strip().splitlines()[-1])
        peak = res["measured"]["peak_allocated_bytes"]
        print(f"{row_id}: traced {peak / 1e9:.3f} GB, published {row['measured_value']} "
              f"{row['measured_unit']}", file=sys.stderr)
        traced = dict(row)
        traced.update({
            "id": "oracle-" + row_id,
            "source_key": "oracle-litgpt",
            "source": f"calibration/litgpt_trace.py at litgpt @{commit}",
            "framework_version": f"litgpt @{commit} (fake-CUDA trace: torch 2.15, lightning 2.4)",
            "measured_value": peak,
            "measured_unit": "bytes",
            "measured_gib": round(peak / 2**30, 4),
            "per_gpu_gib": round(peak / 2**30, 4),
            "metric": "torch.cuda.max_memory_allocated equivalent (fake-tensor allocation trace)",
            "secondary_measurements": None,
            "notes": (row.get("notes") or "") + f" Traced: the published row {row_id}'s job "
                     "on fake CUDA tensors, training step only (no validation or generation); "
                     f"litgpt_trace.py {' '.join(a for a in argv[5:])}.",
            "trace": {"tracer": TRACER, "peak_at": res["measured"]["peak_at"],
                      "trainable_params": res["params"]["trainable"]},
        })
        out.append(traced)
    tmp = FIXTURE + ".tmp"
    with open(tmp, "w") as f:
        for r in out:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(tmp, FIXTURE)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--matrix", action="store_true", help="regenerate " + FIXTURE)
    p.add_argument("--litgpt-repo", help="with --matrix: a clone of Lightning-AI/litgpt")
    p.add_argument("--litgpt-src", help="a litgpt source tree (holds litgpt/ or lit_gpt/)")
    p.add_argument("--config", help="litgpt config name")
    p.add_argument("--layers", type=int, default=0, help="cut the model to this many layers")
    p.add_argument("--targets", default="query,value")
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--lora-alpha", type=int, default=16)
    p.add_argument("--lora-dropout", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--quantize", choices=("nf4", "nf4-dq"),
                   help="4-bit base (litgpt --quantize bnb.nf4 / bnb.nf4-dq)")
    p.add_argument("--bnb-saves-input", action="store_true",
                   help="4-bit matmuls keep their input, as bitsandbytes < 0.43.2 did")
    p.add_argument("--paged-optimizer", action="store_true",
                   help="bnb PagedAdamW: states outside what the allocator counts")
    p.add_argument("--top", type=int, default=0, help="list the largest live tensors at the peak")
    p.add_argument("--precision", choices=("bf16-true", "bf16-mixed"), default="bf16-true")
    p.add_argument("--longest-first", action="store_true",
                   help="only the first micro-batch is --seq tokens long, the rest a quarter of "
                        "it (lit-gpt 2023's `get_batch` puts the longest sample first)")
    args = p.parse_args(argv)
    if args.matrix:
        if not args.litgpt_repo:
            p.error("--matrix needs --litgpt-repo")
        matrix(args.litgpt_repo)
        return
    if not (args.litgpt_src and args.config):
        p.error("--litgpt-src and --config are required")
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
