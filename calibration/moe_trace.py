#!/usr/bin/env python
"""Fake-tensor trace of a training step of a transformers 5 MoE model (gpt-oss, ...).

transformers 5 runs routed experts through `grouped_mm` (`integrations/moe.py`,
`experts_implementation="grouped_mm"`, the default), which asks the device for its compute
capability before picking the kernel. On a machine without a GPU that question fails, so this
wrapper answers it as an sm90 GPU (H100/H200) would, then runs the fake-CUDA oracle
(../shared/oracle/oracle.py) unchanged: every option is the oracle's.

`--matrix hybrid` regenerates validation/oracle-traces/hybrid.jsonl (the cases
crates/moro-core/tests/hybrid.rs checks; about 6 minutes): the hybrid decoders of
validation/hybrid-configs/ cut to 4 layers (three recurrent, one attention), with and
without routed experts: Granite 4 (`granitemoehybrid`, Mamba-2) and Qwen3-Next
(`qwen3_next`, gated DeltaNet). Neither `mamba_ssm` nor `fla` is installed, so transformers
runs its torch paths (`mamba2_chunk_scan`, `torch_chunk_gated_delta_rule`), as it does on a
GPU without those packages.

`--matrix gemma3n` regenerates validation/oracle-traces/gemma3n.jsonl (crates/moro-core/tests/
gemma3n.rs): Gemma 3n's text model in the shape of validation/text-configs/ cut to 6 layers.

`--matrix moe` regenerates validation/oracle-traces/moe.jsonl (the cases
crates/moro-core/tests/moe.rs checks; about 8 minutes on two cores): gpt-oss-20b whole, and
Mixtral-8x7B, Qwen3-30B-A3B and GLM-4.5-Air cut to 4 layers, from their configs in data/models (gpt-oss
without its `quantization_config`: a fine-tune dequantizes the MXFP4 experts to bf16,
`Mxfp4Config(dequantize=True)`, as the OpenAI cookbook and TRL's gpt-oss recipe load it).

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
TRACES = os.path.join(ROOT, "validation", "oracle-traces", "moe.jsonl")
MODELS_DIR = os.path.join(ROOT, "data", "models")

# (config in data/models, layers to keep or None, targets, attention) per model.
MODELS = [
    ("openai--gpt-oss-20b", None, "q_proj,k_proj,v_proj,o_proj", "eager"),
    ("mistralai--Mixtral-8x7B-v0.1", 4, "q_proj,k_proj,v_proj,o_proj,w1,w2,w3", "sdpa"),
    ("Qwen--Qwen3-30B-A3B", 4, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "sdpa"),
    ("zai-org--GLM-4.5-Air", 4, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "sdpa"),
]

# (case, oracle arguments) traced on every model.
CASES = [
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


def trace_config(stem: str, layers: int | None, tmp: str) -> str:
    """The model's config without `quantization_config` (a fine-tune dequantizes gpt-oss's
    MXFP4 experts: `Mxfp4Config(dequantize=True)`), cut to `layers` (file `<stem>-L<n>.json`,
    which validation/oracle_to_rows.py turns into `model_overrides`)."""
    with open(os.path.join(MODELS_DIR, stem + ".json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    name = stem
    if layers is not None:
        cfg["num_hidden_layers"] = layers
        if "layer_types" in cfg:
            cfg["layer_types"] = cfg["layer_types"][:layers]
        name += "-L%d" % layers
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


HYBRID_TRACES = os.path.join(ROOT, "validation", "oracle-traces", "hybrid.jsonl")
HYBRID_CONFIGS = os.path.join(ROOT, "validation", "hybrid-configs")
# Per model_type: the 4-layer cut's layer types and the LoRA targets.
HYBRID_LAYERS = {
    "granitemoehybrid": (["mamba", "mamba", "attention", "mamba"],
                         "q_proj,k_proj,v_proj,o_proj,in_proj,out_proj"),
    "qwen3_next": (["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                   "q_proj,k_proj,v_proj,o_proj,in_proj_qkvz,in_proj_ba,out_proj"),
}
# The routed experts off, per model_type.
HYBRID_DENSE = {"granitemoehybrid": "num_local_experts=0", "qwen3_next": "num_experts=0"}
# (case, config overrides, oracle arguments).
HYBRID_CASES = [
    ("lora bf16 1x1024", [], ["--method", "lora", "--precision", "bf16", "--batch", "1", "--seq", "1024"]),
    ("lora bf16 2x1000 ckpt", [], ["--method", "lora", "--precision", "bf16", "--batch", "2", "--seq", "1000", "--grad-ckpt"]),
    ("lora bf16-mixed 1x1024", [], ["--method", "lora", "--precision", "bf16-mixed", "--batch", "1", "--seq", "1024"]),
    ("full bf16 fused 1x1024", [], ["--method", "full", "--precision", "bf16", "--adamw-impl", "fused", "--batch", "1", "--seq", "1024"]),
    ("full bf16 1x2048 ckpt", [], ["--method", "full", "--precision", "bf16", "--adamw-impl", "foreach", "--batch", "1", "--seq", "2048", "--grad-ckpt"]),
    ("qlora bf16 1x1024 ckpt", [], ["--method", "qlora", "--precision", "bf16", "--batch", "1", "--seq", "1024", "--grad-ckpt"]),
    ("dense lora bf16 1x1024", ["dense"], ["--method", "lora", "--precision", "bf16", "--batch", "1", "--seq", "1024"]),
    ("v8192 full bf16 1x2048", ["vocab_size=8192"], ["--method", "full", "--precision", "bf16", "--adamw-impl", "fused", "--batch", "1", "--seq", "2048"]),
    ("v8192 lora bf16 1x4096 ckpt", ["vocab_size=8192"], ["--method", "lora", "--precision", "bf16", "--batch", "1", "--seq", "4096", "--grad-ckpt"]),
]


GEMMA3N_TRACES = os.path.join(ROOT, "validation", "oracle-traces", "gemma3n.jsonl")
GEMMA3N_CONFIG = os.path.join(ROOT, "validation", "text-configs", "gemma-3n-e4b-text-shape.json")
# Gemma 3n's text model cut to 6 layers: sliding and full attention, activation sparsity in
# the first two, the last two reading the KV of the last layer of their kind that has its own.
GEMMA3N_CUT = {
    "num_hidden_layers": 6,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                    "sliding_attention", "sliding_attention", "full_attention"],
    "num_kv_shared_layers": 2,
    "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
    "intermediate_size": [16384] * 6,
}
DENSE = "activation_sparsity_pattern=[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]"
GEMMA3N_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
GEMMA3N_CASES = [
    ("lora bf16 1x1024", [], ["--method", "lora", "--precision", "bf16", "--batch", "1", "--seq", "1024"]),
    ("v8192 lora bf16 1x2048", ["vocab_size=8192", "vocab_size_per_layer_input=8192"], ["--method", "lora", "--precision", "bf16", "--batch", "1", "--seq", "2048"]),
    ("v8192 lora bf16-mixed 1x2048", ["vocab_size=8192", "vocab_size_per_layer_input=8192"], ["--method", "lora", "--precision", "bf16-mixed", "--batch", "1", "--seq", "2048"]),
    ("v8192 full bf16 1x2048", ["vocab_size=8192", "vocab_size_per_layer_input=8192"], ["--method", "full", "--precision", "bf16", "--adamw-impl", "fused", "--batch", "1", "--seq", "2048"]),
    # Checkpointed, without the sparse layers: recomputing `_gaussian_topk` makes a tensor on
    # the (fake) device outside the fake mode, which a GPU run does not mind.
    ("v8192 dense lora bf16 2x2048 ckpt", ["vocab_size=8192", "vocab_size_per_layer_input=8192", DENSE], ["--method", "lora", "--precision", "bf16", "--batch", "2", "--seq", "2048", "--grad-ckpt"]),
    ("v8192 dense full bf16 1x4096 ckpt", ["vocab_size=8192", "vocab_size_per_layer_input=8192", DENSE], ["--method", "full", "--precision", "bf16", "--adamw-impl", "fused", "--batch", "1", "--seq", "4096", "--grad-ckpt"]),
]


def run_gemma3n_matrix() -> None:
    """Every Gemma 3n case into GEMMA3N_TRACES (cases already there are kept)."""
    done = set()
    if os.path.exists(GEMMA3N_TRACES):
        with open(GEMMA3N_TRACES) as f:
            done = {json.loads(line).get("label") for line in f}
    with tempfile.TemporaryDirectory() as tmp:
        with open(GEMMA3N_CONFIG) as f:
            cfg = json.load(f)
        cfg.update(GEMMA3N_CUT)
        config = os.path.join(tmp, "gemma-3n-e4b-text-shape-L6.json")
        with open(config, "w") as f:
            json.dump(cfg, f)
        for case, overrides, args in GEMMA3N_CASES:
            label = "gemma-3n-e4b-text-shape-L6 %s" % case
            if label in done:
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "--config", config, *args,
                   "--lora-targets", GEMMA3N_TARGETS, "--label", label, "--out", GEMMA3N_TRACES]
            for o in overrides:
                cmd += ["--override", o]
            print(label, flush=True)
            subprocess.run(cmd, check=True)


def run_hybrid_matrix() -> None:
    """Every hybrid case, one subprocess each, into HYBRID_TRACES (cases already there are
    kept)."""
    done = set()
    if os.path.exists(HYBRID_TRACES):
        with open(HYBRID_TRACES) as f:
            done = {json.loads(line).get("label") for line in f}
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(os.listdir(HYBRID_CONFIGS)):
            with open(os.path.join(HYBRID_CONFIGS, name)) as f:
                cfg = json.load(f)
            layers, targets = HYBRID_LAYERS[cfg["model_type"]]
            cfg["num_hidden_layers"] = len(layers)
            cfg["layer_types"] = layers
            config = os.path.join(tmp, name[:-5] + "-L4.json")
            with open(config, "w") as f:
                json.dump(cfg, f)
            for case, overrides, args in HYBRID_CASES:
                label = "%s-L4 %s" % (name[:-5], case)
                if label in done:
                    continue
                cmd = [sys.executable, os.path.abspath(__file__), "--config", config, *args,
                       "--lora-targets", targets, "--label", label, "--out", HYBRID_TRACES]
                for o in overrides:
                    cmd += ["--override", HYBRID_DENSE[cfg["model_type"]] if o == "dense" else o]
                print(label, flush=True)
                subprocess.run(cmd, check=True)


def run_matrix() -> None:
    """Every case on every model, one subprocess each, into TRACES (cases already there are
    kept: delete the file to trace everything again)."""
    done = set()
    if os.path.exists(TRACES):
        with open(TRACES) as f:
            done = {json.loads(line).get("label") for line in f}
    with tempfile.TemporaryDirectory() as tmp:
        for stem, layers, targets, attn in MODELS:
            config = trace_config(stem, layers, tmp)
            for case, args in CASES:
                label = "%s %s" % (os.path.basename(config)[:-5], case)
                if label in done:
                    continue
                cmd = [sys.executable, os.path.abspath(__file__), "--config", config, *args,
                       "--lora-targets", targets, "--attn", attn, "--label", label,
                       "--out", TRACES]
                print(label, flush=True)
                subprocess.run(cmd, check=True)


def main() -> None:
    if sys.argv[1:] == ["--matrix", "gemma3n"]:
        run_gemma3n_matrix()
        return
    if sys.argv[1:] == ["--matrix", "hybrid"]:
        run_hybrid_matrix()
        return
    if sys.argv[1:] == ["--matrix", "moe"]:
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
