#!/usr/bin/env python
"""Every allocation and free of a one-GPU training step, in order, on fake CUDA tensors.

Runs the fake-CUDA oracle (../shared/oracle/oracle.py: the real Hugging Face model, PEFT and
torch.optim on FakeTensors, no weights, no arithmetic) with its live-storage tracker
recording each storage it sees appear and disappear: the parameters in `parameters()` order
(what loading leaves), then two training steps. Each event is a storage's byte size (the
unrounded `nbytes`, as `cudaMalloc` requests reach the caching allocator), its category
(params, activations, grads, optimizer states, ...) and the phase it was made in.

`crates/moro-core/tests/step_trace.rs` replays these sequences and moro's own
(`moro_core::estimate::trace`) through the same allocator model and compares the allocated
and reserved peaks; `--matrix` regenerates its fixture,
`validation/oracle-traces/step-events.jsonl` (a few minutes on two cores).

  $PY calibration/step_events.py --config ../shared/models/meta-llama--Llama-3.1-8B.json \\
      --override num_hidden_layers=2 --method lora --precision bf16-mixed --seq 512 --grad-ckpt
  $PY calibration/step_events.py --matrix
  $PY calibration/step_events.py --matrix-dora
  $PY calibration/step_events.py --matrix-lora
  $PY calibration/step_events.py --matrix-qlora
  $PY calibration/step_events.py --matrix-full
  $PY calibration/step_events.py --matrix-flash
  $PY calibration/step_events.py --matrix-math
  $PY calibration/step_events.py --matrix-h200
  $PY calibration/step_events.py --matrix-lengths
  $PY calibration/step_events.py --matrix-peft
  $PY calibration/step_events.py --matrix-peft-weight
  $PY calibration/step_events.py --matrix-peft-prompt
  $PY calibration/step_events.py --matrix-peft-ln
  $PY calibration/step_events.py --matrix-peft-boft
  $PY calibration/step_events.py --matrix-peft-qlora
  $PY calibration/step_events.py --matrix-peft-adalora
  $PY calibration/step_events.py --matrix-liger

`--matrix-lengths` writes `validation/oracle-traces/step-events-lengths.jsonl` (compact): five
jobs trained on 16 batches of varying length (`--lengths L1,L2,...`: one step per length).
`--matrix-peft` writes `validation/oracle-traces/step-events-peft.jsonl` (compact): IA³ and
VeRA (`--peft`, as `peft_trace.py` builds them) on the 2-layer Llama-3.1-8B and Qwen2.5-7B,
with and without checkpointing, and IA³ on q, o, up and down of the 2-layer Qwen2.5-7B. `--matrix-peft-weight` writes
`validation/oracle-traces/step-events-peft-weight.jsonl` (compact): LoHa, LoKr and OFT on the
same models, each building a weight-sized tensor per adapted module in every forward.
`--matrix-peft-prompt` writes `validation/oracle-traces/step-events-peft-prompt.jsonl`
(compact): prompt tuning (50 virtual tokens, with and without checkpointing) and prefix tuning
(50 and 200, without: PEFT refuses it with checkpointing) on the same models.
`--matrix-peft-ln` writes `validation/oracle-traces/step-events-peft-ln.jsonl` (compact): LN
tuning on the same models, with and without checkpointing.
`--matrix-peft-adalora` writes `validation/oracle-traces/step-events-peft-adalora.jsonl`
(compact): AdaLoRA (init_r 64 and 16, `update_and_allocate` after each optimizer step, before
any masking) on the same models, with and without checkpointing.
`--matrix-peft-boft` writes `validation/oracle-traces/step-events-peft-boft.jsonl` (compact):
BOFT (block size 4 with one butterfly factor, 16 with two, its CUDA extension's block-diagonal
output stood in for on fake tensors) on the same models, with and without checkpointing.
`--matrix-peft-qlora` writes `validation/oracle-traces/step-events-peft-qlora.jsonl` (compact):
BOFT, OFT, IA³, VeRA and AdaLoRA on the 2-layer Llama-3.1-8B in NF4 (fp32 hidden states after
`prepare_model_for_kbit_training`; BOFT's permutations on the host), with and without
checkpointing: the methods the step trace leaves to the formulas on a 4-bit base.

`--liger` applies Liger's kernels as the Trainer's `use_liger_kernel=True` does
(`liger_fake.py`: liger-kernel 0.8.5's own Python, its Triton launches doing nothing on fake
tensors). `--matrix-liger` writes `validation/oracle-traces/step-events-liger.jsonl`
(compact): LoRA on the 2-layer Llama-3.1-8B with and without checkpointing and on Qwen3-8B,
QLoRA on Llama-3.1-8B and Qwen2.5-7B, full fine-tunes of Llama-3.1-8B and Qwen2.5-7B.

`--desc` adds `descs`: each allocation's op, dtype and shape as the tracker names them
(`mm bfloat16 (2048, 4096)`; parameters and gradients have none), in allocation order, for
reading a sequence op by op.

`--matrix-lora` writes `validation/oracle-traces/step-events-lora.jsonl` (compact, as
below): the 2-layer Llama-3.1-8B with LoRA as `trace/decoder_layer.rs` follows it op by op
beyond the main fixture's jobs: fp32 adapters on the bf16 model without autocast, dropout
0.05 under autocast, eager attention (one and two sequences), with and without
checkpointing, and q and v alone; the 2-layer Qwen3-8B (its q and k norms); the 2-layer
Llama-2-7B (no grouped KV heads), eager, 2 × 384 tokens, r 8, dropout 0.1.

`--matrix-qlora` writes `validation/oracle-traces/step-events-qlora.jsonl` (compact): QLoRA
(NF4 with and without double quantization, after `prepare_model_for_kbit_training`) on the
2-layer Llama-3.1-8B with and without checkpointing, with dropout 0.05, on q and v alone
over 2 × 512 tokens, and on the 2-layer Qwen2.5-7B (q, k and v biases), Mistral-7B and
Qwen3-8B (fp32 q and k norms, with and without checkpointing), as
`trace/decoder_layer.rs` follows it op by op. Every 4-bit matmul's forward dequantizes its
weight (`install_dequant_forward`).

`--matrix-full` writes `validation/oracle-traces/step-events-full.jsonl` (compact): full
fine-tunes in bf16 without autocast, as `trace/decoder_layer.rs` follows them op by op: the
2-layer Qwen3-8B (its trainable q and k norms) with and without checkpointing, Mistral-7B
over 2 × 512 tokens, Llama-3.1-8B with eager attention and with foreach AdamW over 1,024
tokens, and Qwen2.5-7B (q, k and v biases).

`--matrix-flash` writes `validation/oracle-traces/step-events-flash.jsonl` (compact): jobs of
the matrices above with transformers' `flash_attention_2` on an emulation of the flash-attn
2.8.4 package (`--flash-attn`, `flash_attn_emulation.py`: its allocations and saved tensors,
read from its code, around transformers' own path): LoRA on the 2-layer Llama-3.1-8B with and
without checkpointing, Mistral-7B over 2 x 256 tokens with dropout, Qwen3-8B; QLoRA on
Llama-3.1-8B and Qwen2.5-7B; full fine-tunes of Qwen2.5-7B and of Llama-3.1-8B over 1,024
tokens with checkpointing.

`--matrix-math` writes `validation/oracle-traces/step-events-math.jsonl` (compact): jobs of the
matrices above with SDPA's math kernel (`--sdpa-backend math`), what a GPU without SDPA's
flash backend (compute capability under 8.0: T4, V100, RTX 20xx) runs for grouped KV heads:
LoRA on the 2-layer Llama-3.1-8B with and without checkpointing, Mistral-7B over 2 x 256
tokens with dropout, Qwen3-8B; QLoRA on Llama-3.1-8B and Qwen2.5-7B over 512 tokens; full
fine-tunes of Qwen2.5-7B and of Llama-3.1-8B with checkpointing.

`--matrix-math-mha` writes `validation/oracle-traces/step-events-math-mha.jsonl` (compact):
the same kernel on heads that are not grouped (the 2-layer Llama-2-7B: LoRA with
checkpointing, LoRA over 2 x 256 tokens without, a full fine-tune with checkpointing), where
k and v are not repeated; Apple's MPS runs this kernel for every model in training.

`--matrix-dora` writes `validation/oracle-traces/step-events-dora.jsonl`: the 2-layer
Llama-3.1-8B with PEFT's DoRA (no dropout with checkpointing; dropout 0.05 with and
without), which `step_trace.rs` holds moro's DoRA trace to.

`--matrix-h200` runs whole models, as the H200 harness ran them (`validation/h200/`; DoRA
through `peft_trace.py`'s `--peft`, which a single run here also takes), and writes
`validation/oracle-traces/step-events-h200*.jsonl` in a compact form: `sizes` lists
the distinct request sizes, and `events` is one string of space-separated tokens, `r` where
the harness emptied the cache and reset the peaks after building the model, `<i>` for an
allocation of `sizes[i]` bytes, `-<k>` for the free of the allocation made `k` allocations
earlier. `crates/moro-core/tests/real_step_replay.rs` replays them through moro's allocator
model and compares the peaks with the H200's measurements. The order of the frees one op
makes can differ from run to run (the tracker sees them through weak references); the
replayed peaks do not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
ORACLE_DIR = os.environ.get("MORO_ORACLE_DIR") or os.path.normpath(
    os.path.join(ROOT, "..", "shared", "oracle"))
MODELS_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "models"))
FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events.jsonl")

TRACER = "moro-step-events/1"


def install_recorder(tracker_module):
    """Subclasses the oracle's tracker so that it keeps the order of allocations and frees."""
    base = tracker_module.LiveStorageTracker

    class Recording(base):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.events = []  # [size, category, phase] for a malloc; [-1 - index] for a free
            self.descs = []  # each malloc's op, dtype and shape (`--desc`)
            self._index = {}

        def _on_free(self, key, _ref):
            index = self._index.pop(key, None)
            if index is not None:
                self.events.append([-1 - index])
            super()._on_free(key, _ref)

        def register(self, t, cat=None, desc=""):
            import torch

            if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
                return
            try:
                st = t.untyped_storage()
            except Exception:
                return
            key = id(st)
            new = key not in self.records
            super().register(t, cat, desc)
            rec = self.records.get(key)
            if new and rec is not None and st.nbytes() > 0:
                self._index[key] = len(self.events)
                self.events.append([st.nbytes(), rec.cat, self.phase])
                self.descs.append(desc)
            elif not new and rec is not None and key in self._index:
                # a retag (grads, optimizer states): the category becomes known later
                self.events[self._index[key]][1] = rec.cat

    tracker_module.LiveStorageTracker = Recording
    return Recording


