#!/usr/bin/env python3
"""moro calibration harness: measure the peak GPU memory of real fine-tuning steps.

On a machine with an NVIDIA GPU and torch + transformers + peft (bitsandbytes for QLoRA and
8-bit/paged optimizers, flash-attn for `flash_attention_2`, all optional), it builds models
from config.json with random weights (nothing is downloaded), runs a few real training steps
(or a `generate`) for each job of a grid, and writes one JSON row per job and memory level
in the schema of validation/measured.jsonl, so `moro validate FILE` reads the file directly.

    python3 calibration/harness.py --plan                       # the grid, no torch needed
    python3 calibration/harness.py --output measured-own.jsonl  # run it (resumable)

The parent process never imports torch: each job runs in a fresh child process
(`--worker`), so a crash or an out-of-memory error of one job cannot poison the next, and
each job's allocator starts clean, as a real training run does.

Row format: three rows per completed job, one per level (`level`: allocated, reserved,
device), each with its own `metric` text and `per_gpu_gib`, because `moro validate` compares
one `metric` per row. A job that ran out of memory gets one row, `outcome: "OOM"`.
Every row also carries `job_key` (the stable key used for resuming) and a `calibration`
object with the raw byte counts that `moro calibrate` fits its profile from.

Standard library only in this process; the worker needs torch, transformers, peft and
accelerate (a peft dependency), plus bitsandbytes for the jobs that use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

HARNESS_VERSION = 4
GIB = 1 << 30
MIB = 1 << 20
SOURCE_KEY = "moro-calibration"
RESULT_PREFIX = "MORO_RESULT "

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Config keys that hold the number of decoder layers, by preference.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


# --------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Job:
    """One measurement. `layers`: None = the model's own depth, "auto" = as many as fit the
    card (needs `moro`), or a number."""

    model: str
    method: str  # full | lora | qlora | inference
    precision: str = "bf16-mixed"  # bf16 | bf16-mixed | fp32
    optimizer: str = "adamw_torch_fused"
    batch: int = 1
    seq: int = 2048
    ckpt: bool = True
    attn: str = "sdpa"  # sdpa | eager | flash_attention_2
    quant: str = "none"  # none | nf4 | nf4-dq
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    targets: Tuple[str, ...] = DEFAULT_TARGETS
    layers: Any = None
    new_tokens: int = 0  # inference only: tokens generated after a `seq`-token prompt
    dora: bool = False  # PEFT LoraConfig(use_dora=True)
    liger: bool = False  # the HF Trainer's use_liger_kernel=True (Liger's defaults per model)
    compile: bool = False  # the HF Trainer's torch_compile=True: torch.compile(model)
    # One training step per length, in order (batches of varying length, as a collator that
    # pads each batch to its longest makes them, here unpadded); empty: every step `seq`.
    lengths: Tuple[int, ...] = ()
    quick: bool = False  # part of `moro calibrate`'s short grid
    why: str = ""

    def key(self) -> str:
        """A stable, readable key: the same job always has the same key, whatever the card."""
        parts = [
            self.model,
            self.method,
            "q=" + self.quant,
            self.precision,
            "b%d" % self.batch,
            "s%d" % self.seq,
        ]
        if self.method == "inference":
            parts.append("new%d" % self.new_tokens)
        else:
            parts += [self.optimizer, "ckpt" if self.ckpt else "nockpt"]
        parts.append(self.attn)
        if self.method in ("lora", "qlora"):
            parts.append("r%d/a%d/d%g/%s" % (self.lora_r, self.lora_alpha, self.lora_dropout,
                                             ",".join(self.targets)))
        parts.append("L" + ("full" if self.layers is None else str(self.layers)))
        # Settings added in harness v4: named only when on, so older keys stay as they were.
        parts += [name for name in ("dora", "liger", "compile") if getattr(self, name)]
        if self.lengths:
            parts.append("lengths=" + ",".join(map(str, self.lengths)))
        return "|".join(parts)

    def short_id(self) -> str:
        return hashlib.sha1(self.key().encode()).hexdigest()[:10]

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["targets"] = list(self.targets)
        d["lengths"] = list(self.lengths)
        return d

    @staticmethod
    def from_dict(d: Dict[str, Any]) -> "Job":
        d = dict(d)
        d["targets"] = tuple(d.get("targets") or DEFAULT_TARGETS)
        d["lengths"] = tuple(d.get("lengths") or ())
        fields = {f.name for f in dataclasses.fields(Job)}
        return Job(**{k: v for k, v in d.items() if k in fields})

    def needs(self) -> List[str]:
        """Python packages the job needs beyond torch/transformers/peft."""
        out = []
        if self.quant != "none" or self.optimizer in ("adamw_8bit", "paged_adamw_32bit",
                                                      "paged_adamw_8bit"):
            out.append("bitsandbytes")
        if self.attn == "flash_attention_2":
            out.append("flash_attn")
        if self.liger:
            out.append("liger_kernel")
        return out


L8 = "meta-llama/Llama-3.1-8B"
L70 = "meta-llama/Llama-3.1-70B-Instruct"
Q7 = "Qwen/Qwen2.5-7B"


def grid(name: str = "full") -> List[Job]:
    """The grid, most informative first: the three canonical jobs scaled to the card, then
    one knob at a time around them, then other architectures, then inference."""
    qlora8 = Job(L8, "qlora", quant="nf4-dq", quick=True,
                 why="canonical: 7B-class QLoRA (NF4 + double quant, r16, 7 targets)")
    full8 = Job(L8, "full", precision="bf16", layers="auto", quick=True,
                why="canonical: 7B-class full fine-tune (pure bf16, fused AdamW)")
    qlora70 = Job(L70, "qlora", quant="nf4-dq", layers="auto", quick=True,
                  why="canonical: 70B-class QLoRA, layers scaled to the card")
    lora8 = Job(L8, "lora", quick=True, why="LoRA base (bf16-mixed, fused AdamW, checkpointing)")
    jobs = [qlora8, full8, qlora70, lora8]
    def r(j: Job, **kw: Any) -> Job:
        return dataclasses.replace(j, **{"quick": False, **kw})

    knobs = [
        r(lora8, ckpt=False, quick=True, why="knob: no gradient checkpointing"),
        r(lora8, seq=512, why="knob: sequence 512"),
        r(lora8, seq=4096, quick=True, why="knob: sequence 4096"),
        r(lora8, batch=2, why="knob: micro batch 2"),
        r(lora8, batch=4, seq=1024, why="knob: micro batch 4 x 1024"),
        r(lora8, precision="bf16", quick=True, why="knob: pure bf16 (no autocast)"),
        r(lora8, precision="bf16", ckpt=False, why="knob: pure bf16 without checkpointing"),
        r(lora8, optimizer="adamw_torch", why="knob: foreach AdamW"),
        r(lora8, attn="eager", seq=1024, why="knob: eager attention"),
        r(lora8, attn="eager", seq=1024, ckpt=False, why="knob: eager attention, no ckpt"),
        r(lora8, attn="flash_attention_2", why="knob: FlashAttention-2 (flash-attn package)"),
        r(lora8, lora_r=64, lora_alpha=128, why="knob: LoRA rank 64"),
        r(lora8, lora_dropout=0.05, ckpt=False, why="knob: LoRA dropout 0.05"),
        r(lora8, targets=("q_proj", "v_proj"), why="knob: LoRA on q,v only"),
        r(qlora8, ckpt=False, why="knob: QLoRA without checkpointing"),
        r(qlora8, quant="nf4", why="knob: NF4 without double quant"),
        r(qlora8, optimizer="paged_adamw_32bit", why="knob: paged AdamW (outside torch)"),
        r(qlora8, optimizer="adamw_8bit", why="knob: 8-bit AdamW"),
        r(qlora8, precision="bf16", why="knob: QLoRA pure bf16"),
        r(qlora8, seq=4096, batch=2, why="knob: QLoRA b2 x 4096"),
        r(full8, precision="bf16-mixed", why="knob: full FT with fp32 master weights"),
        r(full8, optimizer="adamw_torch", why="knob: full FT, foreach AdamW"),
        r(full8, ckpt=False, seq=1024, why="knob: full FT without checkpointing"),
        r(full8, optimizer="adamw_8bit", why="knob: full FT, 8-bit AdamW"),
        r(full8, precision="fp32", why="knob: full FT in fp32"),
    ]
    others = [
        Job(Q7, "lora", why="arch: Qwen2.5 (qkv bias, 152k vocab)"),
        Job(Q7, "qlora", quant="nf4-dq", why="arch: Qwen2.5 QLoRA"),
        Job("meta-llama/Llama-3.2-1B-Instruct", "full", precision="bf16",
            why="arch: tied embeddings, full FT"),
        Job("meta-llama/Llama-3.2-1B-Instruct", "full", precision="bf16-mixed", ckpt=False,
            seq=1024, why="arch: tied embeddings, fp32 master, no ckpt"),
        Job("Qwen/Qwen2.5-1.5B", "full", precision="bf16", optimizer="adamw_torch",
            why="arch: small Qwen full FT, foreach"),
        Job("mistralai/Mistral-7B-v0.3", "qlora", quant="nf4-dq", why="arch: Mistral QLoRA"),
        Job("google/gemma-2-2b", "lora", attn="eager", why="arch: Gemma-2 (softcapping, eager)"),
        Job("microsoft/Phi-3-mini-4k-instruct", "lora", targets=("qkv_proj", "o_proj",
            "gate_up_proj", "down_proj"), why="arch: Phi-3 fused projections"),
    ]
    inference = [
        Job(L8, "inference", precision="bf16", batch=1, seq=512, new_tokens=256, ckpt=False,
            quick=True, why="inference: bf16 generate, batch 1"),
        Job(L8, "inference", precision="bf16", batch=8, seq=1024, new_tokens=512, ckpt=False,
            why="inference: bf16 generate, batch 8 (KV cache)"),
        Job(L8, "inference", precision="bf16", quant="nf4", batch=4, seq=1024, new_tokens=256,
            ckpt=False, why="inference: NF4 weights"),
        Job(Q7, "inference", precision="bf16", batch=4, seq=2048, new_tokens=256, ckpt=False,
            why="inference: Qwen2.5 bf16, batch 4"),
    ]
    # The baseline of the 1B settings is the `arch: tied embeddings` job (same key).
    l1b = others[2]
    settings = [
        r(lora8, liger=True, why="setting: Liger kernels (LoRA, checkpointing)"),
        r(lora8, ckpt=False, liger=True, why="setting: Liger kernels, no checkpointing"),
        r(lora8, batch=2, liger=True, why="setting: Liger kernels, micro batch 2"),
        r(lora8, dora=True, why="setting: DoRA (LoRA, checkpointing)"),
        r(lora8, ckpt=False, compile=True, why="setting: torch.compile, no checkpointing"),
        r(lora8, compile=True, why="setting: torch.compile with checkpointing"),
        r(l1b, liger=True, why="setting: Liger kernels, tied 1B full FT"),
        r(l1b, compile=True, why="setting: torch.compile, tied 1B full FT"),
        r(l1b, ckpt=False, seq=1024, compile=True,
          why="setting: torch.compile, tied 1B full FT, no checkpointing"),
        r(l1b, ckpt=False, seq=1024, why="setting: tied 1B full FT, no checkpointing"),
        Job(Q7, "lora", liger=True, why="setting: Liger kernels on Qwen2.5 (152k vocab)"),
    ]
    # Batches of varying length (docs/memory-anatomy.md §17): 16 steps, the lengths of
    # `step_events.py`'s LENGTHS scaled to 2,048, the longest twice; what the cache keeps
    # over them against one batch's reserved level.
    shuffled = tuple(4 * n for n in (256, 96, 384, 160, 512, 64, 448, 320, 128, 512, 224, 480,
                                     192, 416, 288, 352))
    settings += [
        r(lora8, ckpt=False, lengths=shuffled, why="setting: 16 batches of varying length, LoRA"),
        r(qlora8, lengths=shuffled, why="setting: 16 batches of varying length, QLoRA"),
        r(full8, ckpt=False, seq=1024, lengths=tuple(n // 2 for n in shuffled),
          why="setting: 16 batches of varying length, full FT"),
    ]
    jobs += knobs + others + settings + inference
    if name == "quick":
        return [j for j in jobs if j.quick]
    if name == "full":
        return jobs
    raise ValueError("unknown grid `%s` (use full or quick)" % name)


def select(jobs: List[Job], only: Optional[str], max_jobs: Optional[int],
           layers: Optional[int]) -> List[Job]:
    """Filters the grid (`--only REGEX` on the key, the description or the short id the plan
    and the log print), pins `--layers`, caps `--max-jobs`."""
    if only:
        rx = re.compile(only)
        jobs = [j for j in jobs
                if rx.search(j.key()) or rx.search(j.why) or rx.search(j.short_id())]
    if layers is not None:
        jobs = [dataclasses.replace(j, layers=layers) for j in jobs]
    if max_jobs is not None:
        jobs = jobs[:max_jobs]
    return jobs


def plan_text(jobs: List[Job]) -> str:
    head = "%-3s %-10s  %-12s  %-33s  %-10s  %-17s  %2s  %6s  %-4s  %-5s  %-6s  %s" % (
        "#", "id", "method", "model", "precision", "optimizer", "b", "tokens", "ckpt", "attn",
        "layers", "why")
    lines = [head]
    for i, j in enumerate(jobs, 1):
        method = j.method if j.quant == "none" else "%s/%s" % (j.method, j.quant)
        training = j.method != "inference"
        lines.append("%-3d %-10s  %-12s  %-33s  %-10s  %-17s  %2d  %6d  %-4s  %-5s  %-6s  %s" % (
            i, j.short_id(), method, j.model[:33], j.precision,
            j.optimizer if training else "-", j.batch, j.seq + j.new_tokens,
            "yes" if j.ckpt and training else "no", j.attn[:5],
            "full" if j.layers is None else str(j.layers), j.why))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def config_path(configs_dir: str, model: str) -> str:
    return os.path.join(configs_dir, model.replace("/", "--") + ".json")


def load_config(configs_dir: str, model: str) -> Dict[str, Any]:
    path = config_path(configs_dir, model)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise HarnessError("no config for %s: %s (pass --configs DIR with org--name.json files)"
                           % (model, e))


def layer_key(config: Dict[str, Any]) -> str:
    for k in LAYER_KEYS:
        if isinstance(config.get(k), int):
            return k
    text_cfg = config.get("text_config")
    if isinstance(text_cfg, dict):
        for k in LAYER_KEYS:
            if isinstance(text_cfg.get(k), int):
                return k
    raise HarnessError("config has none of %s" % ", ".join(LAYER_KEYS))


def full_layers(config: Dict[str, Any]) -> int:
    k = layer_key(config)
    return int(config.get(k) or config.get("text_config", {}).get(k))


def with_layers(config: Dict[str, Any], n: Optional[int]) -> Dict[str, Any]:
    """The config with `n` decoder layers (None: unchanged). Per-layer lists (Gemma-3's
    `layer_types`, Qwen's `max_window_layers`) are cut or clamped to match."""
    cfg = json.loads(json.dumps(config))
    if n is None:
        return cfg
    k = layer_key(cfg)
    target = cfg if k in cfg else cfg["text_config"]
    target[k] = int(n)
    for lk in ("layer_types",):
        if isinstance(target.get(lk), list):
            target[lk] = target[lk][:n]
    if isinstance(target.get("max_window_layers"), int):
        target["max_window_layers"] = min(target["max_window_layers"], n)
    return cfg


class HarnessError(Exception):
    """A one-line error for the user."""


# --------------------------------------------------------------------------------------------
# Rows (measured.jsonl schema)
# --------------------------------------------------------------------------------------------

METRICS = {
    "allocated": "torch.cuda.max_memory_allocated (peak over the measured training steps)",
    "reserved": "torch.cuda.max_memory_reserved (peak over the measured training steps)",
    "device": "NVML / nvidia-smi device memory used by this process at the peak (CUDA context"
              " + PyTorch reserved + memory outside the allocator)",
}

PRECISION_TEXT = {
    "bf16": "bf16-true (pure bf16 weights, no autocast)",
    "bf16-mixed": "bf16-mixed (fp32 trainable weights + torch.autocast bfloat16)",
    "fp32": "fp32 (32-true, no autocast)",
}

LIGER_LOSS = ("Liger fused linear cross-entropy (use_liger_kernel=True: the model's own "
              "apply_liger_kernel_to_* defaults, logits never materialized)")

OPTIMIZER_TEXT = {
    "adamw_torch_fused": "adamw_torch_fused (torch.optim.AdamW fused=True)",
    "adamw_torch": "adamw_torch (torch.optim.AdamW foreach=True)",
    "adamw_8bit": "adamw_8bit (bitsandbytes AdamW8bit)",
    "paged_adamw_32bit": "paged_adamw_32bit (bitsandbytes PagedAdamW32bit)",
    "paged_adamw_8bit": "paged_adamw_8bit (bitsandbytes PagedAdamW8bit)",
}


def framework_version(versions: Dict[str, Optional[str]]) -> str:
    """`torch X, transformers Y, ...`: the packages that shape the measured step. TRL is not
    named: the harness does not use it (moro would read the row as the TRL stack)."""
    names = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "flash_attn",
             "liger_kernel")
    return ", ".join("%s %s" % (n, versions[n]) for n in names if versions.get(n))


