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
- unsloth: the script as written, in a venv with the TRL and transformers Unsloth pins; Unsloth
  raises at import without a GPU, so `FastLanguageModel` is a recorder that binds each call to
  the parameters Unsloth's source declares (`check_unsloth`).
- trl and unsloth: `load_dataset` answers with rows of the named dataset's columns, and what
  reaches `SFTTrainer` must have a `text`, `messages` or `prompt`/`completion` column.
- llamafactory: `get_train_args(llamafactory.yaml)` in its venv.
- mlx: the launch line and `mlx_lora.yaml` through mlx_lm's own parsers and dataset loader
  (`check_mlx`), in a venv with `mlx[cpu]` and mlx-lm.

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


# The columns of the datasets the exports name, as their Hub dataset cards list them (read
# 2026-12-05). A script's `load_dataset` is answered with two rows of these columns, so what
# reaches `SFTTrainer` is what the real dataset would give after the script's own mapping.
DATASET_COLUMNS = {
    "trl-lib/Capybara": {"messages": [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]] * 2},
    "yahma/alpaca-cleaned": {"instruction": ["Add.", "Greet."], "input": ["1 + 1", ""], "output": ["2", "Hello"]},
    "tatsu-lab/alpaca": {
        "instruction": ["Add.", "Greet."],
        "input": ["1 + 1", ""],
        "output": ["2", "Hello"],
        "text": ["...", "..."],
    },
}

# The columns `SFTTrainer` trains on (TRL 1.x `SFTTrainer._prepare_dataset`): a text field, a
# conversation, or a prompt and its completion.
SFT_COLUMN_SETS = [{"text"}, {"messages"}, {"prompt", "completion"}]


def fake_load_dataset(seen: dict):
    import datasets

    def load_dataset(path, *a, **kw):
        seen["dataset"] = kw.get("data_files", path)
        if "data_files" in kw or path not in DATASET_COLUMNS:
            seen["dataset_columns_known"] = False
            return datasets.Dataset.from_dict({"text": ["x", "y"]})
        seen["dataset_columns_known"] = True
        return datasets.Dataset.from_dict(DATASET_COLUMNS[path])

    return load_dataset


def recording_trainer(seen: dict, config_class):
    """An `SFTTrainer` stand-in: checks its arguments' class and the dataset's columns."""

    class Trainer:
        def __init__(self, model=None, args=None, train_dataset=None, **kw):
            if not isinstance(args, config_class):
                raise AssertionError(f"args is {type(args).__name__}, not {config_class.__name__}")
            cols = set(train_dataset.column_names)
            if not any(need <= cols for need in SFT_COLUMN_SETS):
                raise AssertionError(
                    f"SFTTrainer gets columns {sorted(cols)} from {seen.get('dataset')}: it trains "
                    "on `text`, `messages` or `prompt`/`completion`"
                )
            seen["columns"] = sorted(cols)
            seen["trainer"] = sorted(kw)

        def train(self, *a, **kw):
            seen["trained"] = True

        def save_model(self, *a, **kw):
            pass

    return Trainer


def dataset_detail(seen: dict) -> str:
    if seen.get("dataset_columns_known"):
        return f"{seen['dataset']} reaches SFTTrainer as {', '.join(seen['columns'])}"
    return f"{seen.get('dataset')}: columns not known here"


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

    transformers.AutoModelForCausalLM.from_pretrained = from_pretrained
    datasets.load_dataset = fake_load_dataset(seen)
    trl.SFTTrainer = recording_trainer(seen, trl.SFTConfig)
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
    detail = ["script ran as written (model, data and loop recorded)", dataset_detail(seen)]
    argv = trl_cli_args(script)
    if argv is not None:
        from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

        TrlParser((ScriptArguments, SFTConfig, ModelConfig)).parse_args_and_config(argv)
        detail.append("`trl sft` command line parsed")
    return {"detail": "; ".join(detail)}


def unsloth_parameters(root: Path, module: str, cls: str, method: str) -> tuple[list[str], bool]:
    """The named parameters of `cls.method` in Unsloth's source file `module` and whether it
    takes `**kwargs`, read from the code (Unsloth raises at import without a GPU)."""
    import ast

    tree = ast.parse((root / module).read_text())
    c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    f = next(n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == method)
    a = f.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return names, a.kwarg is not None


