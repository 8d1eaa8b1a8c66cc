#!/usr/bin/env python3
"""Checks every export snapshot with the trainers' own code (issue 18 §4).

    python calibration/check_exports.py [--snapshots DIR] [--out FILE.md] \
        [--llamafactory-python PY] [--axolotl-python PY]

Run it with a Python whose environment has transformers, trl, peft, accelerate and
deepspeed (a venv outside the repository: `pip install trl deepspeed` on top of the
oracle's venv, `calibration/README.md`). LLaMA-Factory and axolotl pin their own
transformers, so each is checked with its own venv's Python when given. No GPU and no model
weights are needed: each check runs the trainer's own argument classes and config loaders on
the exported files, and the TRL script is run as written with the model load, the dataset
and the trainer's loop replaced by recorders. Each check runs in a subprocess of its own.

What each trainer's check does:
- hf-trainer: `TrainingArguments(**training_args.json)` (its DeepSpeed config through the
  Trainer's integration), and ZeRO-3 is enabled when the config says stage 3.
- accelerate: `load_config_from_file(accelerate.yaml)`, and its DeepSpeed config through
  `DeepSpeedPlugin(hf_ds_config=...)`.
- deepspeed: the config through `HfDeepSpeedConfig` and DeepSpeed's own
  `DeepSpeedZeroConfig` model of `zero_optimization`.
- trl: the script as written; the model must be loaded after the DeepSpeed config exists
  when it is ZeRO-3 (else every rank loads the whole model), FlashAttention 2 only with a
  16-bit dtype; the `trl sft` command line in its header parses with TRL's own parser.
- unsloth: compiles (Unsloth needs a GPU to import).
- llamafactory: `get_train_args(llamafactory.yaml)` in its venv.

A file whose launch command is distributed (torchrun, `FORCE_TORCHRUN=1`, `accelerate
launch`, the DeepSpeed launcher) is checked with that launcher's environment for rank 0, in a
world of one process.
- axolotl: `validate_config` of axolotl.yaml in its venv.

The report (markdown) lists the versions and one line per file: ok, failed (with the
trainer's message) or not checked (why), with the warnings the trainer printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
SNAPSHOTS = HERE.parent / "crates" / "moro-export" / "tests" / "snapshots"


# --------------------------------------------------------------------------------------------
# Checks, each run in a subprocess (`--one TRAINER DIR`) in the trainer directory.


def check_hf_trainer(d: Path) -> dict:
    from transformers import TrainingArguments
    from transformers.integrations import is_deepspeed_zero3_enabled

    args = json.loads((d / "training_args.json").read_text())
    # Kept alive: the Trainer's DeepSpeed config is a weak reference to these arguments.
    training_args = TrainingArguments(**args)
    detail = []
    if "deepspeed" in args:
        stage = json.loads((d / args["deepspeed"]).read_text())["zero_optimization"]["stage"]
        if (stage == 3) != is_deepspeed_zero3_enabled():
            raise AssertionError(f"ZeRO stage {stage} but zero3 enabled = {is_deepspeed_zero3_enabled()}")
        detail.append(f"DeepSpeed ZeRO-{stage} config accepted")
    del training_args
    return {"detail": "; ".join(detail) or "TrainingArguments accepted"}


def check_accelerate(d: Path) -> dict:
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(d / "accelerate.yaml"))
    detail = [f"{type(cfg).__name__} {cfg.distributed_type}"]
    ds = d / "ds_config.json"
    if ds.exists():
        from accelerate.utils import DeepSpeedPlugin

        DeepSpeedPlugin(hf_ds_config=str(ds))
        detail.append("DeepSpeedPlugin accepted ds_config.json")
    return {"detail": "; ".join(detail)}


def check_deepspeed(d: Path) -> dict:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from transformers.integrations import HfDeepSpeedConfig

    cfg = json.loads((d / "ds_config.json").read_text())
    HfDeepSpeedConfig(str(d / "ds_config.json"))
    zero = {k: v for k, v in cfg["zero_optimization"].items() if v != "auto"}
    DeepSpeedZeroConfig(**zero)
    return {"detail": f"ZeRO-{cfg['zero_optimization']['stage']} config accepted"}


def trl_cli_args(script: str) -> list[str] | None:
    """The `trl sft` command line the script's header shows, as argv."""
    lines = script.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.strip().startswith("#   trl sft"))
    except StopIteration:
        return None
    words: list[str] = []
    import shlex

    for l in lines[start:]:
        if not l.startswith("#"):
            break
        body = l.lstrip("#").strip()
        cont = body.endswith("\\")
        words += shlex.split(body.rstrip("\\"))
        if not cont:
            break
    return words[2:]  # drop `trl sft`