def base_weights_dtype(job: Job) -> str:
    if job.quant != "none":
        return "nf4 (bitsandbytes 4-bit), other weights bf16"
    if job.precision == "fp32" or (job.method == "full" and job.precision == "bf16-mixed"):
        return "fp32"
    return "bf16"


def gib(b: Optional[int]) -> Optional[float]:
    return None if b is None else round(b / GIB, 6)


def build_rows(job: Job, result: Dict[str, Any], machine: Dict[str, Any],
               when: Optional[str] = None) -> List[Dict[str, Any]]:
    """The rows of one job's result: three levels, or one `OOM` row."""
    when = when or time.strftime("%Y-%m", time.gmtime())
    versions = machine.get("versions", {})
    gpu = machine.get("gpu_name", "unknown GPU")
    layers_used = result.get("layers")
    layers_full = result.get("layers_full")
    inference = None
    if job.method == "inference":
        inference = {
            "batch_size": job.batch,
            "prompt_tokens_approx": job.seq,
            "max_new_tokens": job.new_tokens,
            "engine": "transformers generate (greedy, KV cache, min_new_tokens = max_new_tokens)",
            "prompt": "random tokens",
        }
    quant = None
    if job.quant != "none":
        quant = {"type": "nf4", "double_quant": job.quant == "nf4-dq",
                 "compute_dtype": "bfloat16", "storage": "uint8", "library": "bitsandbytes"}
    lora = None
    if job.method in ("lora", "qlora"):
        lora = {"r": job.lora_r, "alpha": job.lora_alpha, "dropout": job.lora_dropout,
                "target_modules": list(job.targets), "use_dora": job.dora}
    calib = {
        "harness_version": HARNESS_VERSION,
        "allocated_bytes": result.get("allocated_bytes"),
        "reserved_bytes": result.get("reserved_bytes"),
        "device_bytes": result.get("device_bytes"),
        "requested_bytes": result.get("requested_bytes"),
        "nonalloc_bytes": result.get("nonalloc_bytes"),
        "context_bare_bytes": machine.get("context_bytes"),
        "cublas_workspace_bytes": machine.get("cublas_workspace_bytes"),
        "load_allocated_bytes": result.get("load_allocated_bytes"),
        "load_live_bytes": result.get("load_live_bytes"),
        "load_reserved_bytes": result.get("load_reserved_bytes"),
        "load_peak_reserved_bytes": result.get("load_peak_reserved_bytes"),
        "load_cache": "kept" if result.get("load_cache_kept") else "emptied",
        "device_source": result.get("device_source"),
        "memory_limit_bytes": result.get("memory_limit_bytes"),
        "gpu_total_bytes": machine.get("total_bytes"),
        "compute_capability": machine.get("compute_capability"),
        "driver": machine.get("driver"),
        "cuda_runtime": versions.get("cuda"),
        "layers": layers_used,
        "layers_full": layers_full,
        "steps": result.get("steps"),
        "wall_s": result.get("wall_s"),
        "alloc_retries": result.get("alloc_retries"),
        "checks": result.get("checks"),
    }
    if result.get("peak_trace"):
        calib["peak_trace"] = result["peak_trace"]
    notes = ["moro calibration harness v%d, random weights from config.json, random tokens."
             % HARNESS_VERSION]
    if layers_used is not None and layers_full is not None and layers_used != layers_full:
        notes.append("Model cut to %d of %d decoder layers to fit the card (model_overrides)."
                     % (layers_used, layers_full))
    if job.method != "inference":
        notes.append("%d training steps; peak stats reset after the model was built (and the "
                     "cache emptied); gradient checkpointing non-reentrant."
                     % (result.get("steps") or 0))
    if result.get("error"):
        notes.append("OOM: " + str(result["error"])[:300])
    base = {
        "source_key": SOURCE_KEY,
        "source": "moro calibration/harness.py v%d on %s" % (HARNESS_VERSION, gpu),
        "source_locator": job.key(),
        "measured_when": when,
        "task": "inference" if job.method == "inference" else "finetune",
        "framework": "moro calibration harness (PyTorch loop as HF Trainer: "
                     "model(input_ids, labels).loss, backward, optimizer.step, "
                     "zero_grad(set_to_none))" if job.method != "inference"
                     else "transformers generate",
        "framework_version": framework_version(versions),
        "model": job.model.split("/")[-1],
        "model_hf_id": job.model,
        "arch": result.get("model_type"),
        "params_b": None if result.get("params") is None else round(result["params"] / 1e9, 4),
        "method": job.method,
        "base_weights_dtype": base_weights_dtype(job),
        "quantization": quant,
        "lora": lora,
        "trainable_params": result.get("trainable_params"),
        "optimizer": None if job.method == "inference" else OPTIMIZER_TEXT.get(job.optimizer,
                                                                              job.optimizer),
        "optimizer_state_dtype": None,
        "precision": PRECISION_TEXT[job.precision],
        "micro_batch_size": job.batch,
        "seq_len": job.seq + job.new_tokens if job.method == "inference" else job.seq,
        "seq_len_kind": ("random tokens, no padding, no attention mask, one step per length, in "
                         "order: %s" % ", ".join(map(str, job.lengths)) if job.lengths else
                         "fixed (random tokens, no padding, no attention mask)"),
        "grad_accum": 1,
        "global_batch_size": job.batch,
        "gradient_checkpointing": job.ckpt and job.method != "inference",
        "attention_impl": job.attn,
        "loss_impl": None if job.method == "inference" else LIGER_LOSS if job.liger
        else "HF ForCausalLMLoss cross_entropy (full fp32 logits)",
        "liger_kernels": (result.get("checks") or {}).get("liger") if job.liger else None,
        "torch_compile": job.compile,
        "activation_offload": False,
        "optimizer_in_backward": False,
        "cpu_offload": None,
        "num_gpus": 1,
        "sharding": None,
        "gpu": gpu,
        "dataset": "random tokens",
        "inference": inference,
        "is_estimate": False,
        "unit_ambiguous": False,
        "job_key": job.key(),
        "calibration": calib,
    }
    overrides: Dict[str, Any] = {}
    if layers_used is not None and layers_full is not None and layers_used != layers_full:
        overrides[result.get("layer_key", "num_hidden_layers")] = layers_used
    # The model as measured: a tie the config asks for but the built model lacks (or the
    # reverse) is part of what ran.
    tied = (result.get("checks") or {}).get("tied_embeddings")
    if tied is not None and result.get("config_tied") is not None and tied != result["config_tied"]:
        overrides["tie_word_embeddings"] = tied
    if overrides:
        base["model_overrides"] = overrides
    # Rows measured on top of the load's cache are other measurements of the same job.
    kept = "-kept" if result.get("load_cache_kept") else ""
    rows = []
    if result.get("outcome") == "OOM":
        row = dict(base)
        row.update({
            "id": "moro-cal-%s%s-oom" % (job.short_id(), kept),
            "level": "allocated",
            "measured_value": None, "measured_unit": "bytes", "measured_gib": None,
            "measured_scope": "per_gpu", "metric": METRICS["allocated"],
            "secondary_measurements": {"memory_limit_bytes": result.get("memory_limit_bytes")},
            "outcome": "OOM", "confidence": "high" if _full_card(result, machine) else "medium",
            "notes": " ".join(notes), "per_gpu_gib": None,
        })
        rows.append(row)
        return rows
    levels = {
        "allocated": result.get("allocated_bytes"),
        "reserved": result.get("reserved_bytes"),
        "device": result.get("device_bytes"),
    }
    for level, value in levels.items():
        if value is None:
            continue
        row = dict(base)
        others = {"%s_bytes" % k: v for k, v in levels.items() if k != level and v is not None}
        row.update({
            "id": "moro-cal-%s%s-%s" % (job.short_id(), kept, level),
            "level": level,
            "measured_value": float(value), "measured_unit": "bytes",
            "measured_gib": gib(value), "measured_scope": "per_gpu",
            "metric": METRICS[level],
            "secondary_measurements": others,
            "outcome": "ok", "confidence": "high",
            "notes": " ".join(notes), "per_gpu_gib": gib(value),
        })
        rows.append(row)
    return rows