def install_dequant_forward():
    """A 4-bit matmul's forward dequantizes its weight, as bitsandbytes 0.50 does on CUDA for
    a training step's micro-batch: `gemm_4bit` (`backends/cuda/ops.py`) takes
    `_dequant_linear_fallback` above 512 rows on every architecture, above 256 for weights of
    4M elements or more, above 64 on sm90 (H100, H200); its fused kernel wins only for fewer
    rows (`_gemm_4bit_use_custom_cuda`). Fake tensors run neither kernel, so the fallback's
    buffers are made around `bnb.matmul_4bit` (which `Linear4bit.forward` calls after casting
    its input) in the fallback's order: the nested absmax dequantized and offset
    (two fp32 tensors), the weight in the input's dtype, then the output; freed as the
    function returns. The oracle's own emulation (`qlora_approx.py`, above 1,536 rows only,
    made before the input's cast) is turned off."""
    import torch
    import qlora_approx
    import bitsandbytes

    qlora_approx._GEMM_4BIT_CUSTOM_MAX_M = 1 << 62
    orig = bitsandbytes.matmul_4bit

    def matmul_4bit(A, B, quant_state, out=None, bias=None):
        absmax_dq = absmax = weight = None
        if A.numel():
            if quant_state.nested:
                shape = quant_state.absmax.shape
                absmax_dq = torch.empty(shape, dtype=torch.float32, device=A.device)
                absmax = torch.empty(shape, dtype=torch.float32, device=A.device)
            weight = torch.empty(tuple(quant_state.shape), dtype=A.dtype, device=A.device)
        output = orig(A, B, quant_state, out=out, bias=bias)
        del absmax
        del absmax_dq
        del weight
        return output

    bitsandbytes.matmul_4bit = matmul_4bit