def check_trl(d: Path) -> dict:
    import runpy
    import transformers
    import datasets
    import trl
    from transformers.integrations import is_deepspeed_zero3_enabled

    script = (d / "train_trl.py").read_text()
    seen: dict = {}

    def from_pretrained(name, *a, **kw):
        seen["load"] = {"zero3": is_deepspeed_zero3_enabled(), "kwargs": {k: repr(v) for k, v in kw.items()}}
        dtype = kw.get("dtype", kw.get("torch_dtype"))
        if kw.get("attn_implementation") == "flash_attention_2" and str(dtype) not in (
            "torch.bfloat16",
            "torch.float16",
        ) and kw.get("quantization_config") is None:
            raise AssertionError(f"FlashAttention 2 with dtype {dtype}: it needs bf16 or fp16")
        return object()

    class Trainer:
        def __init__(self, model=None, args=None, **kw):
            if not isinstance(args, trl.SFTConfig):
                raise AssertionError(f"args is {type(args).__name__}, not SFTConfig")
            seen["trainer"] = sorted(kw)

        def train(self, *a, **kw):
            seen["trained"] = True

        def save_model(self, *a, **kw):
            pass

    transformers.AutoModelForCausalLM.from_pretrained = from_pretrained
    datasets.load_dataset = lambda *a, **kw: datasets.Dataset.from_dict({"text": ["x"]})
    trl.SFTTrainer = Trainer
    runpy.run_path(str(d / "train_trl.py"), run_name="__main__")
    if not seen.get("trained"):
        raise AssertionError("the script never calls trainer.train()")
    ds = d / "ds_config.json"
    if ds.exists():
        stage = json.loads(ds.read_text())["zero_optimization"]["stage"]
        if stage == 3 and not seen["load"]["zero3"]:
            raise AssertionError(
                "the model is loaded before SFTConfig(deepspeed=...) exists, so ZeRO-3's "
                "zero.Init never partitions it: every rank loads the whole model"
            )
    detail = ["script ran as written (model, data and loop recorded)"]
    argv = trl_cli_args(script)
    if argv is not None:
        from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

        TrlParser((ScriptArguments, SFTConfig, ModelConfig)).parse_args_and_config(argv)
        detail.append("`trl sft` command line parsed")
    return {"detail": "; ".join(detail)}


def check_unsloth(d: Path) -> dict:
    import py_compile

    py_compile.compile(str(d / "train_unsloth.py"), doraise=True)
    return {"status": "not checked", "detail": "compiles; Unsloth needs a GPU to import"}


def check_llamafactory(d: Path) -> dict:
    import yaml
    from llamafactory.hparams import get_train_args

    cfg = yaml.safe_load((d / "llamafactory.yaml").read_text())
    get_train_args(cfg)
    return {"detail": "get_train_args accepted"}


def check_axolotl(d: Path) -> dict:
    import yaml
    from axolotl.utils.config import validate_config
    from axolotl.utils.dict import DictDefault

    cfg = yaml.safe_load((d / "axolotl.yaml").read_text())
    validate_config(DictDefault(cfg))
    return {"detail": "validate_config accepted"}


CHECKS = {
    "hf-trainer": check_hf_trainer,
    "accelerate": check_accelerate,
    "deepspeed": check_deepspeed,
    "trl": check_trl,
    "unsloth": check_unsloth,
    "llamafactory": check_llamafactory,
    "axolotl": check_axolotl,
}

VERSIONS = {
    "default": ["transformers", "trl", "peft", "accelerate", "deepspeed", "torch"],
    "llamafactory": ["llamafactory", "transformers", "peft"],
    "axolotl": ["axolotl", "transformers", "peft"],
}


def assume_target_gpu() -> None:
    """The files are for the GPU the recipe was searched for, which has bf16 wherever the
    recipe uses it; this machine may have no GPU, so the Trainer's bf16 check is told so."""
    yes = lambda *a, **kw: True  # noqa: E731
    try:
        import transformers.training_args as ta

        ta.is_torch_bf16_gpu_available = yes
    except ImportError:
        pass
    try:
        import llamafactory.hparams.parser as lf

        lf.is_torch_bf16_gpu_available = yes
    except ImportError:
        pass