def _full_card(result: Dict[str, Any], machine: Dict[str, Any]) -> bool:
    lim, tot = result.get("memory_limit_bytes"), machine.get("total_bytes")
    return bool(lim and tot and lim >= 0.97 * tot)


# --------------------------------------------------------------------------------------------
# Output file: resumption and atomic appends
# --------------------------------------------------------------------------------------------


def done_keys(path: str) -> Dict[str, str]:
    """`job_key` → outcome of the rows already in `path` (unreadable lines are ignored)."""
    out: Dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("job_key"), str):
                    out[row["job_key"]] = str(row.get("outcome", "ok"))
    except FileNotFoundError:
        pass
    return out


def write_atomic(path: str, text: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def append_rows(path: str, rows: List[Dict[str, Any]]) -> None:
    """Appends rows by rewriting the file atomically: a kill at any moment leaves either the
    old file or the new one, never half a line."""
    try:
        with open(path, encoding="utf-8") as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    if old and not old.endswith("\n"):
        old += "\n"
    new = "".join(json.dumps(r, sort_keys=False) + "\n" for r in rows)
    write_atomic(path, old + new)


# --------------------------------------------------------------------------------------------
# GPU memory queries without torch (NVML via pynvml, else nvidia-smi)
# --------------------------------------------------------------------------------------------


class Smi:
    """Device memory of one GPU, from pynvml when importable, else nvidia-smi."""

    def __init__(self, device: Optional[str] = None, runner: Callable[..., Any] = subprocess.run):
        self.device = device  # index or UUID; None = first visible
        self.runner = runner
        self.nvml = None
        self.handle = None
        try:
            import pynvml  # type: ignore

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = self._nvml_handle(device)
        except Exception:  # noqa: BLE001 - any failure means: use nvidia-smi
            self.nvml = None
            self.handle = None

    def _nvml_handle(self, device: Optional[str]):
        p = self.nvml
        if device and device.startswith("GPU-"):
            return p.nvmlDeviceGetHandleByUUID(device)
        return p.nvmlDeviceGetHandleByIndex(int(device or 0))

    @property
    def source(self) -> str:
        return "nvml" if self.nvml else "nvidia-smi"

    def memory(self) -> Optional[Tuple[int, int]]:
        """(used, total) bytes of the device, or None when nothing can be queried."""
        if self.nvml:
            try:
                m = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
                return int(m.used), int(m.total)
            except Exception:  # noqa: BLE001
                return None
        if not shutil.which("nvidia-smi"):
            return None
        args = ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"]
        if self.device:
            args += ["-i", self.device]
        try:
            out = self.runner(args, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        if out.returncode != 0:
            return None
        return parse_smi_memory(out.stdout)

    def used_by_uuid(self) -> Dict[str, int]:
        """Used bytes of every device, by UUID (to find the one CUDA picks, whose NVML index
        may differ)."""
        out: Dict[str, int] = {}
        if self.nvml:
            try:
                for i in range(self.nvml.nvmlDeviceGetCount()):
                    hd = self.nvml.nvmlDeviceGetHandleByIndex(i)
                    u = self.nvml.nvmlDeviceGetUUID(hd)
                    u = u.decode() if isinstance(u, bytes) else str(u)
                    out[u] = int(self.nvml.nvmlDeviceGetMemoryInfo(hd).used)
            except Exception:  # noqa: BLE001
                return {}
            return out
        if not shutil.which("nvidia-smi"):
            return out
        try:
            r = self.runner(["nvidia-smi", "--query-gpu=uuid,memory.used",
                             "--format=csv,noheader,nounits"], capture_output=True, text=True,
                            timeout=30)
        except (OSError, subprocess.SubprocessError):
            return out
        return parse_smi_uuid_used(r.stdout) if r.returncode == 0 else out

    def process_used(self, pid: int) -> Optional[int]:
        """Memory used by process `pid` on the device (None when the driver does not say,
        e.g. inside a PID namespace)."""
        if self.nvml:
            try:
                procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
            except Exception:  # noqa: BLE001
                return None
            for p in procs:
                if int(p.pid) == pid and p.usedGpuMemory is not None:
                    return int(p.usedGpuMemory)
            return None
        if not shutil.which("nvidia-smi"):
            return None
        args = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        if self.device:
            args += ["-i", self.device]
        try:
            out = self.runner(args, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return parse_smi_process(out.stdout, pid) if out.returncode == 0 else None

    def driver(self) -> Optional[str]:
        if self.nvml:
            try:
                v = self.nvml.nvmlSystemGetDriverVersion()
                return v.decode() if isinstance(v, bytes) else str(v)
            except Exception:  # noqa: BLE001
                return None
        if not shutil.which("nvidia-smi"):
            return None
        try:
            out = self.runner(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        lines = out.stdout.strip().splitlines()
        return lines[0].strip() if out.returncode == 0 and lines else None


def parse_smi_memory(text: str) -> Optional[Tuple[int, int]]:
    """`nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits` (MiB),
    first line."""
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            try:
                return int(float(parts[0]) * MIB), int(float(parts[1]) * MIB)
            except ValueError:
                return None
    return None


def parse_smi_uuid_used(text: str) -> Dict[str, int]:
    """`--query-gpu=uuid,memory.used --format=csv,noheader,nounits` (MiB)."""
    out: Dict[str, int] = {}
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            try:
                out[parts[0]] = int(float(parts[1]) * MIB)
            except ValueError:
                continue
    return out


def parse_smi_process(text: str, pid: int) -> Optional[int]:
    """`--query-compute-apps=pid,used_memory` (MiB) for `pid`."""
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0] == str(pid):
            try:
                return int(float(parts[1]) * MIB)
            except ValueError:
                return None
    return None


# --------------------------------------------------------------------------------------------
# Predictions with `moro estimate` (the shared-machine safety check)
# --------------------------------------------------------------------------------------------


def estimate_args(job: Job, config_file: str) -> List[str]:
    """`moro estimate` flags describing `job` on the model in `config_file`."""
    a = ["estimate", "--json", "--model", config_file, "--method", job.method,
         "--precision", job.precision, "--micro-batch-size", str(job.batch)]
    attn = {"flash_attention_2": "flash"}.get(job.attn, job.attn)
    a += ["--attention", attn, "--stack", "hf"]
    if job.method == "inference":
        a += ["--seq-len", str(job.seq + job.new_tokens)]
    else:
        a += ["--seq-len", str(job.seq), "--optimizer", job.optimizer,
              "--gradient-checkpointing=%s" % ("true" if job.ckpt else "false")]
    a += ["--quantization", job.quant]
    if job.method in ("lora", "qlora"):
        a += ["--lora-rank", str(job.lora_r), "--lora-alpha", str(job.lora_alpha),
              "--lora-dropout", str(job.lora_dropout), "--target-modules", ",".join(job.targets)]
    return a


def predict_device_bytes(moro: Optional[str], job: Job, config: Dict[str, Any],
                         layers: Optional[int], tmpdir: str,
                         runner: Callable[..., Any] = subprocess.run) -> Optional[int]:
    """moro's predicted device-level peak for `job` with `layers` layers, or None (no moro,
    or moro cannot estimate it)."""
    if not moro:
        return None
    cfg = with_layers(config, layers)
    path = os.path.join(tmpdir, "%s-L%s.json" % (job.model.replace("/", "--"), layers))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    try:
        out = runner([moro] + estimate_args(job, path), capture_output=True, text=True,
                     timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode not in (0, 1):
        return None
    try:
        return int(json.loads(out.stdout)["peak_device_bytes"])
    except (ValueError, KeyError, TypeError):
        return None


def choose_layers(job: Job, config: Dict[str, Any], avail: Optional[int],
                  predict: Callable[[Optional[int]], Optional[int]]) -> Tuple[Optional[int], str]:
    """The layer count to run `job` with, or (None, reason) to skip it.

    `avail`: device bytes this job may use (free minus the margin), None when unknown.
    `predict(layers)`: moro's device-level prediction, None when unavailable.
    Returns (layers, "") to run; layers None means the config's own count.
    """
    full = full_layers(config)
    pinned = job.layers if isinstance(job.layers, int) else None
    want = pinned if pinned is not None else full

    def norm(n: int) -> Optional[int]:
        return None if n == full else n

    if avail is None:
        return norm(want), ""
    p = predict(want)
    if p is None or p <= avail:
        return norm(want), ""
    if job.layers != "auto":
        return (None, "predicted %.1f GiB > %.1f GiB free (minus margin)" % (p / GIB, avail / GIB))
    lo, hi, best = 1, want - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        pm = predict(mid)
        if pm is None:
            return (None, "moro could not estimate %d layers" % mid)
        if pm <= avail:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best is None or best < 2:
        return (None, "even 2 layers are predicted not to fit in %.1f GiB" % (avail / GIB))
    return (best, "")


# --------------------------------------------------------------------------------------------
# The parent: probe, plan, run jobs in children, write rows
# --------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    sys.stderr.write("[calibrate] %s\n" % msg)
    sys.stderr.flush()


def run_child(args: List[str], timeout: float) -> Tuple[Optional[Dict[str, Any]], str]:
    """Runs `harness.py ARGS` in a child python; returns (result, error text)."""
    cmd = [sys.executable, os.path.abspath(__file__)] + args
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True,
                              timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        return None, "timed out after %.0f s" % timeout
    except OSError as e:
        return None, str(e)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            try:
                result = json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                pass
    if result is None:
        return None, "worker exited with status %d and no result" % proc.returncode
    return result, ""


def probe_machine(timeout: float = 300) -> Dict[str, Any]:
    result, err = run_child(["--worker-probe"], timeout)
    if result is None:
        raise HarnessError("probing the GPU failed: %s" % err)
    if result.get("error"):
        raise HarnessError(result["error"])
    return result


def run_job(job: Job, layers: Optional[int], opts: Dict[str, Any], timeout: float
            ) -> Tuple[Optional[Dict[str, Any]], str]:
    spec = {"job": job.to_dict(), "layers": layers}
    spec.update(opts)
    return run_child(["--worker", json.dumps(spec)], timeout)


def run_grid(args: argparse.Namespace, jobs: List[Job],
             probe: Callable[[], Dict[str, Any]] = probe_machine,
             runner: Callable[..., Tuple[Optional[Dict[str, Any]], str]] = run_job,
             smi_factory: Callable[[Optional[str]], Smi] = Smi,
             clock: Callable[[], float] = time.monotonic) -> Dict[str, int]:
    """Runs the jobs not yet in the output file, within the budget. Returns counts."""
    start = clock()
    done = done_keys(args.output)
    counts = {"ran": 0, "oom": 0, "skipped": 0, "already": 0, "failed": 0}
    todo = []
    for j in jobs:
        if j.key() in done:
            counts["already"] += 1
        else:
            todo.append(j)
    if counts["already"]:
        log("%d job(s) already in %s: skipped" % (counts["already"], args.output))
    if not todo:
        log("nothing to do")
        return counts
    machine = probe()
    write_atomic(args.output + ".machine.json", json.dumps(machine, indent=2) + "\n")
    log("GPU: %s (%.1f GiB), CUDA context %s, torch %s" % (
        machine.get("gpu_name"), (machine.get("total_bytes") or 0) / GIB,
        "%.0f MiB" % (machine["context_bytes"] / MIB) if machine.get("context_bytes") else "?",
        machine.get("versions", {}).get("torch")))
    smi = smi_factory(machine.get("uuid"))
    margin = int(args.margin_gib * GIB)
    available = set(k for k, v in machine.get("versions", {}).items() if v)
    tmpdir = tempfile.mkdtemp(prefix="moro-calib-")
    try:
        for job in todo:
            elapsed = clock() - start
            left = args.budget_seconds - elapsed
            if left < args.min_job_seconds:
                log("budget of %d s spent: stopping (%d job(s) left; run again to resume)"
                    % (args.budget_seconds, len(todo) - counts["ran"] - counts["oom"]
                       - counts["skipped"] - counts["failed"]))
                break
            missing = [p for p in job.needs() if p not in available]
            if missing:
                log("skip %s: needs %s" % (job.short_id(), ", ".join(missing)))
                counts["skipped"] += 1
                continue
            try:
                config = load_config(args.configs, job.model)
            except HarnessError as e:
                log("skip %s: %s" % (job.short_id(), e))
                counts["skipped"] += 1
                continue
            mem = smi.memory()
            avail = None if mem is None else mem[1] - mem[0] - margin
            moro = args.moro

            def predict(n: Optional[int], job=job, config=config) -> Optional[int]:
                return predict_device_bytes(moro, job, config, n, tmpdir)

            layers, why = choose_layers(job, config, avail, predict)
            if why:
                log("skip %s (%s): %s" % (job.short_id(), job.why, why))
                counts["skipped"] += 1
                continue
            opts = {"configs": args.configs, "margin_bytes": margin, "steps": args.steps,
                    "uuid": machine.get("uuid"), "snapshot": bool(getattr(args, "snapshot", False)),
                    "keep_load_cache": bool(getattr(args, "keep_load_cache", False)),
                    "trace_dir": args.output + ".traces" if getattr(args, "snapshot", False)
                    else None}
            auto = job.layers == "auto"
            attempts = 0
            while True:
                attempts += 1
                log("run %s: %s [%s layers] (%.0f s left)" % (
                    job.short_id(), job.why or job.key(),
                    "all" if layers is None else layers, left))
                result, err = runner(job, layers, opts, min(left, args.job_timeout))
                if result is None:
                    log("job %s failed: %s" % (job.short_id(), err))
                    counts["failed"] += 1
                    break
                if result.get("outcome") == "error":
                    log("job %s failed: %s" % (job.short_id(), result.get("error")))
                    counts["failed"] += 1
                    break
                append_rows(args.output, build_rows(job, result, machine))
                if result.get("outcome") == "OOM":
                    counts["oom"] += 1
                    log("job %s: out of memory (recorded)" % job.short_id())
                    # An auto-scaled job is retried with fewer layers, under a new key.
                    n = result.get("layers") or 0
                    if auto and n > 2 and attempts < 3:
                        layers = max(2, n * 2 // 3)
                        job = dataclasses.replace(job, layers=layers)
                        left = args.budget_seconds - (clock() - start)
                        if left >= args.min_job_seconds:
                            continue
                    break
                counts["ran"] += 1
                log("job %s: allocated %.2f GiB, reserved %.2f GiB, device %s" % (
                    job.short_id(), result["allocated_bytes"] / GIB,
                    result["reserved_bytes"] / GIB,
                    "%.2f GiB" % (result["device_bytes"] / GIB)
                    if result.get("device_bytes") else "?"))
                break
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return counts


# --------------------------------------------------------------------------------------------
# The worker (child process; imports torch)
# --------------------------------------------------------------------------------------------


def package_versions() -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {}
    from importlib import metadata

    for name in ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "flash_attn",
                 "trl", "pynvml", "liger_kernel", "triton"):
        try:
            mod = __import__(name)
            version = getattr(mod, "__version__", None)
            if version is None:
                try:
                    version = metadata.version(name.replace("_", "-"))
                except metadata.PackageNotFoundError:
                    version = "present"
            out[name] = str(version)
        except Exception:  # noqa: BLE001 - a broken optional package counts as absent
            out[name] = None
    try:
        import torch

        out["cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        out["cuda"] = None
    return out


def device_uuid(torch) -> Optional[str]:
    try:
        u = str(torch.cuda.get_device_properties(0).uuid)
        return u if u.startswith("GPU-") else "GPU-" + u
    except Exception:  # noqa: BLE001
        return None


def our_used(smi: Smi, baseline: Optional[int]) -> Tuple[Optional[int], str]:
    """Device memory this process uses: the driver's per-process figure, else the device's
    used memory minus what was used before this process touched CUDA."""
    p = smi.process_used(os.getpid())
    if p is not None:
        return p, smi.source + " per-process"
    m = smi.memory()
    if m is not None and baseline is not None:
        return max(0, m[0] - baseline), smi.source + " device used minus baseline"
    return None, ""


def worker_probe() -> Dict[str, Any]:
    """Machine facts: GPU, versions, the bare CUDA context, the cuBLAS workspace."""
    versions = package_versions()
    try:
        import torch
    except ImportError:
        return {"error": "torch is not installed in %s (pip install torch)" % sys.executable}
    if not torch.version.cuda:
        return {"error": "torch has no CUDA (CPU-only build)"}
    smi0 = Smi(os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or None)
    before_all = smi0.used_by_uuid()  # before this process touches CUDA
    before = smi0.memory()
    if not torch.cuda.is_available():
        return {"error": "no NVIDIA GPU visible"}
    torch.cuda.init()
    uuid = device_uuid(torch)
    smi = Smi(uuid) if uuid else smi0
    baseline = before_all.get(uuid) if uuid in before_all else (before[0] if before else None)
    x = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    used, source = our_used(smi, baseline)
    context = None if used is None else used - torch.cuda.memory_reserved()
    # cuBLAS workspace: allocated through the caching allocator on the first matmul.
    a = torch.ones(256, 256, device="cuda", dtype=torch.bfloat16)
    m0 = torch.cuda.memory_allocated()
    c = a @ a
    torch.cuda.synchronize()
    ws = torch.cuda.memory_allocated() - m0 - 256 * 256 * 2
    del c, a, x
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu_name": torch.cuda.get_device_name(0),
        "uuid": uuid,
        "total_bytes": int(props.total_memory),
        "compute_capability": [props.major, props.minor],
        "context_bytes": context,
        "context_source": source,
        "cublas_workspace_bytes": ws if ws > 0 else None,
        "driver": smi.driver(),
        "versions": versions,
        "device_source": smi.source,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "harness_version": HARNESS_VERSION,
    }


class Sampler(threading.Thread):
    """Polls this process's device memory (NVML only: nvidia-smi is too slow to poll)."""

    def __init__(self, smi: Smi, baseline: Optional[int], period: float = 0.02):
        super().__init__(daemon=True)
        self.smi, self.baseline, self.period = smi, baseline, period
        self.peak: Optional[int] = None
        self.stop = threading.Event()

    def run(self) -> None:
        if not self.smi.nvml:
            return
        while not self.stop.is_set():
            used, _ = our_used(self.smi, self.baseline)
            if used is not None and (self.peak is None or used > self.peak):
                self.peak = used
            self.stop.wait(self.period)


def _site(frames: List[Dict[str, Any]]) -> str:
    """Where an allocation was made: the innermost Python frame outside torch itself
    (transformers, PEFT, bitsandbytes, this harness), else the innermost frame."""
    def fmt(f: Dict[str, Any]) -> str:
        return "%s:%s:%s" % (os.path.basename(str(f.get("filename", "?"))), f.get("line", "?"),
                             f.get("name", "?"))
    for f in frames:
        name = str(f.get("filename", ""))
        if name.endswith(".py") and "/torch/" not in name and not name.endswith("harness.py"):
            return fmt(f)
    return fmt(frames[0]) if frames else "?"


def allocation_events(trace: List[Dict[str, Any]]) -> List[List[Any]]:
    """A CUDA allocator trace as `allocsim.py` events: `["a", addr, size]`, `["f", addr]`."""
    out: List[List[Any]] = []
    for ev in trace:
        a = ev.get("action")
        if a == "alloc":
            out.append(["a", ev.get("addr"), int(ev.get("size") or 0)])
        elif a == "free_completed":
            out.append(["f", ev.get("addr")])
    return out


def replayed_peaks(trace: List[Dict[str, Any]], start_allocated: int,
                   start_reserved: int) -> Optional[Dict[str, int]]:
    """The real trace replayed through `allocsim.py` from an empty cache, on top of what was
    there when recording began: a check of the allocator model against the allocator.
    None where allocsim is not beside this file (the copy `moro calibrate` embeds)."""
    try:
        import allocsim  # type: ignore
    except ImportError:
        return None
    a = allocsim.replay(allocation_events(trace))
    return {"replayed_allocated_peak_bytes": start_allocated + a.peak_allocated,
            "replayed_reserved_peak_bytes": start_reserved + a.peak_reserved}


def peak_trace(events: List[Dict[str, Any]], start_allocated: int, start_reserved: int,
               top: int = 15) -> Dict[str, Any]:
    """What was live at the allocated peak of a CUDA allocator trace
    (`torch.cuda.memory._snapshot()["device_traces"][i]`), and how much was cached but free
    at the reserved peak. `start_*`: the counters when recording began (what was allocated
    before is in the peak but not in the live list: `untracked_bytes`)."""
    cur, peak, peak_at = start_allocated, start_allocated, -1
    seg, seg_peak, alloc_at_seg_peak = start_reserved, start_reserved, start_allocated
    for i, ev in enumerate(events):
        a, size = ev.get("action"), int(ev.get("size") or 0)
        if a == "alloc":
            cur += size
            if cur > peak:
                peak, peak_at = cur, i
        elif a == "free_completed":
            cur -= size
        elif a in ("segment_alloc", "segment_map"):
            seg += size
            if seg > seg_peak:
                seg_peak, alloc_at_seg_peak = seg, cur
        elif a in ("segment_free", "segment_unmap"):
            seg -= size
    live: Dict[Any, Tuple[int, str]] = {}
    for ev in events[:peak_at + 1]:
        a = ev.get("action")
        if a == "alloc":
            live[ev.get("addr")] = (int(ev.get("size") or 0), _site(ev.get("frames") or []))
        elif a == "free_completed":
            live.pop(ev.get("addr"), None)
    groups: Dict[Tuple[str, int], int] = {}
    for size, site in live.values():
        groups[(site, size)] = groups.get((site, size), 0) + 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[0][1] * kv[1])[:top]
    traced = sum(size for size, _ in live.values())
    return {
        "allocated_peak_bytes": peak,
        "peak_event": peak_at,
        "untracked_bytes": peak - traced,
        "live_top": [{"site": site, "bytes_each": size, "count": n, "bytes": size * n}
                     for (site, size), n in ranked],
        "reserved_peak_bytes": seg_peak,
        "allocated_at_reserved_peak_bytes": alloc_at_seg_peak,
        "events": len(events),
    }


def build_model(job: Job, config: Dict[str, Any], device: str = "cuda"):
    """The model with random weights, built on `device` without a full-size CPU copy:
    parameters are created on the meta device, then made directly on the GPU (NF4 layers are
    quantized there one at a time)."""
    import torch
    import transformers
    from accelerate import init_empty_weights

    cfg_dict = dict(config)
    cfg_dict.pop("quantization_config", None)
    model_type = cfg_dict.pop("model_type", None)
    cfg = transformers.AutoConfig.for_model(model_type, **cfg_dict)
    cfg.use_cache = job.method == "inference"
    full_fp32 = job.precision == "fp32" or (job.method == "full" and job.precision == "bf16-mixed")
    dtype = torch.float32 if full_fp32 else torch.bfloat16
    major = int(transformers.__version__.split(".")[0])
    dtype_kw = {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}
    with init_empty_weights(include_buffers=False):
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation=job.attn, **dtype_kw)
    # from_pretrained ties lm_head to the embedding after loading; from_config under
    # init_empty_weights leaves them two parameters (transformers 5), so tie them here.
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
        if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
            model.get_output_embeddings().weight = model.get_input_embeddings().weight
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    if job.quant != "none":
        _quantize_linears(model, job, device, gen)
    _materialize(model, device, gen)
    # Buffers (rotary inv_freq, ...) were made on the host with their real values.
    for module in model.modules():
        for name, b in list(module._buffers.items()):
            if b is not None and b.device.type != torch.device(device).type:
                module._buffers[name] = b.to(device)
    if job.quant != "none":
        # What from_pretrained(quantization_config=BitsAndBytesConfig(...)) marks, so that
        # PEFT takes its bitsandbytes paths.
        for attr, value in (("is_loaded_in_4bit", True), ("is_quantized", True),
                            ("quantization_method", "bitsandbytes")):
            try:
                setattr(model, attr, value)
            except AttributeError:
                pass
    return model


def _materialize(model, device: str, gen) -> None:
    """Replaces meta parameters with random ones on `device`, keeping tied parameters tied."""
    import torch

    made: Dict[int, Any] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_meta:
                continue
            key = id(p)
            if key not in made:
                t = torch.empty(p.shape, dtype=p.dtype, device=device)
                if t.dim() >= 2:
                    t.normal_(0.0, 0.02, generator=gen)
                elif name == "bias":
                    t.zero_()
                else:
                    t.fill_(1.0)
                made[key] = torch.nn.Parameter(t, requires_grad=p.requires_grad)
            module._parameters[name] = made[key]


def _quantize_linears(model, job: Job, device: str, gen) -> None:
    """Swaps every decoder-layer nn.Linear (not lm_head) for a bitsandbytes Linear4bit whose
    random bf16 weight is quantized on the GPU, as from_pretrained with BitsAndBytesConfig
    does (its default skip list is the output head)."""
    import bitsandbytes as bnb
    import torch

    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, torch.nn.Linear) or child_name == "lm_head":
                continue
            q = bnb.nn.Linear4bit(child.in_features, child.out_features,
                                  bias=child.bias is not None, compute_dtype=torch.bfloat16,
                                  compress_statistics=job.quant == "nf4-dq", quant_type="nf4",
                                  quant_storage=torch.uint8, device="meta")
            w = torch.empty(child.out_features, child.in_features, dtype=torch.bfloat16,
                            device=device).normal_(0.0, 0.02, generator=gen)
            q.weight = bnb.nn.Params4bit(w, requires_grad=False, compress_statistics=(
                job.quant == "nf4-dq"), quant_type="nf4", quant_storage=torch.uint8).to(device)
            del w
            if child.bias is not None:
                q.bias = torch.nn.Parameter(torch.zeros(child.out_features, dtype=torch.bfloat16,
                                                        device=device), requires_grad=False)
            q.requires_grad_(False)
            setattr(module, child_name, q)


def make_optimizer(job: Job, params):
    import torch

    lr = 1e-5
    if job.optimizer == "adamw_torch_fused":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if job.optimizer == "adamw_torch":
        return torch.optim.AdamW(params, lr=lr, foreach=True)
    import bitsandbytes as bnb

    if job.optimizer == "adamw_8bit":
        return bnb.optim.AdamW8bit(params, lr=lr)
    if job.optimizer == "paged_adamw_32bit":
        return bnb.optim.PagedAdamW32bit(params, lr=lr)
    if job.optimizer == "paged_adamw_8bit":
        return bnb.optim.PagedAdamW8bit(params, lr=lr)
    raise HarnessError("unknown optimizer %s" % job.optimizer)


def prepare_training(job: Job, model):
    """Gradient checkpointing, PEFT, the optimizer: as HF Trainer + PEFT set them up."""
    ckpt_kwargs = {"use_reentrant": False}
    if job.method == "qlora":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=job.ckpt, gradient_checkpointing_kwargs=ckpt_kwargs)
        if job.ckpt and not getattr(model, "is_gradient_checkpointing", False):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ckpt_kwargs)
    elif job.ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ckpt_kwargs)
    if job.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(r=job.lora_r, lora_alpha=job.lora_alpha, lora_dropout=job.lora_dropout,
                          target_modules=list(job.targets), bias="none", task_type="CAUSAL_LM",
                          use_dora=job.dora)
        model = get_peft_model(model, lcfg)
    if job.liger:
        # Trainer.__init__ (transformers 5): with use_liger_kernel it calls
        # _apply_liger_kernel_to_instance on the model, or on a PEFT model's base model.
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        _apply_liger_kernel_to_instance(model=base)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(job, params)
    if job.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        # Trainer.create_optimizer: with a bitsandbytes optimizer of optim_bits 8, every
        # nn.Embedding weight keeps 32-bit states (GlobalOptimManager override).
        import bitsandbytes as bnb
        import torch

        manager = bnb.optim.GlobalOptimManager.get_instance()
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
    if job.compile:
        # Trainer with torch_compile=True: torch.compile(model) with the default backend
        # (inductor) and mode; the optimizer keeps the uncompiled parameters (the same ones).
        import torch

        model = torch.compile(model)
    return model, opt


