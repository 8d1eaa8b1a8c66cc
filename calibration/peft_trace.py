#!/usr/bin/env python
"""Fake-tensor trace of a training step with any PEFT method (DoRA, LoKr, prefix tuning, ...).

Runs the fake-CUDA oracle (../shared/oracle/oracle.py: the real transformers model, PEFT and
optimizer on FakeTensors, every device storage counted) with its `LoraConfig` replaced by the
PEFT config given as JSON, so PEFT builds and runs the method exactly as it ships.

  --peft '{"peft_type": "LOKR", "r": 32, "alpha": 64, "decompose_factor": 4,
           "target_modules": ["q_proj", "v_proj"]}'
  --peft '{"peft_type": "LORA", "r": 32, "lora_alpha": 64, "use_dora": true,
           "target_modules": ["q_proj", "v_proj"]}'
  --peft '{"peft_type": "PREFIX_TUNING", "num_virtual_tokens": 200}'

`--matrix peft-methods` regenerates validation/oracle-traces/peft-methods.jsonl (the cases
crates/moro-core/tests/peft_variants.rs checks, about 4 minutes on two cores).

Every other option is the oracle's (`--config`, `--precision`, `--batch`, `--seq`,
`--adamw-impl`, `--grad-ckpt`, `--out`, ...); pass `--method lora`.

Example (PY = the oracle venv's python, from the repository root):
  $PY calibration/peft_trace.py --config ../shared/models/meta-llama--Llama-3.2-3B.json \\
      --method lora --precision bf16 --adamw-impl foreach --batch 4 --seq 768 \\
      --peft '{"peft_type": "LOKR", "r": 32, "alpha": 64, "decompose_factor": 4,
               "target_modules": ["q_proj", "v_proj"]}'
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
ORACLE_DIR = os.environ.get("MORO_ORACLE_DIR") or os.path.normpath(
    os.path.join(ROOT, "..", "shared", "oracle")
)


def take_peft_argument(argv: list[str]) -> tuple[dict, list[str]]:
    """Split `--peft JSON` off the oracle's own arguments."""
    rest, spec = [], None
    it = iter(argv)
    for a in it:
        if a == "--peft":
            spec = next(it, None)
        elif a.startswith("--peft="):
            spec = a.split("=", 1)[1]
        else:
            rest.append(a)
    if spec is None:
        sys.exit("peft_trace: --peft JSON is required")
    return json.loads(spec), rest


def install_config(spec: dict) -> None:
    """Make the oracle's `LoraConfig(...)` build the PEFT config `spec` describes."""
    import peft

    kind = spec.pop("peft_type", "LORA").upper()
    classes = {
        "LORA": peft.LoraConfig,
        "LOKR": peft.LoKrConfig,
        "LOHA": peft.LoHaConfig,
        "PREFIX_TUNING": peft.PrefixTuningConfig,
        "PROMPT_TUNING": peft.PromptTuningConfig,
        "IA3": peft.IA3Config,
        "VERA": peft.VeraConfig,
        "LN_TUNING": peft.LNTuningConfig,
        "OFT": peft.OFTConfig,
        "BOFT": peft.BOFTConfig,
        "ADALORA": peft.AdaLoraConfig,
    }
    cls = classes[kind]

    def make(**oracle_kwargs):
        kwargs = {"task_type": "CAUSAL_LM", **spec}
        if kind == "LORA":
            kwargs = {**oracle_kwargs, **kwargs}
        return cls(**kwargs)

    peft.LoraConfig = make
    if kind in ("LOKR", "LOHA"):
        always_apply_module_dropout(kind)
    if kind == "BOFT":
        place_boft_permutations()
    if kind == "ADALORA":
        allocate_ranks_after_each_step()