def check_unsloth(d: Path) -> dict:
    """The script run as written with Unsloth's two calls bound to the parameters its source
    declares: `FastLanguageModel.from_pretrained` (unsloth/models/loader.py) must name each
    keyword; `get_peft_model` (`FastLlamaModel.get_peft_model`, unsloth/models/llama.py, which
    `FastLanguageModel`'s wraps) passes the rest of its keywords to PEFT's `LoraConfig`, so a
    keyword is either its own parameter or a `LoraConfig` field. TRL's `SFTConfig` is TRL's
    own, in the TRL release Unsloth pins."""
    import dataclasses
    import importlib.util
    import runpy
    import types

    import datasets
    import peft
    import torch
    import trl

    spec = importlib.util.find_spec("unsloth")
    if spec is None or not spec.submodule_search_locations:
        return {"status": "not checked", "detail": "Unsloth is not installed in this venv"}
    root = Path(list(spec.submodule_search_locations)[0])
    load_params, _ = unsloth_parameters(root, "models/loader.py", "FastLanguageModel", "from_pretrained")
    peft_params, _ = unsloth_parameters(root, "models/llama.py", "FastLlamaModel", "get_peft_model")
    lora_fields = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    seen: dict = {}

    class Tokenizer:
        eos_token = "</s>"

    class FastLanguageModel:
        @staticmethod
        def from_pretrained(**kw):
            unknown = sorted(set(kw) - set(load_params))
            if unknown:
                raise AssertionError(f"FastLanguageModel.from_pretrained has no parameter {unknown}")
            gc = kw.get("use_gradient_checkpointing", "unsloth")
            if gc not in (True, False, "unsloth"):
                raise AssertionError(f"use_gradient_checkpointing={gc!r}")
            if kw.get("dtype") not in (None, torch.bfloat16, torch.float16, torch.float32):
                raise AssertionError(f"dtype={kw.get('dtype')!r}")
            if kw.get("load_in_4bit") and kw.get("full_finetuning"):
                raise AssertionError("load_in_4bit with full_finetuning")
            seen["load"] = sorted(kw)
            return object(), Tokenizer()

        @staticmethod
        def get_peft_model(model, **kw):
            unknown = sorted(set(kw) - set(peft_params) - lora_fields)
            if unknown:
                raise AssertionError(
                    f"get_peft_model: {unknown} is neither its parameter nor a LoraConfig field"
                )
            if kw.get("use_gradient_checkpointing", "unsloth") not in (True, False, "unsloth"):
                raise AssertionError(f"use_gradient_checkpointing={kw['use_gradient_checkpointing']!r}")
            seen["peft"] = sorted(kw)
            return model

    fake = types.ModuleType("unsloth")
    fake.FastLanguageModel = FastLanguageModel
    sys.modules["unsloth"] = fake
    datasets.load_dataset = fake_load_dataset(seen)
    trl.SFTTrainer = recording_trainer(seen, trl.SFTConfig)
    runpy.run_path(str(d / "train_unsloth.py"), run_name="__main__")
    if not seen.get("trained"):
        raise AssertionError("the script never calls trainer.train()")
    return {
        "detail": "script ran as written with Unsloth's calls bound to its source's parameters; "
        + dataset_detail(seen)
    }


def check_mlx(d: Path) -> dict:
    """mlx_lm's own reading of the export: the launch line through `mlx_lm.convert`'s and
    `mlx_lm.lora`'s argument parsers, the YAML through `mlx_lm.lora`'s loader with every key
    one it reads (`CONFIG_DEFAULTS` or a command-line option) and of its default's type, the
    arguments merged as its `main` merges them, and its `load_dataset` on rows of the named
    dataset's columns (a local folder is the user's and is not read here)."""
    import importlib
    import shlex
    import types

    import datasets
    import yaml

    # `mlx_lm.convert` the module (the package exports a function of that name).
    convert = importlib.import_module("mlx_lm.convert")
    lora = importlib.import_module("mlx_lm.lora")
    mlx_datasets = importlib.import_module("mlx_lm.tuner.datasets")

    launch = launch_line(d)
    parsed = None
    for part in launch.split("&&"):
        argv = shlex.split(part)
        parser = {"mlx_lm.convert": convert.configure_parser, "mlx_lm.lora": lora.build_parser}.get(argv[0])
        if parser is None:
            raise AssertionError(f"unknown command {argv[0]} in the launch line")
        ns = parser().parse_args(argv[1:])
        if argv[0] == "mlx_lm.lora":
            parsed = ns
    if parsed is None or not parsed.config:
        raise AssertionError("the launch line runs no `mlx_lm.lora --config`")
    config = yaml.load((d / parsed.config).read_text(), lora.yaml_loader)
    known = set(lora.CONFIG_DEFAULTS) | set(vars(parsed))
    unknown = sorted(set(config) - known)
    if unknown:
        raise AssertionError(f"mlx_lm.lora reads no key {unknown}")
    for k, v in config.items():
        default = lora.CONFIG_DEFAULTS.get(k)
        if default is not None and not isinstance(v, type(default)) and not (
            isinstance(default, float) and isinstance(v, int)
        ):
            raise AssertionError(f"{k}: {v!r} is not a {type(default).__name__}")
    extra = sorted(set(config.get("lora_parameters", {})) - {"rank", "scale", "dropout", "keys"})
    if extra:
        raise AssertionError(f"lora_parameters: mlx_lm reads no {extra}")
    args = vars(parsed)
    for k, v in config.items():
        if args.get(k) is None:
            args[k] = v
    for k, v in lora.CONFIG_DEFAULTS.items():
        if args.get(k) is None:
            args[k] = v
    args = types.SimpleNamespace(**args)
    detail = ["launch line and config read by mlx_lm's own parsers"]
    if Path(args.data).suffix or args.data.startswith("."):
        detail.append(f"{args.data}: a local folder, not read here")
    elif args.data in DATASET_COLUMNS:
        rows = datasets.Dataset.from_dict(DATASET_COLUMNS[args.data])
        datasets.load_dataset = lambda *a, **kw: datasets.DatasetDict({"train": rows})
        train, _, _ = mlx_datasets.load_dataset(args, tokenizer=None)
        detail.append(f"{args.data} reads as {type(train).__name__}")
    else:
        detail.append(f"{args.data}: columns not known here")
    return {"detail": "; ".join(detail)}