def start_recording(torch) -> Tuple[int, int]:
    """Starts the allocator's trace; returns the allocated and reserved bytes before it."""
    start = (int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved()))
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    return start


def finish_recording(torch, start: Tuple[int, int], job: Job,
                     trace_dir: Optional[str]) -> Dict[str, Any]:
    """Stops the trace and analyses it (`peak_trace`, `replayed_peaks`); with `trace_dir`,
    writes the allocations to `trace_dir/ID.json`."""
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][torch.cuda.current_device()]
    result = peak_trace(trace, *start)
    result.update(replayed_peaks(trace, *start) or {})
    if trace_dir:
        os.makedirs(trace_dir, exist_ok=True)
        write_atomic(os.path.join(trace_dir, "%s.json" % job.short_id()),
                     json.dumps(allocation_events(trace)))
    return result


def worker_job(spec: Dict[str, Any], device: str = "cuda") -> Dict[str, Any]:
    """Runs one job and measures it. Never raises for an out-of-memory error."""
    import torch

    job = Job.from_dict(spec["job"])
    config = load_config(spec["configs"], job.model)
    layers = spec.get("layers")
    cfg = with_layers(config, layers)
    out: Dict[str, Any] = {"outcome": "ok", "layers": full_layers(cfg),
                           "layers_full": full_layers(config), "layer_key": layer_key(config),
                           "model_type": config.get("model_type"), "steps": 0}
    cuda = device == "cuda"
    device_id = spec.get("uuid") or os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]
    smi = Smi(device_id or None) if cuda else None
    before = smi.memory() if smi else None
    baseline = before[0] if before else None
    t0 = time.monotonic()
    if cuda:
        torch.cuda.init()
        torch.ones(1, device="cuda")
        free, total = torch.cuda.mem_get_info()
        limit = max(free - int(spec.get("margin_bytes", 2 * GIB)), 256 * MIB)
        frac = min(1.0, limit / total)
        torch.cuda.set_per_process_memory_fraction(frac)
        out["memory_limit_bytes"] = int(frac * total)
    sampler = Sampler(smi, baseline) if smi else None
    try:
        model = build_model(job, cfg, device)
        out["params"] = sum(_numel(p) for p in model.parameters())
        if cuda:
            torch.cuda.synchronize()
            out["load_allocated_bytes"] = torch.cuda.max_memory_allocated()
        if job.method == "inference":
            model.eval()
        else:
            model, opt = prepare_training(job, model)
            out["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        out["checks"] = model_checks(model)
        out["config_tied"] = bool(getattr(model.config, "tie_word_embeddings", False))
        if cuda:
            # What loading left in the cache: real runs keep it (nothing calls empty_cache),
            # so `keep_load_cache` measures the step on top of it.
            out["load_cache_kept"] = bool(spec.get("keep_load_cache"))
            out["load_live_bytes"] = int(torch.cuda.memory_allocated())
            out["load_reserved_bytes"] = int(torch.cuda.memory_reserved())
            out["load_peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
            if not spec.get("keep_load_cache"):
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            if spec.get("snapshot"):
                start_counters = start_recording(torch)
        if sampler:
            sampler.start()
        vocab = int(getattr(model.config, "vocab_size", None) or cfg.get("vocab_size") or 32000)
        gen = torch.Generator(device=device)
        gen.manual_seed(1)
        if job.method == "inference":
            ids = torch.randint(0, vocab, (job.batch, job.seq), device=device, generator=gen)
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                               max_new_tokens=job.new_tokens, min_new_tokens=job.new_tokens,
                               do_sample=False, use_cache=True, pad_token_id=0)
            out["steps"] = 1
        else:
            autocast = job.precision == "bf16-mixed"
            for seq in job.lengths or [job.seq] * int(spec.get("steps", 3)):
                ids = torch.randint(0, vocab, (job.batch, seq), device=device, generator=gen)
                labels = ids.clone()
                with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
                    o = model(input_ids=ids, labels=labels)
                loss = o.loss
                del o
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss, ids, labels
                out["steps"] += 1
        if cuda:
            torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as e:
        out["outcome"] = "OOM"
        out["error"] = str(e).splitlines()[0] if str(e) else "CUDA out of memory"
    except Exception as e:  # noqa: BLE001 - reported as a failed job, not a row
        if "out of memory" in str(e).lower():
            out["outcome"] = "OOM"
            out["error"] = str(e).splitlines()[0]
        else:
            out["outcome"] = "error"
            out["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    finally:
        if sampler:
            sampler.stop.set()
            if sampler.is_alive():
                sampler.join(timeout=2)
    out["wall_s"] = round(time.monotonic() - t0, 2)
    if cuda and spec.get("snapshot"):
        try:
            out["peak_trace"] = finish_recording(torch, start_counters, job, spec.get("trace_dir"))
        except Exception as e:  # noqa: BLE001 - the measurement stands without the trace
            out["peak_trace"] = {"error": "%s: %s" % (type(e).__name__, e)}
    if cuda:
        stats = torch.cuda.memory_stats()
        out["allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        out["reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        out["requested_bytes"] = stats.get("requested_bytes.all.peak")
        out["alloc_retries"] = stats.get("num_alloc_retries")
        used, source = our_used(smi, baseline) if smi else (None, "")
        if used is not None:
            nonalloc = used - torch.cuda.memory_reserved()
            out["nonalloc_bytes"] = nonalloc
            # Memory outside the allocator (context, modules, paged states) only grows, so
            # the device peak is at least the reserved peak plus what is outside it now.
            dev = out["reserved_bytes"] + max(nonalloc, 0)
            if sampler and sampler.peak:
                dev = max(dev, sampler.peak)
            out["device_bytes"] = dev
            out["device_source"] = source
    return out


def model_checks(model) -> Dict[str, Any]:
    """What the model really is, for the row: parameter dtypes (trainable / frozen, in
    elements), the attention implementation, whether checkpointing is on, 4-bit layers."""
    dtypes: Dict[str, Dict[str, int]] = {"trainable": {}, "frozen": {}}
    for p in model.parameters():
        side = dtypes["trainable" if p.requires_grad else "frozen"]
        k = str(p.dtype).replace("torch.", "")
        side[k] = side.get(k, 0) + p.numel()
    cfg = getattr(model, "config", None)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    lora_4bit = sum(1 for m in model.modules() if type(m).__module__.endswith("lora.bnb")
                    and type(m).__name__ == "Linear4bit")
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    tied = None
    if emb is not None and out is not None:
        tied = getattr(emb, "weight", None) is getattr(out, "weight", None)
    # Liger patches an existing model by binding its kernels' `forward` onto each module
    # instance (`monkey_patch.py` `_bind_method_to_module`), so count those, not classes.
    liger = {}
    for m in model.modules():
        bound = m.__dict__.get("forward")
        name = getattr(getattr(bound, "__func__", None), "__qualname__", "")
        if name.startswith("Liger"):
            liger[name] = liger.get(name, 0) + 1
    forward = getattr(getattr(base, "forward", None), "__func__", None)
    if forward is not None and "lce_forward" in getattr(forward, "__name__", ""):
        liger["fused_linear_cross_entropy"] = forward.__module__ + "." + forward.__name__
    return {
        "tied_embeddings": tied,
        "liger": liger or None,
        "compiled": type(model).__name__ == "OptimizedModule",
        "param_dtypes": dtypes,
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "gradient_checkpointing": bool(getattr(base, "is_gradient_checkpointing", False)),
        "linear4bit": sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit"
                          and type(m).__module__.startswith("bitsandbytes")),
        "lora_bnb_4bit_layers": lora_4bit,
    }


def _numel(p) -> int:
    # A Params4bit stores two 4-bit values per byte.
    n = p.numel()
    return n * 2 if getattr(p, "quant_state", None) is not None else n


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def default_configs_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "data", "models"))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="harness.py",
        description="Measure peak GPU memory of real fine-tuning steps for moro "
                    "(rows in the validation/measured.jsonl schema).")
    p.add_argument("--plan", action="store_true", help="print the grid and exit (no torch needed)")
    p.add_argument("--json", action="store_true", help="with --plan: one JSON object per job")
    p.add_argument("--grid", default="full", choices=["full", "quick"],
                   help="full grid or moro calibrate's short one (default full)")
    p.add_argument("--only", help="only jobs whose key or description matches this regex")
    p.add_argument("--max-jobs", type=int, help="at most this many jobs (in grid order)")
    p.add_argument("--layers", type=int,
                   help="run every job with this many decoder layers (recorded in the rows)")
    p.add_argument("--output", default="measured-own.jsonl",
                   help="rows are appended here; jobs already in it are skipped")
    p.add_argument("--configs", default=default_configs_dir(),
                   help="directory of org--name.json model configs (default: data/models)")
    p.add_argument("--budget-seconds", type=float, default=3600,
                   help="stop starting jobs after this many seconds (default 3600)")
    p.add_argument("--job-timeout", type=float, default=900,
                   help="kill a job after this many seconds (default 900)")
    p.add_argument("--min-job-seconds", type=float, default=45,
                   help="do not start a job with less budget than this left (default 45)")
    p.add_argument("--steps", type=int, default=3, help="training steps per job (default 3)")
    p.add_argument("--margin-gib", type=float, default=2.0,
                   help="leave this much device memory free for others (default 2)")
    p.add_argument("--moro", default=None,
                   help="moro binary for the free-memory check (default: `moro` on PATH)")
    p.add_argument("--no-moro", action="store_true", help="skip the predicted-need check")
    p.add_argument("--snapshot", action="store_true",
                   help="record the allocator's trace: what was live at the peak, the trace "
                        "replayed through allocsim.py (calibration.peak_trace), and the "
                        "allocations themselves (OUTPUT.traces/ID.json); slower")
    p.add_argument("--keep-load-cache", action="store_true",
                   help="do not empty PyTorch's cache after loading the model (as real runs "
                        "do not): the rows then measure the step on top of the load's "
                        "fragmentation (row ids end in -kept)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-probe", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.no_moro:
        args.moro = None
    elif args.moro is None:
        args.moro = shutil.which("moro")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker_probe:
        print(RESULT_PREFIX + json.dumps(worker_probe()), flush=True)
        return 0
    if args.worker:
        try:
            res = worker_job(json.loads(args.worker))
        except HarnessError as e:
            res = {"outcome": "error", "error": str(e)}
        print(RESULT_PREFIX + json.dumps(res), flush=True)
        return 0
    try:
        jobs = select(grid(args.grid), args.only, args.max_jobs, args.layers)
    except (ValueError, re.error) as e:
        sys.stderr.write("error: %s\n" % e)
        return 2
    if args.plan:
        if args.json:
            for j in jobs:
                d = j.to_dict()
                d["key"] = j.key()
                d["id"] = j.short_id()
                print(json.dumps(d))
        else:
            sys.stdout.write(plan_text(jobs))
        return 0
    try:
        counts = run_grid(args, jobs)
    except HarnessError as e:
        sys.stderr.write("error: %s\n" % e)
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: rows written so far are kept; run again to resume\n")
        return 130
    log("done: %(ran)d measured, %(oom)d out of memory, %(skipped)d skipped, %(failed)d "
        "failed, %(already)d already measured" % counts)
    print(json.dumps({"output": args.output, **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
