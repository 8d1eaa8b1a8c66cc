#!/usr/bin/env python
"""Fake-tensor trace of a training step with TRL's `chunked_nll` loss (SFTTrainer's default).

Runs the fake-CUDA oracle (../shared/oracle/oracle.py: the real transformers model, PEFT and
optimizer on FakeTensors, every device storage counted) with the model's forward patched as
`SFTTrainer` patches it when `loss_type` is `chunked_nll` (TRL >= 1.7): the decoder runs up to
its last hidden state, and `_chunked_cross_entropy_loss` computes the loss over 256-token
chunks, each under non-reentrant checkpointing. TRL's own functions are read from its
`trl/trainer/sft_trainer.py` (`--trl-source`, or the installed `trl`'s) and run as they ship,
with one substitution: the count of valid labels (`valid.sum()`, which the loop's bounds
read as a Python number) is the real count on the CPU, since a fake tensor has no value.
Every label of the oracle's batch is valid (`labels = input_ids.clone()`), so the count is
the number of shifted tokens; the memory traced is unchanged.

  $PY calibration/trl_trace.py --trl-source /path/to/trl/trainer/sft_trainer.py \\
      --config ../shared/models/meta-llama--Llama-3.2-1B-Instruct.json --method lora \\
      --precision bf16-mixed --batch 2 --seq 1024 --grad-ckpt

`--trl-peft` also prepares a PEFT model as `SFTTrainer` does (TRL f2cd577): no
`prepare_model_for_kbit_training`, the trainable parameters of a quantized model cast to bf16
(`--no-kbit-prepare --lora-dtype bf16` for `--method qlora`), and under checkpointing
`model.enable_input_require_grads()` after `get_peft_model`, so the first layer's input needs
a gradient.

`--liger` (with `--trl-peft` and `--events`) runs the step as `SFTTrainer` does with
`use_liger_kernel=True`: TRL's loss is then the model's own (`loss_type` "nll"), which Liger's
patch makes its fused linear cross-entropy (`step_events.py --liger`); `--matrix-trl-liger`
writes `validation/oracle-traces/step-events-trl-liger.jsonl` (compact): QLoRA on the 2-layer
Llama-3.1-8B with and without checkpointing and on Qwen2.5-7B, LoRA with checkpointing.

`--events FILE` also writes the step's allocation sequence (`step_events.py`'s format);
`--matrix FILE` regenerates the cases `crates/moro-core/tests/step_trace.rs` reads into
`validation/oracle-traces/trl-chunked-nll.jsonl`; `--matrix-trl-peft` writes
`validation/oracle-traces/step-events-trl-peft.jsonl` (compact, as `step_events.py
--matrix-qlora`). Every other option is the oracle's.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
ORACLE_DIR = os.environ.get("MORO_ORACLE_DIR") or os.path.normpath(
    os.path.join(ROOT, "..", "shared", "oracle")
)
MODELS_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "models"))

# What SFTTrainer's chunked loss needs from sft_trainer.py.
NAMES = (
    "_CHUNKED_LM_HEAD_CHUNK_SIZE",
    "_ChunkedCELMHeadOutput",
    "_chunk",
    "_chunked_cross_entropy_loss",
    "_patch_chunked_ce_lm_head",
)


def take(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """Split `flag VALUE` off the oracle's own arguments."""
    rest, value = [], None
    it = iter(argv)
    for a in it:
        if a == flag:
            value = next(it, None)
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
        else:
            rest.append(a)
    return value, rest


def trl_source(path: str | None) -> str:
    if path is None:
        spec = importlib.util.find_spec("trl")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("trl_trace: trl is not installed; pass --trl-source .../trl/trainer/sft_trainer.py")
        path = os.path.join(spec.submodule_search_locations[0], "trainer", "sft_trainer.py")
    with open(path) as f:
        return f.read()


