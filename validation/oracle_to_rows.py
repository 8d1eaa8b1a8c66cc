#!/usr/bin/env python3
"""Convert the fake-CUDA oracle's traces (../shared/oracle/results.jsonl) into rows of the
measured.jsonl schema, so `moro validate` scores moro against them at the allocated level.

The oracle runs the real HF training step (transformers + PEFT + torch AdamW) on PyTorch's
fake tensors and records every allocation: simulated, not measured, but exact for what it
covers (see ../shared/oracle/README.md). Rows the moro job schema cannot express are left
out: the `no-kbit-prep` QLoRA variant (fp32 adapters on a bf16 base without PEFT's upcast).

Usage: python3 validation/oracle_to_rows.py ../shared/oracle/results.jsonl \
    validation/oracle-traces/*.jsonl > validation/oracle.jsonl

`validation/oracle-traces/` keeps the traces run since (their `env` names the versions), with
the per-tensor listings stripped. A config cut to fewer layers (`...-L4.json`) becomes a row
with `model_overrides`. Rank traces of sharded jobs (`fsdp-*.jsonl`, from
`calibration/shard_trace.py`: one process as rank r of a fake process group) become rows with
`num_gpus` = the world size and the rank in the id; the event-list fixture is skipped.
"""
import json
import sys

MODELS = {
    "meta-llama--Llama-3.2-1B-Instruct.json": "meta-llama/Llama-3.2-1B-Instruct",
    "Qwen--Qwen2.5-0.5B.json": "Qwen/Qwen2.5-0.5B",
    "Qwen--Qwen2.5-1.5B.json": "Qwen/Qwen2.5-1.5B",
    "Qwen--Qwen2.5-7B.json": "Qwen/Qwen2.5-7B",
    "meta-llama--Llama-3.1-8B.json": "meta-llama/Llama-3.1-8B",
    "Qwen--Qwen3-0.6B.json": "Qwen/Qwen3-0.6B",
    "Qwen--Qwen3-8B.json": "Qwen/Qwen3-8B",
    "Qwen--Qwen3-8B-L4.json": "Qwen/Qwen3-8B",
    "Qwen--Qwen2.5-7B-L4.json": "Qwen/Qwen2.5-7B",
    "meta-llama--Llama-2-7b-hf.json": "meta-llama/Llama-2-7b-hf",
    "meta-llama--Llama-2-70b-hf.json": "meta-llama/Llama-2-70b-hf",
    "meta-llama--Llama-3.2-3B.json": "meta-llama/Llama-3.2-3B",
    "google--gemma-2-2b.json": "google/gemma-2-2b",
    "EleutherAI--pythia-410m.json": "EleutherAI/pythia-410m",
    "openai--gpt-oss-20b.json": "openai/gpt-oss-20b",
    "mistralai--Mixtral-8x7B-v0.1-L4.json": "mistralai/Mixtral-8x7B-v0.1",
    "Qwen--Qwen3-30B-A3B-L4.json": "Qwen/Qwen3-30B-A3B",
    "mistralai--Mistral-7B-v0.1.json": "mistralai/Mistral-7B-v0.1",
    "mistralai--Mistral-7B-v0.3.json": "mistralai/Mistral-7B-v0.3",
}


# Layers of the full configs, to tell a trace cut to fewer layers.
MODEL_LAYERS = {
    "meta-llama/Llama-3.2-1B-Instruct": 16,
    "meta-llama/Llama-2-7b-hf": 32,
    "meta-llama/Llama-2-70b-hf": 80,
    "mistralai/Mistral-7B-v0.1": 32,
    "mistralai/Mistral-7B-v0.3": 32,
    "meta-llama/Llama-3.1-8B": 32,
}


def sharding_fields(r):
    """The row fields of a rank trace's sharding (`dist`), or None for a one-GPU trace."""
    d = r.get("dist")
    if not d:
        return None
    stack = d.get("stack", "hf")
    version = "FSDP2 fully_shard" if d.get("fsdp_version") == 2 else "FSDP1"
    # The tracer's torchtune-style runs shard an HF model the way torchtune's distributed
    # recipes do (FSDP2 per layer, pure bf16, no autocast) but keep the HF model and its loss:
    # moro's hf stack at bf16 is that job.
    framework = {
        "hf": "HF Trainer + accelerate %s (fake-CUDA rank trace)" % version,
        "torchtune": "HF transformers model, %s per layer then root, pure bf16 without "
                     "autocast (fake-CUDA rank trace)" % version,
    }.get(stack)
    if framework is None:
        return None
    sharding = "FSDP %s (%s, %s loading%s)" % (
        d.get("sharding_strategy", "FULL_SHARD"), version, d.get("loading_path", "?"),
        ", CPU offload" if d.get("cpu_offload") else "")
    return {
        "num_gpus": d["world_size"],
        "sharding": sharding,
        "cpu_offload": "params" if d.get("cpu_offload") else None,
        "framework": framework,
        "rank": d["rank"],
    }


