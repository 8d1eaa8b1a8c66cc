#!/usr/bin/env python
"""Fake-tensor trace of an encoder-decoder training step (T5, mT5, BART).

Runs the fake-CUDA oracle (../shared/oracle/oracle.py: the real transformers model, PEFT and
optimizer on FakeTensors, every device storage counted) with the model built by
`AutoModelForSeq2SeqLM` instead of `AutoModelForCausalLM`: the oracle's `input_ids` (batch ×
`--seq`) are the encoder's tokens and the labels are `--target-len` random tokens, from which
the model builds its own decoder inputs (`_shift_right`), as `Seq2SeqTrainer` and PEFT's
seq2seq examples feed it.

transformers 5.25 ties a T5 `lm_head` to `shared` in `from_config` whatever the config says
(`T5Config.__post_init__` forces `tie_word_embeddings = True`); `from_pretrained` unties it
when the checkpoint holds both with different values (`PreTrainedModel.tie_weights`), as every
T5 v1.1 / FLAN-T5 / mT5 checkpoint does. `--untie` gives the model its own `lm_head` weight so
the trace is the one those checkpoints train.

`--per-block` records the live bytes after each encoder and decoder block of the first
forward (`per_block_live_bytes` in the result): the differences are what one block keeps
for backward, the figure a per-layer formula is checked against.

`--padded` passes an encoder attention mask, as a padded batch has.

`--generate --config C --batch B --seq S --new-tokens N` traces generation instead: the
encoder once, then N greedy decoder steps with an `EncoderDecoderCache`, as `generate` runs
them; `--matrix seq2seq-generate` regenerates validation/oracle-traces/seq2seq-generate.jsonl.

`--matrix seq2seq` regenerates validation/oracle-traces/seq2seq.jsonl (the cases
crates/moro-core/tests/seq2seq.rs checks); `--matrix seq2seq-bart`
validation/oracle-traces/seq2seq-bart.jsonl (BART; crates/moro-core/tests/bart.rs);
`--matrix seq2seq-umt5` validation/oracle-traces/seq2seq-umt5.jsonl (UMT5;
crates/moro-core/tests/seq2seq.rs).

Unpadded BART runs answer transformers' "is this mask all ones?" as a GPU does (yes): BART's
decoder makes itself an all-ones mask, which fake tensors cannot read. (T5 passes its
position bias as a mask anyway; its traces are left as they were made.)

Every other option is the oracle's (`--config`, `--method`, `--precision`, `--batch`, `--seq`,
`--grad-ckpt`, `--lora-targets`, `--out`, ...).

Example (PY = the oracle venv's python, from the repository root):
  $PY calibration/seq2seq_trace.py --config validation/seq2seq-configs/flan-t5-base.json \\
      --untie --method lora --lora-targets q,v --precision bf16 --batch 4 --seq 512 \\
      --target-len 128
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
CONFIGS = os.path.join(ROOT, "validation", "seq2seq-configs")
TRACES = os.path.join(ROOT, "validation", "oracle-traces", "seq2seq.jsonl")


def take(argv: list[str], name: str, has_value: bool) -> tuple[str | bool | None, list[str]]:
    """Split `name` (and its value) off the oracle's own arguments."""
    rest, value = [], (None if has_value else False)
    it = iter(argv)
    for a in it:
        if a == name:
            value = next(it, None) if has_value else True
        elif has_value and a.startswith(name + "="):
            value = a.split("=", 1)[1]
        else:
            rest.append(a)
    return value, rest


BLOCKS: list[tuple[str, int]] = []
TRACKERS: list = []