def load_chunked_loss(source: str) -> dict:
    """TRL's chunked-loss definitions, executed in a namespace with what they import."""
    import dataclasses
    import inspect
    import types

    import torch
    import torch.nn.functional as F
    import transformers
    from packaging.version import Version
    from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

    tree = ast.parse(source)
    parts, found = [], set()
    for node in tree.body:
        name = getattr(node, "name", None)
        if isinstance(node, ast.Assign):
            name = getattr(node.targets[0], "id", None)
        if name in NAMES:
            found.add(name)
            # a class's decorators (`@dataclass`) are outside its segment
            start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
            parts.append("\n".join(source.splitlines()[start - 1 : node.end_lineno]))
    missing = [n for n in NAMES if n not in found]
    if missing:
        sys.exit("trl_trace: %s not found in the TRL source" % ", ".join(missing))
    code = "\n\n".join(parts)
    if code.count("n_valid_tensor = valid.sum()") != 1:
        sys.exit("trl_trace: the TRL source no longer counts valid labels as `valid.sum()`")
    code = code.replace("n_valid_tensor = valid.sum()", "n_valid_tensor = _valid_count(valid)")

    def valid_count(valid):
        # every label is valid in the oracle's batch
        return torch.tensor(valid.numel(), dtype=torch.int64)

    ns = {
        "torch": torch,
        "F": F,
        "transformers": transformers,
        "Version": Version,
        "dataclass": dataclasses.dataclass,
        "inspect": inspect,
        "types": types,
        "CausalLMOutputWithPast": CausalLMOutputWithPast,
        "BaseModelOutputWithPast": BaseModelOutputWithPast,
        "maybe_gather_lm_head_ctx": lambda *a: contextlib.nullcontext(),
        "_valid_count": valid_count,
    }
    exec(compile(code, "trl/trainer/sft_trainer.py (extract)", "exec"), ns)
    return ns


def install_patch(ns: dict) -> None:
    """Patch every causal LM the oracle builds as SFTTrainer patches it."""
    import transformers

    auto = transformers.AutoModelForCausalLM
    original = auto.from_config.__func__

    def from_config(cls, *a, **k):
        model = original(cls, *a, **k)
        ns["_patch_chunked_ce_lm_head"](model, chunk_size=ns["_CHUNKED_LM_HEAD_CHUNK_SIZE"])
        return model

    auto.from_config = classmethod(from_config)


# (model config, method, precision, batch, seq, checkpointing, extra oracle arguments)
TWO_LAYERS = ["--override", "num_hidden_layers=2"]
MATRIX = [
    ("meta-llama--Llama-3.2-1B-Instruct", "lora", "bf16-mixed", 2, 1024, True, []),
    ("meta-llama--Llama-3.2-1B-Instruct", "lora", "bf16-mixed", 2, 1024, False, []),
    ("meta-llama--Llama-3.2-1B-Instruct", "full", "bf16", 2, 1024, True, []),
    ("meta-llama--Llama-3.2-1B-Instruct", "qlora", "bf16-mixed", 2, 1024, True, []),
    ("Qwen--Qwen2.5-0.5B", "lora", "bf16-mixed", 4, 512, True, []),
    ("Qwen--Qwen2.5-0.5B", "full", "bf16-mixed", 2, 512, False, []),
    ("Qwen--Qwen3-0.6B", "lora", "bf16", 2, 1024, True, []),
    ("google--gemma-2-2b", "lora", "bf16-mixed", 1, 512, True, ["--attn", "eager"]),
    ("meta-llama--Llama-3.1-8B", "lora", "bf16-mixed", 1, 2048, True, TWO_LAYERS),
    ("meta-llama--Llama-3.1-8B", "full", "bf16-mixed", 1, 1024, True, TWO_LAYERS),
    ("mistralai--Mistral-7B-v0.3", "lora", "bf16", 2, 1024, False, TWO_LAYERS),
]


def peft_matrix() -> list[list[str]]:
    """`--matrix-trl-peft`: 2-layer QLoRA and LoRA jobs (r 16) prepared as `SFTTrainer`
    prepares them (`--trl-peft`), with TRL's chunked loss."""
    import step_events

    def job(ckpt, method="qlora", **k):
        a = step_events.qlora_args(ckpt, **k)
        a[a.index("--method") + 1] = method
        i = a.index("--label") + 1
        if method == "lora":
            a[i] = a[i].replace("-qlora-r16-nf4dq-", "-lora-r16-")
        a[i] = "trl-" + a[i]
        return a

    return [job(True), job(False), job(True, seq=512, dropout=0.05),
            job(True, seq=512, batch=2, targets=["q_proj", "v_proj"]),
            job(True, double_quant=False), job(True, model="Qwen--Qwen2.5-7B"),
            job(False, model="mistralai--Mistral-7B-v0.3"), job(True, model="Qwen--Qwen3-8B"),
            job(True, method="lora"), job(False, method="lora", model="Qwen--Qwen2.5-7B")]


PEFT_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-trl-peft.jsonl")
LIGER_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-trl-liger.jsonl")


def liger_matrix() -> list[list[str]]:
    """`--matrix-trl-liger`: [`peft_matrix`]'s jobs run with Liger's kernels."""
    jobs = peft_matrix()
    picked = [jobs[0], jobs[1], jobs[5], jobs[8]]
    out = []
    for a in picked:
        a = list(a)
        i = a.index("--label") + 1
        a[i] = a[i] + "-liger"
        out.append(a + ["--liger"])
    return out