def install_lengths(lengths):
    """Each step's batch `lengths[i]` tokens long, where the oracle makes every step's
    `(batch, seq)` inputs with `torch.randint(0, vocab, (B, S), device="cuda")`: the batches
    a trainer pads to their own longest sample."""
    import torch

    orig = torch.randint
    pending = list(lengths)

    def randint(*a, **k):
        if len(a) == 3 and len(a[2]) == 2 and k.get("device") == "cuda" and pending:
            a = (a[0], a[1], (a[2][0], pending.pop(0)))
        return orig(*a, **k)

    torch.randint = randint


def run(argv, descs=False, flash_attn=False, lengths=None, liger=False):
    sys.path.insert(0, ORACLE_DIR)
    import tracker as tracker_module

    if liger:
        import liger_fake

        liger_fake.install()

    install_dequant_forward()
    if lengths:
        install_lengths(lengths)
    if flash_attn:
        import flash_attn_emulation

        flash_attn_emulation.install()

    recording = install_recorder(tracker_module)
    import oracle

    oracle.LiveStorageTracker = recording
    if flash_attn:
        make = oracle.make_hf_config
        oracle.make_hf_config = lambda d, attn: make(d, "flash_attention_2")
    seen = []
    orig_init = recording.__init__

    def keep(self, *a, **k):
        orig_init(self, *a, **k)
        seen.append(self)

    recording.__init__ = keep
    args = oracle.build_parser().parse_args(argv)
    res = oracle.run(args)
    t = seen[-1]
    cats = sorted({e[1] for e in t.events if len(e) == 3})
    phases = sorted({e[2] for e in t.events if len(e) == 3})
    rows = [e if len(e) == 1 else [e[0], cats.index(e[1]), phases.index(e[2])] for e in t.events]
    _, cfg = oracle.load_config_dict(args)
    return {
        "tracer": TRACER,
        "label": args.label or "",
        "config": cfg,
        "job": res.get("job"),
        "env": res.get("env"),
        "peak_allocated_bytes": res["measured"]["peak_allocated_bytes"],
        "categories": cats,
        "phases": phases,
        "events": rows,
        **({"descs": t.descs} if descs else {}),
    }


def job_args(model, method, ckpt):
    cfg = os.path.join(MODELS_DIR, model + ".json")
    a = ["--config", cfg, "--override", "num_hidden_layers=2", "--method", method,
         "--seq", "512", "--batch", "1", "--steps", "2"]
    a += ["--precision", "bf16" if method == "full" else "bf16-mixed"]
    if ckpt:
        a.append("--grad-ckpt")
    label = "%s-L2-%s-b1s512%s" % (model, method, "-ckpt" if ckpt else "")
    return a + ["--label", label]


def compact(row, h200_row):
    """The row in the compact form `--matrix-h200` writes (module doc)."""
    sizes = sorted({e[0] for e in row["events"] if len(e) == 3})
    index = {size: i for i, size in enumerate(sizes)}
    setup = row["phases"].index("setup")
    tokens, made, position, reset = [], 0, {}, False
    for i, e in enumerate(row["events"]):
        if len(e) == 3:
            if not reset and e[2] != setup:
                tokens.append("r")
                reset = True
            position[i] = made
            made += 1
            tokens.append(str(index[e[0]]))
        else:
            tokens.append("-%d" % (made - position[-1 - e[0]]))
    out = {k: v for k, v in row.items() if k not in ("categories", "phases", "events")}
    out["h200_row"] = h200_row
    out["sizes"] = sizes
    out["events"] = " ".join(tokens)
    return out