def one(trainer: str, d: Path) -> None:
    """Runs one check here and prints its result as one JSON line."""
    os.chdir(d)
    assume_target_gpu()
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            r = CHECKS[trainer](d)
            r.setdefault("status", "ok")
        except Exception as e:  # the trainer's own refusal is the result
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            r = {"status": "failed", "detail": f"{type(e).__name__}: {first}"}
        caught = sorted({f"{x.category.__name__}: {str(x.message).splitlines()[0]}" for x in w})
    r["warnings"] = caught
    print("RESULT " + json.dumps(r))


def launcher_env(d: Path) -> dict:
    """The environment the export's launch command gives rank 0 of a distributed run
    (torchrun, `FORCE_TORCHRUN=1`, `accelerate launch`, the DeepSpeed launcher), as one rank
    of a world of one on this machine; nothing for a plain `python` launch."""
    f = d / "_launch_and_warnings.txt"
    launch = next(
        (l[len("launch: ") :] for l in f.read_text().splitlines() if l.startswith("launch: ")), ""
    ) if f.exists() else ""
    if not any(w in launch for w in ("torchrun", "FORCE_TORCHRUN=1", "accelerate launch", "deepspeed ")):
        return {}
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29517",
    }


def versions(python: str, names: list[str]) -> dict:
    code = (
        "import importlib.metadata as m, json\n"
        f"print(json.dumps({{n: (m.version(n) if n in {{d.metadata['Name'].lower() for d in m.distributions()}} else None) for n in {names!r}}}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {n: None for n in names}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--snapshots", type=Path, default=SNAPSHOTS)
    ap.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    ap.add_argument("--llamafactory-python", default=None)
    ap.add_argument("--axolotl-python", default=None)
    ap.add_argument("--one", nargs=2, metavar=("TRAINER", "DIR"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        one(a.one[0], Path(a.one[1]).resolve())
        return
    pythons = {"llamafactory": a.llamafactory_python, "axolotl": a.axolotl_python}
    rows = []
    for snap in sorted(p for p in a.snapshots.iterdir() if p.is_dir()):
        for d in sorted(p for p in snap.iterdir() if p.is_dir()):
            trainer = d.name
            py = pythons.get(trainer, sys.executable) if trainer in pythons else sys.executable
            if py is None:
                r = {"status": "not checked", "detail": f"no {trainer} venv given", "warnings": []}
            else:
                env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
                env.update(launcher_env(d))
                # The venv's own tools (DeepSpeed builds its CPU ops with the venv's ninja).
                env["PATH"] = str(Path(py).parent) + os.pathsep + env.get("PATH", "")
                p = subprocess.run(
                    [py, str(Path(__file__).resolve()), "--one", trainer, str(d)],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=600,
                    check=False,
                )
                line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
                if line is None:
                    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
                    r = {"status": "failed", "detail": f"check crashed: {tail}", "warnings": []}
                else:
                    r = json.loads(line[len("RESULT ") :])
            r.update(snapshot=snap.name, trainer=trainer)
            rows.append(r)
            print(f"{r['status']:12} {snap.name}/{trainer}: {r['detail']}", file=sys.stderr)
    report = render(rows, a, pythons)
    if a.out:
        a.out.write_text(report)
    else:
        sys.stdout.write(report)
    sys.exit(1 if any(r["status"] == "failed" for r in rows) else 0)


def render(rows: list[dict], a, pythons: dict) -> str:
    out = ["# Export snapshots checked with the trainers' own code", ""]
    out.append("Written by `calibration/check_exports.py`; what each check does is in its docstring.")
    out.append("")
    out.append("| environment | versions |")
    out.append("|---|---|")
    envs = [("default", sys.executable)] + [(k, v) for k, v in pythons.items() if v]
    for name, py in envs:
        vs = versions(py, VERSIONS[name])
        out.append(f"| {name} | " + ", ".join(f"{k} {v}" for k, v in vs.items() if v) + " |")
    out.append("")
    n = {s: sum(r["status"] == s for r in rows) for s in ("ok", "failed", "not checked")}
    out.append(f"{len(rows)} files: {n['ok']} ok, {n['failed']} failed, {n['not checked']} not checked.")
    out.append("")
    out.append("| snapshot | trainer | result | detail | warnings |")
    out.append("|---|---|---|---|---|")
    for r in rows:
        w = "<br>".join(x.replace("|", "\\|") for x in r["warnings"]) or ""
        detail = r["detail"].replace("|", "\\|")
        out.append(f"| {r['snapshot']} | {r['trainer']} | {r['status']} | {detail} | {w} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