def record_trackers() -> None:
    """Keep a handle on the oracle's live-storage tracker, for `--per-block`."""
    import torch
    import tracker

    cls = tracker.LiveStorageTracker
    init = cls.__init__

    def keep(self, *a, **k):
        init(self, *a, **k)
        TRACKERS.append(self)

    cls.__init__ = keep
    register = cls.register

    def register_with_shape(self, t, cat=None, desc=""):
        if isinstance(t, torch.Tensor) and self.phase_label == "step1.forward":
            desc = "%s %s %s" % (desc, str(t.dtype).replace("torch.", ""), tuple(t.shape))
        return register(self, t, cat, desc)

    cls.register = register_with_shape


def hook_blocks(model) -> None:
    """After each T5 block or BART layer of the first forward, note the live bytes, and for
    the second block of each stack the tensors it left alive (op, dtype, shape, bytes)."""
    kinds = ("T5Block", "BartEncoderLayer", "BartDecoderLayer")
    before: dict[str, set] = {}

    def live():
        t = TRACKERS[-1] if TRACKERS else None
        return t if t is not None and t.phase_label == "step1.forward" else None

    for name, mod in model.named_modules():
        if type(mod).__name__ in kinds:

            def pre(_m, _i, name=name):
                t = live()
                if t is not None:
                    before[name] = set(t.records)

            def after(_m, _i, _o, name=name):
                t = live()
                if t is None:
                    return
                kept = []
                if name.endswith(".1") and name in before:
                    kept = sorted(
                        ((r.desc, r.nbytes) for k, r in t.records.items() if k not in before[name]),
                        key=lambda x: -x[1],
                    )
                BLOCKS.append((name, t.current, kept))

            mod.register_forward_pre_hook(pre)
            mod.register_forward_hook(after)


def install_seq2seq(
    target_len: int, untie: bool, per_block: bool = False, padded: bool = False,
    bart: bool = False,
) -> None:
    """Make the oracle's `AutoModelForCausalLM.from_config` build the seq2seq model, whose
    forward takes the oracle's `input_ids` as the encoder's and `target_len` labels; with
    `padded`, an encoder attention mask as `DataCollatorForSeq2Seq` pads (fake tensors
    cannot show it is all ones, so the model builds the mask a padded batch gets)."""
    import torch
    import transformers

    class Seq2SeqShim:
        @staticmethod
        def from_config(cfg, dtype=None):
            model = transformers.AutoModelForSeq2SeqLM.from_config(cfg, dtype=dtype)
            if untie and model.lm_head.weight is model.get_input_embeddings().weight:
                w = model.lm_head.weight
                model.lm_head.weight = torch.nn.Parameter(
                    torch.empty(w.shape, dtype=w.dtype, device=w.device)
                )
                model.config.tie_word_embeddings = False
            if per_block:
                hook_blocks(model)
            inner = model.forward

            def forward(input_ids=None, labels=None, **kw):
                b = input_ids.shape[0]
                labels = torch.randint(
                    0, cfg.vocab_size, (b, target_len), device=input_ids.device
                )
                if padded:
                    kw["attention_mask"] = torch.ones_like(input_ids)
                return inner(input_ids=input_ids, labels=labels, **kw)

            model.forward = forward
            return model

    transformers.AutoModelForCausalLM = Seq2SeqShim
    if not padded and bart:
        answer_all_ones_masks()


def answer_all_ones_masks() -> None:
    """BART's decoder makes `torch.ones(batch, length)` its attention mask when none is given,
    and `create_causal_mask` skips it only after reading that it is all ones (`fast_all`),
    which a fake tensor cannot show: a GPU skips it (SDPA's `is_causal`), so this trace
    answers as the GPU does. Only unpadded runs, whose every mask is all ones, get this."""
    from transformers import masking_utils

    masking_utils.fast_all = lambda *a, **k: True
    masking_utils.is_tracing = lambda tensor=None: False