def launch_line(d: Path) -> str:
    f = d / "_launch_and_warnings.txt"
    return next(
        (l[len("launch: ") :] for l in f.read_text().splitlines() if l.startswith("launch: ")), ""
    ) if f.exists() else ""


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
    "mlx": check_mlx,
    "llamafactory": check_llamafactory,
    "axolotl": check_axolotl,
}

VERSIONS = {
    "default": ["transformers", "trl", "peft", "accelerate", "deepspeed", "torch"],
    "llamafactory": ["llamafactory", "transformers", "peft"],
    "axolotl": ["axolotl", "transformers", "peft"],
    "unsloth": ["unsloth", "unsloth_zoo", "trl", "transformers", "peft", "datasets", "torch"],
    "mlx": ["mlx", "mlx-lm", "datasets"],
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
    launch = launch_line(d)
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
    ap.add_argument("--unsloth-python", default=None)
    ap.add_argument("--mlx-python", default=None)
    ap.add_argument(
        "--record",
        type=Path,
        default=None,
        help="write each file's result and snapshot hash here as JSON (the CI test reads it)",
    )
    ap.add_argument("--one", nargs=2, metavar=("TRAINER", "DIR"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        one(a.one[0], Path(a.one[1]).resolve())
        return
    pythons = {
        "llamafactory": a.llamafactory_python,
        "axolotl": a.axolotl_python,
        "unsloth": a.unsloth_python,
        "mlx": a.mlx_python,
    }
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
            r.update(snapshot=snap.name, trainer=trainer, sha256=snapshot_hash(d))
            rows.append(r)
            print(f"{r['status']:12} {snap.name}/{trainer}: {r['detail']}", file=sys.stderr)
    report = render(rows, a, pythons)
    if a.record:
        envs = [("default", sys.executable)] + [(k, v) for k, v in pythons.items() if v]
        record = {
            "versions": {name: versions(py, VERSIONS[name]) for name, py in envs},
            "files": [
                {k: r[k] for k in ("snapshot", "trainer", "status", "detail", "sha256")} for r in rows
            ],
        }
        a.record.write_text(json.dumps(record, indent=1) + "\n")
    if a.out:
        a.out.write_text(report)
    else:
        sys.stdout.write(report)
    sys.exit(1 if any(r["status"] == "failed" for r in rows) else 0)


def snapshot_hash(d: Path) -> str:
    """One hash for a trainer's snapshot folder: SHA-256 over `name\\n` and the SHA-256 of its
    bytes, `\\n`, for each file in name order (`moro-export`'s `export_check` test computes the
    same)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(p for p in d.iterdir() if p.is_file()):
        h.update(f"{f.name}\n{hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


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
    out.append("| snapshot | trainer | result | detail | warnings | sha256 |")
    out.append("|---|---|---|---|---|---|")
    for r in rows:
        w = "<br>".join(x.replace("|", "\\|") for x in r["warnings"]) or ""
        detail = r["detail"].replace("|", "\\|")
        out.append(
            f"| {r['snapshot']} | {r['trainer']} | {r['status']} | {detail} | {w} | {r['sha256'][:12]} |"
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