def run_peft_matrix(source: str | None, liger: bool = False) -> None:
    """Runs [`peft_matrix`] (or [`liger_matrix`]) each in its own process; writes the compact
    rows."""
    import tempfile

    import step_events

    fixture = LIGER_FIXTURE if liger else PEFT_FIXTURE
    tmp = fixture + ".tmp"
    with open(tmp, "w") as out:
        for a in liger_matrix() if liger else peft_matrix():
            with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
                cmd = [sys.executable, os.path.abspath(__file__), "--trl-peft", "--events", f.name]
                cmd += (["--trl-source", source] if source else []) + a
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                row = json.loads(open(f.name).readline())
            print(a[a.index("--label") + 1], flush=True)
            out.write(json.dumps(step_events.compact(row, None), separators=(",", ":")) + "\n")
    os.replace(tmp, fixture)


def run_matrix(out: str, source: str | None) -> None:
    done = set()
    if os.path.exists(out):
        with open(out) as f:
            done = {json.loads(line).get("label") for line in f}
    for model, method, precision, batch, seq, ckpt, extra in MATRIX:
        label = "%s %s %s %dx%d%s%s" % (
            model, method, precision, batch, seq, " ckpt" if ckpt else "", " 2-layer" if extra == TWO_LAYERS else "")
        if label in done:
            continue
        cmd = [
            sys.executable, os.path.abspath(__file__),
            "--config", os.path.join(MODELS_DIR, model + ".json"),
            "--method", method, "--precision", precision, "--adamw-impl", "fused",
            "--batch", str(batch), "--seq", str(seq), "--label", label, "--out", out,
        ] + (["--grad-ckpt"] if ckpt else []) + (["--trl-source", source] if source else []) + extra
        print(label, flush=True)
        subprocess.run(cmd, check=True)


def install_trl_peft(argv: list[str]) -> list[str]:
    """SFTTrainer's PEFT preparation (`--trl-peft`, module doc): returns the oracle's
    arguments with TRL's QLoRA dtypes, and wraps `peft.get_peft_model` so the model it
    returns makes its input embeddings require grad under checkpointing."""
    import peft

    argv = [a for a in argv if a != "--trl-peft"]
    method = argv[argv.index("--method") + 1] if "--method" in argv else "lora"
    if method == "qlora":
        argv = [a for a in argv if a != "--no-kbit-prepare"] + ["--no-kbit-prepare", "--lora-dtype", "bf16"]
    if "--grad-ckpt" in argv:
        original = peft.get_peft_model

        def get_peft_model(*a, **k):
            model = original(*a, **k)
            model.enable_input_require_grads()
            return model

        peft.get_peft_model = get_peft_model
    return argv


def main() -> None:
    source, rest = take(sys.argv[1:], "--trl-source")
    if "--trl-peft" in rest:
        sys.path.insert(0, ORACLE_DIR)
        rest = install_trl_peft(rest)
    if rest in (["--matrix-trl-peft"], ["--matrix-trl-liger"]):
        sys.path.insert(0, HERE)
        run_peft_matrix(source, liger=rest == ["--matrix-trl-liger"])
        return
    matrix, rest = take(rest, "--matrix")
    if matrix is not None:
        run_matrix(matrix, source)
        return
    events, rest = take(rest, "--events")
    liger = "--liger" in rest
    rest = [a for a in rest if a != "--liger"]
    sys.path.insert(0, ORACLE_DIR)
    sys.path.insert(0, HERE)
    if not liger:
        ns = load_chunked_loss(trl_source(source))
        install_patch(ns)
    if events is not None:
        import step_events

        rec = step_events.run([a for a in rest if a != "--desc"], "--desc" in rest, liger=liger)
        rec["loss"] = "liger fused linear cross-entropy" if liger else "trl chunked_nll"
        rec["stack"] = "trl"
        if liger:
            rec["job"]["liger_kernel"] = True
        with open(events, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print("peak_allocated %d bytes" % rec["peak_allocated_bytes"])
        return
    import oracle

    args = oracle.build_parser().parse_args(rest)
    res = oracle.run(args)
    res["job"]["loss"] = "trl chunked_nll (chunk %d)" % ns["_CHUNKED_LM_HEAD_CHUNK_SIZE"]
    res["label"] = args.label or ""
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    m = res["measured"]
    print("peak_allocated %d bytes (%.4f GiB) at %s" % (m["peak_allocated_bytes"], m["peak_allocated_gib"], m["peak_at"]))
    print(json.dumps(m["breakdown_at_peak_gib"]))


if __name__ == "__main__":
    main()