# (config, method, precision, batch, source tokens, target tokens, options, LoRA targets);
# options: "ckpt" (gradient checkpointing), "padded" (an encoder attention mask).
MATRIX = [
    ("t5-small", "full", "bf16", 4, 256, 64, "", ""),
    ("t5-small", "full", "bf16", 4, 512, 64, "", ""),
    ("t5-small", "full", "bf16", 4, 256, 128, "", ""),
    ("t5-small", "full", "bf16", 4, 256, 64, "padded", ""),
    ("flan-t5-base", "lora", "bf16", 4, 256, 64, "", "q,v"),
    ("flan-t5-base", "lora", "bf16", 4, 512, 128, "", "q,v"),
    ("flan-t5-base", "lora", "bf16-mixed", 4, 512, 128, "", "q,k,v,o,wi_0,wi_1,wo"),
    ("flan-t5-base", "lora", "bf16-mixed", 8, 512, 128, "padded", "q,v"),
    ("flan-t5-base", "lora", "bf16", 4, 512, 128, "ckpt", "q,v"),
    ("flan-t5-base", "full", "bf16-mixed", 2, 512, 128, "ckpt", ""),
    ("flan-t5-base", "full", "bf16", 4, 384, 96, "", ""),
]


def label_of(case) -> str:
    name, method, precision, b, s, t, options, targets = case
    return "%s %s %s b%d s%d t%d%s%s" % (
        name, method, precision, b, s, t, " " + options if options else "",
        " " + targets if targets else "",
    )


BART_TRACES = os.path.join(ROOT, "validation", "oracle-traces", "seq2seq-bart.jsonl")
# BART (bart-base's shape, dropout 0.1 everywhere as its config has it), the same columns.
BART_MATRIX = [
    ("bart-base", "full", "bf16", 4, 256, 64, "", ""),
    ("bart-base", "full", "bf16", 4, 256, 64, "padded", ""),
    ("bart-base", "lora", "bf16", 4, 512, 128, "", "q_proj,v_proj"),
    ("bart-base", "lora", "bf16-mixed", 4, 512, 128, "", "q_proj,k_proj,v_proj,out_proj,fc1,fc2"),
    ("bart-base", "lora", "bf16-mixed", 8, 512, 128, "padded", "q_proj,v_proj"),
    ("bart-base", "lora", "bf16", 4, 512, 128, "ckpt", "q_proj,v_proj"),
    ("bart-base", "full", "bf16-mixed", 2, 512, 128, "ckpt", ""),
    ("bart-base", "full", "bf16", 16, 512, 128, "", ""),
    ("bart-base", "full", "bf16", 16, 512, 128, "padded", ""),
]


UMT5_TRACES = os.path.join(ROOT, "validation", "oracle-traces", "seq2seq-umt5.jsonl")
# UMT5 (umt5-small's shape: a relative position bias in every layer), the same columns.
UMT5_MATRIX = [
    ("umt5-small", "full", "bf16", 4, 256, 64, "", ""),
    ("umt5-small", "lora", "bf16", 4, 512, 128, "", "q,v"),
    ("umt5-small", "lora", "bf16-mixed", 8, 512, 128, "padded", "q,v"),
    ("umt5-small", "lora", "bf16", 4, 512, 128, "ckpt", "q,v"),
]


def run_matrix(matrix=None, traces=TRACES) -> None:
    """Every case, one subprocess each, into `traces` (cases already there are kept: delete
    the file to trace everything again)."""
    import subprocess

    done = set()
    if os.path.exists(traces):
        with open(traces) as f:
            done = {json.loads(line).get("label") for line in f}
    for case in MATRIX if matrix is None else matrix:
        label = label_of(case)
        if label in done:
            continue
        name, method, precision, b, s, t, options, targets = case
        cmd = [
            sys.executable, os.path.abspath(__file__),
            "--config", os.path.join(CONFIGS, name + ".json"),
            "--method", method, "--precision", precision, "--adamw-impl", "foreach",
            "--batch", str(b), "--seq", str(s), "--target-len", str(t),
            "--label", label, "--out", traces, "--attn", "sdpa",
        ]
        if name.startswith(("flan", "umt5")):
            cmd.append("--untie")
        if "ckpt" in options:
            cmd.append("--grad-ckpt")
        if "padded" in options:
            cmd.append("--padded")
        if targets:
            cmd += ["--lora-targets", targets, "--lora-r", "16", "--lora-alpha", "32"]
        print(label, flush=True)
        subprocess.run(cmd, check=True)