def allocate_ranks_after_each_step() -> None:
    """AdaLoRA's loop calls `model.base_model.update_and_allocate(step)` after
    `optimizer.step()` and before `zero_grad()` (PEFT's docs and its MetaMathQA benchmark):
    the `RankAllocator` then keeps, per `lora_` parameter, its importance and two smoothed
    copies (`update_ipt`). The oracle's loop steps a `torch.optim.AdamW`, so its `step` is
    wrapped to make that call too. Masking (`mask_to_budget`, after `tinit` steps) reads
    scores as numbers, which fake tensors do not hold: the traced jobs set `tinit` past the
    steps they run."""
    import peft
    import torch

    build = peft.get_peft_model
    models = []

    def get_peft_model(*args, **kwargs):
        model = build(*args, **kwargs)
        models.append(model)
        return model

    peft.get_peft_model = get_peft_model
    step = torch.optim.AdamW.step
    done = [0]

    def step_and_allocate(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        done[0] += 1
        for model in models:
            model.base_model.update_and_allocate(done[0])
        return out

    torch.optim.AdamW.step = step_and_allocate


def place_boft_permutations() -> None:
    """BOFT registers its permutation `boft_P` as an fp32 buffer made on the CPU
    (`BOFTLayer.update_layer`: `torch.empty(...)` in the default dtype) that PEFT never moves;
    the HF Trainer then moves the whole model to the GPU (`Trainer._move_model_to_device`),
    fp32 as made. The oracle builds PEFT's layers on the fake device in the base dtype, so
    each `boft_P` is put back to fp32 there; for a 4-bit base, which the Trainer does not
    move, on the CPU, where `forward` copies it to the GPU (`self.boft_P.to(x)`)."""
    import peft
    import torch

    build = peft.get_peft_model

    def get_peft_model(*args, **kwargs):
        quantized = getattr(args[0] if args else kwargs["model"], "is_loaded_in_4bit", False)
        model = build(*args, **kwargs)
        for module in model.modules():
            if isinstance(getattr(module, "boft_P", None), torch.Tensor):
                where = "cpu" if quantized else module.boft_P.device
                module.boft_P = module.boft_P.to(where, torch.float32)
        return model

    peft.get_peft_model = get_peft_model

    # PEFT builds the butterfly's block-diagonal matrix with its CUDA extension `fbd_cuda`
    # and, without it, trains one butterfly factor whatever the config says. The extension's
    # forward makes the (N, D·H, D·H) fp32 output and nothing else (`fbd_cuda_kernel.cu`);
    # the same output, filled block by block, stands in for it on fake tensors.
    import peft.tuners.boft.layer as boft_layer

    class BlockDiag:
        @staticmethod
        def forward(blocks):
            n, d, h, _ = blocks.shape
            out = torch.zeros(n, d * h, d * h, dtype=blocks.dtype, device=blocks.device)
            return [out]

        @staticmethod
        def backward(grad, blocks):
            return [torch.empty_like(blocks)]

    boft_layer.get_fbd_cuda = lambda: BlockDiag
    # The butterfly permutations' indices are data a fake tensor does not hold; their
    # matrices have the same shape whatever the order.
    boft_layer.BOFTLayer.block_butterfly_perm = lambda self, n, *args, **kwargs: torch.arange(n)


def always_apply_module_dropout(kind: str) -> None:
    """LyCORIS layers test `torch.rand(1) > module_dropout` every forward, which a fake tensor
    cannot answer; with `module_dropout = 0` (the default) the test is always true."""
    import importlib
    import types

    import torch

    layer = importlib.import_module("peft.tuners.%s.layer" % kind.lower())
    proxy = types.ModuleType("torch_without_rand")
    proxy.__dict__.update(torch.__dict__)
    proxy.rand = lambda *a, **k: 1.0
    layer.torch = proxy


MODELS_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "models"))
TRACES = os.path.join(ROOT, "validation", "oracle-traces", "peft-methods.jsonl")

# (model config, LoRA-family targets, batch, seq, attention) per architecture; Gemma-2's
# soft-capped attention has no SDPA path in transformers.
MATRIX_MODELS = [
    ("meta-llama--Llama-3.2-3B", "q_proj,v_proj", 4, 768, "sdpa"),
    ("Qwen--Qwen3-0.6B", "q_proj,v_proj", 2, 512, "sdpa"),
    ("google--gemma-2-2b", "q_proj,v_proj", 2, 512, "eager"),
    ("EleutherAI--pythia-410m", "query_key_value,dense", 2, 512, "sdpa"),
]

MATRIX_METHODS = [
    ("lora", {"peft_type": "LORA"}, "0"),
    ("dora", {"peft_type": "LORA", "use_dora": True}, "0"),
    ("dora-dropout", {"peft_type": "LORA", "use_dora": True}, "0.05"),
    ("lokr", {"peft_type": "LOKR", "r": 32, "alpha": 64, "decompose_factor": 4}, "0"),
    ("lokr-sqrt", {"peft_type": "LOKR", "r": 8, "alpha": 16}, "0"),
    ("prefix-50", {"peft_type": "PREFIX_TUNING", "num_virtual_tokens": 50}, "0"),
]


def run_matrix() -> None:
    """Every method on every architecture, one subprocess each, into TRACES (cases already
    there are kept: delete the file to trace everything again)."""
    import subprocess

    done = set()
    if os.path.exists(TRACES):
        with open(TRACES) as f:
            done = {json.loads(line).get("label") for line in f}
    for model, targets, batch, seq, attn in MATRIX_MODELS:
        for name, spec, dropout in MATRIX_METHODS:
            label = "%s %s" % (model, name)
            if label in done:
                continue
            spec = dict(spec)
            if spec["peft_type"] in ("LOKR",):
                spec["target_modules"] = targets.split(",")
            cmd = [
                sys.executable, os.path.abspath(__file__),
                "--config", os.path.join(MODELS_DIR, model + ".json"),
                "--method", "lora", "--precision", "bf16", "--adamw-impl", "foreach",
                "--batch", str(batch), "--seq", str(seq),
                "--lora-r", "32", "--lora-alpha", "64", "--lora-targets", targets,
                "--lora-dropout", dropout, "--label", label, "--attn", attn,
                "--out", TRACES, "--peft", json.dumps(spec),
            ]
            print(model, name, flush=True)
            subprocess.run(cmd, check=True)


def main() -> None:
    if sys.argv[1:] == ["--matrix", "peft-methods"]:
        run_matrix()
        return
    spec, rest = take_peft_argument(sys.argv[1:])
    sys.path.insert(0, ORACLE_DIR)
    label = json.dumps(spec, sort_keys=True)
    install_config(dict(spec))
    import oracle

    args = oracle.build_parser().parse_args(rest)
    if not args.label:
        args.label = label
    res = oracle.run(args)
    res["job"]["peft"] = spec
    res["label"] = args.label
    line = json.dumps(res)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    m = res["measured"]
    print(
        "peak_allocated %.4f GiB at %s; trainable %d"
        % (m["peak_allocated_gib"], m["peak_at"], res["params"]["trainable"])
    )
    print(json.dumps(m["breakdown_at_peak_gib"]))


if __name__ == "__main__":
    main()