# Whole models as the H200 harness ran them (harness v1: bf16-mixed, 1 x 2048, fused AdamW,
# r 16 / alpha 32 / no dropout on the seven projections, non-reentrant checkpointing), each
# with the `validation/h200/` row it reproduces, whether it is DoRA, and the fixture it goes
# to (one file stays under 320 KiB).
H200_MATRIX = [
    ("moro-cal-7cbf4904a2", "meta-llama--Llama-3.1-8B", "lora", False, "step-events-h200.jsonl"),
    ("moro-cal-04f2bd94cc", "mistralai--Mistral-7B-v0.3", "qlora", False, "step-events-h200.jsonl"),
    ("moro-cal-566e30cdce", "meta-llama--Llama-3.1-8B", "lora", True,
     "step-events-h200-dora.jsonl"),
    ("moro-cal-d01d2061c2", "meta-llama--Llama-3.2-1B-Instruct", "full", False,
     "step-events-h200-full.jsonl"),
    ("moro-cal-8f7aee3b3a", "Qwen--Qwen2.5-1.5B", "full", False, "step-events-h200-full.jsonl"),
]
# The full fine-tunes' harness settings (bf16 weights without autocast; the harness left
# lm_head a parameter of its own, the rows' `model_overrides`), by H200 row.
H200_FULL = {
    "moro-cal-d01d2061c2": "fused",
    "moro-cal-8f7aee3b3a": "foreach",
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def dora_peft(dropout):
    """`--peft`'s spec for PEFT's DoRA, r 16 / alpha 32 on the seven projections."""
    return ["--peft", json.dumps({"peft_type": "LORA", "r": 16, "lora_alpha": 32,
                                  "lora_dropout": dropout, "use_dora": True,
                                  "target_modules": TARGETS})]


def run_child(a):
    """This script on `a` in its own process: its row, parsed; exits on failure."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)] + a,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        sys.exit(1)
    sys.stderr.write("%s\n" % a[a.index("--label") + 1])
    return json.loads(proc.stdout)


def h200_args(model, method, dora, h200_row=None):
    cfg = os.path.join(MODELS_DIR, model + ".json")
    if not os.path.exists(cfg):
        cfg = os.path.join(ROOT, "data", "models", model + ".json")
    if method == "full":
        return ["--config", cfg, "--override", "tie_word_embeddings=false", "--method", "full",
                "--precision", "bf16", "--seq", "2048", "--batch", "1", "--steps", "2",
                "--grad-ckpt", "--adamw-impl", H200_FULL[h200_row],
                "--label", "%s-full-b1s2048-ckpt" % model]
    a = ["--config", cfg, "--method", method, "--precision", "bf16-mixed", "--seq", "2048",
         "--batch", "1", "--steps", "2", "--grad-ckpt", "--adamw-impl", "fused",
         "--lora-r", "16", "--lora-alpha", "32", "--lora-dropout", "0",
         "--label", "%s-%s%s-b1s2048-ckpt" % (model, method, "-dora" if dora else "")]
    return a + (dora_peft(0.0) if dora else [])


MATRIX = [
    job_args(m, method, ckpt)
    for m in ("meta-llama--Llama-3.1-8B", "Qwen--Qwen2.5-1.5B")
    for method in ("full", "lora", "qlora")
    for ckpt in (False, True)
]


def dora_args(dropout, ckpt):
    """Llama-3.1-8B cut to 2 layers with PEFT's DoRA on the seven projections, as
    `peft_trace.py`'s `--peft` builds it (`--matrix-dora`)."""
    a = job_args("meta-llama--Llama-3.1-8B", "lora", ckpt)[:-2]
    label = "meta-llama--Llama-3.1-8B-L2-lora-dora-d%g-b1s512%s" % (dropout, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", "fused", "--lora-r", "16", "--lora-alpha", "32",
                "--lora-dropout", str(dropout), "--label", label] + dora_peft(dropout)


DORA_MATRIX = [dora_args(0.0, True), dora_args(0.05, True), dora_args(0.05, False)]


def lora_args(precision, dropout, ckpt, targets=None, attn="sdpa",
              model="meta-llama--Llama-3.1-8B", batch=1, seq=512, rank=16):
    """A model cut to 2 layers with LoRA r 16 (`--matrix-lora`): fp32 adapters on the
    bf16 model without autocast, or under autocast with dropout, on q and v only, with
    eager attention, or Qwen3's q and k norms."""
    targets = targets or TARGETS
    a = job_args(model, "lora", ckpt)[:-2]
    label = "%s-L2-lora-r%d-%s-d%g-%s-%s-b%ds%d%s" % (
        model, rank, precision, dropout, "qv" if len(targets) == 2 else "all7", attn,
        batch, seq, "-ckpt" if ckpt else "")
    return a + ["--precision", precision, "--adamw-impl", "fused", "--lora-r", str(rank),
                "--lora-alpha", str(2 * rank), "--lora-dropout", str(dropout), "--attn", attn,
                "--batch", str(batch), "--seq", str(seq),
                "--lora-targets", ",".join(targets), "--label", label]


LORA_MATRIX = [lora_args("bf16", 0.0, False), lora_args("bf16", 0.0, True),
               lora_args("bf16-mixed", 0.05, False), lora_args("bf16-mixed", 0.05, True),
               lora_args("bf16-mixed", 0.0, True, ["q_proj", "v_proj"]),
               lora_args("bf16-mixed", 0.0, False, attn="eager"),
               lora_args("bf16-mixed", 0.0, True, attn="eager"),
               lora_args("bf16-mixed", 0.0, False, model="Qwen--Qwen3-8B"),
               lora_args("bf16-mixed", 0.0, True, model="Qwen--Qwen3-8B"),
               lora_args("bf16-mixed", 0.0, False, attn="eager", batch=2, seq=256),
               lora_args("bf16-mixed", 0.1, True, attn="eager", model="meta-llama--Llama-2-7b-hf",
                         batch=2, seq=384, rank=8)]
LORA_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-lora.jsonl")


def qlora_args(ckpt, seq=1024, batch=1, dropout=0.0, targets=None,
               model="meta-llama--Llama-3.1-8B", double_quant=True):
    """A model cut to 2 layers with QLoRA r 16 (`--matrix-qlora`): NF4 after PEFT's
    `prepare_model_for_kbit_training`, fp32 adapters under bf16 autocast, SDPA."""
    targets = targets or TARGETS
    a = job_args(model, "qlora", ckpt)[:-2]
    label = "%s-L2-qlora-r16-%s-d%g-%s-b%ds%d%s" % (
        model, "nf4dq" if double_quant else "nf4", dropout,
        "qv" if len(targets) == 2 else "all7", batch, seq, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", "fused", "--lora-r", "16", "--lora-alpha", "32",
                "--lora-dropout", str(dropout), "--batch", str(batch), "--seq", str(seq),
                "--lora-targets", ",".join(targets), "--label", label] + (
        [] if double_quant else ["--no-double-quant"])


QLORA_MATRIX = [qlora_args(False), qlora_args(True),
                qlora_args(True, seq=512, dropout=0.05), qlora_args(False, seq=512, dropout=0.05),
                qlora_args(True, seq=512, batch=2, targets=["q_proj", "v_proj"]),
                qlora_args(True, double_quant=False),
                qlora_args(True, model="Qwen--Qwen2.5-7B"),
                qlora_args(False, model="mistralai--Mistral-7B-v0.3"),
                qlora_args(False, model="Qwen--Qwen3-8B"),
                qlora_args(True, model="Qwen--Qwen3-8B")]
QLORA_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-qlora.jsonl")


def full_args(ckpt, model="meta-llama--Llama-3.1-8B", batch=1, seq=512, attn="sdpa",
              adamw="fused"):
    """A model cut to 2 layers, fully fine-tuned in bf16 without autocast (`--matrix-full`)."""
    a = job_args(model, "full", ckpt)[:-2]
    label = "%s-L2-full-%s-%s-b%ds%d%s" % (model, attn, adamw, batch, seq, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", adamw, "--attn", attn, "--batch", str(batch), "--seq", str(seq),
                "--label", label]


FULL_MATRIX = [full_args(True, model="Qwen--Qwen3-8B"), full_args(False, model="Qwen--Qwen3-8B"),
               full_args(False, model="mistralai--Mistral-7B-v0.3", batch=2),
               full_args(True, attn="eager"), full_args(True, seq=1024, adamw="foreach"),
               full_args(False, model="Qwen--Qwen2.5-7B")]
FULL_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-full.jsonl")


def peft_vector_args(kind, ckpt, model="meta-llama--Llama-3.1-8B"):
    """IA³ or VeRA (`--matrix-peft`) on a model cut to 2 layers, bf16-mixed, 1 x 512: PEFT's
    defaults for IA³ on a decoder (k, v and the MLP's down projection, down as the
    feedforward module), IA³ on q, o, up and down (up and down scaling their inputs:
    `ia3-qoud`), VeRA at r 256 on q and v."""
    spec = {
        "ia3": {"peft_type": "IA3", "target_modules": ["k_proj", "v_proj", "down_proj"],
                "feedforward_modules": ["down_proj"]},
        "ia3-qoud": {"peft_type": "IA3",
                     "target_modules": ["q_proj", "o_proj", "up_proj", "down_proj"],
                     "feedforward_modules": ["up_proj", "down_proj"]},
        "vera": {"peft_type": "VERA", "r": 256, "target_modules": ["q_proj", "v_proj"]},
    }[kind]
    a = job_args(model, "lora", ckpt)[:-2]
    label = "%s-L2-%s-b1s512%s" % (model, kind, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", "fused", "--peft", json.dumps(spec), "--label", label]


PEFT_MATRIX = [peft_vector_args(k, c, m) for m in ("meta-llama--Llama-3.1-8B", "Qwen--Qwen2.5-7B")
               for k in ("ia3", "vera") for c in (True, False)] + [
    peft_vector_args("ia3-qoud", c, "Qwen--Qwen2.5-7B") for c in (True, False)]
PEFT_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-peft.jsonl")


def peft_weight_args(kind, ckpt, model="meta-llama--Llama-3.1-8B"):
    """LoHa, LoKr or OFT (`--matrix-peft-weight`: methods that build a weight-sized tensor
    per module every forward) on q and v of a model cut to 2 layers, bf16-mixed, 1 x 512:
    LoHa at r 16, LoKr at r 32 with factor 4 (PEFT's MetaMathQA setting), OFT in 32 blocks."""
    spec = {"loha": {"peft_type": "LOHA", "r": 16, "alpha": 32},
            "lokr": {"peft_type": "LOKR", "r": 32, "alpha": 64, "decompose_factor": 4},
            "oft": {"peft_type": "OFT", "r": 32, "oft_block_size": 0}}[kind]
    spec["target_modules"] = ["q_proj", "v_proj"]
    a = job_args(model, "lora", ckpt)[:-2]
    label = "%s-L2-%s-b1s512%s" % (model, kind, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", "fused", "--peft", json.dumps(spec), "--label", label]


PEFT_WEIGHT_MATRIX = [peft_weight_args(k, c, m)
                      for m in ("meta-llama--Llama-3.1-8B", "Qwen--Qwen2.5-7B")
                      for k in ("loha", "lokr", "oft") for c in (True, False)]
PEFT_WEIGHT_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces",
                                   "step-events-peft-weight.jsonl")


def peft_adalora_args(rank, ckpt, model="meta-llama--Llama-3.1-8B"):
    """AdaLoRA (`--matrix-peft-adalora`) at `init_r` `rank` on q and v of a model cut to 2
    layers, bf16-mixed, 1 x 512; `tinit` past the two steps (no masking yet)."""
    spec = {"peft_type": "ADALORA", "init_r": rank, "target_r": rank // 2, "total_step": 1000,
            "tinit": 100, "tfinal": 100, "lora_alpha": 2 * rank,
            "target_modules": ["q_proj", "v_proj"]}
    a = job_args(model, "lora", ckpt)[:-2]
    label = "%s-L2-adalora%d-b1s512%s" % (model, rank, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", "fused", "--peft", json.dumps(spec), "--label", label]


PEFT_ADALORA_MATRIX = [peft_adalora_args(r, c, m)
                       for m in ("meta-llama--Llama-3.1-8B", "Qwen--Qwen2.5-7B")
                       for r in (64, 16) for c in (True, False)]
PEFT_ADALORA_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces",
                                    "step-events-peft-adalora.jsonl")


def peft_boft_args(block, ckpt, model="meta-llama--Llama-3.1-8B", factor=1, method="lora"):
    """BOFT (`--matrix-peft-boft`, `--matrix-peft-qlora`) on q and v of a model cut to 2
    layers, bf16-mixed, 1 x 512, blocks of `block` (PEFT's MetaMathQA setting: 4), `factor`
    butterfly factors, on a bf16 or (`method` qlora) a 4-bit base."""
    spec = {"peft_type": "BOFT", "boft_block_size": block, "boft_n_butterfly_factor": factor,
            "target_modules": ["q_proj", "v_proj"]}
    a = job_args(model, method, ckpt)[:-2]
    label = "%s-L2-%sboft%d-f%d-b1s512%s" % (model, "q" if method == "qlora" else "", block,
                                             factor, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", "fused", "--peft", json.dumps(spec), "--label", label]


PEFT_BOFT_MATRIX = [peft_boft_args(b, c, m, f)
                    for m in ("meta-llama--Llama-3.1-8B", "Qwen--Qwen2.5-7B")
                    for b, f in ((4, 1), (16, 2)) for c in (True, False)]
PEFT_BOFT_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces",
                                 "step-events-peft-boft.jsonl")


def peft_4bit_args(kind, ckpt):
    """OFT, IA³, VeRA or AdaLoRA (`--matrix-peft-qlora`) on the 2-layer Llama-3.1-8B in NF4,
    bf16-mixed, 1 x 512, as the unquantized matrices set them."""
    spec = {"oft": {"peft_type": "OFT", "r": 32, "oft_block_size": 0,
                    "target_modules": ["q_proj", "v_proj"]},
            "ia3": {"peft_type": "IA3", "target_modules": ["k_proj", "v_proj", "down_proj"],
                    "feedforward_modules": ["down_proj"]},
            "vera": {"peft_type": "VERA", "r": 256, "target_modules": ["q_proj", "v_proj"]},
            "adalora": {"peft_type": "ADALORA", "init_r": 64, "target_r": 32,
                        "total_step": 1000, "tinit": 100, "tfinal": 100, "lora_alpha": 128,
                        "target_modules": ["q_proj", "v_proj"]}}[kind]
    model = "meta-llama--Llama-3.1-8B"
    a = job_args(model, "qlora", ckpt)[:-2]
    label = "%s-L2-q%s-b1s512%s" % (model, kind, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", "fused", "--peft", json.dumps(spec), "--label", label]


PEFT_QLORA_MATRIX = ([peft_boft_args(b, c, "meta-llama--Llama-3.1-8B", f, "qlora")
                      for b, f, c in ((4, 1, True), (4, 1, False), (16, 2, False))]
                     + [peft_4bit_args(k, c) for k in ("oft", "ia3", "vera", "adalora")
                        for c in (True, False)])
PEFT_QLORA_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces",
                                  "step-events-peft-qlora.jsonl")


def peft_prompt_args(kind, ckpt, model="meta-llama--Llama-3.1-8B", tokens=50):
    """Prompt or prefix tuning (`--matrix-peft-prompt`) with `tokens` virtual tokens on a
    model cut to 2 layers, bf16-mixed, 1 x 512 (PEFT refuses prefix tuning with
    checkpointing)."""
    spec = {"peft_type": "PROMPT_TUNING" if kind == "prompt" else "PREFIX_TUNING",
            "num_virtual_tokens": tokens}
    a = job_args(model, "lora", ckpt)[:-2]
    label = "%s-L2-%s%d-b1s512%s" % (model, kind, tokens, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", "fused", "--peft", json.dumps(spec), "--label", label]


PEFT_PROMPT_MATRIX = [peft_prompt_args(k, c, m, n)
                      for m in ("meta-llama--Llama-3.1-8B", "Qwen--Qwen2.5-7B")
                      for k, c, n in (("prompt", True, 50), ("prompt", False, 50),
                                      ("prefix", False, 50), ("prefix", False, 200))]
PEFT_PROMPT_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces",
                                   "step-events-peft-prompt.jsonl")


def peft_ln_args(ckpt, model="meta-llama--Llama-3.1-8B"):
    """LN tuning (`--matrix-peft-ln`: PEFT's default norms, a trainable copy of each) on a
    model cut to 2 layers, bf16-mixed, 1 x 512."""
    a = job_args(model, "lora", ckpt)[:-2]
    label = "%s-L2-ln-tuning-b1s512%s" % (model, "-ckpt" if ckpt else "")
    return a + ["--adamw-impl", "fused", "--peft", json.dumps({"peft_type": "LN_TUNING"}),
                "--label", label]


PEFT_LN_MATRIX = [peft_ln_args(c, m) for m in ("meta-llama--Llama-3.1-8B", "Qwen--Qwen2.5-7B")
                  for c in (True, False)]
PEFT_LN_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-peft-ln.jsonl")


# Batches padded to their own longest sample (`--matrix-lengths`): one shuffled order of
# lengths up to 512, the longest twice, longer batches after shorter ones.
LENGTHS = [256, 96, 384, 160, 512, 64, 448, 320, 128, 512, 224, 480, 192, 416, 288, 352]


def with_lengths(a, lengths=None):
    """Job `a` trained on one batch of each of `lengths` tokens in turn."""
    lengths = lengths or LENGTHS
    i = a.index("--label")
    return a[:i] + ["--lengths", ",".join(map(str, lengths)),
                    "--label", a[i + 1] + "-lengths%d" % len(lengths)]


LENGTHS_MATRIX = [with_lengths(lora_args("bf16-mixed", 0.0, True, batch=2, seq=512)),
                  with_lengths(lora_args("bf16-mixed", 0.0, False, batch=2, seq=512)),
                  with_lengths(qlora_args(True, seq=512, batch=2)),
                  with_lengths(full_args(True, model="Qwen--Qwen2.5-7B", batch=2)),
                  with_lengths(lora_args("bf16-mixed", 0.1, True, attn="eager",
                                         model="meta-llama--Llama-2-7b-hf", batch=2, seq=512,
                                         rank=8))]
LENGTHS_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-lengths.jsonl")


def with_attention(a, tag, flags):
    """`a` with other attention `flags`, its label saying `tag` where it said `sdpa` (or at
    its end)."""
    i = a.index("--label")
    label = a[i + 1]
    label = label.replace("-sdpa-", "-%s-" % tag) if "-sdpa-" in label else label + "-" + tag
    return a[:i] + ["--label", label] + flags + a[i + 2:]


# The jobs each attention kernel is recorded for: LoRA with and without checkpointing,
# with dropout over two sequences, with Qwen3's q and k norms; QLoRA; full fine-tunes.
def attention_jobs(qlora_seq):
    return (
        lora_args("bf16-mixed", 0.0, True), lora_args("bf16-mixed", 0.0, False),
        lora_args("bf16-mixed", 0.05, True, model="mistralai--Mistral-7B-v0.3", batch=2, seq=256),
        lora_args("bf16-mixed", 0.0, True, model="Qwen--Qwen3-8B"),
        qlora_args(True, seq=qlora_seq), qlora_args(False, seq=qlora_seq, model="Qwen--Qwen2.5-7B"),
        full_args(False, model="Qwen--Qwen2.5-7B"),
    )


# transformers' `flash_attention_2` on the emulated flash-attn package (`flash_attn_emulation.py`).
FLASH_MATRIX = [with_attention(a, "fa2", ["--flash-attn"])
                for a in attention_jobs(1024) + (full_args(True, seq=1024),)]
FLASH_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-flash.jsonl")

# A GPU without SDPA's flash backend (compute capability under 8.0): SDPA's math kernel,
# which grouped KV heads get there.
MATH_MATRIX = [with_attention(a, "math", ["--sdpa-backend", "math"])
               for a in attention_jobs(512) + (full_args(True),)]
MATH_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-math.jsonl")

# SDPA's math kernel on heads that are not grouped (Llama-2-7B), what Apple's MPS runs for
# every model in training: k and v are not repeated.
MATH_MHA_MATRIX = [with_attention(a, "math", ["--sdpa-backend", "math"]) for a in (
    lora_args("bf16-mixed", 0.0, True, model="meta-llama--Llama-2-7b-hf"),
    lora_args("bf16-mixed", 0.0, False, model="meta-llama--Llama-2-7b-hf", batch=2, seq=256),
    full_args(True, model="meta-llama--Llama-2-7b-hf"))]
MATH_MHA_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-math-mha.jsonl")
DORA_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-dora.jsonl")

# Liger's kernels as the Trainer's `use_liger_kernel=True` applies them (`liger_fake.py`):
# LoRA with and without checkpointing, on Qwen3's q and k norms, QLoRA's fp32 stream, full
# fine-tunes.
LIGER_MATRIX = [with_attention(a, "liger", ["--liger"]) for a in (
    lora_args("bf16-mixed", 0.0, True), lora_args("bf16-mixed", 0.0, False),
    lora_args("bf16-mixed", 0.0, True, model="Qwen--Qwen3-8B"),
    qlora_args(True, seq=512), qlora_args(False, seq=512, model="Qwen--Qwen2.5-7B"),
    full_args(True), full_args(False, model="Qwen--Qwen2.5-7B"))]
LIGER_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "step-events-liger.jsonl")


def write_matrix(matrix, fixture, compact_rows=False):
    """Runs each job of `matrix` in its own process and writes the rows to `fixture`, in
    the compact form where `compact_rows`."""
    tmp = fixture + ".tmp"
    with open(tmp, "w") as out:
        for a in matrix:
            row = run_child(a)
            if compact_rows:
                row = compact(row, None)
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
    os.replace(tmp, fixture)


def main():
    argv = sys.argv[1:]
    if argv == ["--matrix-h200"]:
        rows = {}
        for h200_row, model, method, dora, fixture in H200_MATRIX:
            row = compact(run_child(h200_args(model, method, dora, h200_row)), h200_row)
            rows.setdefault(fixture, []).append(json.dumps(row, separators=(",", ":")))
        for fixture, lines in rows.items():
            path = os.path.join(ROOT, "validation", "oracle-traces", fixture)
            with open(path + ".tmp", "w") as out:
                out.write("\n".join(lines) + "\n")
            os.replace(path + ".tmp", path)
        return
    spec = None
    if any(a == "--peft" or a.startswith("--peft=") for a in argv):
        # A PEFT method other than plain LoRA, as `peft_trace.py` builds it.
        import peft_trace

        spec, argv = peft_trace.take_peft_argument(argv)
        peft_trace.install_config(dict(spec))
    # Each matrix flag: its jobs, its fixture, and whether the rows are compact.
    matrices = {
        "--matrix": (MATRIX, FIXTURE, False),
        "--matrix-dora": (DORA_MATRIX, DORA_FIXTURE, False),
        "--matrix-lora": (LORA_MATRIX, LORA_FIXTURE, True),
        "--matrix-qlora": (QLORA_MATRIX, QLORA_FIXTURE, True),
        "--matrix-full": (FULL_MATRIX, FULL_FIXTURE, True),
        "--matrix-flash": (FLASH_MATRIX, FLASH_FIXTURE, True),
        "--matrix-math": (MATH_MATRIX, MATH_FIXTURE, True),
        "--matrix-math-mha": (MATH_MHA_MATRIX, MATH_MHA_FIXTURE, True),
        "--matrix-liger": (LIGER_MATRIX, LIGER_FIXTURE, True),
        "--matrix-lengths": (LENGTHS_MATRIX, LENGTHS_FIXTURE, True),
        "--matrix-peft": (PEFT_MATRIX, PEFT_FIXTURE, True),
        "--matrix-peft-weight": (PEFT_WEIGHT_MATRIX, PEFT_WEIGHT_FIXTURE, True),
        "--matrix-peft-prompt": (PEFT_PROMPT_MATRIX, PEFT_PROMPT_FIXTURE, True),
        "--matrix-peft-ln": (PEFT_LN_MATRIX, PEFT_LN_FIXTURE, True),
        "--matrix-peft-boft": (PEFT_BOFT_MATRIX, PEFT_BOFT_FIXTURE, True),
        "--matrix-peft-qlora": (PEFT_QLORA_MATRIX, PEFT_QLORA_FIXTURE, True),
        "--matrix-peft-adalora": (PEFT_ADALORA_MATRIX, PEFT_ADALORA_FIXTURE, True),
    }
    if len(argv) == 1 and argv[0] in matrices:
        jobs, fixture, compact_rows = matrices[argv[0]]
        write_matrix(jobs, fixture, compact_rows=compact_rows)
        return
    descs = "--desc" in argv
    flash_attn = "--flash-attn" in argv
    liger = "--liger" in argv
    lengths = None
    if "--lengths" in argv:
        i = argv.index("--lengths")
        lengths = [int(x) for x in argv[i + 1].split(",")]
        argv = argv[:i] + argv[i + 2:] + ["--steps", str(len(lengths))]
    row = run([a for a in argv if a not in ("--desc", "--flash-attn", "--liger")], descs,
              flash_attn, lengths, liger)
    if lengths:
        row["lengths"] = lengths
    if flash_attn:
        row["job"]["attn_implementation"] = "flash_attention_2"
    if liger:
        row["job"]["liger_kernel"] = True
    if spec is not None:
        row["job"]["peft"] = spec
    print(json.dumps(row, separators=(",", ":")))


if __name__ == "__main__":
    main()