def generate(argv: list[str]) -> None:
    """`--generate`: an encoder-decoder's generation as `model.generate` runs it, on fake
    tensors: the encoder once under `no_grad`, then `--new-tokens` decoder steps with an
    `EncoderDecoderCache` (the self-attention's keys and values grow a token a step; the
    cross-attention's are computed at the first step and kept), each step's last logits
    copied to fp32 (`next_token_logits = outputs.logits[:, -1, :].to(copy=True,
    dtype=torch.float32)`, transformers 5.25 `_sample`). Greedy, so no sampling buffers."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--untie", action="store_true")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--new-tokens", type=int, required=True)
    p.add_argument("--padded", action="store_true")
    p.add_argument("--label", default="")
    p.add_argument("--out")
    p.add_argument("--top", type=int, default=0, help="list N largest live tensor groups at the peak")
    args = p.parse_args(argv)
    sys.path.insert(0, HERE)
    from prefill_trace import fake_inference_setup

    oracle, tracker = fake_inference_setup()
    tracker.snapshot_top_at_peak = args.top > 0
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from transformers import AutoModelForSeq2SeqLM
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    with open(args.config) as f:
        d = json.load(f)
    if d.get("model_type") == "bart" and not args.padded:
        answer_all_ones_masks()
    cfg = oracle.make_hf_config(d, "sdpa")
    cfg.use_cache = True
    phases = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        with torch.device("cuda"):
            model = AutoModelForSeq2SeqLM.from_config(cfg, dtype=torch.bfloat16)
        if args.untie and model.lm_head.weight is model.get_input_embeddings().weight:
            w = model.lm_head.weight
            model.lm_head.weight = torch.nn.Parameter(
                torch.empty(w.shape, dtype=w.dtype, device=w.device), requires_grad=False
            )
        model.eval()
        for p_ in model.parameters():
            tracker.register(p_, "params_frozen", "param")
        for b in model.buffers():
            tracker.register(b, "buffers", "buffer")
        with tracker, torch.no_grad():
            ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
            mask = torch.ones_like(ids) if args.padded else None
            enc = model.get_encoder()(input_ids=ids, attention_mask=mask)
            phases["encoder"] = tracker.peak
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            dec = torch.zeros((args.batch, 1), dtype=torch.long, device="cuda")
            for _ in range(args.new_tokens):
                out = model(
                    encoder_outputs=enc,
                    attention_mask=mask,
                    decoder_input_ids=dec,
                    past_key_values=cache,
                    use_cache=True,
                )
                logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
                del out
                dec = logits.argmax(-1, keepdim=True)
                del logits
            phases["end_live"] = tracker.current
    row = {
        "tracer": "moro-seq2seq-generate/1",
        "label": args.label,
        "config_name": os.path.basename(args.config),
        "untied_lm_head": args.untie,
        "batch": args.batch,
        "seq_len": args.seq,
        "new_tokens": args.new_tokens,
        "padded": args.padded,
        "env": oracle.versions(),
        "peak_allocated_bytes": tracker.peak,
        "encoder_peak_bytes": phases["encoder"],
        "end_live_bytes": phases["end_live"],
        "params_bytes": tracker.peak_cats.get("params_frozen", 0),
    }
    if args.top > 0:
        row["top_live_at_peak"] = tracker.top_live_at_peak(args.top)
    line = json.dumps(row)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    print(line)


GENERATE_TRACES = os.path.join(ROOT, "validation", "oracle-traces", "seq2seq-generate.jsonl")

# (config, batch, source tokens, new tokens, options)
GENERATE_MATRIX = [
    ("t5-small", 4, 256, 32, ""),
    ("flan-t5-base", 4, 512, 16, ""),
    ("flan-t5-base", 1, 2048, 64, ""),
    ("flan-t5-base", 8, 512, 128, "padded"),
    ("flan-t5-base", 16, 128, 256, ""),
]


BART_GENERATE_TRACES = os.path.join(
    ROOT, "validation", "oracle-traces", "seq2seq-bart-generate.jsonl")
BART_GENERATE_MATRIX = [
    ("bart-base", 4, 512, 32, ""),
    ("bart-base", 1, 1024, 64, ""),
    ("bart-base", 8, 512, 128, "padded"),
    ("bart-base", 16, 128, 256, ""),
]


def run_generate_matrix(matrix=None, traces=GENERATE_TRACES) -> None:
    """Every generation case, one subprocess each, into `traces` (cases already there are
    kept)."""
    import subprocess

    done = set()
    if os.path.exists(traces):
        with open(traces) as f:
            done = {json.loads(line).get("label") for line in f}
    for name, b, s, n, options in GENERATE_MATRIX if matrix is None else matrix:
        label = "%s b%d s%d new%d%s" % (name, b, s, n, " " + options if options else "")
        if label in done:
            continue
        cmd = [
            sys.executable, os.path.abspath(__file__), "--generate",
            "--config", os.path.join(CONFIGS, name + ".json"),
            "--batch", str(b), "--seq", str(s), "--new-tokens", str(n),
            "--label", label, "--out", traces,
        ]
        if name.startswith("flan"):
            cmd.append("--untie")
        if "padded" in options:
            cmd.append("--padded")
        print(label, flush=True)
        subprocess.run(cmd, check=True)


def main() -> None:
    if sys.argv[1:] == ["--matrix", "seq2seq"]:
        run_matrix()
        return
    if sys.argv[1:] == ["--matrix", "seq2seq-umt5"]:
        run_matrix(UMT5_MATRIX, UMT5_TRACES)
        return
    if sys.argv[1:] == ["--matrix", "seq2seq-bart"]:
        run_matrix(BART_MATRIX, BART_TRACES)
        return
    if sys.argv[1:] == ["--matrix", "seq2seq-bart-generate"]:
        run_generate_matrix(BART_GENERATE_MATRIX, BART_GENERATE_TRACES)
        return
    if sys.argv[1:] == ["--matrix", "seq2seq-generate"]:
        run_generate_matrix()
        return
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2:])
        return
    target_len, rest = take(sys.argv[1:], "--target-len", True)
    untie, rest = take(rest, "--untie", False)
    per_block, rest = take(rest, "--per-block", False)
    padded, rest = take(rest, "--padded", False)
    if target_len is None:
        sys.exit("seq2seq_trace: --target-len N is required")
    sys.path.insert(0, ORACLE_DIR)
    config = rest[rest.index("--config") + 1] if "--config" in rest else ""
    with open(config) as f:
        bart = json.load(f).get("model_type") == "bart"
    install_seq2seq(int(target_len), bool(untie), bool(per_block), bool(padded), bart)
    if per_block:
        record_trackers()
    import oracle

    args = oracle.build_parser().parse_args(rest)
    res = oracle.run(args)
    res["job"]["target_len"] = int(target_len)
    res["job"]["untied_lm_head"] = bool(untie)
    res["job"]["padded"] = bool(padded)
    res["label"] = args.label
    if per_block:
        res["per_block_live_bytes"] = BLOCKS
    line = json.dumps(res)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    m = res["measured"]
    print(
        "peak_allocated %.4f GiB at %s; trainable %d; params %d"
        % (m["peak_allocated_gib"], m["peak_at"], res["params"]["trainable"], res["params"]["total"])
    )
    print(json.dumps(m["breakdown_at_peak_gib"]))


if __name__ == "__main__":
    main()
