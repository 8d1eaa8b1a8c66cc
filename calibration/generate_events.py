#!/usr/bin/env python
"""Every allocation and free of a decoder's generation, in order, on fake CUDA tensors, as
transformers' `generate` runs it: the prefill of the prompt under `no_grad` with a
`DynamicCache` (its last position's logits kept), then greedy decode steps, each feeding the
token chosen before, the cache's keys and values grown by `torch.cat` in every layer
(`DynamicLayer.update`, transformers 5.25 `cache_utils.py`), the last logits copied to fp32
(`next_token_logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)`,
`generation/utils.py` `_sample`), `input_ids` and the attention mask each grown by a column
(`_update_model_kwargs_for_generation`).

  $PY calibration/generate_events.py --config CONFIG.json [--set KEY=JSON] --batch B \\
      --prompt P --new-tokens N [--label L]

Prints one row in `step_events.py`'s compact form (`sizes`, and `events`: `<i>` allocates
`sizes[i]` bytes, `-<k>` frees the allocation made `k` allocations earlier, `r` after the
weights), and the fake tracker's allocated peak. `--matrix` regenerates
`validation/oracle-traces/generate-events.jsonl`, which `crates/moro-core/tests/generate.rs`
holds moro's decode replay to.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
MODELS_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "models"))
FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "generate-events.jsonl")
MOE_FIXTURE = os.path.join(ROOT, "validation", "oracle-traces", "generate-moe.jsonl")


def trace(argv: list[str]) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--set", action="append", default=[], help="config override KEY=JSON")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, required=True)
    p.add_argument("--new-tokens", type=int, required=True)
    p.add_argument("--label", default="")
    p.add_argument("--desc", action="store_true", help="each allocation's op, dtype and shape")
    args = p.parse_args(argv)

    sys.path.insert(0, HERE)
    import step_events
    from prefill_trace import ORACLE_DIR

    sys.path.insert(0, ORACLE_DIR)
    import tracker as tracker_module

    recording = step_events.install_recorder(tracker_module)
    import prefill_trace

    oracle, _ = prefill_trace.fake_inference_setup()
    from seq2seq_trace import answer_all_ones_masks

    # The prompt is unpadded, so every mask is all ones, which a GPU reads and skips
    # (SDPA without a mask); a fake tensor cannot be read, so the trace answers as the GPU.
    answer_all_ones_masks()
    t = recording("cuda")
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import DynamicCache

    cfg, d, model_type, overrides = prefill_trace.load_config(args.config, args.set)
    b, prompt = args.batch, args.prompt
    with FakeTensorMode(allow_non_fake_inputs=True):
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.eval()
        t.phase = "setup"
        for p_ in model.parameters():
            t.register(p_, "params_frozen", "param")
        for buf in model.buffers():
            t.register(buf, "buffers", "buffer")
        t.phase = "prefill"
        with t, torch.no_grad():
            # What `generate` holds and makes around the model (transformers 5.25
            # `generation/utils.py`): the caller's ids and mask; position ids from the mask
            # (`_prepare_position_ids_for_generation`), the mask then dropped as all ones;
            # each step the ids and position ids grown by a column and the model fed their
            # last column's copies (`prepare_inputs_for_generation`), the last logits copied
            # to fp32, the greedy token (EOS stopping: finished rows get the pad token).
            ids = torch.randint(0, cfg.vocab_size, (b, prompt), device="cuda")
            mask = torch.ones_like(ids)
            pos = mask.long().cumsum(-1) - 1
            pos = pos.masked_fill(mask == 0, 0)
            unfinished = torch.ones(b, dtype=torch.long, device="cuda")
            pad = torch.tensor(cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else 0,
                               device="cuda")
            cache = DynamicCache(config=cfg)
            out = model(input_ids=ids.clone(), position_ids=pos, past_key_values=cache,
                        use_cache=True, logits_to_keep=1)
            # `_optimize_model_for_decode`: on a GPU, stacked experts decode with
            # `batched_mm` instead of `grouped_mm`.
            experts = model.get_experts_implementation()
            if "grouped_mm" in experts.values():
                model.set_experts_implementation(
                    {k: "batched_mm" if v == "grouped_mm" else v for k, v in experts.items()})
            for step in range(args.new_tokens):
                pos = torch.cat([pos, torch.arange(1, device="cuda") + pos[..., -1:]], dim=-1)
                logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
                nxt = torch.argmax(logits, dim=-1)
                nxt = nxt * unfinished + pad * (1 - unfinished)
                ids = torch.cat([ids, nxt[:, None]], dim=-1)
                del out, logits, nxt
                if step == args.new_tokens - 1:
                    break
                t.phase = "decode"
                out = model(input_ids=ids[:, -1:].clone(), position_ids=pos[..., -1:].clone(),
                            past_key_values=cache, use_cache=True, logits_to_keep=1)
    row = {
        "tracer": "moro-step-events/1",
        "label": args.label,
        "config": dict(d, model_type=model_type),
        "overrides": overrides,
        "batch": b,
        "prompt": prompt,
        "new_tokens": args.new_tokens,
        "env": oracle.versions(),
        "peak_allocated_bytes": t.peak,
        "categories": sorted({e[1] for e in t.events if len(e) == 3}),
        "phases": sorted({e[2] for e in t.events if len(e) == 3}),
    }
    if args.desc:
        row["descs"] = t.descs
    cats, phases = row["categories"], row["phases"]
    row["events"] = [e if len(e) == 1 else [e[0], cats.index(e[1]), phases.index(e[2])]
                     for e in t.events]
    return step_events.compact(row, None)


# (config, batch, prompt tokens, new tokens): each model cut to 2 layers. One layer's keys
# stay in the small pool (the first), move through the 20 MiB segments that requests under
# 10 MiB share (the second and fourth), or outgrow them into segments of their own (the
# third and fifth); in the third the decode, not the prefill, sets the reserved peak. Qwen3
# adds its per-head q and k norms, and the 4B ties its embedding to the head.
MATRIX = [
    ("meta-llama--Llama-3.1-8B", 1, 512, 32),
    ("meta-llama--Llama-3.1-8B", 16, 256, 96),
    ("meta-llama--Llama-3.1-8B", 20, 32, 384),
    ("Qwen--Qwen2.5-7B", 8, 512, 32),
    ("mistralai--Mistral-7B-v0.3", 32, 128, 48),
    ("Qwen--Qwen3-4B", 8, 128, 32),
]


# MoE models cut to 2 layers, decoding where the experts' gathered weights outweigh the
# prompt's prefill (`--matrix-moe`: peaks only, the estimate's formulas are held to them).
MOE_MATRIX = [
    ("Qwen--Qwen3-30B-A3B", 16, 32, 4),
    ("mistralai--Mixtral-8x7B-v0.1", 8, 32, 4),
    ("deepseek-ai--DeepSeek-V2-Lite", 8, 32, 4),
]


def run_case(name: str, batch: int, prompt: int, new: int) -> str:
    """One matrix job, 2 layers of `name`, traced in its own process: its row as printed."""
    label = "%s-L2-b%d-p%d-n%d" % (name, batch, prompt, new)
    a = ["--config", os.path.join(MODELS_DIR, name + ".json"), "--set", "num_hidden_layers=2",
         "--batch", str(batch), "--prompt", str(prompt), "--new-tokens", str(new),
         "--label", label]
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)] + a,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        sys.exit(1)
    sys.stderr.write(label + "\n")
    return proc.stdout.strip()


def write_rows(path: str, rows: list[str]) -> None:
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")


def run_moe_matrix() -> None:
    keep = ("tracer", "label", "config", "overrides", "batch", "prompt", "new_tokens", "env",
            "peak_allocated_bytes")
    rows = []
    for case in MOE_MATRIX:
        row = json.loads(run_case(*case))
        rows.append(json.dumps({k: row[k] for k in keep}, separators=(",", ":")))
    write_rows(MOE_FIXTURE, rows)


def run_matrix() -> None:
    write_rows(FIXTURE, [run_case(*case) for case in MATRIX])


def main() -> None:
    if sys.argv[1:] == ["--matrix"]:
        run_matrix()
        return
    if sys.argv[1:] == ["--matrix-moe"]:
        run_moe_matrix()
        return
    row = trace(sys.argv[1:])
    row.pop("h200_row", None)
    print(json.dumps(row, separators=(",", ":")))


if __name__ == "__main__":
    main()