def convert(r):
    job = r["job"]
    model = MODELS.get(r["config_name"])
    if model is None or (not r.get("dist") and any("override" in a for a in r.get("argv", []))):
        return None
    if job["method"] == "qlora" and (job.get("qlora") or {}).get("kbit_prepare") is False:
        return None
    if "no-kbit-prep" in r.get("label", ""):
        return None
    precision = {"bf16-mixed": "bf16 AMP (bf16-mixed: fp32 trainable, autocast)",
                 "bf16": "bf16 (pure)", "fp32": "fp32"}[job["precision"].split()[0]]
    lora = None
    method = job["method"]
    if job["method"] in ("lora", "qlora"):
        l = job["lora"]
        lora = {"r": l["r"], "alpha": l["alpha"], "dropout": l["dropout"],
                "target_modules": l["targets"]}
        # calibration/peft_trace.py: the PEFT config that replaced the oracle's LoraConfig.
        peft = dict(job.get("peft") or {})
        kind = peft.pop("peft_type", "LORA")
        if kind == "LORA":
            lora["use_dora"] = bool(peft.get("use_dora"))
        else:
            method = kind.lower()
            lora = {"peft_type": kind, **peft}
            if kind == "LOKR":
                lora.setdefault("dropout", l["dropout"])
                lora.setdefault("target_modules", l["targets"])
    quant = None
    if job["method"] == "qlora":
        q = job.get("qlora") or {}
        quant = {"type": "bnb nf4", "double_quant": q.get("double_quant", True),
                 "compute_dtype": "bf16"}
    meas = r["measured"]["peak_allocated_bytes"]
    overrides = None
    if r["config_name"].endswith("-L4.json"):
        overrides = {"num_hidden_layers": r["config"]["num_hidden_layers"]}
    # Rank traces and calibration/trl_trace.py cut some models to fewer layers (`--override
    # num_hidden_layers=N`): a row with `model_overrides`.
    layers = r["config"].get("num_hidden_layers")
    if (r.get("dist") or job.get("loss")) and layers != MODEL_LAYERS.get(model, layers):
        overrides = {"num_hidden_layers": layers}
    shard = sharding_fields(r)
    if r.get("dist") and shard is None:
        return None
    # A transformer-only wrap that puts the adapters in the layers' flat parameters (not
    # PEFT's policy, which the HF Trainer applies) is a variant moro does not describe.
    if shard is not None and "wrap-transformer" in r["label"]:
        return None
    if shard is not None:
        if r["dist"].get("stack") == "torchtune":
            precision = "bf16 (pure)"
    row = {
        "id": "oracle-" + r["label"].replace("/", "-").replace(" ", "-"),
        "source_key": "oracle-fake-cuda",
        "model_hf_id": model,
        "arch": r["config"].get("model_type", ""),
        "method": method,
        "quantization": quant,
        "lora": lora,
        "optimizer": "torch.optim.AdamW(%s)" % ("fused" if "fused" in job["optimizer"] else "foreach"),
        "precision": precision,
        "micro_batch_size": job["micro_batch"],
        "seq_len": job["seq_len"],
        "seq_len_kind": "packed (no attention mask)",
        "grad_accum": 1,
        "gradient_checkpointing": job["grad_ckpt"],
        "attention_impl": job["attn_implementation"],
        "framework": "HF transformers + PEFT (fake-CUDA oracle)",
        "framework_version": "torch %s, transformers %s, peft %s" % (
            r["env"].get("torch", "?"), r["env"].get("transformers", "?"), r["env"].get("peft", "?")),
        "num_gpus": 1,
        "gpu": "NVIDIA H100 80GB HBM3 (simulated sm80+ kernel choice)",
        "metric": "torch.cuda.max_memory_allocated equivalent (fake-tensor allocation trace)",
        "measured_value": meas,
        "measured_unit": "bytes",
        "per_gpu_gib": meas / 2**30,
        "outcome": "ok",
        "confidence": "high",
        "notes": "simulated by ../shared/oracle (oracle.py), not a GPU measurement",
    }
    if job.get("peft"):
        row["trainable_params"] = r["params"]["trainable"]
        row["notes"] = ("simulated by calibration/peft_trace.py (the oracle with PEFT's own "
                        "config for the method), not a GPU measurement")
    if job.get("loss"):
        row["id"] = "oracle-trl-" + r["label"].replace("/", "-").replace(" ", "-")
        row["loss_impl"] = job["loss"]
        row["notes"] = ("simulated by calibration/trl_trace.py (the oracle with TRL's chunked "
                        "loss patched in as SFTTrainer patches it), not a GPU measurement")
    if overrides:
        row["model_overrides"] = overrides
    if shard is not None:
        row["id"] = "oracle-%s-w%d-r%d" % (r["label"].replace("/", "-"), shard["num_gpus"], shard["rank"])
        row["source_key"] = "oracle-fake-cuda-sharded"
        row["num_gpus"] = shard["num_gpus"]
        row["sharding"] = shard["sharding"]
        row["cpu_offload"] = shard["cpu_offload"]
        row["framework"] = shard["framework"]
        row["framework_version"] += ", accelerate %s" % r["env"].get("accelerate", "?")
        row["metric"] = "torch.cuda.max_memory_allocated equivalent on rank %d (fake-tensor allocation trace)" % shard["rank"]
        row["notes"] = "simulated by calibration/shard_trace.py (one rank of a fake process group), not a GPU measurement"
    return row


def main():
    seen = set()
    for path in sys.argv[1:]:
        for line in open(path):
            row = convert(json.loads(line))
            if row is not None and row["id"] not in seen:
                seen.add(row["id"])
                print(json.dumps(row, sort_keys=True))


if __name__ == "__main__":
    main()
